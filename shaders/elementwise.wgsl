// elementwise.wgsl: unary, binary (broadcasting), select, and the fused backward of unary ops.
//
// Every entry is one thread per output element, 1-D over `n` (flat_id on a grid folded to 2-D).
// Threads past `n` return at once; that is the only bounds check needed, because each thread
// reads inputs at indices derived from its own output index, which are in range by
// construction of the strides (the host validates shapes).
//
// The op is a runtime switch on `p.op` over the named codes the prelude declares (UN_*, BIN_*,
// from the host's `Unary` and `Binary` enums): it is uniform across the dispatch, so the branch
// costs next to nothing in these memory-bound kernels, and one pipeline serves every op.
//
//   unary        y[i] = f(x[i]; a, b)
//   unary_bwd    dx[i] = g[i] * f'(x[i] or y[i]; a, b)   (which one: see each op)
//   binary       z[i] = f(x[i], y[i])                    same shapes, contiguous
//   binary_bcast z[i] = f(x[ix(i)], y[iy(i)])            any input layouts: strides (0 = repeat)
//                                                         and offsets (views, broadcasting)
//   select       z[i] = c[ic(i)] != 0 ? x[ix(i)] : y[iy(i)]
//
// Bindings: on the signature lines; unary_bwd's x is the op's saved input or output.
// Params: n, op, a, b, rank, then the output shape and up to three stride vectors (rank <= 6,
// each packed in two vec4<u32>).
// Loops: bcast_offsets runs `rank` (<= 6) iterations; nothing else loops.

struct Params {
  n: u32,
  op: u32,
  a: f32,
  b: f32,
  rank: u32,
  // Element offsets of the (up to three) strided inputs.
  off0: u32,
  off1: u32,
  off2: u32,
  dims: array<vec4<u32>, 2>,
  s0: array<vec4<u32>, 2>,
  s1: array<vec4<u32>, 2>,
  s2: array<vec4<u32>, 2>,
}

fn unary_op(op: u32, x: f32, a: f32, b: f32) -> f32 {
  switch op {
    case UN_NEG: { return -x; }
    case UN_EXP: { return exp(x); }
    case UN_LOG: { return log(x); }
    case UN_SQRT: { return sqrt(x); }
    case UN_RELU: { return max(x, 0.0); }
    case UN_GELU: { return 0.5 * x * (1.0 + erf_(x * 0.7071067811865476)); }   // exact (erf)
    case UN_TANH: { return tanh_(x); }
    case UN_SIGMOID: { return sigmoid_(x); }
    case UN_ABS: { return abs(x); }
    case UN_SQUARE: { return x * x; }
    case UN_RECIP: { return 1.0 / x; }
    case UN_ADD_SCALAR: { return x + a; }
    case UN_MUL_SCALAR: { return x * a; }
    case UN_POW_SCALAR: { return pow_(x, a); }
    case UN_RSUB_SCALAR: { return a - x; }
    case UN_MAX_SCALAR: { return max(x, a); }
    case UN_MIN_SCALAR: { return min(x, a); }
    case UN_AFFINE: { return a * x + b; }
    case UN_SILU: { return x * sigmoid_(x); }
    case UN_CLAMP: { return clamp(x, a, b); }
    case UN_STEP: { return select(0.0, 1.0, x > a); }
    default: { return x; }
  }
}

// f'(v) where v is the saved input x, except tanh, sigmoid, exp, sqrt and recip, which use
// the saved output y (cheaper and as exact).
fn unary_grad(op: u32, v: f32, a: f32, b: f32) -> f32 {
  switch op {
    case UN_NEG: { return -1.0; }
    case UN_EXP: { return v; }                                             // y
    case UN_LOG: { return 1.0 / v; }                                       // x
    case UN_SQRT: { return 0.5 / v; }                                      // y
    case UN_RELU: { return select(0.0, 1.0, v > 0.0); }                    // x
    case UN_GELU: {                                                        // x
      let cdf = 0.5 * (1.0 + erf_(v * 0.7071067811865476));
      let pdf = 0.3989422804014327 * exp(-0.5 * v * v);
      return cdf + v * pdf;
    }
    case UN_TANH: { return 1.0 - v * v; }                                  // y
    case UN_SIGMOID: { return v * (1.0 - v); }                             // y
    case UN_ABS: { return sign(v); }                                       // x
    case UN_SQUARE: { return 2.0 * v; }                                    // x
    case UN_RECIP: { return -v * v; }                                      // y
    case UN_ADD_SCALAR: { return 1.0; }
    case UN_MUL_SCALAR: { return a; }
    // d/dx x^a = a x^(a-1); 0 when a == 0 (x^0 is constant), as PyTorch.
    case UN_POW_SCALAR: { return select(a * pow_(v, a - 1.0), 0.0, a == 0.0); }
    case UN_RSUB_SCALAR: { return -1.0; }
    case UN_MAX_SCALAR: { return select(0.0, 1.0, v > a); }                // x
    case UN_MIN_SCALAR: { return select(0.0, 1.0, v < a); }                // x
    case UN_AFFINE: { return a; }
    case UN_SILU: {                                                        // x
      let s = sigmoid_(v);
      return s * (1.0 + v * (1.0 - s));
    }
    case UN_CLAMP: { return select(0.0, 1.0, v >= a && v <= b); }         // x
    default: { return 0.0; }
  }
}

fn binary_op(op: u32, x: f32, y: f32) -> f32 {
  switch op {
    case BIN_ADD: { return x + y; }
    case BIN_SUB: { return x - y; }
    case BIN_MUL: { return x * y; }
    case BIN_DIV: { return x / y; }
    case BIN_MAX: { return max(x, y); }
    case BIN_MIN: { return min(x, y); }
    case BIN_POW: { return pow_(x, y); }
    case BIN_EQ: { return select(0.0, 1.0, x == y); }
    case BIN_NE: { return select(0.0, 1.0, x != y); }
    case BIN_LT: { return select(0.0, 1.0, x < y); }
    case BIN_LE: { return select(0.0, 1.0, x <= y); }
    case BIN_GT: { return select(0.0, 1.0, x > y); }
    case BIN_GE: { return select(0.0, 1.0, x >= y); }
    default: { return x; }
  }
}

// Offsets of output element i in up to three broadcast inputs.
fn bcast_offsets(i: u32) -> vec3<u32> {
  var rem = i;
  var o = vec3<u32>(p.off0, p.off1, p.off2);
  for (var k = i32(p.rank) - 1; k >= 0; k = k - 1) {
    let d = p.dims[k / 4][k % 4];
    let qr = udivmod(rem, d);
    let c = qr.y;
    rem = qr.x;
    o = o + c * vec3<u32>(p.s0[k / 4][k % 4], p.s1[k / 4][k % 4], p.s2[k / 4][k % 4]);
  }
  return o;
}

//! entry unary(x: data, y: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  st_y(i, unary_op(p.op, ld_x(i), p.a, p.b));
}

//! entry unary_bwd(x: data, g: data, dx: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  st_dx(i, ld_g(i) * unary_grad(p.op, ld_x(i), p.a, p.b));
}

//! entry binary(x: data, y: data, z: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  st_z(i, binary_op(p.op, ld_x(i), ld_y(i)));
}

//! entry binary_bcast(x: data, y: data, z: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  let o = bcast_offsets(i);
  st_z(i, binary_op(p.op, ld_x(o.x), ld_y(o.y)));
}

//! entry select(c: any, x: data, y: data, z: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  let o = bcast_offsets(i);
  st_z(i, select(ld_y(o.z), ld_x(o.y), ldf_c(o.x) != 0.0));
}
