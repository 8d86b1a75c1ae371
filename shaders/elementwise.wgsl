// elementwise.wgsl: unary, binary (broadcasting), select, and the fused backward of unary ops.
//
// Every entry is one thread per output element, 1-D over `n` (flat_id on a grid folded to 2-D).
// Threads past `n` return at once; that is the only bounds check needed, because each thread
// reads inputs at indices derived from its own output index, which are in range by
// construction of the strides (the host validates shapes).
//
// The op is a runtime switch on `p.op`: it is uniform across the dispatch, so the branch costs
// next to nothing in these memory-bound kernels, and one pipeline serves every op.
//
//   unary        y[i] = f(x[i]; a, b)
//   unary_bwd    dx[i] = g[i] * f'(x[i] or y[i]; a, b)   (which one: see each op)
//   binary       z[i] = f(x[i], y[i])                    same shapes, contiguous
//   binary_bcast z[i] = f(x[ix(i)], y[iy(i)])            broadcasting through strides (0 = repeat)
//   select       z[i] = c[ic(i)] != 0 ? x[ix(i)] : y[iy(i)]
//
// Bindings: unary reads x, writes y; unary_bwd reads x (the saved input or output) and g,
// writes dx; binary reads x, y, writes z; select reads c, x, y, writes z.
// Params: n, op, a, b, rank, then the output shape and up to three stride vectors (rank <= 6,
// each packed in two vec4<u32>).

struct Params {
  n: u32,
  op: u32,
  a: f32,
  b: f32,
  rank: u32,
  _pad0: u32,
  _pad1: u32,
  _pad2: u32,
  dims: array<vec4<u32>, 2>,
  s0: array<vec4<u32>, 2>,
  s1: array<vec4<u32>, 2>,
  s2: array<vec4<u32>, 2>,
}

fn unary_op(op: u32, x: f32, a: f32, b: f32) -> f32 {
  switch op {
    case 0u: { return -x; }
    case 1u: { return exp(x); }
    case 2u: { return log(x); }
    case 3u: { return sqrt(x); }
    case 4u: { return max(x, 0.0); }
    case 5u: { return 0.5 * x * (1.0 + erf_(x * 0.7071067811865476)); }   // gelu (exact)
    case 6u: { return tanh_(x); }
    case 7u: { return sigmoid_(x); }
    case 8u: { return abs(x); }
    case 9u: { return x * x; }
    case 10u: { return 1.0 / x; }
    case 11u: { return x + a; }
    case 12u: { return x * a; }
    case 13u: { return pow(x, a); }
    case 14u: { return a - x; }
    case 15u: { return max(x, a); }
    case 16u: { return min(x, a); }
    case 17u: { return a * x + b; }
    case 18u: { return x * sigmoid_(x); }                                   // silu
    case 19u: { return clamp(x, a, b); }
    case 20u: { return select(0.0, 1.0, x > a); }                          // step: x > a
    default: { return x; }
  }
}

// f'(v) where v is the saved input x, except tanh, sigmoid, exp, sqrt and recip, which use
// the saved output y (cheaper and as exact).
fn unary_grad(op: u32, v: f32, a: f32, b: f32) -> f32 {
  switch op {
    case 0u: { return -1.0; }                                              // neg
    case 1u: { return v; }                                                 // exp (y)
    case 2u: { return 1.0 / v; }                                           // log (x)
    case 3u: { return 0.5 / v; }                                           // sqrt (y)
    case 4u: { return select(0.0, 1.0, v > 0.0); }                         // relu (x)
    case 5u: {                                                             // gelu (x)
      let cdf = 0.5 * (1.0 + erf_(v * 0.7071067811865476));
      let pdf = 0.3989422804014327 * exp(-0.5 * v * v);
      return cdf + v * pdf;
    }
    case 6u: { return 1.0 - v * v; }                                       // tanh (y)
    case 7u: { return v * (1.0 - v); }                                     // sigmoid (y)
    case 8u: { return sign(v); }                                           // abs (x)
    case 9u: { return 2.0 * v; }                                           // square (x)
    case 10u: { return -v * v; }                                           // recip (y)
    case 11u: { return 1.0; }                                              // add scalar
    case 12u: { return a; }                                                // mul scalar
    case 13u: { return a * pow(v, a - 1.0); }                              // pow scalar (x)
    case 14u: { return -1.0; }                                             // a - x
    case 15u: { return select(0.0, 1.0, v > a); }                          // max scalar (x)
    case 16u: { return select(0.0, 1.0, v < a); }                          // min scalar (x)
    case 17u: { return a; }                                                // affine
    case 18u: {                                                            // silu (x)
      let s = sigmoid_(v);
      return s * (1.0 + v * (1.0 - s));
    }
    case 19u: { return select(0.0, 1.0, v >= a && v <= b); }               // clamp (x)
    default: { return 0.0; }
  }
}

fn binary_op(op: u32, x: f32, y: f32) -> f32 {
  switch op {
    case 0u: { return x + y; }
    case 1u: { return x - y; }
    case 2u: { return x * y; }
    case 3u: { return x / y; }
    case 4u: { return max(x, y); }
    case 5u: { return min(x, y); }
    case 6u: { return pow(x, y); }
    case 7u: { return select(0.0, 1.0, x == y); }
    case 8u: { return select(0.0, 1.0, x != y); }
    case 9u: { return select(0.0, 1.0, x < y); }
    case 10u: { return select(0.0, 1.0, x <= y); }
    case 11u: { return select(0.0, 1.0, x > y); }
    case 12u: { return select(0.0, 1.0, x >= y); }
    default: { return x; }
  }
}

// Offsets of output element i in up to three broadcast inputs.
fn bcast_offsets(i: u32) -> vec3<u32> {
  var rem = i;
  var o = vec3<u32>(0u, 0u, 0u);
  for (var k = i32(p.rank) - 1; k >= 0; k = k - 1) {
    let d = p.dims[k / 4][k % 4];
    let c = rem % d;
    rem = rem / d;
    o = o + c * vec3<u32>(p.s0[k / 4][k % 4], p.s1[k / 4][k % 4], p.s2[k / 4][k % 4]);
  }
  return o;
}

//! entry unary
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  st_y(i, unary_op(p.op, ld_x(i), p.a, p.b));
}

//! entry unary_bwd
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  st_dx(i, ld_g(i) * unary_grad(p.op, ld_x(i), p.a, p.b));
}

//! entry binary
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  st_z(i, binary_op(p.op, ld_x(i), ld_y(i)));
}

//! entry binary_bcast
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  let o = bcast_offsets(i);
  st_z(i, binary_op(p.op, ld_x(o.x), ld_y(o.y)));
}

//! entry select
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  let o = bcast_offsets(i);
  st_z(i, select(ld_y(o.z), ld_x(o.y), ldf_c(o.x) != 0.0));
}
