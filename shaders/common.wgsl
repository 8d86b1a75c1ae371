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

//! fn udiv
// x / d for u32, exact, through an f32 division where x < 2^24. WGSL lets f32 division be off
// by 2.5 ulp (GPUs multiply by an approximate reciprocal: 33 / 33 can give 0.99999994): with
// x < 2^24 that is less than 5 / d in the quotient, so for d >= 3 (smaller d are powers of two)
// the truncated quotient is within 2 of the true one, and up to two steps each way fix it.
// Integer division is one lane at a time on CPU adapters (and a long sequence on GPUs); index
// arithmetic runs on every element.
fn udiv(x: u32, d: u32) -> u32 {
  // A power of two (strides of 2, block sizes) is a shift.
  if ((d & (d - 1u)) == 0u) { return x >> countTrailingZeros(d); }
  if (x < 16777216u && d < 16777216u) {
    var q = u32(f32(x) / f32(d));
    if (q * d > x) { q = q - 1u; }
    if (q * d > x) { q = q - 1u; }
    if ((q + 1u) * d <= x) { q = q + 1u; }
    if ((q + 1u) * d <= x) { q = q + 1u; }
    return q;
  }
  return x / d;
}

//! fn udivmod
// (x / d, x % d) through udiv.
fn udivmod(x: u32, d: u32) -> vec2<u32> {
  let q = udiv(x, d);
  return vec2<u32>(q, x - q * d);
}

//! fn isnan_
// NaN by its bits: drivers may fold `x != x` to false (seen on lavapipe's Vulkan driver).
fn isnan_(x: f32) -> bool {
  return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

//! fn pow_
// x^y with C's pow rules where WGSL's pow is undefined (it is only defined for x > 0): a negative
// base with an integral exponent gives the signed power ((-2)^3 = -8), with any other
// exponent NaN; 0^y is 0 for y > 0, 1 for y == 0 and +inf for y < 0; x^0 is 1 even for NaN.
// Small integral exponents (and 1/2) are computed exactly, as PyTorch does, instead of through
// exp2(y log2 |x|), which rounds 1.5^2 to 2.2500002.
fn pow_(x: f32, y: f32) -> f32 {
  if (y == 0.0) { return 1.0; }
  if (y == 1.0) { return x; }
  if (y == 2.0) { return x * x; }
  if (y == 3.0) { return x * x * x; }
  if (y == -1.0) { return 1.0 / x; }
  if (y == -2.0) { return 1.0 / (x * x); }
  if (y == 0.5) { return sqrt(x); }
  let ax = abs(x);
  // Infinity and NaN built from run-time bits: WGSL rejects them as constant expressions.
  let zero_bits = bitcast<u32>(y) & 0u;
  if (ax == 0.0) { return select(0.0, bitcast<f32>(0x7f800000u + zero_bits), y < 0.0); }
  let r = pow(ax, y);
  if (x >= 0.0 || isnan_(x)) { return r; }
  if (floor(y) != y) { return bitcast<f32>(0x7fc00000u + zero_bits); }
  // An odd integral exponent keeps the sign (exact for |y| < 2^24, beyond that y is even).
  let odd = abs(y) < 16777216.0 && (abs(y) - 2.0 * floor(abs(y) * 0.5)) == 1.0;
  return select(r, -r, odd);
}

//! fn mix32
// A 32-bit integer hash (xor-shift-multiply; a bijection, each input bit reaching every output
// bit). Its CPU twin is reference::mix32.
fn mix32(x: u32) -> u32 {
  var h = x;
  h = (h ^ (h >> 16u)) * 0x7feb352du;
  h = (h ^ (h >> 15u)) * 0x846ca68bu;
  return h ^ (h >> 16u);
}

//! fn head_base
// Where row 0 of attention head `bh` (batch bh / heads, head bh % heads) starts in a strided
// operand: off + batch sb + head sh.
fn head_base(bh: u32, off: u32, sb: u32, sh: u32) -> u32 {
  let t = udivmod(bh, p.heads);
  return off + t.x * sb + t.y * sh;
}

//! fn kv_base
// Where row 0 of the key or value head that attention head `bh` reads starts: with
// grouped-query attention (`p.group` query heads a key/value head) head h reads head
// h / group of K and V, which hold heads / group heads.
fn kv_base(bh: u32, off: u32, sb: u32, sh: u32) -> u32 {
  let t = udivmod(bh, p.heads);
  return off + t.x * sb + (t.y / p.group) * sh;
}

//! fn tile_k
// Element (key, dd) of attention's K, zero past the keys or the head dimension
// (attention.wgsl's register-tile kernels). These tile loads sit under no branch of their
// own, like fwd_tile's: outside, they read index 0 and a select zeroes the value. (Which of
// the two moves the backward's time little either way.)
fn tile_k(kb: u32, key: u32, dd: u32) -> f32 {
  let ok = key < p.skv && dd < p.d;
  return select(0.0, ld_k(select(0u, kb + key * p.k_ss + dd, ok)), ok);
}

//! fn tile_v
// Element (key, dd) of attention's V, zero past the keys or the head dimension.
fn tile_v(vb: u32, key: u32, dd: u32) -> f32 {
  let ok = key < p.skv && dd < p.d;
  return select(0.0, ld_v(select(0u, vb + key * p.v_ss + dd, ok)), ok);
}

//! fn tile_kv
// Element (key, dd) of attention's K and V together.
fn tile_kv(kb: u32, vb: u32, key: u32, dd: u32) -> vec2<f32> {
  return vec2<f32>(tile_k(kb, key, dd), tile_v(vb, key, dd));
}

//! fn tile_qo
// Element (row, dd) of attention's Q and dO, zero past the queries or the head dimension.
fn tile_qo(qb: u32, gb: u32, row: u32, dd: u32) -> vec2<f32> {
  let ok = row < p.sq && dd < p.d;
  let q = ld_q(select(0u, qb + row * p.q_ss + dd, ok));
  let g = ld_dout(select(0u, gb + row * p.g_ss + dd, ok));
  return select(vec2<f32>(0.0), vec2<f32>(q, g), ok);
}

//! fn tile_column4
// Column dd of rows r0 .. r0 + 3 of K and V (`kv`) or of Q and dO, as two vec4s over the
// rows (zero past the rows or the head dimension): how attention.wgsl's register-tile backward
// kernels stage their transposed operands as whole vec4s.
fn tile_column4(kv: bool, b0: u32, b1: u32, r0: u32, dd: u32) -> array<vec4<f32>, 2> {
  var x = vec4<f32>(0.0);
  var y = vec4<f32>(0.0);
  for (var i = 0u; i < 4u; i = i + 1u) {
    var e: vec2<f32>;
    if (kv) { e = tile_kv(b0, b1, r0 + i, dd); } else { e = tile_qo(b0, b1, r0 + i, dd); }
    x[i] = e.x;
    y[i] = e.y;
  }
  return array<vec4<f32>, 2>(x, y);
}

//! fn attn_keep
// Dropout on attention weights: the factor for the weight of key `key` in query row `row`
// (numbered across heads: bh SQ + i): 0 when dropped, 1 / (1 - p) when kept, 1 without
// dropout. The mask is a hash of (seed, row, key), so the backward pass recomputes it
// instead of storing SQ x SKV bits (reference::attention_keep is the CPU twin).
fn attn_keep(row: u32, key: u32) -> f32 {
  return attn_keep_h(attn_row(row), key);
}

//! fn attn_row
// The row's part of attn_keep's hash: a kernel whose lanes keep their rows across every key
// works it out once (attn_keep_h then costs one mix32 a weight, not two).
fn attn_row(row: u32) -> u32 {
  return mix32(row ^ p.seed_lo);
}

//! fn attn_keep_h
// attn_keep for a row whose part of the hash is `rh` (attn_row).
fn attn_keep_h(rh: u32, key: u32) -> f32 {
  if (p.drop_thr == 0u) { return 1.0; }
  let h = mix32(rh ^ (key * 0x9e3779b9u) ^ p.seed_hi);
  return select(p.drop_scale, 0.0, h < p.drop_thr);
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
// Parameters of matmul.wgsl and matmul_coop.wgsl (one layout; host twin: kernels::matmul).
// Split-K: workgroup z = s * batch + b runs K range [s * kchunk, min((s + 1) * kchunk, k)) of
// batch matrix b; with splits > 1 the pass writes raw f32 partial products (raw = 1, no
// epilogue) to c at (s * batch + b) * m * n, and `splitk` sums them and applies the epilogue.
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
  kchunk: u32,
  splits: u32,
  raw: u32,
  // Bias per row (one value per output row, as a convolution's channels) instead of per
  // column; its offset for batch element b is (b % a_mod) * bias_bs (a group's bias).
  bias_rows: u32,
  bias_bs: u32,
  // An implicit convolution's image geometry (`reg` with GATHER = 1 reads op(B) from an NCHW
  // image instead of a column matrix; see matmul.wgsl `reg_gather_setup`): input height and
  // width, kernel taps (KH KW) and width, strides; the input row and column of tap (0, 0) at
  // output position (0, 0) (-PH, -PW) and the step from one tap to the next (DH, DW); for a
  // window read mirrored, tap (KH - 1, KW - 1)'s position and -DH, -DW.
  im_h: u32,
  im_w: u32,
  im_kk: u32,
  im_kw: u32,
  im_sh: u32,
  im_sw: u32,
  im_ph: i32,
  im_pw: i32,
  im_dh: i32,
  im_dw: i32,
  im_wo: u32,
  // matmul_wide.wgsl's RSUM: where the row sums of op(A) start in `bias`.
  sum_off: u32,
}

//! fn subgroup_row
// The row a subgroup owns in the one-subgroup-per-row entries (norm.wgsl's `_rows` and `_vec`,
// softmax.wgsl's `_vec`): the host's ROWS_PER_WG subgroups a workgroup, workgroups folded
// over a 2-D grid.
fn subgroup_row(ids: Ids) -> u32 {
  return (ids.wid.y * ids.nwg.x + ids.wid.x) * ids.sg_num + ids.sg_id;
}

//! fn norm_fwd_row
// norm.wgsl's forward for row r, element i = lane, lane + stride, ...; `row_sum` (defined by
// each entry: a workgroup or a subgroup reduction) adds up the row's partial sums.
fn norm_fwd_row(r: u32, lane: u32, stride: u32, ids: Ids) {
  let base = r * p.len;
  let inv_len = 1.0 / f32(p.len);
  var m0 = 0.0;
  if (p.rms == 0u) {
    var s = 0.0;
    for (var i = lane; i < p.len; i = i + stride) { s = s + ld_x(base + i); }
    m0 = row_sum(s, ids) * inv_len;
  }
  var sd = 0.0;
  var q = 0.0;
  for (var i = lane; i < p.len; i = i + stride) {
    let d = ld_x(base + i) - m0;
    sd = sd + d;
    q = q + d * d;
  }
  var corr = 0.0;
  if (p.rms == 0u) { corr = row_sum(sd, ids) * inv_len; }
  let var_ = max(row_sum(q, ids) * inv_len - corr * corr, 0.0);
  let rstd = inverseSqrt(var_ + p.eps);
  for (var i = lane; i < p.len; i = i + stride) {
    var v = ((ld_x(base + i) - m0) - corr) * rstd * ld_gamma(i);
    if (p.rms == 0u) { v = v + ld_beta(i); }
    st_y(base + i, v);
  }
  if (lane == 0u) {
    st_stats(3u * r, m0);
    st_stats(3u * r + 1u, corr);
    st_stats(3u * r + 2u, rstd);
  }
}

//! fn norm_bwd_row
// norm.wgsl's dx for row r, strided as norm_fwd_row, plus `res` where p.res says.
fn norm_bwd_row(r: u32, lane: u32, stride: u32, ids: Ids) {
  let base = r * p.len;
  let m0 = ld_stats(3u * r);
  let corr = ld_stats(3u * r + 1u);
  let rstd = ld_stats(3u * r + 2u);
  var sg = 0.0;
  var sgx = 0.0;
  for (var i = lane; i < p.len; i = i + stride) {
    let g = ld_dy(base + i) * ld_gamma(i);
    let xh = ((ld_x(base + i) - m0) - corr) * rstd;
    sg = sg + g;
    sgx = sgx + g * xh;
  }
  let inv_len = 1.0 / f32(p.len);
  var mg = row_sum(sg, ids) * inv_len;
  let mgx = row_sum(sgx, ids) * inv_len;
  if (p.rms != 0u) { mg = 0.0; }
  for (var i = lane; i < p.len; i = i + stride) {
    let g = ld_dy(base + i) * ld_gamma(i);
    let xh = ((ld_x(base + i) - m0) - corr) * rstd;
    var d = rstd * (g - mg - xh * mgx);
    if (p.res != 0u) { d = d + ld_res(base + i); }
    st_dx(base + i, d);
  }
}

//! fn matmul_bias_base
// Where batch element `bt`'s bias starts.
fn matmul_bias_base(bt: u32) -> u32 {
  return (bt % p.a_mod) * p.bias_bs;
}

//! fn matmul_apply
// Output element (m, n) with the parts that apply: + bias[n] (or bias[m] with bias_rows) from
// `bb` on when `bias`, then the activation `act` (ACT_*).
fn matmul_apply(v: f32, m: u32, n: u32, bb: u32, bias: bool, act: u32) -> f32 {
  var r = v;
  if (bias) { r = r + ld_bias(bb + select(n, m, p.bias_rows != 0u)); }
  return matmul_act(r, act);
}

//! fn matmul_act
// The activation `act` (ACT_*) of a product's output.
fn matmul_act(v: f32, act: u32) -> f32 {
  if (act == ACT_NONE) { return v; }
  if (act == ACT_RELU) { return max(v, 0.0); }
  if (act == ACT_GELU) { return 0.5 * v * (1.0 + erf_(v * 0.7071067811865476)); }
  return v;
}

//! fn matmul_epilogue
// matmul_apply as the parameters say; a raw partial product (split-K) is stored as is.
fn matmul_epilogue(v: f32, m: u32, n: u32, bb: u32) -> f32 {
  if (p.raw != 0u) { return v; }
  return matmul_apply(v, m, n, bb, p.has_bias != 0u, p.act);
}

//! fn matmul_fused
// matmul_apply with its choices fixed when the pipeline is built: the launch constant FUSE is
// bias (1) + 2 x activation (ACT_*), and 0 for a raw split-K partial. The same choices read
// from the parameters for every element cost a large share of a short product's time (a
// GPT-sized 16384 x 1152 x 384), even where nothing is applied.
fn matmul_fused(v: f32, m: u32, n: u32, bb: u32) -> f32 {
  return matmul_apply(v, m, n, bb, (FUSE & 1u) != 0u, FUSE >> 1u);
}

//! fn matmul_krange
// The K range [x, y) of split s = wid.z / batch.
fn matmul_krange(z: u32) -> vec2<u32> {
  let s = z / p.batch;
  let k0 = s * p.kchunk;
  return vec2<u32>(k0, min(k0 + p.kchunk, p.k));
}

//! fn matmul_a
// op(A)[gm, gk] of batch matrix `base`, or 0 past M or the end of the K range (zero-padded
// tiles add nothing).
fn matmul_a(base: u32, gm: u32, gk: u32, kend: u32) -> f32 {
  if (gm < p.m && gk < kend) { return ld_a(base + gm * p.sam + gk * p.sak); }
  return 0.0;
}

//! fn matmul_b
// op(B)[gk, gn] of batch matrix `base`, or 0 past N or the end of the K range.
fn matmul_b(base: u32, gk: u32, gn: u32, kend: u32) -> f32 {
  if (gn < p.n && gk < kend) { return ld_b(base + gk * p.sbk + gn * p.sbn); }
  return 0.0;
}

//! fn simt_out
// A CPU kernel's output element: through the epilogue, or stored as is when the launch has
// neither bias nor activation (EPI = 0, a constant, so the test folds away: on lavapipe the
// epilogue's uniform tests cost 20% of a product with K = 32).
fn simt_out(v: f32, m: u32, n: u32, bb: u32) -> f32 {
  if (EPI == 0u) { return v; }
  return matmul_epilogue(v, m, n, bb);
}

//! fn simt_store4
// Stores 4 outputs of row m from column n on.
fn simt_store4(at: u32, m: u32, n: u32, bb: u32, v: vec4<f32>) {
  st_c(at, simt_out(v.x, m, n, bb));
  st_c(at + 1u, simt_out(v.y, m, n + 1u, bb));
  st_c(at + 2u, simt_out(v.z, m, n + 2u, bb));
  st_c(at + 3u, simt_out(v.w, m, n + 3u, bb));
}

//! fn bf16_unpack
// Element i_ of a word holding two bf16 values (element 2k in the low half): a bf16 is the high
// half of an f32, so widening is a shift.
fn bf16_unpack(w_: u32, i_: u32) -> f32 {
  return bitcast<f32>(select(w_ << 16u, w_ & 0xffff0000u, (i_ & 1u) == 1u));
}

//! fn f16_bits
// The f16 bits of v (low half), for adapters without native f16 storage. pack2x16float is
// indeterminate outside the f16 range, so overflow and NaN are encoded by hand, as a native
// f16 conversion would round them.
fn f16_bits(v: f32) -> u32 {
  if ((bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u) { return 0x7e00u; }
  if (abs(v) >= 65520.0) { return select(0x7c00u, 0xfc00u, v < 0.0); }
  return pack2x16float(vec2<f32>(v, 0.0)) & 0xffffu;
}

//! fn bf16_round
// The bf16 bits of v, rounded to nearest even as PyTorch and `half` round. Adding 0x7fff plus the
// kept low bit carries into the high half exactly when the dropped half is above one half, or
// one half with an odd kept part; the carry turns the largest finite values into infinity as
// rounding should. NaN is kept quiet (the carry could turn a NaN into infinity).
fn bf16_round(v: f32) -> u32 {
  let b = bitcast<u32>(v);
  if ((b & 0x7fffffffu) > 0x7f800000u) { return (b >> 16u) | 0x40u; }
  return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}

//! fn coop_get0u
// Element access on cooperative matrices, which WGSL lacks: stubs whose bodies wgrad's own
// SPIR-V gives (kernels/spirv.rs `element_access`; a kernel calling them must `//! requires
// spirv`, and the pipeline refuses one that is not). coop_get<E>u(m) is element E of this
// invocation's share of a 16 x 16 f32 accumulator (8 elements with subgroups of 32);
// coop_set<E>u(m, x) returns m with it replaced by x; coop_seta<E>u the same for an f16 A
// operand. Which row and column element E holds is the driver's layout, measured by
// kernels/coop_layout.rs before any kernel relies on it.
fn coop_get0u(m: coop_mat16x16<f32, C>) -> f32 { return 0.0; }

//! fn coop_set0u
fn coop_set0u(m: coop_mat16x16<f32, C>, x: f32) -> coop_mat16x16<f32, C> { return m; }

//! fn coop_seta0u
fn coop_seta0u(m: coop_mat16x16<f16, A>, x: f16) -> coop_mat16x16<f16, A> { return m; }

//! fn coop_get1u
fn coop_get1u(m: coop_mat16x16<f32, C>) -> f32 { return 0.0; }

//! fn coop_set1u
fn coop_set1u(m: coop_mat16x16<f32, C>, x: f32) -> coop_mat16x16<f32, C> { return m; }

//! fn coop_seta1u
fn coop_seta1u(m: coop_mat16x16<f16, A>, x: f16) -> coop_mat16x16<f16, A> { return m; }

//! fn coop_get2u
fn coop_get2u(m: coop_mat16x16<f32, C>) -> f32 { return 0.0; }

//! fn coop_set2u
fn coop_set2u(m: coop_mat16x16<f32, C>, x: f32) -> coop_mat16x16<f32, C> { return m; }

//! fn coop_seta2u
fn coop_seta2u(m: coop_mat16x16<f16, A>, x: f16) -> coop_mat16x16<f16, A> { return m; }

//! fn coop_get3u
fn coop_get3u(m: coop_mat16x16<f32, C>) -> f32 { return 0.0; }

//! fn coop_set3u
fn coop_set3u(m: coop_mat16x16<f32, C>, x: f32) -> coop_mat16x16<f32, C> { return m; }

//! fn coop_seta3u
fn coop_seta3u(m: coop_mat16x16<f16, A>, x: f16) -> coop_mat16x16<f16, A> { return m; }

//! fn coop_get4u
fn coop_get4u(m: coop_mat16x16<f32, C>) -> f32 { return 0.0; }

//! fn coop_set4u
fn coop_set4u(m: coop_mat16x16<f32, C>, x: f32) -> coop_mat16x16<f32, C> { return m; }

//! fn coop_seta4u
fn coop_seta4u(m: coop_mat16x16<f16, A>, x: f16) -> coop_mat16x16<f16, A> { return m; }

//! fn coop_get5u
fn coop_get5u(m: coop_mat16x16<f32, C>) -> f32 { return 0.0; }

//! fn coop_set5u
fn coop_set5u(m: coop_mat16x16<f32, C>, x: f32) -> coop_mat16x16<f32, C> { return m; }

//! fn coop_seta5u
fn coop_seta5u(m: coop_mat16x16<f16, A>, x: f16) -> coop_mat16x16<f16, A> { return m; }

//! fn coop_get6u
fn coop_get6u(m: coop_mat16x16<f32, C>) -> f32 { return 0.0; }

//! fn coop_set6u
fn coop_set6u(m: coop_mat16x16<f32, C>, x: f32) -> coop_mat16x16<f32, C> { return m; }

//! fn coop_seta6u
fn coop_seta6u(m: coop_mat16x16<f16, A>, x: f16) -> coop_mat16x16<f16, A> { return m; }

//! fn coop_get7u
fn coop_get7u(m: coop_mat16x16<f32, C>) -> f32 { return 0.0; }

//! fn coop_set7u
fn coop_set7u(m: coop_mat16x16<f32, C>, x: f32) -> coop_mat16x16<f32, C> { return m; }

//! fn coop_seta7u
fn coop_seta7u(m: coop_mat16x16<f16, A>, x: f16) -> coop_mat16x16<f16, A> { return m; }
