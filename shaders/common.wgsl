// common.wgsl: helpers shared by kernel families. Not a kernel: the composer copies a helper
// into a kernel's source when the kernel uses it (and does not define it itself). Each helper
// is a section opened by `//! fn NAME` (used as `NAME(`) or `//! struct NAME` (used as `NAME`).

//! fn erf_
// erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): WGSL has no erf.
fn erf_(x: f32) -> f32 {
  let a = abs(x);
  let t = 1.0 / (1.0 + 0.3275911 * a);
  let poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t;
  return sign(x) * (1.0 - poly * exp(-a * a));
}

//! fn tanh_
// tanh through exp with the argument clamped: some drivers return NaN for large |x|.
fn tanh_(x: f32) -> f32 {
  let c = clamp(x, -15.0, 15.0);
  let e = exp(2.0 * c);
  return (e - 1.0) / (e + 1.0);
}

//! fn sigmoid_
fn sigmoid_(x: f32) -> f32 {
  return 1.0 / (1.0 + exp(-x));
}

//! fn row_max_sumexp
// The maximum of row `x[base .. base + len]` and the sum of exp(x - max), for a workgroup that
// owns the row (all threads call it, in uniform control flow). Each thread keeps an online
// (max, sum) pair over its elements, rescaling its sum by exp(m - m') when a new maximum m'
// arrives, so the row is read once; the workgroup then combines the pairs. Starting from the
// lowest finite value keeps exp(m - v) defined for a thread that saw no element.
fn row_max_sumexp(base: u32, len: u32, ids: Ids) -> vec2<f32> {
  var m = -3.4028234663852886e38;
  var s = 0.0;
  for (var i = ids.lid; i < len; i = i + WG) {
    let v = ld_x(base + i);
    if (v > m) {
      s = s * exp(m - v) + 1.0;
      m = v;
    } else {
      s = s + exp(v - m);
    }
  }
  let mx = block_max(m, ids);
  return vec2<f32>(mx, block_sum(s * exp(m - mx), ids));
}

//! struct MatmulParams
// Parameters of matmul.wgsl and matmul_coop.wgsl (one layout, filled by kernels/matmul.rs).
struct MatmulParams {
  m: u32,
  n: u32,
  k: u32,
  batch: u32,
  sam: u32,
  sak: u32,
  sbk: u32,
  sbn: u32,
  a_bs: u32,
  b_bs: u32,
  a_mod: u32,
  b_mod: u32,
  a_kfast: u32,
  b_nfast: u32,
  act: u32,
  has_bias: u32,
  a_off: u32,
  b_off: u32,
  c_off: u32,
  _pad: u32,
}

//! fn matmul_epilogue
// A matmul output element: + bias[n] when there is one, then the activation (0 none, 1 relu,
// 2 gelu).
fn matmul_epilogue(v: f32, n: u32) -> f32 {
  var r = v;
  if (p.has_bias != 0u) { r = r + ld_bias(n); }
  if (p.act == 1u) { r = max(r, 0.0); }
  if (p.act == 2u) { r = 0.5 * r * (1.0 + erf_(r * 0.7071067811865476)); }
  return r;
}

//! fn matmul_a
// op(A)[gm, gk] of batch matrix `base`, or 0 past M or K (zero-padded tiles add nothing).
fn matmul_a(base: u32, gm: u32, gk: u32) -> f32 {
  if (gm < p.m && gk < p.k) { return ld_a(base + gm * p.sam + gk * p.sak); }
  return 0.0;
}

//! fn matmul_b
// op(B)[gk, gn] of batch matrix `base`, or 0 past K or N.
fn matmul_b(base: u32, gk: u32, gn: u32) -> f32 {
  if (gn < p.n && gk < p.k) { return ld_b(base + gk * p.sbk + gn * p.sbn); }
  return 0.0;
}
