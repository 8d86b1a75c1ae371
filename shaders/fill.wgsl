// fill.wgsl: constants, counter-based random numbers, dropout.
//
// Entry points (all one thread per element, 1-D over `n` elements, index from flat_id on a
// grid folded to 2-D; threads past `n` return at once, which is the only bounds check needed
// because every access is at the thread's own index):
//   fill     out[i] = value
//   words    out[i] = bit pattern of value, on raw u32 words (poisoning fresh blocks with NaN
//            for tests: the pattern 0x7fc07fc0 is NaN as one f32 and as two f16 halves)
//   uniform  out[i] = a + (b - a) * u(i),          u in [0, 1)
//   normal   out[i] = a + b * z(i),                z standard normal (Box-Muller)
//   dropout  y[i] = x[i] * (u(i) >= a ? b : 0)     a = drop probability, b = 1 / (1 - a)
//            The mask depends only on (seed, i), so the backward pass is the same kernel
//            applied to dy with the same seed, and a replay (checkpointing) draws the same mask.
//   dropout4 the same, four elements a thread (the host's choice when n is a multiple of 4)
//   add_dropout4  y = r + dropout4(x): a residual connection joining a dropped-out branch in
//            one pass (dropout4's mask for the same seed, so its backward is dropout4 on dy)
//
// Bindings: on each entry's signature line. Params: n, a, b, and the 64-bit seed as two words.
// Loops: none.
//
// Random numbers: u(i) hashes (i, seed, stream) with two rounds of a 32-bit avalanche hash
// (xor-shift-multiply, Wellons' lowbias32); the seed enters both rounds, so different seeds give
// unrelated streams, not shifted copies of one stream.

struct Params {
  n: u32,
  a: f32,
  b: f32,
  seed_lo: u32,
  seed_hi: u32,
  // The word `words` stores.
  bits: u32,
}

fn hash32(x: u32) -> u32 {
  var h = x;
  h = h ^ (h >> 16u);
  h = h * 0x7feb352du;
  h = h ^ (h >> 15u);
  h = h * 0x846ca68bu;
  h = h ^ (h >> 16u);
  return h;
}

fn rand_bits(i: u32, stream: u32) -> u32 {
  let k1 = hash32(p.seed_lo ^ (stream * 0x9e3779b9u));
  let k2 = hash32(p.seed_hi + 0x632be5abu);
  return hash32(hash32(i ^ k1) ^ k2);
}

// Uniform in [0, 1) with 24 random bits.
fn uniform01(i: u32, stream: u32) -> f32 {
  return f32(rand_bits(i, stream) >> 8u) * (1.0 / 16777216.0);
}

// Whether dropout keeps element i. A dropped element is 0 even where x is inf or NaN.
fn kept(i: u32) -> bool {
  return uniform01(i, 3u) >= p.a;
}

//! entry fill(out: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  st_out(i, p.a);
}

//! entry words(out: u32 mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  st_out(i, p.bits);
}

//! entry uniform(out: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  st_out(i, p.a + (p.b - p.a) * uniform01(i, 0u));
}

//! entry normal(out: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  // u1 in (0, 1] keeps the log finite.
  let u1 = (f32(rand_bits(i, 1u) >> 8u) + 1.0) * (1.0 / 16777216.0);
  let u2 = uniform01(i, 2u);
  let z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
  st_out(i, p.a + p.b * z);
}

//! entry dropout(x: data, y: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  st_y(i, select(0.0, ld_x(i) * p.b, kept(i)));
}

// Four elements a thread (p.n counts vectors; the same mask as `dropout`).
//! entry dropout4(x: data vec4, y: data mut vec4)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let j = flat_id(ids);
  if (j >= p.n) { return; }
  let i = 4u * j;
  let k = vec4<bool>(kept(i), kept(i + 1u), kept(i + 2u), kept(i + 3u));
  st4_y(j, select(vec4<f32>(0.0), ld4_x(j) * p.b, k));
}

//! entry add_dropout4(r: data vec4, x: data vec4, y: data mut vec4)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let j = flat_id(ids);
  if (j >= p.n) { return; }
  let i = 4u * j;
  let k = vec4<bool>(kept(i), kept(i + 1u), kept(i + 2u), kept(i + 3u));
  st4_y(j, ld4_r(j) + select(vec4<f32>(0.0), ld4_x(j) * p.b, k));
}
