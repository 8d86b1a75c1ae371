// attention.wgsl: fused scaled dot-product attention, flash style, forward and backward.
//
//   O = softmax(scale * Q K^T + mask) V,  Q: [BH, SQ, D], K, V: [BH, SKV, D], O: [BH, SQ, D]
//
// The SQ x SKV score matrix never goes to memory. Each workgroup keeps a BR x BC block of
// scores in workgroup memory at a time, so memory is O(SQ) per head (the output and one f32
// log-sum-exp per query row), not O(SQ * SKV).
// The causal mask lets query i see key j when j <= i + (SKV - SQ) (bottom-right aligned, so
// SQ == SKV is the usual lower triangle, and with more keys than queries the queries are the
// last SQ positions of the sequence); masked scores are -inf.
//
// Constants: BR query rows and BC keys per block, DMAX >= D (the head dimension, padded for
// register arrays; tiles are zero past D, so loops over DMAX add nothing for the padding;
// workgroup-memory rows are DMAX + 1 floats so threads reading different rows at the same
// column hit different banks). WG = 128 threads.
//
// Chunks: one dispatch covers the key range [c0, c1) (fwd, bwd_q) or the query range [c0, c1)
// (bwd_kv); the host runs the chunks of a long sequence as consecutive dispatches, each
// starting from the running state the one before left in `state` (f32) unless p.first, and
// writing the result instead of the state when p.last. That keeps every invocation's loops
// inside the loop budget (kernels/mod.rs) for any sequence length.
//
//   fwd        Workgroup (x, y) = (query block, head). Thread t owns query row r = t / TPR and
//              columns l, l + TPR, ... of its output (TPR = WG / BR threads per row). For each
//              key block: load K and V tiles, compute the row's scores into Ss, then every
//              thread of the row reads the row back and does the online-softmax update:
//              m' = max(m, max_c s), rescale l and the output accumulators by exp(m - m'),
//              add p_c = exp(s_c - m') and p_c * V[c]. At the end O = acc / l and, for the
//              backward pass, lse = m + log(l). Causal rows stop at the last block they can see.
//              State per row: acc[DMAX], m, l.
//   fwd_tile, bwd_kv_tile, bwd_q_tile, bwd_q_split
//              fwd, bwd_kv, bwd_q in register tiles for head dimensions up to 64 and up to
//              128 (bwd_q_tile at 64, bwd_q_split at 128; see the entries).
//   bwd_delta  DL = 16 threads per query row: delta = sum_d dO * O (the softmax backward's
//              dot).
//   bwd_kv     Workgroup (x, y) = (key block, head); thread t owns key c = t / TPC and columns
//              of dK and dV in registers. For each query block (starting at the first that can
//              see these keys): recompute P = exp(scale * Q K^T - lse), dP = dO V^T and
//              dS = P * (dP - delta) for the BR x BC block, then dV += P^T dO and
//              dK += scale * dS^T Q. No atomics: each workgroup owns its keys' gradients.
//              State per key: dK[DMAX], dV[DMAX].
//   bwd_q      Workgroup (x, y) = (query block, head); thread owns a query row's dQ columns;
//              for each key block recompute dS as above and add scale * dS K. State per row:
//              dQ[DMAX].
//
// Bounds: tiles are loaded with zero past SQ, SKV or D; scores of keys past SKV (and masked
// ones) are -inf, so they get probability 0; rows past SQ are computed but never stored.
// Barriers sit in loops whose bounds depend only on workgroup ids and uniform parameters.
//
// Bindings: signature lines; lse and delta are f32; `state` is a dummy when a call has one
// chunk.
// Params: bh, sq, skv, d, scale, causal, -inf (passed in: WGSL rejects an infinite constant),
// first, last, c0, c1.
// Loops (per invocation, counting constant loops as if not unrolled): per block of the chunk,
// fwd (BC DMAX / WG + 1) + (BC / TPR + 1) + (BC / TPR)(DMAX + 2) + (BC + 1) + (BC + 1) +
// BC (OPT + 1); bwd_kv (BR DMAX / WG + 1) + 2 + (BR BC / WG + 1) + (BR BC / WG)(DMAX + 1) +
// (BR + 1) + BR (KPT + 1); bwd_q (BC DMAX / WG + 1) + (BR BC / WG + 1) + (BR BC / WG)(DMAX + 1) +
// (BC + 1) + BC (OPT + 1). The host (kernels::attention) sizes chunks from these; the tile
// kernels' counts are beside their chunk sizes there (FWD_TILE_CHUNK, BackwardTile::chunk).

struct Params {
  bh: u32,
  sq: u32,
  skv: u32,
  d: u32,
  scale: f32,
  causal: u32,
  ninf: f32,
  first: u32,
  last: u32,
  c0: u32,
  c1: u32,
  // The BH index is (batch b, head h) with `heads` heads; q, k, v, o and dout (g) are read
  // at off + b sb + h sh + row ss + column (any layout whose head dimension is contiguous:
  // the heads of a fused QKV projection need no copy). The gradients dq, dk, dv go to their
  // own layouts (dq_off ...: dense, or the gradient of a fused QKV projection in place);
  // lse, delta and the chunk state are dense.
  heads: u32,
  q_off: u32,
  q_sb: u32,
  q_sh: u32,
  q_ss: u32,
  k_off: u32,
  k_sb: u32,
  k_sh: u32,
  k_ss: u32,
  v_off: u32,
  v_sb: u32,
  v_sh: u32,
  v_ss: u32,
  o_off: u32,
  o_sb: u32,
  o_sh: u32,
  o_ss: u32,
  g_off: u32,
  g_sb: u32,
  g_sh: u32,
  g_ss: u32,
  dq_off: u32,
  dq_sb: u32,
  dq_sh: u32,
  dq_ss: u32,
  dk_off: u32,
  dk_sb: u32,
  dk_sh: u32,
  dk_ss: u32,
  dv_off: u32,
  dv_sb: u32,
  dv_sh: u32,
  dv_ss: u32,
  // Dropout on the attention weights (common.wgsl's attn_keep).
  drop_thr: u32,
  drop_scale: f32,
  seed_lo: u32,
  seed_hi: u32,
  // Query heads per key/value head (grouped-query attention): query head h reads
  // key/value head h / group.
  group: u32,
}

// Where row 0 of head `bh` starts in each strided operand (common.wgsl `head_base`).
fn base_q(bh: u32) -> u32 { return head_base(bh, p.q_off, p.q_sb, p.q_sh); }
fn base_k(bh: u32) -> u32 { return kv_base(bh, p.k_off, p.k_sb, p.k_sh); }
fn base_v(bh: u32) -> u32 { return kv_base(bh, p.v_off, p.v_sb, p.v_sh); }
fn base_o(bh: u32) -> u32 { return head_base(bh, p.o_off, p.o_sb, p.o_sh); }
fn base_g(bh: u32) -> u32 { return head_base(bh, p.g_off, p.g_sb, p.g_sh); }

// Lanes per row in bwd_delta.
const DL: u32 = 16u;
const RS: u32 = DMAX + 1u;
// A score sums its first SH dimensions, then the rest, then adds the two: at head dimension
// 128 every kernel (fwd_tile's two lanes a key group included) sums dimensions 0..63 and
// 64..127 apart, so the backward's recomputed scores equal the forward's to the bit. Summed
// in another order, they differed by rounding, and the gradients of steep softmaxes, which
// cancel large terms, lost a factor of 10 (attention_with_growing_scores, dq at d = 128).
const SH: u32 = select(DMAX, 64u, DMAX == 128u);

// Whether query `qi` may not attend to key `kj` (outside the keys, or causally masked).
fn masked(qi: u32, kj: u32) -> bool {
  if (kj >= p.skv) { return true; }
  return p.causal != 0u && kj + p.sq > qi + p.skv;
}

// One past the last key the query block starting at q0 can see.
fn key_end(q0: u32) -> u32 {
  if (p.causal == 0u) { return p.skv; }
  return min(p.skv, q0 + BR + p.skv - p.sq);
}

// Where the vec4 of dimensions 4 d4 .. 4 d4 + 3 of row `r` of a block sits when the register-
// tile backward kernels stage rows as vec4s (a query in bwd_kv_tile, a key in bwd_q_tile and
// bwd_q_split): rotated by r / step, where a thread reads `step` neighbouring rows, so that
// the threads of a subgroup reading one d4 of their rows fall on different banks.
fn row_at(r: u32, d4: u32, step: u32) -> u32 {
  return r * (DMAX / 4u) + ((d4 + r / step) & (DMAX / 4u - 1u));
}

//! entry fwd(q: data, k: data, v: data, o: data mut, lse: f32 mut, state: f32 mut)
//! check WG=128 BR=32 BC=32 DMAX=32
//! check WG=128 BR=32 BC=32 DMAX=64
//! check WG=128 BR=16 BC=16 DMAX=128
//! check WG=128 BR=8 BC=8 DMAX=256
var<workgroup> Qs: array<f32, BR * RS>;
var<workgroup> Ks: array<f32, BC * RS>;
var<workgroup> Vs: array<f32, BC * DMAX>;
var<workgroup> Ss: array<f32, BR * BC>;

const TPR: u32 = WG / BR;
const OPT: u32 = DMAX / TPR;

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let bh = ids.wid.y;
  let q0 = ids.wid.x * BR;
  let t = ids.lid;
  let r = t / TPR;
  let l = t % TPR;
  let qi = q0 + r;
  let row_ok = qi < p.sq;
  let qb = base_q(bh);
  let kb = base_k(bh);
  let vb = base_v(bh);
  let sb = (bh * p.sq + qi) * (DMAX + 2u);
  for (var e = t; e < BR * DMAX; e = e + WG) {
    let rr = e / DMAX;
    let dd = e % DMAX;
    var v = 0.0;
    if (q0 + rr < p.sq && dd < p.d) { v = ld_q(qb + (q0 + rr) * p.q_ss + dd); }
    Qs[rr * RS + dd] = v;
  }
  var acc: array<f32, OPT>;
  var m = p.ninf;
  var lsum = 0.0;
  for (var j = 0u; j < OPT; j = j + 1u) { acc[j] = 0.0; }
  if (p.first == 0u && row_ok) {
    for (var j = 0u; j < OPT; j = j + 1u) { acc[j] = ld_state(sb + l + j * TPR); }
    m = ld_state(sb + DMAX);
    lsum = ld_state(sb + DMAX + 1u);
  }
  let kend = min(p.c1, key_end(q0));
  for (var k0 = p.c0; k0 < kend; k0 = k0 + BC) {
    workgroupBarrier();
    for (var e = t; e < BC * DMAX; e = e + WG) {
      let c = e / DMAX;
      let dd = e % DMAX;
      var kv = 0.0;
      var vv = 0.0;
      if (k0 + c < p.skv && dd < p.d) {
        kv = ld_k(kb + (k0 + c) * p.k_ss + dd);
        vv = ld_v(vb + (k0 + c) * p.v_ss + dd);
      }
      Ks[c * RS + dd] = kv;
      Vs[c * DMAX + dd] = vv;
    }
    workgroupBarrier();
    for (var c = l; c < BC; c = c + TPR) {
      // In two runs at 128 (`SH`).
      var s = 0.0;
      var s2 = 0.0;
      for (var dd = 0u; dd < SH; dd = dd + 1u) { s = fma(Qs[r * RS + dd], Ks[c * RS + dd], s); }
      for (var dd = SH; dd < DMAX; dd = dd + 1u) { s2 = fma(Qs[r * RS + dd], Ks[c * RS + dd], s2); }
      s = s + s2;
      Ss[r * BC + c] = select(s * p.scale, p.ninf, masked(qi, k0 + c));
    }
    workgroupBarrier();
    var mb = m;
    for (var c = 0u; c < BC; c = c + 1u) { mb = max(mb, Ss[r * BC + c]); }
    if (mb != p.ninf) {
      let corr = exp(m - mb);
      lsum = lsum * corr;
      for (var j = 0u; j < OPT; j = j + 1u) { acc[j] = acc[j] * corr; }
      for (var c = 0u; c < BC; c = c + 1u) {
        let pc = exp(Ss[r * BC + c] - mb);
        lsum = lsum + pc;
        // Dropout scales the weight in the output only: the softmax sum stays whole.
        let pd = pc * attn_keep(bh * p.sq + qi, k0 + c);
        for (var j = 0u; j < OPT; j = j + 1u) { acc[j] = fma(pd, Vs[c * DMAX + l + j * TPR], acc[j]); }
      }
      m = mb;
    }
  }
  if (row_ok) {
    if (p.last != 0u) {
      let inv = 1.0 / lsum;
      let ob = base_o(bh);
      for (var j = 0u; j < OPT; j = j + 1u) {
        let dd = l + j * TPR;
        if (dd < p.d) { st_o(ob + qi * p.o_ss + dd, acc[j] * inv); }
      }
      if (l == 0u) { st_lse(bh * p.sq + qi, m + log(lsum)); }
    } else {
      for (var j = 0u; j < OPT; j = j + 1u) { st_state(sb + l + j * TPR, acc[j]); }
      if (l == 0u) {
        st_state(sb + DMAX, m);
        st_state(sb + DMAX + 1u, lsum);
      }
    }
  }
}

//! entry fwd_tile(q: data vec4, k: data vec4, v: data vec4, o: data mut, lse: f32 mut, state: f32 mut)
//! requires subgroups
//! check WG=128 BR=64 BC=32 DMAX=64 VEC=0,1 SEP=0,1
//! check WG=128 BR=32 BC=32 DMAX=128 VEC=0,1 SEP=0
// fwd in register tiles, for head dimensions up to 64 (DMAX = 64, zero past d) on adapters
// with subgroups of at least 8, and up to 128 (DMAX = 128) with subgroups of at least 16: the
// same online softmax, chunks and state as fwd. A workgroup (WG = 128) takes BR query rows
// (64, or 32 at 128) and walks the keys in blocks of 32. Thread t (row group rg = t / LN,
// lane = t % LN, LN = 8 or 16 lanes a row group) owns rows 4 rg .. 4 rg + 3: their scores
// against keys 4 kg .. 4 kg + 3 of the block (kg = lane % 8; four vec4s over the rows) and
// their output columns 4 lane .. 4 lane + 3 and DMAX / 2 + 4 lane .. + 3 (eight vec4s over
// the columns). At 128 the two lanes lane and lane + 8 share a key group and each sums the
// scores over half the dimensions (dh = lane / 8), added by one shuffle.
// Q and each block of K sit in workgroup memory transposed (Qt: a vec4 of 4 rows per
// dimension and row group; KPt: a vec4 of 4 keys per dimension and key group), so a step of
// the scores reads two vec4s and does 16 multiply-adds; the weights P go to Pt (a vec4 of 4
// rows per key and row group) and V sits row-major, so a step of the output reads three vec4s
// for 32. The lanes of a row group are neighbours in one subgroup: they combine the row
// maxima and sums by subgroup shuffles, and all keep the same running max and sum.
//
// What keeps it fast (each found in NVIDIA's driver's machine code, and measured):
// - The workgroup arrays are indexed [outer][inner][lane] and the inner loops run over the
//   outer index with the inner one unrolled: naga's bounds clamp falls once per 8 dimensions
//   (4 keys) instead of on every read, and the reads take constant offsets.
// - K, V and Q come in 16-byte runs where the head dimension, the strides and the offsets are
//   multiples of 4 (VEC, the host's test), element by element otherwise. No load sits under
//   a branch (`run4`).
// - Each block loads its own K at its top (stored at once) and its V there too, stored after
//   the scores, so V's loads fly while they multiply. Loading the next block's K and V into
//   registers a whole block ahead holds ~145 registers a thread and runs slower, carrying
//   only K across blocks slower still (docs/performance.md, attention).
// - With SEP (40 KiB of workgroup memory) P has its own array, so the scores need no barrier
//   before P is stored: three barriers a block. Without (32 KiB adapters, and at 128, where
//   Q, K and V take the whole 48 KiB) P replaces K in KPt, and Pt is not declared.
// - The masks are applied only in blocks that hold a masked key (the causal diagonal, the
//   end of the keys), and the dropout hash only when dropout is on.
// - P is stored rotated by its key group, (rg + kg) % 16, so the eight lanes of a quarter
//   warp store to distinct banks.
const RG: u32 = BR / 4u;
const LN: u32 = WG / RG;
// Where a lane's second run of output columns starts; the runs of 4 columns of V a row; how
// many keys apart a thread's runs of V lie, and how many it loads a block.
const HALF: u32 = DMAX / 2u;
const VD: u32 = DMAX / 4u;
const VKS: u32 = WG / VD;
const NV: u32 = BC / VKS;
var<workgroup> Qt: array<array<array<vec4<f32>, RG>, 8>, DMAX / 8u>;
var<workgroup> KPt: array<array<array<vec4<f32>, 16>, 4>, DMAX / 8u>;
var<workgroup> Vt: array<array<array<vec4<f32>, VD>, 4>, 8>;
// (A block `unroll`ed SEP times: present only with SEP = 1.)
//! unroll sep in 0..SEP
var<workgroup> Pt: array<array<array<vec4<f32>, 16>, 4>, 8>;
//! end

// The maximum and the sum over the eight key groups of a row group.
fn group_max(x: vec4<f32>) -> vec4<f32> {
  var r = max(x, subgroupShuffleXor(x, 1u));
  r = max(r, subgroupShuffleXor(r, 2u));
  return max(r, subgroupShuffleXor(r, 4u));
}
fn group_sum(x: vec4<f32>) -> vec4<f32> {
  var r = x + subgroupShuffleXor(x, 1u);
  r = r + subgroupShuffleXor(r, 2u);
  return r + subgroupShuffleXor(r, 4u);
}

// Dimensions 4 d4 .. 4 d4 + 3 of row `row` of Q (which = 0), K (1) or V (2), whose head
// starts at `base` with row stride `ss`; zero past `n` rows or the head dimension. With VEC
// (the host's promise that the head dimension, the strides and the heads' offsets are
// multiples of 4) one 16-byte load, else four. The loads are unconditional, at index 0 where
// the element is outside (zero is selected after): a load under a branch makes the driver
// wait for it where the branches join, which serialised every load of a block.
fn run4(which: u32, base: u32, ss: u32, n: u32, row: u32, d4: u32) -> vec4<f32> {
  let ok = row < n && 4u * d4 < p.d;
  let i = select(0u, base + row * ss + 4u * d4, ok);
  if (VEC != 0u) {
    var r: vec4<f32>;
    if (which == 0u) { r = ld4_q(i / 4u); } else if (which == 1u) { r = ld4_k(i / 4u); } else { r = ld4_v(i / 4u); }
    return select(vec4<f32>(0.0), r, ok);
  }
  var r = vec4<f32>(0.0);
  //! unroll j in 0..4
  {
    let okj = ok && 4u * d4 + $j < p.d;
    let ij = select(0u, i + $j, okj);
    var x: f32;
    if (which == 0u) { x = ld_q(ij); } else if (which == 1u) { x = ld_k(ij); } else { x = ld_v(ij); }
    r[$j] = select(0.0, x, okj);
  }
  //! end
  return r;
}

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let bh = ids.wid.y;
  let q0 = ids.wid.x * BR;
  let t = ids.lid;
  let rg = t / LN;
  let lane = t % LN;
  let kg = lane % 8u;
  // The half of the dimensions this lane's scores sum over, as an offset in Qt's and KPt's
  // outer index (0 at 64, where it folds away).
  let dh = select(0u, (lane / 8u) * 8u, LN == 16u);
  let qb = base_q(bh);
  let kb = base_k(bh);
  let vb = base_v(bh);
  // This thread's share of Q: row group g = e % RG's dimensions 4 d4 .. 4 d4 + 3 (d4 = e / RG)
  // for e = t, t + WG (128 threads cover BR rows x DMAX dimensions in two),
  // transposed into vec4s of 4 rows (neighbouring threads on neighbouring row groups:
  // distinct banks). Of each block of K: keys 4 kq .. 4 kq + 3, dimensions 4 dq .. 4 dq + 3
  // and, at 128, 4 (dq + 16) .. + 3 (transposed into vec4s over the keys); of V: dimensions
  // 4 vd .. 4 vd + 3 of keys vk + VKS i.
  let kq = t % 8u;
  let dq = t / 8u;
  let vd = t % VD;
  let vk = t / VD;
  for (var e = t; e < BR * DMAX / 16u; e = e + WG) {
    let g = e % RG;
    let d4 = e / RG;
    //! unroll i in 0..4
    let x$i = run4(0u, qb, p.q_ss, p.sq, q0 + 4u * g + $i, d4);
    //! end
    //! unroll j in 0..4
    Qt[(4u * d4 + $j) / 8u][(4u * d4 + $j) % 8u][g] = vec4<f32>(x0u[$j], x1u[$j], x2u[$j], x3u[$j]);
    //! end
  }
  let rows = vec4<u32>(q0 + 4u * rg) + vec4<u32>(0u, 1u, 2u, 3u);
  let ninf = vec4<f32>(p.ninf);
  var m = ninf;
  var l = vec4<f32>(0.0);
  //! unroll r in 0..4
  var lo$r = vec4<f32>(0.0);
  var hi$r = vec4<f32>(0.0);
  //! end
  if (p.first == 0u) {
    //! unroll r in 0..4
    if (rows[$r] < p.sq) {
      let sb = (bh * p.sq + rows[$r]) * (DMAX + 2u);
      lo$r = vec4<f32>(ld_state(sb + 4u * lane), ld_state(sb + 4u * lane + 1u), ld_state(sb + 4u * lane + 2u), ld_state(sb + 4u * lane + 3u));
      hi$r = vec4<f32>(ld_state(sb + HALF + 4u * lane), ld_state(sb + HALF + 1u + 4u * lane), ld_state(sb + HALF + 2u + 4u * lane), ld_state(sb + HALF + 3u + 4u * lane));
      m[$r] = ld_state(sb + DMAX);
      l[$r] = ld_state(sb + DMAX + 1u);
    }
    //! end
  }
  let kend = min(p.c1, key_end(q0));
  let row0 = bh * p.sq + rows.x;
  for (var k0 = p.c0; k0 < kend; k0 = k0 + BC) {
    workgroupBarrier();
    // Dimension dd = 4 dq' + j of keys 4 kq .. + 3 at KPt[dd / 8][(dd % 8) / 2][(dd % 2) 8 + kq]
    // (dq' = dq, and dq + 16 at 128).
    //! unroll u in 0..2
    if ($u < DMAX / 64u) {
      let du = dq + 16u * $u;
      //! unroll i in 0..4
      let kr$i = run4(1u, kb, p.k_ss, p.skv, k0 + 4u * kq + $i, du);
      //! end
      //! unroll j in 0..4
      KPt[du / 2u][(du % 2u) * 2u + $j / 2u][($j % 2u) * 8u + kq] = vec4<f32>(kr0u[$j], kr1u[$j], kr2u[$j], kr3u[$j]);
      //! end
    }
    //! end
    // V's loads fly while the scores multiply.
    //! unroll i in 0..8
    var vr$i = vec4<f32>(0.0);
    if ($i < NV) { vr$i = run4(2u, vb, p.v_ss, p.skv, k0 + vk + VKS * $i, vd); }
    //! end
    workgroupBarrier();
    //! unroll c in 0..4
    var s$c = vec4<f32>(0.0);
    //! end
    // Dimensions 8 j + 2 i and 8 j + 2 i + 1 of the lane's half.
    for (var jj = 0u; jj < 8u; jj = jj + 1u) {
      let j = dh + jj;
      //! unroll i in 0..4
      {
        let a = Qt[j][2u * $i][rg];
        let b = KPt[j][$i][kg];
        s0u = fma(a, vec4<f32>(b.x), s0u);
        s1u = fma(a, vec4<f32>(b.y), s1u);
        s2u = fma(a, vec4<f32>(b.z), s2u);
        s3u = fma(a, vec4<f32>(b.w), s3u);
        let a2 = Qt[j][2u * $i + 1u][rg];
        let b2 = KPt[j][$i][8u + kg];
        s0u = fma(a2, vec4<f32>(b2.x), s0u);
        s1u = fma(a2, vec4<f32>(b2.y), s1u);
        s2u = fma(a2, vec4<f32>(b2.z), s2u);
        s3u = fma(a2, vec4<f32>(b2.w), s3u);
      }
      //! end
    }
    if (LN == 16u) {
      //! unroll c in 0..4
      s$c = s$c + subgroupShuffleXor(s$c, 8u);
      //! end
    }
    // Scaled once summed, as `fwd` does: Q scaled first rounds every element where the scale
    // is not a power of 2 (1 / sqrt(128)), and the gradients of scores near 50 then missed
    // the f64 reference by 2e-5 (attention_with_growing_scores).
    //! unroll c in 0..4
    s$c = s$c * p.scale;
    //! end
    // Keys past the end, or causally masked (as `masked`), score -inf: tested only in blocks
    // that reach past the keys or past the causal diagonal of the workgroup's first row.
    if (k0 + BC > p.skv || (p.causal != 0u && k0 + BC + p.sq > q0 + p.skv + 1u)) {
      let seen = rows + vec4<u32>(p.skv);
      //! unroll c in 0..4
      {
        let key = k0 + 4u * kg + $c;
        s$c = select(ninf, s$c, vec4<bool>(key < p.skv) & !(vec4<bool>(p.causal != 0u) & (vec4<u32>(key + p.sq) > seen)));
      }
      //! end
    }
    let mb = max(m, group_max(max(max(s0u, s1u), max(s2u, s3u))));
    // Exponents from the new maximum, or from 0 in rows that have seen only masked keys.
    let base = select(mb, vec4<f32>(0.0), mb == ninf);
    let corr = exp(m - base);
    //! unroll c in 0..4
    var p$c = exp(s$c - base);
    //! end
    l = l * corr + group_sum(p0u + p1u + p2u + p3u);
    m = mb;
    // Dropout scales the weights in the output only: the softmax sum stays whole.
    if (p.drop_thr != 0u) {
      //! unroll c in 0..4
      {
        let key = k0 + 4u * kg + $c;
        p$c = p$c * vec4<f32>(attn_keep(row0, key), attn_keep(row0 + 1u, key), attn_keep(row0 + 2u, key), attn_keep(row0 + 3u, key));
      }
      //! end
    }
    // The weights of key c = 4 kg + c for rows 4 rg .. + 3 go to Pt[kg][c][(rg + kg) % 16]
    // (without SEP to KPt, once every thread is past its reads of K; at 128 from the lanes of
    // the first half, which hold the same weights as the second); V's dimensions 4 vd .. + 3
    // of key c to Vt[c / 4][c % 4][vd]. Both were last read before the loop's first barrier.
    if (SEP == 0u) {
      workgroupBarrier();
      if (lane < 8u) {
        //! unroll c in 0..4
        KPt[kg][$c][(rg + kg) % 16u] = p$c;
        //! end
      }
    }
    //! unroll sep in 0..SEP
    //! unroll c in 0..4
    Pt[kg][$c][(rg + kg) % 16u] = p$c;
    //! end
    //! end
    //! unroll i in 0..8
    if ($i < NV) {
      let key = vk + VKS * $i;
      Vt[key / 4u][key % 4u][vd] = vr$i;
    }
    //! end
    workgroupBarrier();
    //! unroll r in 0..4
    lo$r = lo$r * corr[$r];
    hi$r = hi$r * corr[$r];
    //! end
    // Keys 4 j .. 4 j + 3.
    for (var j = 0u; j < BC / 4u; j = j + 1u) {
      let pr = (rg + j) % 16u;
      //! unroll i in 0..4
      {
        var w: vec4<f32>;
        if (SEP == 0u) { w = KPt[j][$i][pr]; }
        //! unroll sep in 0..SEP
        else { w = Pt[j][$i][pr]; }
        //! end
        let v0 = Vt[j][$i][lane];
        let v1 = Vt[j][$i][HALF / 4u + lane];
        lo0u = fma(vec4<f32>(w.x), v0, lo0u);
        hi0u = fma(vec4<f32>(w.x), v1, hi0u);
        lo1u = fma(vec4<f32>(w.y), v0, lo1u);
        hi1u = fma(vec4<f32>(w.y), v1, hi1u);
        lo2u = fma(vec4<f32>(w.z), v0, lo2u);
        hi2u = fma(vec4<f32>(w.z), v1, hi2u);
        lo3u = fma(vec4<f32>(w.w), v0, lo3u);
        hi3u = fma(vec4<f32>(w.w), v1, hi3u);
      }
      //! end
    }
  }
  let ob = base_o(bh);
  //! unroll r in 0..4
  if (rows[$r] < p.sq) {
    let qi = rows[$r];
    if (p.last != 0u) {
      let inv = 1.0 / l[$r];
      for (var j = 0u; j < 4u; j = j + 1u) {
        if (4u * lane + j < p.d) { st_o(ob + qi * p.o_ss + 4u * lane + j, lo$r[j] * inv); }
        if (HALF + 4u * lane + j < p.d) { st_o(ob + qi * p.o_ss + HALF + 4u * lane + j, hi$r[j] * inv); }
      }
      if (lane == 0u) { st_lse(bh * p.sq + qi, m[$r] + log(l[$r])); }
    } else {
      let sb = (bh * p.sq + qi) * (DMAX + 2u);
      for (var j = 0u; j < 4u; j = j + 1u) {
        st_state(sb + 4u * lane + j, lo$r[j]);
        st_state(sb + HALF + 4u * lane + j, hi$r[j]);
      }
      if (lane == 0u) {
        st_state(sb + DMAX, m[$r]);
        st_state(sb + DMAX + 1u, l[$r]);
      }
    }
  }
  //! end
}

//! entry bwd_delta(o: data, dout: data, delta: f32 mut)
//! check WG=256 BR=16 BC=32 DMAX=64
var<workgroup> Dsum: array<f32, WG>;
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  // DL lanes a row, reading neighbouring columns (one lane a row read addresses a row apart,
  // and ran at a sixth of the memory bandwidth); the lanes' sums combine in workgroup memory.
  // Rows past the end still take part in the barriers, and store nothing.
  let lane = ids.lid % DL;
  let i = flat_id(ids) / DL;
  let ok = i < p.bh * p.sq;
  var s = 0.0;
  if (ok) {
    let br = udivmod(i, p.sq);
    let ob = base_o(br.x) + br.y * p.o_ss;
    let gb = base_g(br.x) + br.y * p.g_ss;
    for (var dd = lane; dd < p.d; dd = dd + DL) { s = fma(ld_dout(gb + dd), ld_o(ob + dd), s); }
  }
  Dsum[ids.lid] = s;
  workgroupBarrier();
  for (var h = DL / 2u; h > 0u; h = h / 2u) {
    if (lane < h) { Dsum[ids.lid] = Dsum[ids.lid] + Dsum[ids.lid + h]; }
    workgroupBarrier();
  }
  if (ok && lane == 0u) { st_delta(i, Dsum[ids.lid]); }
}

//! entry bwd_kv(q: data, k: data, v: data, dout: data, lse: f32, delta: f32, dk: data mut, dv: data mut, state: f32 mut)
//! check WG=128 BR=16 BC=32 DMAX=32
//! check WG=128 BR=16 BC=32 DMAX=64
//! check WG=128 BR=8 BC=16 DMAX=128
//! check WG=128 BR=4 BC=8 DMAX=256
var<workgroup> Kt: array<f32, BC * RS>;
var<workgroup> Vt: array<f32, BC * RS>;
var<workgroup> Qt: array<f32, BR * RS>;
var<workgroup> Ot: array<f32, BR * RS>;
var<workgroup> Pt: array<f32, BR * BC>;
var<workgroup> St: array<f32, BR * BC>;
var<workgroup> Lt: array<f32, BR>;
var<workgroup> Dt: array<f32, BR>;

const TPC: u32 = WG / BC;
const KPT: u32 = DMAX / TPC;

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let bh = ids.wid.y;
  let k0 = ids.wid.x * BC;
  let t = ids.lid;
  let c = t / TPC;
  let l = t % TPC;
  let key_ok = k0 + c < p.skv;
  let qb = base_q(bh);
  let gb = base_g(bh);
  let kb = base_k(bh);
  let vb = base_v(bh);
  let dkb = head_base(bh, p.dk_off, p.dk_sb, p.dk_sh);
  let dvb = head_base(bh, p.dv_off, p.dv_sb, p.dv_sh);
  let sb = (bh * p.skv + k0 + c) * (2u * DMAX);
  for (var e = t; e < BC * DMAX; e = e + WG) {
    let cc = e / DMAX;
    let dd = e % DMAX;
    var kv = 0.0;
    var vv = 0.0;
    if (k0 + cc < p.skv && dd < p.d) {
      kv = ld_k(kb + (k0 + cc) * p.k_ss + dd);
      vv = ld_v(vb + (k0 + cc) * p.v_ss + dd);
    }
    Kt[cc * RS + dd] = kv;
    Vt[cc * RS + dd] = vv;
  }
  var dk: array<f32, KPT>;
  var dv: array<f32, KPT>;
  for (var j = 0u; j < KPT; j = j + 1u) { dk[j] = 0.0; dv[j] = 0.0; }
  if (p.first == 0u && key_ok) {
    for (var j = 0u; j < KPT; j = j + 1u) {
      dk[j] = ld_state(sb + l + j * TPC);
      dv[j] = ld_state(sb + DMAX + l + j * TPC);
    }
  }
  // The first query that can see key k0 is k0 - (SKV - SQ).
  var qstart = p.c0;
  if (p.causal != 0u && k0 + p.sq > p.skv) { qstart = max(qstart, ((k0 + p.sq - p.skv) / BR) * BR); }
  let qend = min(p.c1, p.sq);
  for (var q0 = qstart; q0 < qend; q0 = q0 + BR) {
    workgroupBarrier();
    for (var e = t; e < BR * DMAX; e = e + WG) {
      let rr = e / DMAX;
      let dd = e % DMAX;
      var qv = 0.0;
      var ov = 0.0;
      if (q0 + rr < p.sq && dd < p.d) {
        qv = ld_q(qb + (q0 + rr) * p.q_ss + dd);
        ov = ld_dout(gb + (q0 + rr) * p.g_ss + dd);
      }
      Qt[rr * RS + dd] = qv;
      Ot[rr * RS + dd] = ov;
    }
    for (var rr = t; rr < BR; rr = rr + WG) {
      var lv = 0.0;
      var dv0 = 0.0;
      if (q0 + rr < p.sq) {
        lv = ld_lse(bh * p.sq + q0 + rr);
        dv0 = ld_delta(bh * p.sq + q0 + rr);
      }
      Lt[rr] = lv;
      Dt[rr] = dv0;
    }
    workgroupBarrier();
    for (var e = t; e < BR * BC; e = e + WG) {
      let rr = e / BC;
      let cc = e % BC;
      let qi = q0 + rr;
      var pv = 0.0;
      var ds = 0.0;
      if (qi < p.sq && !masked(qi, k0 + cc)) {
        // The score in two runs at 128, as the forward sums it (`SH`).
        var s = 0.0;
        var s2 = 0.0;
        var dp = 0.0;
        for (var dd = 0u; dd < DMAX; dd = dd + 1u) {
          if (dd < SH) {
            s = fma(Qt[rr * RS + dd], Kt[cc * RS + dd], s);
          } else {
            s2 = fma(Qt[rr * RS + dd], Kt[cc * RS + dd], s2);
          }
          dp = fma(Ot[rr * RS + dd], Vt[cc * RS + dd], dp);
        }
        s = s + s2;
        // With dropout (mask factor z): dS = P (z dP' - delta), dV takes z P.
        let keep = attn_keep(bh * p.sq + qi, k0 + cc);
        pv = exp(s * p.scale - Lt[rr]);
        ds = pv * (dp * keep - Dt[rr]);
        pv = pv * keep;
      }
      Pt[e] = pv;
      St[e] = ds;
    }
    workgroupBarrier();
    for (var rr = 0u; rr < BR; rr = rr + 1u) {
      let pv = Pt[rr * BC + c];
      let ds = St[rr * BC + c];
      for (var j = 0u; j < KPT; j = j + 1u) {
        let dd = l + j * TPC;
        dv[j] = fma(pv, Ot[rr * RS + dd], dv[j]);
        dk[j] = fma(ds, Qt[rr * RS + dd], dk[j]);
      }
    }
  }
  if (key_ok) {
    if (p.last != 0u) {
      for (var j = 0u; j < KPT; j = j + 1u) {
        let dd = l + j * TPC;
        if (dd < p.d) {
          st_dk(dkb + (k0 + c) * p.dk_ss + dd, dk[j] * p.scale);
          st_dv(dvb + (k0 + c) * p.dv_ss + dd, dv[j]);
        }
      }
    } else {
      for (var j = 0u; j < KPT; j = j + 1u) {
        st_state(sb + l + j * TPC, dk[j]);
        st_state(sb + DMAX + l + j * TPC, dv[j]);
      }
    }
  }
}

//! entry bwd_q(q: data, k: data, v: data, dout: data, lse: f32, delta: f32, dq: data mut, state: f32 mut)
//! check WG=128 BR=16 BC=32 DMAX=32
//! check WG=128 BR=16 BC=32 DMAX=64
//! check WG=128 BR=8 BC=16 DMAX=128
//! check WG=128 BR=4 BC=8 DMAX=256
var<workgroup> Kt: array<f32, BC * RS>;
var<workgroup> Vt: array<f32, BC * RS>;
var<workgroup> Qt: array<f32, BR * RS>;
var<workgroup> Ot: array<f32, BR * RS>;
var<workgroup> St: array<f32, BR * BC>;
var<workgroup> Lt: array<f32, BR>;
var<workgroup> Dt: array<f32, BR>;

const TPR: u32 = WG / BR;
const OPT: u32 = DMAX / TPR;

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let bh = ids.wid.y;
  let q0 = ids.wid.x * BR;
  let t = ids.lid;
  let r = t / TPR;
  let l = t % TPR;
  let qi = q0 + r;
  let row_ok = qi < p.sq;
  let qb = base_q(bh);
  let gb = base_g(bh);
  let kb = base_k(bh);
  let vb = base_v(bh);
  let dqb = head_base(bh, p.dq_off, p.dq_sb, p.dq_sh);
  let sb = (bh * p.sq + qi) * DMAX;
  for (var e = t; e < BR * DMAX; e = e + WG) {
    let rr = e / DMAX;
    let dd = e % DMAX;
    var qv = 0.0;
    var ov = 0.0;
    if (q0 + rr < p.sq && dd < p.d) {
      qv = ld_q(qb + (q0 + rr) * p.q_ss + dd);
      ov = ld_dout(gb + (q0 + rr) * p.g_ss + dd);
    }
    Qt[rr * RS + dd] = qv;
    Ot[rr * RS + dd] = ov;
  }
  for (var rr = t; rr < BR; rr = rr + WG) {
    var lv = 0.0;
    var dv0 = 0.0;
    if (q0 + rr < p.sq) {
      lv = ld_lse(bh * p.sq + q0 + rr);
      dv0 = ld_delta(bh * p.sq + q0 + rr);
    }
    Lt[rr] = lv;
    Dt[rr] = dv0;
  }
  var dq: array<f32, OPT>;
  for (var j = 0u; j < OPT; j = j + 1u) { dq[j] = 0.0; }
  if (p.first == 0u && row_ok) {
    for (var j = 0u; j < OPT; j = j + 1u) { dq[j] = ld_state(sb + l + j * TPR); }
  }
  let kend = min(p.c1, key_end(q0));
  for (var k0 = p.c0; k0 < kend; k0 = k0 + BC) {
    workgroupBarrier();
    for (var e = t; e < BC * DMAX; e = e + WG) {
      let cc = e / DMAX;
      let dd = e % DMAX;
      var kv = 0.0;
      var vv = 0.0;
      if (k0 + cc < p.skv && dd < p.d) {
        kv = ld_k(kb + (k0 + cc) * p.k_ss + dd);
        vv = ld_v(vb + (k0 + cc) * p.v_ss + dd);
      }
      Kt[cc * RS + dd] = kv;
      Vt[cc * RS + dd] = vv;
    }
    workgroupBarrier();
    for (var e = t; e < BR * BC; e = e + WG) {
      let rr = e / BC;
      let cc = e % BC;
      let qr = q0 + rr;
      var ds = 0.0;
      if (qr < p.sq && !masked(qr, k0 + cc)) {
        // The score in two runs at 128, as the forward sums it (`SH`).
        var s = 0.0;
        var s2 = 0.0;
        var dp = 0.0;
        for (var dd = 0u; dd < DMAX; dd = dd + 1u) {
          if (dd < SH) {
            s = fma(Qt[rr * RS + dd], Kt[cc * RS + dd], s);
          } else {
            s2 = fma(Qt[rr * RS + dd], Kt[cc * RS + dd], s2);
          }
          dp = fma(Ot[rr * RS + dd], Vt[cc * RS + dd], dp);
        }
        s = s + s2;
        ds = exp(s * p.scale - Lt[rr]) * (dp * attn_keep(bh * p.sq + qr, k0 + cc) - Dt[rr]);
      }
      St[e] = ds;
    }
    workgroupBarrier();
    for (var cc = 0u; cc < BC; cc = cc + 1u) {
      let ds = St[r * BC + cc];
      for (var j = 0u; j < OPT; j = j + 1u) {
        dq[j] = fma(ds, Kt[cc * RS + l + j * TPR], dq[j]);
      }
    }
  }
  if (row_ok) {
    if (p.last != 0u) {
      for (var j = 0u; j < OPT; j = j + 1u) {
        let dd = l + j * TPR;
        if (dd < p.d) { st_dq(dqb + qi * p.dq_ss + dd, dq[j] * p.scale); }
      }
    } else {
      for (var j = 0u; j < OPT; j = j + 1u) { st_state(sb + l + j * TPR, dq[j]); }
    }
  }
}

//! entry bwd_kv_tile(q: data, k: data, v: data, dout: data, lse: f32, delta: f32, dk: data mut, dv: data mut, state: f32 mut)
//! check WG=128 BR=32 BC=16 DMAX=64 QPT=4 NQ=2 DH=1
//! check WG=256 BR=32 BC=32 DMAX=64 QPT=2 NQ=2 DH=1
//! check WG=128 BR=16 BC=16 DMAX=128 QPT=4 NQ=1 DH=2
//! check WG=64 BR=16 BC=8 DMAX=128 QPT=8 NQ=1 DH=2
// bwd_kv in register tiles, for head dimensions up to 64 (DMAX = 64) or 128 (DMAX = 128), zero
// past d: the same products, chunks and state. A workgroup takes BC keys (16 with WG = 128
// threads, 32 with 256 where workgroup memory allows; at 128, 16 or 8), whose K and V sit in
// workgroup memory transposed (a vec4 of 4 keys per dimension), and walks the queries in
// blocks of BR (32; 16 at 128), staging each block's Q and dO row-major in rotated vec4s (as
// bwd_q_tile's K and V; QPT queries a thread). The two halves of the workgroup split the work:
// a thread of the first half computes S and then accumulates dK, one of the second dP' and
// dV, each for keys 4 kg .. 4 kg + 3 (KG = BC / 4 key groups) and queries NQ x .. NQ x +
// NQ - 1 (S, dP': vec4s over the keys; per 4 dimensions 4 + NQ vec4s read for 16 NQ
// multiply-adds) or columns 4 x .. 4 x + 3, and at 128 also 64 + 4 x .. 64 + 4 x + 3 (dK, dV:
// 1 + DH vec4s read per 16 DH multiply-adds), x < 16. With two queries a thread (64) the key
// groups are the threads' fastest index, with one (128) x is: each ran faster than the other
// order at its head dimension (docs/performance.md, attention). P goes from the first half to the
// second through workgroup memory, which forms dS and the dropped weights z P. (32 keys and 16
// queries a block with S and dP in the same thread would read a vec4 or a scalar every 2-3
// multiply-adds.) Scores at 128 sum dimensions 0..63 and 64..127 apart, as the forward (`SH`).
// Workgroup memory: 28.25 KiB with BC = 16, 40.25 KiB with 32; at 128, 34.25 KiB with 16,
// 25.25 KiB with 8.
const KG: u32 = BC / 4u;
const D4: u32 = DMAX / 4u;
var<workgroup> KVT: array<vec4<f32>, 2u * DMAX * KG>;
var<workgroup> QGr: array<vec4<f32>, 2u * BR * D4>;
var<workgroup> PD: array<vec4<f32>, 2u * BR * KG>;
var<workgroup> LDk: array<vec2<f32>, BR>;

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let bh = ids.wid.y;
  let k0 = ids.wid.x * BC;
  let t = ids.lid;
  let role = t / (WG / 2u);
  let kg = select((t % (WG / 2u)) / 16u, t % KG, NQ == 2u);
  let x = select(t % 16u, (t % (WG / 2u)) / KG, NQ == 2u);
  let qb = base_q(bh);
  let gb = base_g(bh);
  let kb = base_k(bh);
  let vb = base_v(bh);
  // K^T and V^T as whole vec4s, neighbouring threads on neighbouring key groups.
  for (var e = t; e < BC * DMAX / 4u; e = e + WG) {
    let g = e % KG;
    let dd = e / KG;
    let kv = tile_column4(true, kb, vb, k0 + 4u * g, dd);
    KVT[dd * KG + g] = kv[0];
    KVT[DMAX * KG + dd * KG + g] = kv[1];
  }
  let keys = vec4<u32>(k0 + 4u * kg) + vec4<u32>(0u, 1u, 2u, 3u);
  // dK (role 0) or dV (role 1) of keys 4 kg + c, columns 64 h + 4 x .. 64 h + 4 x + 3.
  //! unroll c in 0..4
  //! unroll h in 0..DH
  var acc$c$h = vec4<f32>(0.0);
  if (p.first == 0u && keys[$c] < p.skv) {
    let sb = (bh * p.skv + keys[$c]) * (2u * DMAX) + role * DMAX + 64u * $h + 4u * x;
    acc$c$h = vec4<f32>(ld_state(sb), ld_state(sb + 1u), ld_state(sb + 2u), ld_state(sb + 3u));
  }
  //! end
  //! end
  // The first query that can see key k0 is k0 - (SKV - SQ).
  var qstart = p.c0;
  if (p.causal != 0u && k0 + p.sq > p.skv) { qstart = max(qstart, ((k0 + p.sq - p.skv) / BR) * BR); }
  let qend = min(p.c1, p.sq);
  // This thread's share of each query block: queries QPT qg .. QPT qg + QPT - 1, dimensions
  // 4 dg .. 4 dg + 3 of Q and dO, loaded into registers a block ahead.
  let qg = t / D4;
  let dg = t % D4;
  //! unroll i in 0..QPT
  //! unroll j in 0..4
  var qo$i$j = tile_qo(qb, gb, qstart + QPT * qg + $i, 4u * dg + $j);
  //! end
  //! end
  let kvo = role * DMAX * KG;
  let qgo = role * BR * D4;
  for (var q0 = qstart; q0 < qend; q0 = q0 + BR) {
    workgroupBarrier();
    //! unroll i in 0..QPT
    QGr[row_at(QPT * qg + $i, dg, NQ)] = vec4<f32>(qo$i0u.x, qo$i1u.x, qo$i2u.x, qo$i3u.x);
    QGr[BR * D4 + row_at(QPT * qg + $i, dg, NQ)] = vec4<f32>(qo$i0u.y, qo$i1u.y, qo$i2u.y, qo$i3u.y);
    //! end
    if (t < BR) {
      var ld = vec2<f32>(0.0);
      if (q0 + t < p.sq) { ld = vec2<f32>(ld_lse(bh * p.sq + q0 + t), ld_delta(bh * p.sq + q0 + t)); }
      LDk[t] = ld;
    }
    workgroupBarrier();
    if (q0 + BR < qend) {
      //! unroll i in 0..QPT
      //! unroll j in 0..4
      qo$i$j = tile_qo(qb, gb, q0 + BR + QPT * qg + $i, 4u * dg + $j);
      //! end
      //! end
    }
    // S (role 0: K, Q) or dP' (role 1: V, dO) for queries NQ x + c, vec4s over the keys; at
    // 128 each half of the dimensions into its own sum first.
    //! unroll c in 0..NQ
    var a$c = vec4<f32>(0.0);
    //! end
    //! unroll h in 0..DH
    {
      //! unroll c in 0..NQ
      var b$c = vec4<f32>(0.0);
      //! end
      for (var d4 = 16u * $h; d4 < 16u * $h + 16u; d4 = d4 + 1u) {
        //! unroll j in 0..4
        let kt$j = KVT[kvo + (4u * d4 + $j) * KG + kg];
        //! end
        //! unroll c in 0..NQ
        let r$c = QGr[qgo + row_at(NQ * x + $c, d4, NQ)];
        b$c = fma(kt0u, vec4<f32>(r$c.x), b$c);
        b$c = fma(kt1u, vec4<f32>(r$c.y), b$c);
        b$c = fma(kt2u, vec4<f32>(r$c.z), b$c);
        b$c = fma(kt3u, vec4<f32>(r$c.w), b$c);
        //! end
      }
      //! unroll c in 0..NQ
      if ($h == 0u) { a$c = b$c; } else { a$c = a$c + b$c; }
      //! end
    }
    //! end
    // Role 0: P for its queries (0 where masked, as `masked`, or past the queries).
    //! unroll c in 0..NQ
    let qi$c = q0 + NQ * x + $c;
    let ok$c = vec4<bool>(qi$c < p.sq) & (keys < vec4<u32>(p.skv)) & !(vec4<bool>(p.causal != 0u) & (keys + vec4<u32>(p.sq) > vec4<u32>(qi$c + p.skv)));
    if (role == 0u) {
      PD[(NQ * x + $c) * KG + kg] = select(vec4<f32>(0.0), exp(a$c * p.scale - LDk[NQ * x + $c].x), ok$c);
    }
    //! end
    workgroupBarrier();
    // Role 1: dS = P (dP' z - delta) beside P, then z P in P's place (dV's weights).
    if (role == 1u) {
      //! unroll c in 0..NQ
      let row$c = bh * p.sq + qi$c;
      let z$c = vec4<f32>(attn_keep(row$c, keys.x), attn_keep(row$c, keys.y), attn_keep(row$c, keys.z), attn_keep(row$c, keys.w));
      let pr$c = PD[(NQ * x + $c) * KG + kg];
      PD[BR * KG + (NQ * x + $c) * KG + kg] = pr$c * (a$c * z$c - LDk[NQ * x + $c].y);
      PD[(NQ * x + $c) * KG + kg] = pr$c * z$c;
      //! end
    }
    workgroupBarrier();
    // dK += dS^T Q (role 0), dV += (z P)^T dO (role 1).
    let pdo = (1u - role) * BR * KG;
    for (var i = 0u; i < BR; i = i + 1u) {
      let w = PD[pdo + i * KG + kg];
      //! unroll h in 0..DH
      let r$h = QGr[qgo + row_at(i, 16u * $h + x, NQ)];
      acc0u$h = fma(vec4<f32>(w.x), r$h, acc0u$h);
      acc1u$h = fma(vec4<f32>(w.y), r$h, acc1u$h);
      acc2u$h = fma(vec4<f32>(w.z), r$h, acc2u$h);
      acc3u$h = fma(vec4<f32>(w.w), r$h, acc3u$h);
      //! end
    }
  }
  // dK is scaled at the end (S was unscaled).
  let sc = select(1.0, p.scale, role == 0u);
  let ob = select(head_base(bh, p.dv_off, p.dv_sb, p.dv_sh), head_base(bh, p.dk_off, p.dk_sb, p.dk_sh), role == 0u);
  let oss = select(p.dv_ss, p.dk_ss, role == 0u);
  //! unroll c in 0..4
  if (keys[$c] < p.skv) {
    //! unroll h in 0..DH
    if (p.last != 0u) {
      for (var j = 0u; j < 4u; j = j + 1u) {
        let col = 64u * $h + 4u * x + j;
        if (col < p.d) {
          if (role == 0u) { st_dk(ob + keys[$c] * oss + col, acc$c$h[j] * sc); } else { st_dv(ob + keys[$c] * oss + col, acc$c$h[j]); }
        }
      }
    } else {
      let sb = (bh * p.skv + keys[$c]) * (2u * DMAX) + role * DMAX + 64u * $h + 4u * x;
      for (var j = 0u; j < 4u; j = j + 1u) { st_state(sb + j, acc$c$h[j]); }
    }
    //! end
  }
  //! end
}

//! entry bwd_q_tile(q: data, k: data, v: data, dout: data, lse: f32, delta: f32, dq: data mut, state: f32 mut)
//! check WG=128 BR=32 BC=32 DMAX=64 KPT=4
//! check WG=256 BR=64 BC=32 DMAX=64 KPT=2
// bwd_q in register tiles, for head dimensions up to 64 (DMAX = 64, zero past d): the same
// products, chunks and state. A workgroup of WG = 4 BR threads takes BR query rows (32, or
// 64 where 48 KiB of workgroup memory allow: half the barriers and K/V staging per row) and
// walks the keys in blocks of 32 (KPT keys of each staged by a thread). Q and dO sit in workgroup memory transposed (a vec4 of 4 rows per dimension and row
// group), each block of K and V row-major in vec4s along the dimension (`row_at` rotates each
// key's vec4s so that neighbouring keys' reads fall on different banks). Thread t (row group
// rg = t / 16, lane = t % 16) takes S and dP for rows 4 rg .. 4 rg + 3 and keys 2 lane,
// 2 lane + 1 (vec4s over the rows: per 4 dimensions, twelve vec4s read for 64 multiply-adds),
// turns them into dS, which replaces V in workgroup memory (a vec4 of 4 rows per key and row
// group), then adds dS K to dQ's rows 4 rg .. 4 rg + 3, columns 4 lane .. 4 lane + 3 (two
// vec4s read per 16 multiply-adds). (16 rows with one query and 4 keys a thread would read a
// vec4 or a scalar every 2-4 multiply-adds.) Workgroup memory: 32 KiB with
// BR = 32, 48 KiB with 64.
const RG: u32 = BR / 4u;
var<workgroup> QTq: array<vec4<f32>, DMAX * RG>;
var<workgroup> GTq: array<vec4<f32>, DMAX * RG>;
var<workgroup> Kq: array<vec4<f32>, 512>;
var<workgroup> VSq: array<vec4<f32>, 512>;

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let bh = ids.wid.y;
  let q0 = ids.wid.x * BR;
  let t = ids.lid;
  let rg = t / 16u;
  let lane = t % 16u;
  let qb = base_q(bh);
  let gb = base_g(bh);
  let kb = base_k(bh);
  let vb = base_v(bh);
  // Q^T and dO^T as whole vec4s, neighbouring threads on neighbouring row groups.
  for (var e = t; e < BR * DMAX / 4u; e = e + WG) {
    let g = e % RG;
    let dd = e / RG;
    let qo = tile_column4(false, qb, gb, q0 + 4u * g, dd);
    QTq[dd * RG + g] = qo[0];
    GTq[dd * RG + g] = qo[1];
  }
  let rows = vec4<u32>(q0 + 4u * rg) + vec4<u32>(0u, 1u, 2u, 3u);
  let live = rows < vec4<u32>(p.sq);
  var lse4 = vec4<f32>(0.0);
  var del4 = vec4<f32>(0.0);
  //! unroll r in 0..4
  var dq$r = vec4<f32>(0.0);
  if (live[$r]) {
    lse4[$r] = ld_lse(bh * p.sq + rows[$r]);
    del4[$r] = ld_delta(bh * p.sq + rows[$r]);
    if (p.first == 0u) {
      let sb = (bh * p.sq + rows[$r]) * DMAX + 4u * lane;
      dq$r = vec4<f32>(ld_state(sb), ld_state(sb + 1u), ld_state(sb + 2u), ld_state(sb + 3u));
    }
  }
  //! end
  let kend = min(p.c1, key_end(q0));
  // This thread's share of each K and V block: keys KPT kg .. KPT kg + KPT - 1, dimensions
  // 4 dg .. 4 dg + 3, loaded into registers a block ahead.
  let kg = t / 16u;
  let dg = t % 16u;
  //! unroll i in 0..KPT
  //! unroll j in 0..4
  var kv$i$j = tile_kv(kb, vb, p.c0 + KPT * kg + $i, 4u * dg + $j);
  //! end
  //! end
  let row0 = bh * p.sq + rows.x;
  for (var k0 = p.c0; k0 < kend; k0 = k0 + BC) {
    workgroupBarrier();
    //! unroll i in 0..KPT
    Kq[row_at(KPT * kg + $i, dg, 2u)] = vec4<f32>(kv$i0u.x, kv$i1u.x, kv$i2u.x, kv$i3u.x);
    VSq[row_at(KPT * kg + $i, dg, 2u)] = vec4<f32>(kv$i0u.y, kv$i1u.y, kv$i2u.y, kv$i3u.y);
    //! end
    workgroupBarrier();
    if (k0 + BC < kend) {
      //! unroll i in 0..KPT
      //! unroll j in 0..4
      kv$i$j = tile_kv(kb, vb, k0 + BC + KPT * kg + $i, 4u * dg + $j);
      //! end
      //! end
    }
    // S and dP' for keys 2 lane + c, as vec4s over the rows.
    //! unroll c in 0..2
    var s$c = vec4<f32>(0.0);
    var dp$c = vec4<f32>(0.0);
    //! end
    for (var d4 = 0u; d4 < 16u; d4 = d4 + 1u) {
      //! unroll j in 0..4
      let qa$j = QTq[(4u * d4 + $j) * RG + rg];
      let ga$j = GTq[(4u * d4 + $j) * RG + rg];
      //! end
      //! unroll c in 0..2
      let kk$c = Kq[row_at(2u * lane + $c, d4, 2u)];
      let vv$c = VSq[row_at(2u * lane + $c, d4, 2u)];
      s$c = fma(qa0u, vec4<f32>(kk$c.x), s$c);
      s$c = fma(qa1u, vec4<f32>(kk$c.y), s$c);
      s$c = fma(qa2u, vec4<f32>(kk$c.z), s$c);
      s$c = fma(qa3u, vec4<f32>(kk$c.w), s$c);
      dp$c = fma(ga0u, vec4<f32>(vv$c.x), dp$c);
      dp$c = fma(ga1u, vec4<f32>(vv$c.y), dp$c);
      dp$c = fma(ga2u, vec4<f32>(vv$c.z), dp$c);
      dp$c = fma(ga3u, vec4<f32>(vv$c.w), dp$c);
      //! end
    }
    // dS = P (dP' keep - delta), 0 where masked (as `masked`) or past the rows.
    //! unroll c in 0..2
    let key$c = k0 + 2u * lane + $c;
    let ok$c = live & vec4<bool>(key$c < p.skv) & !(vec4<bool>(p.causal != 0u) & (vec4<u32>(key$c + p.sq) > rows + vec4<u32>(p.skv)));
    let keep$c = vec4<f32>(attn_keep(row0, key$c), attn_keep(row0 + 1u, key$c), attn_keep(row0 + 2u, key$c), attn_keep(row0 + 3u, key$c));
    let ds$c = select(vec4<f32>(0.0), exp(s$c * p.scale - lse4) * (dp$c * keep$c - del4), ok$c);
    //! end
    // Every thread is past its reads of V: dS replaces it.
    workgroupBarrier();
    //! unroll c in 0..2
    VSq[(2u * lane + $c) * RG + rg] = ds$c;
    //! end
    workgroupBarrier();
    for (var c = 0u; c < BC; c = c + 1u) {
      let ds = VSq[c * RG + rg];
      let kk = Kq[row_at(c, lane, 2u)];
      dq0u = fma(vec4<f32>(ds.x), kk, dq0u);
      dq1u = fma(vec4<f32>(ds.y), kk, dq1u);
      dq2u = fma(vec4<f32>(ds.z), kk, dq2u);
      dq3u = fma(vec4<f32>(ds.w), kk, dq3u);
    }
  }
  //! unroll r in 0..4
  if (live[$r]) {
    if (p.last != 0u) {
      let dqo = head_base(bh, p.dq_off, p.dq_sb, p.dq_sh) + rows[$r] * p.dq_ss;
      for (var j = 0u; j < 4u; j = j + 1u) {
        if (4u * lane + j < p.d) { st_dq(dqo + 4u * lane + j, dq$r[j] * p.scale); }
      }
    } else {
      let sb = (bh * p.sq + rows[$r]) * DMAX + 4u * lane;
      for (var j = 0u; j < 4u; j = j + 1u) { st_state(sb + j, dq$r[j]); }
    }
  }
  //! end
}

//! entry bwd_q_split(q: data, k: data, v: data, dout: data, lse: f32, delta: f32, dq: data mut, state: f32 mut)
//! check WG=128 BR=32 BC=16 DMAX=128 KPT=4 NK=2 DH=2
//! check WG=64 BR=16 BC=16 DMAX=128 KPT=8 NK=2 DH=2
// bwd_q for head dimensions 65 to 128 (DMAX = 128, zero past d), in register tiles with the
// scores split between two halves of the workgroup: the same products, chunks and state as
// bwd_q. A workgroup of WG = 4 BR threads takes BR query rows (32 where 48 KiB of workgroup
// memory allow, else 16) and walks the keys in blocks of BC = 16 (KPT keys of each staged by a
// thread). Q and dO sit in workgroup memory transposed (QG: a vec4 of 4 rows per dimension
// and row group), each block of K and V row-major in vec4s along the dimension (KV; `row_at`).
// Thread u = t % (WG / 2) of the first half computes S, of the second dP', for rows 4 sg ..
// 4 sg + 3 (sg = u / 8) and keys NK kp .. NK kp + NK - 1 (kp = u % 8): vec4s over the rows,
// per 4 dimensions 4 + NK vec4s read for 16 NK multiply-adds. The first half stores P in V's
// place once every thread is past its reads of V; the second turns it into dS there (a vec4
// of 4 rows per key and row group). Then every thread adds dS K to dQ's rows 4 rg .. 4 rg + 3
// (rg = t / 16), columns 4 lane .. 4 lane + 3 and 64 + 4 lane .. 64 + 4 lane + 3 (lane =
// t % 16; three vec4s read per 32 multiply-adds). With S and dP in one thread, as bwd_q_tile
// has them at 64, every step reads a vec4 of each of four operands for the pair and the
// scores run bound by workgroup-memory reads at 128. Scores sum dimensions 0..63 and 64..127
// apart, as the forward (`SH`). Workgroup memory: 48 KiB with BR = 32, 32 KiB with 16.
const RG: u32 = BR / 4u;
const D4: u32 = DMAX / 4u;
var<workgroup> QG: array<vec4<f32>, 2u * DMAX * RG>;
var<workgroup> KV: array<vec4<f32>, 2u * BC * D4>;

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let bh = ids.wid.y;
  let q0 = ids.wid.x * BR;
  let t = ids.lid;
  let rg = t / 16u;
  let lane = t % 16u;
  let role = t / (WG / 2u);
  let sg = (t % (WG / 2u)) / 8u;
  let kp = t % 8u;
  let qb = base_q(bh);
  let gb = base_g(bh);
  let kb = base_k(bh);
  let vb = base_v(bh);
  // Q^T and dO^T as whole vec4s, neighbouring threads on neighbouring row groups.
  for (var e = t; e < BR * DMAX / 4u; e = e + WG) {
    let g = e % RG;
    let dd = e / RG;
    let qo = tile_column4(false, qb, gb, q0 + 4u * g, dd);
    QG[dd * RG + g] = qo[0];
    QG[DMAX * RG + dd * RG + g] = qo[1];
  }
  // The score phase's rows and their log-sum-exp and delta.
  let srows = vec4<u32>(q0 + 4u * sg) + vec4<u32>(0u, 1u, 2u, 3u);
  let slive = srows < vec4<u32>(p.sq);
  var lse4 = vec4<f32>(0.0);
  var del4 = vec4<f32>(0.0);
  //! unroll r in 0..4
  if (slive[$r]) {
    lse4[$r] = ld_lse(bh * p.sq + srows[$r]);
    del4[$r] = ld_delta(bh * p.sq + srows[$r]);
  }
  //! end
  // dQ's rows.
  let rows = vec4<u32>(q0 + 4u * rg) + vec4<u32>(0u, 1u, 2u, 3u);
  let live = rows < vec4<u32>(p.sq);
  //! unroll r in 0..4
  //! unroll h in 0..DH
  var dq$r$h = vec4<f32>(0.0);
  if (p.first == 0u && live[$r]) {
    let sb = (bh * p.sq + rows[$r]) * DMAX + 64u * $h + 4u * lane;
    dq$r$h = vec4<f32>(ld_state(sb), ld_state(sb + 1u), ld_state(sb + 2u), ld_state(sb + 3u));
  }
  //! end
  //! end
  let kend = min(p.c1, key_end(q0));
  // This thread's share of each K and V block: keys KPT kg .. KPT kg + KPT - 1, dimensions
  // 4 dg .. 4 dg + 3, loaded into registers a block ahead.
  let kg = t / D4;
  let dg = t % D4;
  //! unroll i in 0..KPT
  //! unroll j in 0..4
  var kv$i$j = tile_kv(kb, vb, p.c0 + KPT * kg + $i, 4u * dg + $j);
  //! end
  //! end
  let srow0 = bh * p.sq + srows.x;
  let qgo = role * DMAX * RG;
  let kvo = role * BC * D4;
  for (var k0 = p.c0; k0 < kend; k0 = k0 + BC) {
    workgroupBarrier();
    //! unroll i in 0..KPT
    KV[row_at(KPT * kg + $i, dg, NK)] = vec4<f32>(kv$i0u.x, kv$i1u.x, kv$i2u.x, kv$i3u.x);
    KV[BC * D4 + row_at(KPT * kg + $i, dg, NK)] = vec4<f32>(kv$i0u.y, kv$i1u.y, kv$i2u.y, kv$i3u.y);
    //! end
    workgroupBarrier();
    if (k0 + BC < kend) {
      //! unroll i in 0..KPT
      //! unroll j in 0..4
      kv$i$j = tile_kv(kb, vb, k0 + BC + KPT * kg + $i, 4u * dg + $j);
      //! end
      //! end
    }
    // S (role 0: Q, K) or dP' (role 1: dO, V) for keys NK kp + c, as vec4s over the rows; at
    // 128 each half of the dimensions into its own sum first.
    //! unroll c in 0..NK
    var a$c = vec4<f32>(0.0);
    //! end
    //! unroll h in 0..DH
    {
      //! unroll c in 0..NK
      var b$c = vec4<f32>(0.0);
      //! end
      for (var d4 = 16u * $h; d4 < 16u * $h + 16u; d4 = d4 + 1u) {
        //! unroll j in 0..4
        let qa$j = QG[qgo + (4u * d4 + $j) * RG + sg];
        //! end
        //! unroll c in 0..NK
        let kk$c = KV[kvo + row_at(NK * kp + $c, d4, NK)];
        b$c = fma(qa0u, vec4<f32>(kk$c.x), b$c);
        b$c = fma(qa1u, vec4<f32>(kk$c.y), b$c);
        b$c = fma(qa2u, vec4<f32>(kk$c.z), b$c);
        b$c = fma(qa3u, vec4<f32>(kk$c.w), b$c);
        //! end
      }
      //! unroll c in 0..NK
      if ($h == 0u) { a$c = b$c; } else { a$c = a$c + b$c; }
      //! end
    }
    //! end
    // Every thread is past its reads of V: role 0 stores P there (0 where masked, as
    // `masked`, or past the rows), then role 1 turns it into dS = P (dP' keep - delta).
    workgroupBarrier();
    //! unroll c in 0..NK
    let key$c = k0 + NK * kp + $c;
    let at$c = BC * D4 + (NK * kp + $c) * RG + sg;
    if (role == 0u) {
      let ok$c = slive & vec4<bool>(key$c < p.skv) & !(vec4<bool>(p.causal != 0u) & (vec4<u32>(key$c + p.sq) > srows + vec4<u32>(p.skv)));
      KV[at$c] = select(vec4<f32>(0.0), exp(a$c * p.scale - lse4), ok$c);
    }
    //! end
    workgroupBarrier();
    if (role == 1u) {
      //! unroll c in 0..NK
      let keep$c = vec4<f32>(attn_keep(srow0, key$c), attn_keep(srow0 + 1u, key$c), attn_keep(srow0 + 2u, key$c), attn_keep(srow0 + 3u, key$c));
      KV[at$c] = KV[at$c] * (a$c * keep$c - del4);
      //! end
    }
    workgroupBarrier();
    for (var c = 0u; c < BC; c = c + 1u) {
      let ds = KV[BC * D4 + c * RG + rg];
      //! unroll h in 0..DH
      let kk$h = KV[row_at(c, 16u * $h + lane, NK)];
      dq0u$h = fma(vec4<f32>(ds.x), kk$h, dq0u$h);
      dq1u$h = fma(vec4<f32>(ds.y), kk$h, dq1u$h);
      dq2u$h = fma(vec4<f32>(ds.z), kk$h, dq2u$h);
      dq3u$h = fma(vec4<f32>(ds.w), kk$h, dq3u$h);
      //! end
    }
  }
  //! unroll r in 0..4
  if (live[$r]) {
    //! unroll h in 0..DH
    if (p.last != 0u) {
      let dqo = head_base(bh, p.dq_off, p.dq_sb, p.dq_sh) + rows[$r] * p.dq_ss;
      for (var j = 0u; j < 4u; j = j + 1u) {
        let col = 64u * $h + 4u * lane + j;
        if (col < p.d) { st_dq(dqo + col, dq$r$h[j] * p.scale); }
      }
    } else {
      let sb = (bh * p.sq + rows[$r]) * DMAX + 64u * $h + 4u * lane;
      for (var j = 0u; j < 4u; j = j + 1u) { st_state(sb + j, dq$r$h[j]); }
    }
    //! end
  }
  //! end
}
