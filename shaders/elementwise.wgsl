// elementwise.wgsl: unary, binary (broadcasting), select, and the fused backward of unary ops.
//
// Every entry is one thread per output element, 1-D over `n` (flat_id on a grid folded to 2-D).
// Threads past `n` return at once; that is the only bounds check needed, because each thread
// reads inputs at indices derived from its own output index, which are in range by
// construction of the strides (the host validates shapes).
//
// The op is a runtime switch on `p.op` over the named codes the prelude declares (UN_*, BIN_*,
// from the host's `Unary` and `Binary` enums): it is uniform across the dispatch, so the branch
// costs next to nothing in these memory-bound kernels, and one pipeline serves every op. The
// unary switches `unary_op(op, x, a, b)` and `unary_grad(op, v, a, b)` are generated from the
// host's op table (`for_each_unary!` in src/kernels/elementwise.rs) and appended to this file.
//
//   unary        y[i] = f(x[i]; a, b)
//   unary_bwd    dx[i] = g[i] * f'(x[i] or y[i]; a, b)   (which one: see each op)
//   binary       z[i] = f(x[i], y[i])                    same shapes, contiguous
//   binary_bcast z[i] = f(x[ix(i)], y[iy(i)])            any input layouts: strides (0 = repeat)
//                                                         and offsets (views, broadcasting)
//   compare_u32  z[i] = x[ix(i)] OP y[iy(i)] ? 1.0 : 0.0 over u32 operands (exact for every
//                u32; a conversion to f32 would merge values past 2^24), z in f32
//   select       z[i] = c[ic(i)] != 0 ? x[ix(i)] : y[iy(i)]
//   unary4, unary_bwd4, binary4   as above, four elements a thread
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

// Derivatives too long for a row of the host's op table (`unary_grad` calls them).
fn gelu_grad_(x: f32) -> f32 {
  let cdf = 0.5 * (1.0 + erf_(x * 0.7071067811865476));
  let pdf = 0.3989422804014327 * exp(-0.5 * x * x);
  return cdf + x * pdf;
}

fn silu_grad_(x: f32) -> f32 {
  let s = sigmoid_(x);
  return s * (1.0 + x * (1.0 - s));
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

// The same three four elements a thread (p.n counts vectors): 8-byte f16 and 16-byte f32
// loads and stores, where one element a thread leaves these kernels well below the memory
// bandwidth. The host takes them when the element count is a multiple of 4.
// The unary ones take their op as the constant OP, one pipeline per op: the driver then drops
// the switch over every op, which would keep GELU's forward and backward short of the
// memory bandwidth on large activations (docs/performance.md, elementwise).
//! entry unary4(x: data vec4, y: data mut vec4)
//! check OP=0,1
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let j = flat_id(ids);
  if (j >= p.n) { return; }
  let v = ld4_x(j);
  st4_y(j, vec4<f32>(unary_op(OP, v.x, p.a, p.b), unary_op(OP, v.y, p.a, p.b),
                     unary_op(OP, v.z, p.a, p.b), unary_op(OP, v.w, p.a, p.b)));
}

//! entry unary_bwd4(x: data vec4, g: data vec4, dx: data mut vec4)
//! check OP=0,1
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let j = flat_id(ids);
  if (j >= p.n) { return; }
  let v = ld4_x(j);
  let d = vec4<f32>(unary_grad(OP, v.x, p.a, p.b), unary_grad(OP, v.y, p.a, p.b),
                    unary_grad(OP, v.z, p.a, p.b), unary_grad(OP, v.w, p.a, p.b));
  st4_dx(j, ld4_g(j) * d);
}

//! entry binary4(x: data vec4, y: data vec4, z: data mut vec4)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let j = flat_id(ids);
  if (j >= p.n) { return; }
  let a = ld4_x(j);
  let b = ld4_y(j);
  st4_z(j, vec4<f32>(binary_op(p.op, a.x, b.x), binary_op(p.op, a.y, b.y),
                     binary_op(p.op, a.z, b.z), binary_op(p.op, a.w, b.w)));
}

//! entry binary_bcast(x: data, y: data, z: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  let o = bcast_offsets(i);
  st_z(i, binary_op(p.op, ld_x(o.x), ld_y(o.y)));
}

//! entry compare_u32(x: u32, y: u32, z: f32 mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  let o = bcast_offsets(i);
  let x = ld_x(o.x);
  let y = ld_y(o.y);
  var holds = false;
  switch p.op {
    case BIN_EQ: { holds = x == y; }
    case BIN_NE: { holds = x != y; }
    case BIN_LT: { holds = x < y; }
    case BIN_LE: { holds = x <= y; }
    case BIN_GT: { holds = x > y; }
    case BIN_GE: { holds = x >= y; }
    default: {}
  }
  st_z(i, select(0.0, 1.0, holds));
}

//! entry select(c: any, x: data, y: data, z: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  let o = bcast_offsets(i);
  st_z(i, select(ld_y(o.z), ld_x(o.y), ldf_c(o.x) != 0.0));
}
