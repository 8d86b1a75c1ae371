// attention_coop.wgsl: the attention forward and backward passes of attention.wgsl on
// cooperative matrices (tensor cores): f16 Q, K, V, f32 accumulation. Same result, same saved
// log-sum-exp; the backward kernels are described after the forward's. The `_reg` entries at
// the end (fwd_reg, bwd_q_reg, bwd_kv_reg) do the same work with the scores in registers,
// where the driver's cooperative-matrix layout is known (kernels/coop_layout.rs), several
// times faster (docs/performance.md, attention). The entries described first serve every
// other adapter with tensor cores. The `_reg` entries also take bf16 Q, K, V and dO (their
// `half` bindings): wgrad's SPIR-V then makes every 16-bit value bf16 (kernels/spirv.rs
// `bf16_halves`), which is why they only move, convert and multiply those values, never
// compute on them (SPV_KHR_bfloat16 allows nothing else).
//
// Requirements (checked by the host, which otherwise uses attention.wgsl): f16 storage with
// SHADER_F16, 16x16x16 f16 -> f32 cooperative matrices, subgroups of 32, head dimension D equal
// to the constant DMAX (64 or 128), and SQ, SKV multiples of 16 (so every 16-row tile is either
// wholly inside or wholly outside a sequence).
//
// Layout: a workgroup of 128 threads (4 subgroups) takes 64 query rows of one head; subgroup s
// owns rows 16 s .. 16 s + 15 and keeps their Q tiles (D/16 of them) in cooperative-matrix
// registers. Keys go by blocks of 64 (four 16-key tiles); the forward stages each block of K
// (then of V) in workgroup memory once for the four subgroups (see `kv_run`), as bwd_q does,
// and bwd_kv stages each block of Q and dO (`q_run`). The fragments of KT tiles are
// loaded before any of their products: loaded one tile at a time, each product waited for
// its own loads.
//
// Operands are read where they are: q, k, v and dout at off + batch sb + head sh + row pitch
// (the pitches QS, KS, VS, GS are constants, as naga's cooperative loads need), so the heads
// of a fused QKV projection are read in place; o and the gradients dq, dk, dv are written at
// their own strides (the gradient of a fused QKV projection in place), 4 at a time through
// vec4 bindings: the host takes this path only where every offset and stride is a multiple
// of 8 halves, as the cooperative loads need for the operands.
//
// The forward takes one pass over the keys with the online softmax of attention.wgsl, made
// lazy because a cooperative matrix cannot be scaled row by row: scores go through workgroup
// memory, where the subgroup's lanes read them (two lanes per row, halves combined with a
// subgroup shuffle), write P = exp(s - m) as f16 and keep each row's sum; P V accumulates on
// cooperative matrices. A row's maximum m moves only when a block's maximum exceeds it by more
// than TAU, so the weights stay below e^TAU; only then is the output accumulated so far scaled
// (stored to workgroup memory, scaled by rows, loaded back), for the whole workgroup when any
// of its rows moved (the barriers that needs must be uniform). With scores of ordinary size
// that happens at most once or twice a row. The two-pass form it replaces (row maxima and sums
// first, then P V) computed Q K^T twice.
//
// Alignment: every workgroup variable here is a multiple of 16 bytes long, so each starts on
// a 16-byte boundary whatever order the driver lays them out in (it knows only the types'
// own alignment: 2 bytes for Pf, 8 for KVs); the cooperative loads from KVs and Pf need
// that. With a 4-byte flag among them the forward gave wrong results on every shape on
// NVIDIA's driver, and right ones once the flag was padded to 16 bytes. tests/shaders.rs checks the
// sizes of every tensor-core kernel's workgroup variables.
//
// Masks combine with `|` and `&`, not `||` and `&&`: the short-circuit forms are branches,
// which would make the control flow around the cooperative-matrix ops non-uniform.
//
// Bounds: query tiles past SQ are computed and never stored; tiles past SKV (or SQ) in a
// block's last tiles load the last tile again (an in-bounds row), and the mask zeroes their
// weights. Causal rows mask keys j + SQ > i + SKV, and the blocks wholly past the diagonal
// are not visited. Every barrier is in control flow uniform across the workgroup.
//
// Bindings: signature line. Params as attention.wgsl. Constants: DMAX and ND = DMAX / 16,
// the 16-wide column tiles of a head; KT (above); QS, KS, VS, GS (above); CAUSAL and DROP
// (the causal mask and dropout on or off, see `hidden` and `keep_keys`). Loops over them are
// unrolled (`//! unroll`), with one named variable per tile: an array of cooperative matrices
// indexed in a loop may live in memory instead of registers.
// Loops (per invocation): one pass over the key blocks, about 2 (4 / KT + 1) + 1 counted
// iterations per block of 64 keys, 8 ND more when the maximum moves; the host uses this
// kernel only up to 4096 keys (the loop budget), longer sequences take attention.wgsl's
// chunked path.

// The layout of attention.wgsl's Params (one host twin); the chunk fields are unused here.
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

const BR: u32 = 64u;
const BC: u32 = 64u;

// Per subgroup: a 16 x 64 f32 tile of scores (or dP, dS, an output tile) and a 16 x 64 f16
// tile of weights, in runs of 4: a lane reads and writes 4 of them at once, and fragments load
// through a pointer to a run's first element. Two lanes share a row of a tile (half a row, 8
// runs, each); lane l visits its runs starting at run l (mod 8), so the 8 lanes of each
// quarter-subgroup touch distinct banks: visiting them in order from 0 made every access a
// many-way bank conflict (rows are 64 words apart), which cost more than all the products.
// Runs of 4 also beat one element at a time, in the forward and the backward
// (docs/performance.md, attention).
var<workgroup> Sf: array<array<f32, 4>, 1024u>;
var<workgroup> Pf: array<array<f16, 4>, 1024u>;

fn sf4(i: u32) -> vec4<f32> {
  let r = Sf[i];
  return vec4<f32>(r[0], r[1], r[2], r[3]);
}
fn put_sf4(i: u32, x: vec4<f32>) {
  Sf[i] = array<f32, 4>(x.x, x.y, x.z, x.w);
}
fn pf4(i: u32) -> vec4<f32> {
  let r = Pf[i];
  return vec4<f32>(f32(r[0]), f32(r[1]), f32(r[2]), f32(r[3]));
}
fn put_pf4(i: u32, x: vec4<f32>) {
  Pf[i] = array<f16, 4>(f16(x.x), f16(x.y), f16(x.z), f16(x.w));
}
var<workgroup> Ls: array<f32, 64u>;
// fwd: each row's factor for the output accumulated so far (by invocation: both lanes of a
// row hold it), and whether any row of the workgroup moved its maximum this block (element
// 0; see "Alignment" in the header for the other three).
var<workgroup> Alpha: array<f32, 128u>;
var<workgroup> Moved: array<atomic<u32>, 4u>;

// How far (in units of the scaled scores) a block's maximum may exceed the running one before
// fwd moves it: weights up to e^8 = 2981 stay exact to f16's precision (and dropout's factor is
// applied after the sum, so they never grow past it).
const TAU: f32 = 8.0;

// One past the last key a causal row in [r0, r0 + rows) sees (key j is visible to row i when
// j + SQ <= i + SKV), or SKV without the mask.
fn causal_end(r0: u32, rows: u32) -> u32 {
  if (CAUSAL == 0u) { return p.skv; }
  let end = r0 + rows + p.skv;
  return select(0u, min(p.skv, end - p.sq), end > p.sq);
}

// The first row that sees key k0 under the causal mask (0 without it), rounded down to a
// block of `rows`.
fn causal_start(k0: u32, rows: u32) -> u32 {
  if (CAUSAL == 0u || k0 + p.sq <= p.skv) { return 0u; }
  return (k0 + p.sq - p.skv) / rows * rows;
}

// Masks and dropout factors for a run of 4, with dropout on or off fixed when the pipeline is
// built (DROP), as is the causal mask (CAUSAL): tested per element from the parameters, such
// choices cost a large share of a small tensor-core matmul's time (see common.wgsl
// `matmul_fused`).

// Which of four keys row `qi` does not see: past SKV, or causally masked.
fn hidden(keys: vec4<u32>, qi: u32) -> vec4<bool> {
  return (keys >= vec4<u32>(p.skv)) | (vec4<bool>(CAUSAL != 0u) & (keys + vec4<u32>(p.sq) > vec4<u32>(qi + p.skv)));
}

// Which of the four queries qi .. qi + 3 do not see key kj (past SQ or SKV, or causally
// masked).
fn unseen(qi: u32, kj: u32) -> vec4<bool> {
  let qs = vec4<u32>(qi) + vec4<u32>(0u, 1u, 2u, 3u);
  return (qs >= vec4<u32>(p.sq)) | vec4<bool>(kj >= p.skv) | (vec4<bool>(CAUSAL != 0u) & (vec4<u32>(kj + p.sq) > qs + vec4<u32>(p.skv)));
}

// Whether row `qi` does not see key `kj` (past SKV, or causally masked), one element.
fn hidden1(kj: u32, qi: u32) -> bool {
  return (kj >= p.skv) | ((CAUSAL != 0u) & (kj + p.sq > qi + p.skv));
}

// Whether the block of queries q0 .. q0 + nq - 1 and keys k0 .. k0 + nk - 1 holds an element
// the masks hide: a query past SQ, a key past SKV, or one the causal mask hides from the
// block's first query (which sees the fewest). fwd_reg tests elements only in such blocks,
// as all but the edge and the diagonal are wholly visible, which shortens the forward.
// The backward kernels test every element: holding a tile's values untested while the test
// runs makes them slower at head dimension 128 and gains next to nothing at 64
// (docs/performance.md, attention).
fn edge_block(q0: u32, nq: u32, k0: u32, nk: u32) -> bool {
  return (q0 + nq > p.sq) | (k0 + nk > p.skv) | ((CAUSAL != 0u) & (k0 + nk + p.sq > q0 + p.skv + 1u));
}

// A register kernel's column of element e in a 16-wide tile, for the lane whose first
// column is cl = 2 (lane % 4) (kernels/coop_layout.rs `quad_rows`).
fn el_col(cl: u32, e: u32) -> u32 {
  return cl + (e % 2u) + 8u * ((e / 2u) % 2u);
}

// attn_keep for rows row .. row + 3 (numbered across heads) and key kj.
fn keep_rows(row: u32, kj: u32) -> vec4<f32> {
  if (DROP == 0u) { return vec4<f32>(1.0); }
  return vec4<f32>(attn_keep(row, kj), attn_keep(row + 1u, kj), attn_keep(row + 2u, kj), attn_keep(row + 3u, kj));
}

// attn_keep for row `row` and four keys.
fn keep_keys(row: u32, keys: vec4<u32>) -> vec4<f32> {
  if (DROP == 0u) { return vec4<f32>(1.0); }
  return vec4<f32>(attn_keep(row, keys.x), attn_keep(row, keys.y), attn_keep(row, keys.z), attn_keep(row, keys.w));
}

// ----- Backward (FlashAttention-2's split: one kernel for dK and dV, one for dQ) -----
//
// Both recompute P = exp(scale * S - lse) from the saved log-sum-exp and use delta = rowsum(dO
// * O) from attention.wgsl's bwd_delta; dS = P * (dP - delta). Products on cooperative
// matrices; P and dS go through workgroup memory as f16 to be the next product's operand, as
// FlashAttention keeps them in 16-bit. No atomics: each workgroup owns its rows' gradients.
//
//   bwd_kv  Workgroup (x, y) = (block of 64 keys, head); subgroup s owns keys 16 s .. 16 s + 15
//           and its dK and dV accumulators. For each block of BQ queries (Q and dO staged):
//           S and dP = dO V^T for (16 queries, 16 keys) tiles, stored column-major so that
//           workgroup memory holds S^T and dP^T (16 keys x BQ queries per subgroup); then
//           dV += P^T dO and dK += dS^T Q; dK is scaled at the end.
//   bwd_q   Workgroup (x, y) = (block of 64 queries, head); subgroup s owns 16 queries and
//           keeps Q, dO and the dQ accumulators in registers. For each block of 64 keys
//           (K, V, K staged in turn): S = Q K^T, dP = dO V^T, then dQ += dS K, scaled at
//           the end.
//
// Causal: blocks wholly above the diagonal are skipped through the loop bounds (bwd_kv starts
// at the first query block that sees its keys, bwd_q stops after the last key block its
// queries see); the diagonal blocks are masked.
// Loops (per invocation): per block of 64 keys in bwd_q about 3 (4 / KT + 1) + 2 (8 + 1) + 1
// counted iterations, per block of BQ queries in bwd_kv about 4 (BQ / 16 KT + 1) +
// 3 (BQ / 8 + 1) + 1 (at most 4 K for 4096 queries); the host takes this
// path up to 4096 queries and keys, inside the loop budget.

// bwd_kv: the log-sum-exp and delta of the current block of queries.
var<workgroup> Lq: array<f32, 64u>;
var<workgroup> Dq: array<f32, 64u>;

// A block of 64 keys of K or V (fwd: K for the scores, V for P V; bwd_q: K, V, then K
// again for dS K), staged once for the four subgroups as vec4s of halves (row pitch
// KP = DMAX + 8 halves, so the 8 rows a fragment load reads at once start in different
// banks; fragment loads count offsets and pitches in vec4s). Loaded as fragments straight
// from memory, every subgroup would fetch the same K and V again, and those loads take about
// half the forward's time (timed against a variant that reads them from workgroup memory).
// Staged as arrays of 4 halves (stored one half at a time), the backward kernels run slower;
// the forward is the same either way (docs/performance.md, attention). (matmul_tc.wgsl's
// `main` keeps arrays of 4 halves: its fragment loads through vec4 pointers run far slower.)
const KP: u32 = DMAX + 8u;
var<workgroup> KVs: array<vec4<f16>, 16u * KP>;

// A block of 64 keys (k0 .. k0 + 63, clamped to the last key: those rows are masked) of K,
// or of V when `of_v`, goes into KVs in two halves: each invocation loads its 2 ND runs of 4
// halves (run i: row i / (DMAX / 4), DMAX / 4 runs a row) into registers with `kv_run` one
// phase of the loop before it stores them with `put_kv`, so the loads' latency hides behind
// that phase's products. Staged in one step (load, store, barrier), every block waited for
// its loads. All invocations call both in uniform control flow.
fn kv_run(of_v: bool, base: u32, pitch: u32, k0: u32, i: u32) -> vec4<f16> {
  let at = (base + min(k0 + i / (DMAX / 4u), p.skv - 1u) * pitch) / 4u + i % (DMAX / 4u);
  if (of_v) { return v[at]; }
  return k[at];
}
fn put_kv(i: u32, h: vec4<f16>) {
  KVs[(i / (DMAX / 4u)) * (KP / 4u) + i % (DMAX / 4u)] = h;
}

// The register kernels (fwd_reg, bwd_q_reg) stage a block of 64 keys of K and of V at once,
// each in a buffer of its own (pitch KP): run i goes where `put_kv` puts it.
var<workgroup> Kb: array<vec4<f16>, 16u * KP>;
var<workgroup> Vb: array<vec4<f16>, 16u * KP>;
//
// Their runs' addressing is worked out once per invocation (`Runs`): run j of a block (j < 2
// ND, run i = lid + j WG above) is row `row` + j RJ of the block, at the same column for
// every j (WG is a multiple of a row's DMAX / 4 runs). A block's load then takes one clamp and
// one multiply-add, its store a fixed offset. Worked out per run from its index (`kv_run`),
// the addressing was 40% of fwd_reg's instructions in the loop at 128 (NVIDIA's driver's
// machine code); hoisted, the forward and backward run faster (docs/performance.md,
// attention).
const RJ: u32 = WG / (DMAX / 4u);
struct Runs {
  // The invocation's first row in a block, its first run's place in Kb and Vb, and the vec4
  // index of its column in row 0 of K and of V.
  row: u32,
  at: u32,
  k: u32,
  v: u32,
}
fn runs(lid: u32, k_base: u32, v_base: u32) -> Runs {
  let col = lid % (DMAX / 4u);
  let row = lid / (DMAX / 4u);
  return Runs(row, row * (KP / 4u) + col, k_base / 4u + col, v_base / 4u + col);
}
// Run j of the block from row r0 of K and of V, rows clamped to the last key (those are masked).
struct KvRun {
  k: vec4<f16>,
  v: vec4<f16>,
}
fn kv_pair(r: Runs, r0: u32, j: u32) -> KvRun {
  let row = min(r0 + r.row + j * RJ, p.skv - 1u);
  return KvRun(k[r.k + row * (KS / 4u)], v[r.v + row * (VS / 4u)]);
}
fn put_kv_pair(r: Runs, j: u32, x: KvRun) {
  let at = r.at + j * RJ * (KP / 4u);
  Kb[at] = x.k;
  Vb[at] = x.v;
}
// The same for K or V alone (fwd_reg's HOLD = 2).
fn k_run1(r: Runs, r0: u32, j: u32) -> vec4<f16> {
  return k[r.k + min(r0 + r.row + j * RJ, p.skv - 1u) * (KS / 4u)];
}
fn v_run1(r: Runs, r0: u32, j: u32) -> vec4<f16> {
  return v[r.v + min(r0 + r.row + j * RJ, p.skv - 1u) * (VS / 4u)];
}
fn put_k1(r: Runs, j: u32, x: vec4<f16>) {
  Kb[r.at + j * RJ * (KP / 4u)] = x;
}
fn put_v1(r: Runs, j: u32, x: vec4<f16>) {
  Vb[r.at + j * RJ * (KP / 4u)] = x;
}

// fwd at DMAX = 64 (TWO) keeps V in a buffer of its own, Vs, beside K in KVs: a block's V and
// the next block's K are then stored while the lanes work on the scores, and a block takes
// two barriers instead of four (the scores' and the weights'). At 128 the two would not fit
// in 48 KiB beside the scores; there Vs is 16 bytes, never used.
const TWO: bool = DMAX == 64u;
var<workgroup> Vs: array<vec4<f16>, 16u * KP * (2u - DMAX / 64u) + 2u * (DMAX / 64u - 1u)>;
fn put_v(i: u32, h: vec4<f16>) {
  let at = (i / (DMAX / 4u)) * (KP / 4u) + i % (DMAX / 4u);
  if (TWO) { Vs[at] = h; } else { KVs[at] = h; }
}
fn v_frag(key0: u32, dd: u32) -> coop_mat16x16<f16, B> {
  if (TWO) { return coopLoadT<coop_mat16x16<f16, B>>(&Vs[(key0 * KP + dd * 16u) / 4u], KP / 4u); }
  return coopLoadT<coop_mat16x16<f16, B>>(&KVs[(key0 * KP + dd * 16u) / 4u], KP / 4u);
}

//! entry fwd(q: f16, k: f16 vec4, v: f16 vec4, o: data mut vec4, lse: f32 mut)
//! check WG=128 DMAX=64 ND=4 KT=4 QS=64 KS=64 VS=64 GS=64 CAUSAL=0,1 DROP=0,1
//! check WG=128 DMAX=128 ND=8 KT=2 QS=1152 KS=1152 VS=128 GS=384 CAUSAL=0,1 DROP=0,1
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let bh = ids.wid.y;
  let q0 = ids.wid.x * BR;
  let sg = ids.lid / 32u;
  let lane = ids.lid % 32u;
  let r0 = q0 + sg * 16u;
  let qb = head_base(bh, p.q_off, p.q_sb, p.q_sh);
  let kb = kv_base(bh, p.k_off, p.k_sb, p.k_sh);
  let vb = kv_base(bh, p.v_off, p.v_sb, p.v_sh);
  let ob = head_base(bh, p.o_off, p.o_sb, p.o_sh);
  // Rows past SQ load the (bounds-checked) tile anyway; their results are never stored.
  let qr = min(r0, p.sq - 16u);
  //! unroll dd in 0..ND
  var qt$dd = coopLoadT<coop_mat16x16<f16, A>>(&q[qb + qr * QS + $dd * 16u], QS);
  //! end
  // Causal rows stop after the last key any row of this block sees (j + SQ <= i + SKV):
  // the blocks past it are skipped, not masked. The bound is the same for the whole
  // workgroup and only a loop bound, so the cooperative-matrix ops stay in uniform control.
  let kend = causal_end(q0, BR);
  let row = lane / 2u;
  let half = lane % 2u;
  let qi = r0 + row;
  // This lane's half-row of the subgroup's 16 x 64 scores, in runs of 4.
  let sbase = (sg * 1024u + row * 64u + half * 32u) / 4u;

  // One pass over the key blocks with a lazily moved row maximum (see the header): m is the
  // maximum the weights are taken against, l their sum, O their product with V.
  var m = p.ninf;
  var l = 0.0;
  //! unroll dd in 0..ND
  var ot$dd = coop_mat16x16<f32, C>();
  //! end
  // Workgroup memory starts undefined (its zeroing is off); the first barrier orders this.
  atomicStore(&Moved[0], 0u);
  // The invocation's runs of the next blocks (see `kv_run`): V's load during the block's
  // scores; K's during the scores before (TWO) or the P V before.
  //! unroll t in 0..ND
  var ra$t = kv_run(false, kb, KS, 0u, ids.lid + 2u * $t * WG);
  var rb$t = kv_run(false, kb, KS, 0u, ids.lid + (2u * $t + 1u) * WG);
  var va$t = vec4<f16>();
  var vb$t = vec4<f16>();
  //! end
  if (TWO) {
    //! unroll t in 0..ND
    put_kv(ids.lid + 2u * $t * WG, ra$t);
    put_kv(ids.lid + (2u * $t + 1u) * WG, rb$t);
    //! end
    workgroupBarrier();
  }
  for (var k0 = 0u; k0 < kend; k0 = k0 + BC) {
    if (!TWO) {
      //! unroll t in 0..ND
      put_kv(ids.lid + 2u * $t * WG, ra$t);
      put_kv(ids.lid + (2u * $t + 1u) * WG, rb$t);
      //! end
      workgroupBarrier();
    }
    //! unroll t in 0..ND
    va$t = kv_run(true, vb, VS, k0, ids.lid + 2u * $t * WG);
    vb$t = kv_run(true, vb, VS, k0, ids.lid + (2u * $t + 1u) * WG);
    //! end
    if (TWO) {
      //! unroll t in 0..ND
      ra$t = kv_run(false, kb, KS, k0 + BC, ids.lid + 2u * $t * WG);
      rb$t = kv_run(false, kb, KS, k0 + BC, ids.lid + (2u * $t + 1u) * WG);
      //! end
    }
    for (var kg = 0u; kg < 4u; kg = kg + KT) {
      //! unroll kc in 0..KT
      //! unroll dd in 0..ND
      let kt$kc$dd = coopLoad<coop_mat16x16<f16, B>>(&KVs[((kg + $kc) * 16u * KP + $dd * 16u) / 4u], KP / 4u);
      //! end
      //! end
      //! unroll kc in 0..KT
      var acc$kc = coop_mat16x16<f32, C>();
      //! unroll dd in 0..ND
      acc$kc = coopMultiplyAdd(qt$dd, kt$kc$dd, acc$kc);
      //! end
      coopStoreT(acc$kc, &Sf[(sg * 1024u + (kg + $kc) * 16u) / 4u][0], 64u);
      //! end
    }
    workgroupBarrier();
    // Every subgroup is past its score products (and the P V before): V goes in while the
    // lanes work on rows, and the next block's K (TWO: into KVs, which the scores are done
    // with; else into registers, stored at the top of the next block).
    //! unroll t in 0..ND
    put_v(ids.lid + 2u * $t * WG, va$t);
    put_v(ids.lid + (2u * $t + 1u) * WG, vb$t);
    //! end
    if (TWO) {
      //! unroll t in 0..ND
      put_kv(ids.lid + 2u * $t * WG, ra$t);
      put_kv(ids.lid + (2u * $t + 1u) * WG, rb$t);
      //! end
    } else {
      //! unroll t in 0..ND
      ra$t = kv_run(false, kb, KS, k0 + BC, ids.lid + 2u * $t * WG);
      rb$t = kv_run(false, kb, KS, k0 + BC, ids.lid + (2u * $t + 1u) * WG);
      //! end
    }
    // The lane's 32 scaled scores, read once (hidden ones -inf, so their weights are 0).
    var bm = p.ninf;
    //! unroll c in 0..8
    let x$c = select(sf4(sbase + (($c + lane) & 7u)) * p.scale, vec4<f32>(p.ninf), hidden(vec4<u32>(k0 + half * 32u + 4u * (($c + lane) & 7u)) + vec4<u32>(0u, 1u, 2u, 3u), qi));
    bm = max(bm, max(max(x$c.x, x$c.y), max(x$c.z, x$c.w)));
    //! end
    bm = max(bm, subgroupShuffleXor(bm, 1u));
    // Selects, not branches: control flow must stay uniform for the cooperative-matrix ops.
    // The maximum moves only when the block's exceeds it by more than TAU (always on the
    // first visible key, when m is -inf); a row with no visible key yet keeps m = -inf.
    let grow = bm > m + TAU;
    let mn = select(m, bm, grow);
    let alpha = select(1.0, exp(m - mn), grow);
    let live = mn != p.ninf;
    var s = 0.0;
    //! unroll c in 0..8
    {
      let j = ($c + lane) & 7u;
      let keys = vec4<u32>(k0 + half * 32u + 4u * j) + vec4<u32>(0u, 1u, 2u, 3u);
      let w = select(exp(x$c - mn), vec4<f32>(0.0), vec4<bool>(!live));
      s = s + (w.x + w.y) + (w.z + w.w);
      let kw = select(w, vec4<f32>(0.0), keep_keys(bh * p.sq + qi, keys) == vec4<f32>(0.0));
      put_pf4(sbase + j, kw);
    }
    //! end
    s = s + subgroupShuffleXor(s, 1u);
    l = l * alpha + s;
    // O holds a sum against the old maximum only where that was finite.
    let rescale = grow & (m != p.ninf);
    m = mn;
    Alpha[ids.lid] = alpha;
    atomicOr(&Moved[0], u32(rescale));
    // The barrier inside makes Pf, V and Alpha visible too.
    if (workgroupUniformLoad(&Moved[0]) != 0u) {
      atomicStore(&Moved[0], 0u);
      // Each output tile through the subgroup's score region, its rows scaled by alpha (the
      // first barrier keeps the tile before's load ahead of this store).
      //! unroll dd in 0..ND
      workgroupBarrier();
      coopStoreT(ot$dd, &Sf[sg * 256u][0], 16u);
      workgroupBarrier();
      for (var e = lane; e < 64u; e = e + 32u) {
        let a = Alpha[sg * 32u + (e / 4u) * 2u];
        put_sf4(sg * 256u + e, sf4(sg * 256u + e) * a);
      }
      workgroupBarrier();
      ot$dd = coopLoadT<coop_mat16x16<f32, C>>(&Sf[sg * 256u][0], 16u);
      //! end
    }
    for (var kg = 0u; kg < 4u; kg = kg + KT) {
      //! unroll kc in 0..KT
      let pt$kc = coopLoadT<coop_mat16x16<f16, A>>(&Pf[(sg * 1024u + (kg + $kc) * 16u) / 4u][0], 64u);
      //! unroll dd in 0..ND
      let vt$kc$dd = v_frag((kg + $kc) * 16u, $dd);
      //! end
      //! end
      //! unroll kc in 0..KT
      //! unroll dd in 0..ND
      ot$dd = coopMultiplyAdd(pt$kc, vt$kc$dd, ot$dd);
      //! end
      //! end
    }
    // With TWO the next block's scores may start at once: they write Sf, which the lanes
    // finished reading before the weights' barrier, and read KVs, filled before it.
    if (!TWO) { workgroupBarrier(); }
  }
  if (half == 0u) {
    Ls[sg * 16u + row] = l;
    if (qi < p.sq) { st_lse(bh * p.sq + qi, m + log(l)); }
  }
  // Dropout's 1 / (1 - p) for the kept weights, applied once here (P holds 0 or the weight).
  let kept = select(1.0, p.drop_scale, (DROP != 0u) & (p.drop_thr != 0u));

  // Out: the output tiles through the subgroup's score region, four at a time (a 16 x 64
  // strip, row-major), divided by the row sums; each lane stores runs of 4 outputs of a row.
  // One tile at a time, its outputs stored one by one, the forward runs slower (the
  // backward's epilogues likewise).
  //! unroll dd in 0..ND
  coopStoreT(ot$dd, &Sf[(sg * 1024u + ($dd % 4u) * 16u) / 4u][0], 64u);
  if ($dd % 4u == 3u) {
    workgroupBarrier();
    for (var e = lane; e < 256u; e = e + 32u) {
      let rr = e / 16u;
      let qo = r0 + rr;
      if (qo < p.sq) {
        let at = ob + qo * p.o_ss + ($dd / 4u) * 64u + (e % 16u) * 4u;
        let x = sf4(sg * 256u + e) * (kept / Ls[sg * 16u + rr]);
        st4_o(at / 4u, x);
      }
    }
    workgroupBarrier();
  }
  //! end
}

//! entry bwd_kv(q: f16 vec4, k: f16 vec4, v: f16 vec4, dout: f16 vec4, lse: f32, delta: f32, dk: data mut vec4, dv: data mut vec4)
//! check WG=128 DMAX=64 ND=4 KT=2 QS=64 KS=64 VS=64 GS=64 CAUSAL=0,1 DROP=0,1
//! check WG=128 DMAX=128 ND=8 KT=1 QS=1152 KS=1152 VS=128 GS=384 CAUSAL=0,1 DROP=0,1
// Each block of BQ queries (64 at DMAX = 64, 32 at 128) stages its Q and dO rows once in
// workgroup memory for the four subgroups, which read every fragment of them twice (Q for
// S^T and dK, dO for dP^T and dV): loaded straight from memory, each subgroup fetched them
// itself. The budget (48 KiB on the GPUs that have cooperative matrices) holds Qs, Gs, Sf and
// Pf but not a separate dS buffer, so dS waits in Sf as f32 while dV reads the weights from
// Pf, then replaces them there as f16 for dK. Workgroup memory: 43,520 bytes at DMAX = 64,
// 42,496 at 128.
const BQ: u32 = 4096u / DMAX;
var<workgroup> Qs: array<vec4<f16>, BQ * KP / 4u>;
var<workgroup> Gs: array<vec4<f16>, BQ * KP / 4u>;

// k and v are bound as vec4 for `kv_run` (shared with the other entries): a cooperative load
// through a pointer to a vector counts offsets and strides in vectors (rows are 16-byte
// aligned, so the offsets divide by 4).
fn k_tile(kb: u32, key0: u32, dd: u32) -> coop_mat16x16<f16, B> {
  return coopLoad<coop_mat16x16<f16, B>>(&k[(kb + key0 * KS + dd * 16u) / 4u], KS / 4u);
}

// Query rows q0 .. q0 + BQ - 1 (clamped to the last row: those are masked) of Q and dO go
// into Qs and Gs (row pitch KP), BQ DMAX / 4 runs of 4 halves each, 8 an invocation: run i is
// row i / (DMAX / 4). At DMAX = 64 (PRE) each invocation loads its runs of the next block
// into registers while the current block's products run and stores them at the top of the
// next (as fwd does with K and V); at 128 the kernel's accumulators leave no registers for
// that, and each block loads and stores in one step. All invocations call these in uniform
// control flow.
const PRE: bool = DMAX == 64u;
fn q_run(qb: u32, q0: u32, i: u32) -> vec4<f16> {
  return q[(qb + min(q0 + i / (DMAX / 4u), p.sq - 1u) * QS) / 4u + i % (DMAX / 4u)];
}
fn g_run(gb: u32, q0: u32, i: u32) -> vec4<f16> {
  return dout[(gb + min(q0 + i / (DMAX / 4u), p.sq - 1u) * GS) / 4u + i % (DMAX / 4u)];
}
fn put_qg(i: u32, hq: vec4<f16>, hg: vec4<f16>) {
  let at = (i / (DMAX / 4u)) * (KP / 4u) + i % (DMAX / 4u);
  Qs[at] = hq;
  Gs[at] = hg;
}

// Fragment dd of the 16 staged rows starting at r, as A (row-major, for S^T and dP^T) or as B
// (row-major, for dK and dV).
fn q_a(r: u32, dd: u32) -> coop_mat16x16<f16, A> {
  return coopLoadT<coop_mat16x16<f16, A>>(&Qs[(r * KP + dd * 16u) / 4u], KP / 4u);
}
fn g_a(r: u32, dd: u32) -> coop_mat16x16<f16, A> {
  return coopLoadT<coop_mat16x16<f16, A>>(&Gs[(r * KP + dd * 16u) / 4u], KP / 4u);
}
fn q_b(r: u32, dd: u32) -> coop_mat16x16<f16, B> {
  return coopLoadT<coop_mat16x16<f16, B>>(&Qs[(r * KP + dd * 16u) / 4u], KP / 4u);
}
fn g_b(r: u32, dd: u32) -> coop_mat16x16<f16, B> {
  return coopLoadT<coop_mat16x16<f16, B>>(&Gs[(r * KP + dd * 16u) / 4u], KP / 4u);
}

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let bh = ids.wid.y;
  let k0 = ids.wid.x * BC;
  let sg = ids.lid / 32u;
  let lane = ids.lid % 32u;
  let qb = head_base(bh, p.q_off, p.q_sb, p.q_sh);
  let kb = kv_base(bh, p.k_off, p.k_sb, p.k_sh);
  let vb = kv_base(bh, p.v_off, p.v_sb, p.v_sh);
  let gb = head_base(bh, p.g_off, p.g_sb, p.g_sh);
  let dkb = head_base(bh, p.dk_off, p.dk_sb, p.dk_sh);
  let dvb = head_base(bh, p.dv_off, p.dv_sb, p.dv_sh);
  // Keys past SKV load the last (in-range) tile; they are masked and never stored.
  let kr = min(k0 + sg * 16u, p.skv - 16u);
  //! unroll dd in 0..ND
  var dkt$dd = coop_mat16x16<f32, C>();
  var dvt$dd = coop_mat16x16<f32, C>();
  // This subgroup's K (for S^T) and V (for dP^T) fragments, the same for every query block.
  let kf$dd = k_tile(kb, kr, $dd);
  let vf$dd = coopLoad<coop_mat16x16<f16, B>>(&v[(vb + kr * VS + $dd * 16u) / 4u], VS / 4u);
  //! end
  let qstart = causal_start(k0, BQ);
  // Two lanes a key row of the subgroup's 16 x BQ tiles in Sf and Pf (BQ / 8 runs of 4
  // each); lanes start at different runs (`rot`) so that each quarter-subgroup touches 32
  // banks (rows are BQ words apart).
  let row = lane / 2u;
  let half = lane % 2u;
  let rot = select(row, lane, BQ == 64u);
  let kj = k0 + sg * 16u + row;
  let sbase = (sg * 1024u + row * BQ + half * (BQ / 2u)) / 4u;
  //! unroll t in 0..8
  var pq$t = vec4<f16>();
  var pg$t = vec4<f16>();
  if (PRE) {
    pq$t = q_run(qb, qstart, ids.lid + $t * WG);
    pg$t = g_run(gb, qstart, ids.lid + $t * WG);
  }
  //! end
  for (var q0 = qstart; q0 < p.sq; q0 = q0 + BQ) {
    //! unroll t in 0..8
    let i$t = ids.lid + $t * WG;
    if (PRE) {
      put_qg(i$t, pq$t, pg$t);
    } else {
      put_qg(i$t, q_run(qb, q0, i$t), g_run(gb, q0, i$t));
    }
    //! end
    // The block's log-sum-exp and delta, read once.
    if (ids.lid < BQ) {
      let qs = min(q0 + ids.lid, p.sq - 1u);
      Lq[ids.lid] = ld_lse(bh * p.sq + qs);
      Dq[ids.lid] = ld_delta(bh * p.sq + qs);
    }
    workgroupBarrier();
    if (PRE) {
      //! unroll t in 0..8
      pq$t = q_run(qb, q0 + BQ, ids.lid + $t * WG);
      pg$t = g_run(gb, q0 + BQ, ids.lid + $t * WG);
      //! end
    }
    // S for (16 queries, this subgroup's 16 keys) tiles, stored column-major: S^T in Sf.
    for (var qg = 0u; qg < BQ / 16u; qg = qg + KT) {
      //! unroll qc in 0..KT
      //! unroll dd in 0..ND
      let qa$qc$dd = q_a((qg + $qc) * 16u, $dd);
      //! end
      //! end
      //! unroll qc in 0..KT
      var acc$qc = coop_mat16x16<f32, C>();
      //! unroll dd in 0..ND
      acc$qc = coopMultiplyAdd(qa$qc$dd, kf$dd, acc$qc);
      //! end
      coopStore(acc$qc, &Sf[(sg * 1024u + (qg + $qc) * 16u) / 4u][0], BQ);
      //! end
    }
    workgroupBarrier();
    for (var c = 0u; c < BQ / 8u; c = c + 1u) {
      let jr = (c + rot) & (BQ / 8u - 1u);
      let col = half * (BQ / 2u) + 4u * jr;
      let lq = vec4<f32>(Lq[col], Lq[col + 1u], Lq[col + 2u], Lq[col + 3u]);
      let w = exp(sf4(sbase + jr) * p.scale - lq);
      put_pf4(sbase + jr, select(w, vec4<f32>(0.0), unseen(q0 + col, kj)));
    }
    workgroupBarrier();
    // dP = dO V^T for (16 queries, 16 keys) tiles, stored column-major: dP^T in Sf.
    for (var qg = 0u; qg < BQ / 16u; qg = qg + KT) {
      //! unroll qc in 0..KT
      //! unroll dd in 0..ND
      let ga$qc$dd = g_a((qg + $qc) * 16u, $dd);
      //! end
      //! end
      //! unroll qc in 0..KT
      var acc$qc = coop_mat16x16<f32, C>();
      //! unroll dd in 0..ND
      acc$qc = coopMultiplyAdd(ga$qc$dd, vf$dd, acc$qc);
      //! end
      coopStore(acc$qc, &Sf[(sg * 1024u + (qg + $qc) * 16u) / 4u][0], BQ);
      //! end
    }
    workgroupBarrier();
    for (var c = 0u; c < BQ / 8u; c = c + 1u) {
      let jr = (c + rot) & (BQ / 8u - 1u);
      let col = half * (BQ / 2u) + 4u * jr;
      let qi = q0 + col;
      // With dropout (mask factor z): dS = P (z dP' - delta) for dP' = dO V^T, and
      // dV takes the dropped weights z P, which replace P in Pf.
      let z = keep_rows(bh * p.sq + qi, kj);
      let dq = vec4<f32>(Dq[col], Dq[col + 1u], Dq[col + 2u], Dq[col + 3u]);
      let pv = pf4(sbase + jr);
      put_sf4(sbase + jr, select(pv * (sf4(sbase + jr) * z - dq), vec4<f32>(0.0), unseen(qi, kj)));
      if (DROP != 0u) { put_pf4(sbase + jr, pv * z); }
    }
    workgroupBarrier();
    // dV += P^T dO.
    for (var qg = 0u; qg < BQ / 16u; qg = qg + KT) {
      //! unroll qc in 0..KT
      let pt$qc = coopLoadT<coop_mat16x16<f16, A>>(&Pf[(sg * 1024u + (qg + $qc) * 16u) / 4u][0], BQ);
      //! unroll dd in 0..ND
      let go$qc$dd = g_b((qg + $qc) * 16u, $dd);
      //! end
      //! end
      //! unroll qc in 0..KT
      //! unroll dd in 0..ND
      dvt$dd = coopMultiplyAdd(pt$qc, go$qc$dd, dvt$dd);
      //! end
      //! end
    }
    workgroupBarrier();
    // dS replaces the weights in Pf.
    for (var c = 0u; c < BQ / 8u; c = c + 1u) {
      let jr = (c + rot) & (BQ / 8u - 1u);
      put_pf4(sbase + jr, sf4(sbase + jr));
    }
    workgroupBarrier();
    // dK += dS^T Q.
    for (var qg = 0u; qg < BQ / 16u; qg = qg + KT) {
      //! unroll qc in 0..KT
      let st$qc = coopLoadT<coop_mat16x16<f16, A>>(&Pf[(sg * 1024u + (qg + $qc) * 16u) / 4u][0], BQ);
      //! unroll dd in 0..ND
      let qo$qc$dd = q_b((qg + $qc) * 16u, $dd);
      //! end
      //! end
      //! unroll qc in 0..KT
      //! unroll dd in 0..ND
      dkt$dd = coopMultiplyAdd(st$qc, qo$qc$dd, dkt$dd);
      //! end
      //! end
    }
    workgroupBarrier();
  }
  // Out: dK (scaled) then dV through the subgroup's region of Sf, four tiles at a time, as
  // in fwd.
  //! unroll dd in 0..ND
  coopStoreT(dkt$dd, &Sf[(sg * 1024u + ($dd % 4u) * 16u) / 4u][0], 64u);
  if ($dd % 4u == 3u) {
    workgroupBarrier();
    for (var e = lane; e < 256u; e = e + 32u) {
      let key = k0 + sg * 16u + e / 16u;
      if (key < p.skv) {
        let at = dkb + key * p.dk_ss + ($dd / 4u) * 64u + (e % 16u) * 4u;
        let x = sf4(sg * 256u + e) * p.scale;
        st4_dk(at / 4u, x);
      }
    }
    workgroupBarrier();
  }
  //! end
  //! unroll dd in 0..ND
  coopStoreT(dvt$dd, &Sf[(sg * 1024u + ($dd % 4u) * 16u) / 4u][0], 64u);
  if ($dd % 4u == 3u) {
    workgroupBarrier();
    for (var e = lane; e < 256u; e = e + 32u) {
      let key = k0 + sg * 16u + e / 16u;
      if (key < p.skv) {
        let at = dvb + key * p.dv_ss + ($dd / 4u) * 64u + (e % 16u) * 4u;
        let x = sf4(sg * 256u + e);
        st4_dv(at / 4u, x);
      }
    }
    workgroupBarrier();
  }
  //! end
}

//! entry bwd_q(q: f16, k: f16 vec4, v: f16 vec4, dout: f16, lse: f32, delta: f32, dq: data mut vec4)
//! check WG=128 DMAX=64 ND=4 KT=2 QS=64 KS=64 VS=64 GS=64 CAUSAL=0,1 DROP=0,1
//! check WG=128 DMAX=128 ND=8 KT=1 QS=1152 KS=1152 VS=128 GS=384 CAUSAL=0,1 DROP=0,1
// K and V come through KVs (`kv_run`), each block staged three times (K, V, K again) in one
// buffer: two would not fit beside the scores at d = 128. dS overwrites P in Pf (bwd_q needs
// P only to form dS). Scores, dP and weights in runs of 4 as in fwd.
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let bh = ids.wid.y;
  let q0 = ids.wid.x * BR;
  let sg = ids.lid / 32u;
  let lane = ids.lid % 32u;
  let qb = head_base(bh, p.q_off, p.q_sb, p.q_sh);
  let kb = kv_base(bh, p.k_off, p.k_sb, p.k_sh);
  let vb = kv_base(bh, p.v_off, p.v_sb, p.v_sh);
  let gb = head_base(bh, p.g_off, p.g_sb, p.g_sh);
  let dqb = head_base(bh, p.dq_off, p.dq_sb, p.dq_sh);
  let qr = min(q0 + sg * 16u, p.sq - 16u);
  //! unroll dd in 0..ND
  var qt$dd = coopLoadT<coop_mat16x16<f16, A>>(&q[qb + qr * QS + $dd * 16u], QS);
  var gt$dd = coopLoadT<coop_mat16x16<f16, A>>(&dout[gb + qr * GS + $dd * 16u], GS);
  var dqt$dd = coop_mat16x16<f32, C>();
  //! end
  let kend = causal_end(q0, BR);
  let row = lane / 2u;
  let half = lane % 2u;
  let qi = q0 + sg * 16u + row;
  let qs = min(qi, p.sq - 1u);
  let lse_i = ld_lse(bh * p.sq + qs);
  let delta_i = ld_delta(bh * p.sq + qs);
  let sbase = (sg * 1024u + row * 64u + half * 32u) / 4u;
  // The invocation's runs of the next operand for KVs, loaded a phase ahead as in fwd.
  //! unroll t in 0..ND
  var ra$t = kv_run(false, kb, KS, 0u, ids.lid + 2u * $t * WG);
  var rb$t = kv_run(false, kb, KS, 0u, ids.lid + (2u * $t + 1u) * WG);
  //! end
  for (var k0 = 0u; k0 < kend; k0 = k0 + BC) {
    // S = Q K^T.
    //! unroll t in 0..ND
    put_kv(ids.lid + 2u * $t * WG, ra$t);
    put_kv(ids.lid + (2u * $t + 1u) * WG, rb$t);
    ra$t = kv_run(true, vb, VS, k0, ids.lid + 2u * $t * WG);
    rb$t = kv_run(true, vb, VS, k0, ids.lid + (2u * $t + 1u) * WG);
    //! end
    workgroupBarrier();
    for (var kg = 0u; kg < 4u; kg = kg + KT) {
      //! unroll kc in 0..KT
      //! unroll dd in 0..ND
      let kt$kc$dd = coopLoad<coop_mat16x16<f16, B>>(&KVs[((kg + $kc) * 16u * KP + $dd * 16u) / 4u], KP / 4u);
      //! end
      //! end
      //! unroll kc in 0..KT
      var acc$kc = coop_mat16x16<f32, C>();
      //! unroll dd in 0..ND
      acc$kc = coopMultiplyAdd(qt$dd, kt$kc$dd, acc$kc);
      //! end
      coopStoreT(acc$kc, &Sf[(sg * 1024u + (kg + $kc) * 16u) / 4u][0], 64u);
      //! end
    }
    workgroupBarrier();
    for (var c = 0u; c < 8u; c = c + 1u) {
      let j = (c + lane) & 7u;
      let keys = vec4<u32>(k0 + half * 32u + 4u * j) + vec4<u32>(0u, 1u, 2u, 3u);
      let masked = vec4<bool>(qi >= p.sq) | hidden(keys, qi);
      put_pf4(sbase + j, select(exp(sf4(sbase + j) * p.scale - lse_i), vec4<f32>(0.0), masked));
    }
    // Every subgroup is past its score products (the barrier above): V replaces K.
    //! unroll t in 0..ND
    put_kv(ids.lid + 2u * $t * WG, ra$t);
    put_kv(ids.lid + (2u * $t + 1u) * WG, rb$t);
    ra$t = kv_run(false, kb, KS, k0, ids.lid + 2u * $t * WG);
    rb$t = kv_run(false, kb, KS, k0, ids.lid + (2u * $t + 1u) * WG);
    //! end
    workgroupBarrier();
    // dP = dO V^T.
    for (var kg = 0u; kg < 4u; kg = kg + KT) {
      //! unroll kc in 0..KT
      //! unroll dd in 0..ND
      let vt$kc$dd = coopLoad<coop_mat16x16<f16, B>>(&KVs[((kg + $kc) * 16u * KP + $dd * 16u) / 4u], KP / 4u);
      //! end
      //! end
      //! unroll kc in 0..KT
      var acc$kc = coop_mat16x16<f32, C>();
      //! unroll dd in 0..ND
      acc$kc = coopMultiplyAdd(gt$dd, vt$kc$dd, acc$kc);
      //! end
      coopStoreT(acc$kc, &Sf[(sg * 1024u + (kg + $kc) * 16u) / 4u][0], 64u);
      //! end
    }
    workgroupBarrier();
    for (var c = 0u; c < 8u; c = c + 1u) {
      let j = (c + lane) & 7u;
      let keys = vec4<u32>(k0 + half * 32u + 4u * j) + vec4<u32>(0u, 1u, 2u, 3u);
      let masked = vec4<bool>(qi >= p.sq) | hidden(keys, qi);
      let dp = sf4(sbase + j) * keep_keys(bh * p.sq + qi, keys);
      put_pf4(sbase + j, select(pf4(sbase + j) * (dp - delta_i), vec4<f32>(0.0), masked));
    }
    // Every subgroup is past its dP products: K replaces V.
    //! unroll t in 0..ND
    put_kv(ids.lid + 2u * $t * WG, ra$t);
    put_kv(ids.lid + (2u * $t + 1u) * WG, rb$t);
    ra$t = kv_run(false, kb, KS, k0 + BC, ids.lid + 2u * $t * WG);
    rb$t = kv_run(false, kb, KS, k0 + BC, ids.lid + (2u * $t + 1u) * WG);
    //! end
    workgroupBarrier();
    // dQ += dS K.
    for (var kg = 0u; kg < 4u; kg = kg + KT) {
      //! unroll kc in 0..KT
      let st$kc = coopLoadT<coop_mat16x16<f16, A>>(&Pf[(sg * 1024u + (kg + $kc) * 16u) / 4u][0], 64u);
      //! unroll dd in 0..ND
      let kt$kc$dd = coopLoadT<coop_mat16x16<f16, B>>(&KVs[((kg + $kc) * 16u * KP + $dd * 16u) / 4u], KP / 4u);
      //! end
      //! end
      //! unroll kc in 0..KT
      //! unroll dd in 0..ND
      dqt$dd = coopMultiplyAdd(st$kc, kt$kc$dd, dqt$dd);
      //! end
      //! end
    }
    workgroupBarrier();
  }
  // Out: dQ (scaled) through the subgroup's region of Sf, four tiles at a time, as in fwd.
  //! unroll dd in 0..ND
  coopStoreT(dqt$dd, &Sf[(sg * 1024u + ($dd % 4u) * 16u) / 4u][0], 64u);
  if ($dd % 4u == 3u) {
    workgroupBarrier();
    for (var e = lane; e < 256u; e = e + 32u) {
      let qo = q0 + sg * 16u + e / 16u;
      if (qo < p.sq) {
        let at = dqb + qo * p.dq_ss + ($dd / 4u) * 64u + (e % 16u) * 4u;
        let x = sf4(sg * 256u + e) * p.scale;
        st4_dq(at / 4u, x);
      }
    }
    workgroupBarrier();
  }
  //! end
}

//! entry fwd_reg(q: half, k: half vec4, v: half vec4, o: data mut, lse: f32 mut)
//! requires spirv
//! check WG=128 DMAX=64 ND=4 KT=4 QS=64 KS=64 VS=64 GS=64 CAUSAL=0,1 DROP=0,1 HOLD=1
//! check WG=128 DMAX=128 ND=8 KT=2 QS=1152 KS=1152 VS=128 GS=384 CAUSAL=0,1 DROP=0,1 HOLD=2
// ----- fwd_reg: the forward with the softmax in registers -----
//
// The same result as `fwd` (and attention.wgsl), where the driver's cooperative-matrix layout
// is the one kernels/coop_layout.rs calls quad rows (NVIDIA's): the host checks it with one
// measurement per device. `fwd` sends every block of scores through workgroup memory (stored
// from the accumulators, read by the lanes, written back as f16 weights, loaded as fragments:
// four passes over 4 KiB a subgroup and two barriers) because WGSL cannot touch an
// accumulator's elements. Here the lanes work on their own elements of the score tiles
// (common.wgsl `coop_get<E>u`), as FlashAttention-2 does in registers:
//
//   element e of lane l of a 16 x 16 tile is row l / 4 + 8 (e / 4), column 2 (l % 4) + e % 2
//   + 8 ((e / 2) % 2), in the accumulator and in the A operand alike;
//
// so a lane holds two rows of each tile, each row's 16 columns lie in the four lanes of a
// quad (maxima combine with two shuffles), and the weights P of a score tile become the A
// operand of P V element by element, with nothing moved between lanes. The running maximum
// moves with every block (FlashAttention's exact rescaling: the output accumulators'
// elements are multiplied by each row's factor in registers, which is cheap here), in base 2
// (scores scaled by log2(e) once; the log-sum-exp is converted back).
//
// Workgroup: 128 threads, 64 query rows of one head, subgroup s rows 16 s .. 16 s + 15 with
// their Q tiles in registers, as `fwd`. Keys by blocks of 64: each block of K and of V staged
// in workgroup memory once (Kb, Vb; KP pitch as `fwd`), with HOLD = 1 (DMAX = 64) the next
// block's runs loaded into registers while the current one multiplies. At 128 the
// accumulators leave registers for half a block's runs only: HOLD = 2 loads the block's V
// while its scores multiply and the next block's K while its P V does, which speeds the
// non-causal forward and leaves the causal one as it was, against loading both before each
// block's products (docs/performance.md, attention). Two barriers a block. Workgroup memory: 18,432
// bytes at DMAX = 64, 34,816 at 128.
//
// Outputs: each lane stores its own elements of O / l (rows past SQ are not stored), and the
// first lane of each quad its rows' log-sum-exp.
// Loops (per invocation): one per block of 64 keys (at most 64 for the 4096 keys the host
// allows), everything inside unrolled.


@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let bh = ids.wid.y;
  let q0 = ids.wid.x * BR;
  let sg = ids.lid / 32u;
  let lane = ids.lid % 32u;
  let r0 = q0 + sg * 16u;
  let qb = head_base(bh, p.q_off, p.q_sb, p.q_sh);
  let kb = kv_base(bh, p.k_off, p.k_sb, p.k_sh);
  let vb = kv_base(bh, p.v_off, p.v_sb, p.v_sh);
  let ob = head_base(bh, p.o_off, p.o_sb, p.o_sh);
  // Rows past SQ load the (bounds-checked) tile anyway; their results are never stored.
  let qr = min(r0, p.sq - 16u);
  //! unroll dd in 0..ND
  let qt$dd = coopLoadT<coop_mat16x16<f16, A>>(&q[qb + qr * QS + $dd * 16u], QS);
  //! end
  let kend = causal_end(q0, BR);
  // The lane's two rows (elements 0..3 and 4..7 of every tile) and its columns' offsets in
  // a tile (elements e and e + 4 share one).
  let row0 = r0 + lane / 4u;
  let row1 = row0 + 8u;
  let cl = 2u * (lane % 4u);
  // Dropout's hash of the lane's two rows (attn_row), worked out once.
  let rh0 = attn_row(bh * p.sq + row0);
  let rh1 = attn_row(bh * p.sq + row1);
  // Scores in base 2: s scale log2(e).
  let scale2 = p.scale * 1.4426950408889634;
  var m0 = p.ninf;
  var m1 = p.ninf;
  // This lane's part of its rows' sums (the quad's four parts are added at the end).
  var l0 = 0.0;
  var l1 = 0.0;
  //! unroll dd in 0..ND
  var ot$dd = coop_mat16x16<f32, C>();
  //! end
  // The first block's runs of K and V (see `Runs`).
  let pre = HOLD == 1u;
  let split = HOLD == 2u;
  let rs = runs(ids.lid, kb, vb);
  //! unroll t in 0..ND
  var ka$t = KvRun();
  var kz$t = KvRun();
  if (pre) {
    ka$t = kv_pair(rs, 0u, 2u * $t);
    kz$t = kv_pair(rs, 0u, 2u * $t + 1u);
  }
  // HOLD = 2: the block's runs of V (of the next block's K) in flight while its scores (its
  // P V) multiply.
  var hr$t = vec4<f16>();
  var hs$t = vec4<f16>();
  if (split) {
    put_k1(rs, 2u * $t, k_run1(rs, 0u, 2u * $t));
    put_k1(rs, 2u * $t + 1u, k_run1(rs, 0u, 2u * $t + 1u));
  }
  //! end
  if (split) { workgroupBarrier(); }
  for (var k0 = 0u; k0 < kend; k0 = k0 + BC) {
    if (split) {
      //! unroll t in 0..ND
      hr$t = v_run1(rs, k0, 2u * $t);
      hs$t = v_run1(rs, k0, 2u * $t + 1u);
      //! end
    } else {
      //! unroll t in 0..ND
      put_kv_pair(rs, 2u * $t, ka$t);
      put_kv_pair(rs, 2u * $t + 1u, kz$t);
      //! end
      workgroupBarrier();
    }
    // The next block's runs, in flight while this one multiplies (past the last block they
    // reread the last key, never used).
    if (pre) {
      //! unroll t in 0..ND
      ka$t = kv_pair(rs, k0 + BC, 2u * $t);
      kz$t = kv_pair(rs, k0 + BC, 2u * $t + 1u);
      //! end
    }
    // Scores: four 16 x 16 tiles (keys k0 + 16 kc ..).
    //! unroll kc in 0..4
    var s$kc = coop_mat16x16<f32, C>();
    //! unroll dd in 0..ND
    s$kc = coopMultiplyAdd(qt$dd, coopLoad<coop_mat16x16<f16, B>>(&Kb[($kc * 16u * KP + $dd * 16u) / 4u], KP / 4u), s$kc);
    //! end
    //! end
    // The lane's scores, scaled, hidden ones -inf (tested only in an edge block); the block's
    // maximum of each of its rows.
    //! unroll kc in 0..4
    //! unroll e in 0..8
    var x$kc$e = coop_get$e(s$kc) * scale2;
    //! end
    //! end
    if (edge_block(r0, 16u, k0, BC)) {
      //! unroll kc in 0..4
      //! unroll e in 0..8
      x$kc$e = select(x$kc$e, p.ninf, hidden1(k0 + $kc * 16u + el_col(cl, $e), select(row0, row1, $e >= 4u)));
      //! end
      //! end
    }
    var b0 = p.ninf;
    var b1 = p.ninf;
    //! unroll kc in 0..4
    b0 = max(b0, max(max(x$kc0u, x$kc1u), max(x$kc2u, x$kc3u)));
    b1 = max(b1, max(max(x$kc4u, x$kc5u), max(x$kc6u, x$kc7u)));
    //! end
    b0 = max(b0, subgroupShuffleXor(b0, 1u));
    b0 = max(b0, subgroupShuffleXor(b0, 2u));
    b1 = max(b1, subgroupShuffleXor(b1, 1u));
    b1 = max(b1, subgroupShuffleXor(b1, 2u));
    let n0 = max(m0, b0);
    let n1 = max(m1, b1);
    // A row with no visible key yet keeps m = -inf, factor 1 and weights 0 (exp2 of -inf
    // minus -inf would be NaN).
    let a0 = select(1.0, exp2(m0 - n0), n0 != p.ninf);
    let a1 = select(1.0, exp2(m1 - n1), n1 != p.ninf);
    let z0 = select(n0, 0.0, n0 == p.ninf);
    let z1 = select(n1, 0.0, n1 == p.ninf);
    m0 = n0;
    m1 = n1;
    l0 = l0 * a0;
    l1 = l1 * a1;
    //! unroll dd in 0..ND
    //! unroll e in 0..8
    ot$dd = coop_set$e(ot$dd, coop_get$e(ot$dd) * select(a0, a1, $e >= 4u));
    //! end
    //! end
    // Weights: P = exp2(x - m) as the f16 A operand of P V; dropped ones 0 (their factor
    // 1 / (1 - p) is applied once at the end), counted in the sums before dropout.
    //! unroll kc in 0..4
    var pt$kc = coop_mat16x16<f16, A>();
    //! unroll e in 0..8
    {
      let w = exp2(x$kc$e - select(z0, z1, $e >= 4u));
      if ($e < 4u) { l0 = l0 + w; } else { l1 = l1 + w; }
      let kw = select(w, 0.0, (DROP != 0u) & (attn_keep_h(select(rh0, rh1, $e >= 4u), k0 + $kc * 16u + el_col(cl, $e)) == 0.0));
      pt$kc = coop_seta$e(pt$kc, f16(kw));
    }
    //! end
    if (!split) {
      //! unroll dd in 0..ND
      ot$dd = coopMultiplyAdd(pt$kc, coopLoadT<coop_mat16x16<f16, B>>(&Vb[($kc * 16u * KP + $dd * 16u) / 4u], KP / 4u), ot$dd);
      //! end
    }
    //! end
    if (split) {
      // V goes in (Vb's last readers passed the previous block's last barrier); once every
      // subgroup is past this barrier nobody reads Kb, and the next block's K loads.
      //! unroll t in 0..ND
      put_v1(rs, 2u * $t, hr$t);
      put_v1(rs, 2u * $t + 1u, hs$t);
      //! end
      workgroupBarrier();
      //! unroll t in 0..ND
      hr$t = k_run1(rs, k0 + BC, 2u * $t);
      hs$t = k_run1(rs, k0 + BC, 2u * $t + 1u);
      //! end
      //! unroll kc in 0..4
      //! unroll dd in 0..ND
      ot$dd = coopMultiplyAdd(pt$kc, coopLoadT<coop_mat16x16<f16, B>>(&Vb[($kc * 16u * KP + $dd * 16u) / 4u], KP / 4u), ot$dd);
      //! end
      //! end
      //! unroll t in 0..ND
      put_k1(rs, 2u * $t, hr$t);
      put_k1(rs, 2u * $t + 1u, hs$t);
      //! end
    }
    // Everyone is done with Kb and Vb before the next block's runs go in.
    workgroupBarrier();
  }
  l0 = l0 + subgroupShuffleXor(l0, 1u);
  l0 = l0 + subgroupShuffleXor(l0, 2u);
  l1 = l1 + subgroupShuffleXor(l1, 1u);
  l1 = l1 + subgroupShuffleXor(l1, 2u);
  if (lane % 4u == 0u) {
    if (row0 < p.sq) { st_lse(bh * p.sq + row0, (m0 + log2(l0)) * 0.6931471805599453); }
    if (row1 < p.sq) { st_lse(bh * p.sq + row1, (m1 + log2(l1)) * 0.6931471805599453); }
  }
  // Dropout's 1 / (1 - p) for the kept weights, applied once here (P holds 0 or the weight).
  let kept = select(1.0, p.drop_scale, (DROP != 0u) & (p.drop_thr != 0u));
  let f0 = kept / l0;
  let f1 = kept / l1;
  //! unroll dd in 0..ND
  //! unroll e in 0..8
  {
    let rr = select(row0, row1, $e >= 4u);
    if (rr < p.sq) {
      st_o(ob + rr * p.o_ss + $dd * 16u + el_col(cl, $e), coop_get$e(ot$dd) * select(f0, f1, $e >= 4u));
    }
  }
  //! end
  //! end
}

//! entry bwd_q_reg(q: half, k: half vec4, v: half vec4, dout: half, lse: f32, delta: f32, dq: data mut)
//! requires spirv
//! check WG=128 DMAX=64 ND=4 KT=2 QS=64 KS=64 VS=64 GS=64 CAUSAL=0,1 DROP=0,1 HOLD=1
//! check WG=128 DMAX=128 ND=8 KT=1 QS=1152 KS=1152 VS=128 GS=384 CAUSAL=0,1 DROP=0,1 HOLD=0
// bwd_q with the element work in registers, as fwd_reg (same layout condition): subgroup s
// keeps its 16 queries' Q and dO tiles and the dQ accumulators; per block of 64 keys (K and
// V staged together in Kb, Vb) and per pair of 16-key tiles, S = Q K^T and dP = dO V^T stay
// in the accumulators, each lane forms its elements of dS = P (z dP - delta) with P =
// exp(scale S - lse) (z dropout's factor), and dS becomes the A operand of dQ += dS K
// element by element. dQ is scaled and stored by its elements. With HOLD = 1 (DMAX = 64) the
// next block's runs load into registers while this one multiplies; at 128 the accumulators
// need those registers, and each block loads and stores in one step. Workgroup memory as
// fwd_reg.
// Loops (per invocation): one per block of 64 keys, everything inside unrolled.
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let bh = ids.wid.y;
  let q0 = ids.wid.x * BR;
  let sg = ids.lid / 32u;
  let lane = ids.lid % 32u;
  let qb = head_base(bh, p.q_off, p.q_sb, p.q_sh);
  let kb = kv_base(bh, p.k_off, p.k_sb, p.k_sh);
  let vb = kv_base(bh, p.v_off, p.v_sb, p.v_sh);
  let gb = head_base(bh, p.g_off, p.g_sb, p.g_sh);
  let dqb = head_base(bh, p.dq_off, p.dq_sb, p.dq_sh);
  let qr = min(q0 + sg * 16u, p.sq - 16u);
  //! unroll dd in 0..ND
  let qt$dd = coopLoadT<coop_mat16x16<f16, A>>(&q[qb + qr * QS + $dd * 16u], QS);
  let gt$dd = coopLoadT<coop_mat16x16<f16, A>>(&dout[gb + qr * GS + $dd * 16u], GS);
  var dqt$dd = coop_mat16x16<f32, C>();
  //! end
  let kend = causal_end(q0, BR);
  let row0 = q0 + sg * 16u + lane / 4u;
  let row1 = row0 + 8u;
  let cl = 2u * (lane % 4u);
  let rh0 = attn_row(bh * p.sq + row0);
  let rh1 = attn_row(bh * p.sq + row1);
  let scale2 = p.scale * 1.4426950408889634;
  // The lane's rows' log-sum-exp (base 2) and delta.
  let ls0 = ld_lse(bh * p.sq + min(row0, p.sq - 1u)) * 1.4426950408889634;
  let ls1 = ld_lse(bh * p.sq + min(row1, p.sq - 1u)) * 1.4426950408889634;
  let dl0 = ld_delta(bh * p.sq + min(row0, p.sq - 1u));
  let dl1 = ld_delta(bh * p.sq + min(row1, p.sq - 1u));
  let pre = HOLD == 1u;
  let rs = runs(ids.lid, kb, vb);
  //! unroll t in 0..ND
  var ka$t = KvRun();
  var kz$t = KvRun();
  if (pre) {
    ka$t = kv_pair(rs, 0u, 2u * $t);
    kz$t = kv_pair(rs, 0u, 2u * $t + 1u);
  }
  //! end
  for (var k0 = 0u; k0 < kend; k0 = k0 + BC) {
    //! unroll t in 0..ND
    if (!pre) {
      ka$t = kv_pair(rs, k0, 2u * $t);
      kz$t = kv_pair(rs, k0, 2u * $t + 1u);
    }
    put_kv_pair(rs, 2u * $t, ka$t);
    put_kv_pair(rs, 2u * $t + 1u, kz$t);
    //! end
    workgroupBarrier();
    if (pre) {
      //! unroll t in 0..ND
      ka$t = kv_pair(rs, k0 + BC, 2u * $t);
      kz$t = kv_pair(rs, k0 + BC, 2u * $t + 1u);
      //! end
    }
    //! unroll h in 0..2
    //! unroll c in 0..2
    {
    var s$c = coop_mat16x16<f32, C>();
    var dp$c = coop_mat16x16<f32, C>();
    //! unroll dd in 0..ND
    s$c = coopMultiplyAdd(qt$dd, coopLoad<coop_mat16x16<f16, B>>(&Kb[((2u * $h + $c) * 16u * KP + $dd * 16u) / 4u], KP / 4u), s$c);
    dp$c = coopMultiplyAdd(gt$dd, coopLoad<coop_mat16x16<f16, B>>(&Vb[((2u * $h + $c) * 16u * KP + $dd * 16u) / 4u], KP / 4u), dp$c);
    //! end
    var ds$c = coop_mat16x16<f16, A>();
    //! unroll e in 0..8
    {
      let key = k0 + (2u * $h + $c) * 16u + el_col(cl, $e);
      let rr = select(row0, row1, $e >= 4u);
      let pw = exp2(coop_get$e(s$c) * scale2 - select(ls0, ls1, $e >= 4u));
      let z = select(1.0, attn_keep_h(select(rh0, rh1, $e >= 4u), key), DROP != 0u);
      let d = pw * (coop_get$e(dp$c) * z - select(dl0, dl1, $e >= 4u));
      ds$c = coop_seta$e(ds$c, f16(select(d, 0.0, (rr >= p.sq) | hidden1(key, rr))));
    }
    //! end
    //! unroll dd in 0..ND
    dqt$dd = coopMultiplyAdd(ds$c, coopLoadT<coop_mat16x16<f16, B>>(&Kb[((2u * $h + $c) * 16u * KP + $dd * 16u) / 4u], KP / 4u), dqt$dd);
    //! end
    }
    //! end
    //! end
    // Everyone is done with Kb and Vb before the next block's runs go in.
    workgroupBarrier();
  }
  //! unroll dd in 0..ND
  //! unroll e in 0..8
  {
    let rr = select(row0, row1, $e >= 4u);
    if (rr < p.sq) { st_dq(dqb + rr * p.dq_ss + $dd * 16u + el_col(cl, $e), coop_get$e(dqt$dd) * p.scale); }
  }
  //! end
  //! end
}

//! entry bwd_kv_reg(q: half vec4, k: half vec4, v: half vec4, dout: half vec4, lse: f32, delta: f32, dk: data mut, dv: data mut)
//! requires spirv
//! check WG=128 DMAX=64 ND=4 KT=2 QS=64 KS=64 VS=64 GS=64 CAUSAL=0,1 DROP=0,1 HOLD=1
//! check WG=128 DMAX=128 ND=8 KT=1 QS=1152 KS=1152 VS=128 GS=384 CAUSAL=0,1 DROP=0,1 HOLD=1
// bwd_kv with the element work in registers, as fwd_reg (same layout condition). Workgroup
// (x, y) = (block of 64 keys, head); subgroup s owns keys 16 s .. 16 s + 15, their K and V
// tiles as A operands and the dK, dV accumulators. Per block of 64 queries (Q, dO staged in
// Qr, Gr, pitch KP; their log-sum-exp, base 2, and delta in Lr, Dr) and per 16-query tile,
// S^T = K Q^T and dP^T = V dO^T stay in the accumulators (rows keys, columns queries), each
// lane forms its elements of P^T (with dropout's factor z: z P^T) and dS^T = P^T (z dP^T -
// delta), and those become the A operands of dV += (z P)^T dO and dK += dS^T Q element by
// element. HOLD = 1 (the host's choice at both head dimensions) holds the K and V tiles in
// registers across the loop and, at head dimension 64, loads the next block's runs while a
// block multiplies (`ahead`); with HOLD = 0 the tiles are loaded again for each pair of query
// tiles (from memory, where they stay cached). Without `ahead` each block loads and stores
// its runs in one step: at 128 the runs held ahead take 64 more registers than the kernel
// has, and run slower; V reloaded per pair instead of held, slower still
// (docs/performance.md, attention).
// Workgroup memory: 18,944 bytes at DMAX = 64, 35,328 at 128.
// Loops (per invocation): one per block of 64 queries, everything inside unrolled.
var<workgroup> Qr: array<vec4<f16>, 16u * KP>;
var<workgroup> Gr: array<vec4<f16>, 16u * KP>;
var<workgroup> Lr: array<f32, 64u>;
var<workgroup> Dr: array<f32, 64u>;

// Run i of the 64 staged rows of Q (or dO, `of_g`) from row q0 (clamped to the last row:
// those are masked). Addressed per run, not through `Runs`: at head dimension 128 this kernel
// holds 253 registers, and with `Runs` the driver spills 26 of them, which costs more than
// the addressing saves.
fn qg_run(of_g: bool, base: u32, q0: u32, i: u32) -> vec4<f16> {
  let r = min(q0 + i / (DMAX / 4u), p.sq - 1u);
  if (of_g) { return dout[(base + r * GS) / 4u + i % (DMAX / 4u)]; }
  return q[(base + r * QS) / 4u + i % (DMAX / 4u)];
}

// The 16 keys from kr of K (of V), head column tile dd, as an A operand (two functions: a
// cooperative load behind a parameter's branch would not be in uniform control flow).
fn k_a(base: u32, kr: u32, dd: u32) -> coop_mat16x16<f16, A> {
  return coopLoadT<coop_mat16x16<f16, A>>(&k[(base + kr * KS + dd * 16u) / 4u], KS / 4u);
}
fn v_a(base: u32, kr: u32, dd: u32) -> coop_mat16x16<f16, A> {
  return coopLoadT<coop_mat16x16<f16, A>>(&v[(base + kr * VS + dd * 16u) / 4u], VS / 4u);
}

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let bh = ids.wid.y;
  let k0 = ids.wid.x * BC;
  let sg = ids.lid / 32u;
  let lane = ids.lid % 32u;
  let qb = head_base(bh, p.q_off, p.q_sb, p.q_sh);
  let kb = kv_base(bh, p.k_off, p.k_sb, p.k_sh);
  let vb = kv_base(bh, p.v_off, p.v_sb, p.v_sh);
  let gb = head_base(bh, p.g_off, p.g_sb, p.g_sh);
  let dkb = head_base(bh, p.dk_off, p.dk_sb, p.dk_sh);
  let dvb = head_base(bh, p.dv_off, p.dv_sb, p.dv_sh);
  // Keys past SKV load the last (in-range) tile; they are masked and never stored.
  let kr = min(k0 + sg * 16u, p.skv - 16u);
  let pre = HOLD == 1u;
  let ahead = pre & (DMAX == 64u);
  //! unroll dd in 0..ND
  var dkt$dd = coop_mat16x16<f32, C>();
  var dvt$dd = coop_mat16x16<f32, C>();
  var ka$dd = coop_mat16x16<f16, A>();
  var va$dd = coop_mat16x16<f16, A>();
  if (pre) {
    ka$dd = k_a(kb, kr, $dd);
    va$dd = v_a(vb, kr, $dd);
  }
  //! end
  // The lane's two keys (rows of its elements) and first column.
  let key0 = k0 + sg * 16u + lane / 4u;
  let key1 = key0 + 8u;
  let cl = 2u * (lane % 4u);
  let scale2 = p.scale * 1.4426950408889634;
  let qstart = causal_start(k0, 64u);
  //! unroll t in 0..ND
  var qa$t = vec4<f16>();
  var qz$t = vec4<f16>();
  var ga$t = vec4<f16>();
  var gz$t = vec4<f16>();
  if (ahead) {
    qa$t = qg_run(false, qb, qstart, ids.lid + 2u * $t * WG);
    qz$t = qg_run(false, qb, qstart, ids.lid + (2u * $t + 1u) * WG);
    ga$t = qg_run(true, gb, qstart, ids.lid + 2u * $t * WG);
    gz$t = qg_run(true, gb, qstart, ids.lid + (2u * $t + 1u) * WG);
  }
  //! end
  for (var q0 = qstart; q0 < p.sq; q0 = q0 + 64u) {
    //! unroll t in 0..ND
    if (!ahead) {
      qa$t = qg_run(false, qb, q0, ids.lid + 2u * $t * WG);
      qz$t = qg_run(false, qb, q0, ids.lid + (2u * $t + 1u) * WG);
      ga$t = qg_run(true, gb, q0, ids.lid + 2u * $t * WG);
      gz$t = qg_run(true, gb, q0, ids.lid + (2u * $t + 1u) * WG);
    }
    {
      let i = ids.lid + 2u * $t * WG;
      let j = ids.lid + (2u * $t + 1u) * WG;
      let ai = (i / (DMAX / 4u)) * (KP / 4u) + i % (DMAX / 4u);
      let aj = (j / (DMAX / 4u)) * (KP / 4u) + j % (DMAX / 4u);
      Qr[ai] = qa$t;
      Qr[aj] = qz$t;
      Gr[ai] = ga$t;
      Gr[aj] = gz$t;
    }
    //! end
    if (ids.lid < 64u) {
      let qs = min(q0 + ids.lid, p.sq - 1u);
      Lr[ids.lid] = ld_lse(bh * p.sq + qs) * 1.4426950408889634;
      Dr[ids.lid] = ld_delta(bh * p.sq + qs);
    }
    workgroupBarrier();
    if (ahead) {
      //! unroll t in 0..ND
      qa$t = qg_run(false, qb, q0 + 64u, ids.lid + 2u * $t * WG);
      qz$t = qg_run(false, qb, q0 + 64u, ids.lid + (2u * $t + 1u) * WG);
      ga$t = qg_run(true, gb, q0 + 64u, ids.lid + 2u * $t * WG);
      gz$t = qg_run(true, gb, q0 + 64u, ids.lid + (2u * $t + 1u) * WG);
      //! end
    }
    //! unroll h in 0..2
    if (!pre) {
      //! unroll dd in 0..ND
      ka$dd = k_a(kb, kr, $dd);
      va$dd = v_a(vb, kr, $dd);
      //! end
    }
    //! unroll c in 0..2
    {
    var st$c = coop_mat16x16<f32, C>();
    var dpt$c = coop_mat16x16<f32, C>();
    //! unroll dd in 0..ND
    st$c = coopMultiplyAdd(ka$dd, coopLoad<coop_mat16x16<f16, B>>(&Qr[((2u * $h + $c) * 16u * KP + $dd * 16u) / 4u], KP / 4u), st$c);
    dpt$c = coopMultiplyAdd(va$dd, coopLoad<coop_mat16x16<f16, B>>(&Gr[((2u * $h + $c) * 16u * KP + $dd * 16u) / 4u], KP / 4u), dpt$c);
    //! end
    var pz$c = coop_mat16x16<f16, A>();
    var ds$c = coop_mat16x16<f16, A>();
    //! unroll e in 0..8
    {
      let col = (2u * $h + $c) * 16u + el_col(cl, $e);
      let qi = q0 + col;
      let kj = select(key0, key1, $e >= 4u);
      let hide = (qi >= p.sq) | hidden1(kj, qi);
      let pw = select(exp2(coop_get$e(st$c) * scale2 - Lr[col]), 0.0, hide);
      let z = select(1.0, attn_keep(bh * p.sq + qi, kj), DROP != 0u);
      pz$c = coop_seta$e(pz$c, f16(pw * z));
      ds$c = coop_seta$e(ds$c, f16(pw * (coop_get$e(dpt$c) * z - Dr[col])));
    }
    //! end
    //! unroll dd in 0..ND
    dvt$dd = coopMultiplyAdd(pz$c, coopLoadT<coop_mat16x16<f16, B>>(&Gr[((2u * $h + $c) * 16u * KP + $dd * 16u) / 4u], KP / 4u), dvt$dd);
    dkt$dd = coopMultiplyAdd(ds$c, coopLoadT<coop_mat16x16<f16, B>>(&Qr[((2u * $h + $c) * 16u * KP + $dd * 16u) / 4u], KP / 4u), dkt$dd);
    //! end
    }
    //! end
    //! end
    // Everyone is done with Qr, Gr, Lr and Dr before the next block's go in.
    workgroupBarrier();
  }
  //! unroll dd in 0..ND
  //! unroll e in 0..8
  {
    let kj = select(key0, key1, $e >= 4u);
    if (kj < p.skv) {
      st_dk(dkb + kj * p.dk_ss + $dd * 16u + el_col(cl, $e), coop_get$e(dkt$dd) * p.scale);
      st_dv(dvb + kj * p.dv_ss + $dd * 16u + el_col(cl, $e), coop_get$e(dvt$dd));
    }
  }
  //! end
  //! end
}
