// matmul.wgsl: C[b] = act(op(A)[b] x op(B)[b] + bias), tiled in workgroup memory.
//
// Shapes: op(A) is M x K, op(B) is K x N, C is M x N (row-major, contiguous per batch).
// Transposes cost nothing: A's element (m, k) is read at a_off + m*sam + k*sak and B's (k, n)
// at b_off + k*sbk + n*sbn, so a transposed operand just swaps its two strides.
// Batches: workgroup z is s * batch + b (b the batch index, s the split of K, see
// MatmulParams in common.wgsl). An operand's offset is
// off + (b % mod) * batch_stride (off places the product inside larger tensors: convolution
// runs in chunks of the batch), which covers plain batches (mod = batch), broadcasting one matrix
// over all batches (stride 0) and a weight shared across groups (grouped convolution: mod = G).
//
// Tiling: a workgroup of WG = (BM/TM) x (BN/TN) threads computes one BM x BN tile of C. Per
// step of BK along K it copies a BM x BK tile of A and a BK x BN tile of B into workgroup
// memory (transposed so both are read along k), then each thread accumulates a TM x TN block
// of outputs in registers: rows ty + i*(BM/TM), columns tx + j*(BN/TN). That strided mapping
// makes neighbouring threads read neighbouring workgroup-memory words (no bank conflicts) and
// write neighbouring columns of C (coalesced).
// Loads follow the operand's contiguous axis (a_kfast / b_nfast), so global reads coalesce
// whether or not the operand is transposed.
//
// Bounds: any M, N, K. Tile loads past M, N or K store 0 in workgroup memory (so the
// products they join add nothing); stores past M or N are skipped. Every thread reaches every
// barrier: the K loop bound is uniform and no thread returns early.
//
// Epilogue: + bias[n] when has_bias, then act (ACT_NONE, ACT_RELU, ACT_GELU (erf form)),
// stored as C's dtype; or the raw f32 sum when this pass is one split of K. Accumulation is
// always f32.
//
//   main     the product (one split of K per workgroup z).
//   simt     the same product for CPU adapters (lavapipe): no workgroup memory and no
//            barriers, which a CPU driver runs as coroutine switches. A workgroup of 64
//            invocations covers 8 TM x 8 TN outputs; invocation (ty, tx) = (lid / 8, lid % 8)
//            keeps rows m0 + ty TM + i and columns n0 + tx + 8 j in registers and reads its
//            operands straight from memory: the 8 lanes of one SIMD vector share ty, so their
//            A reads are one address, and their B reads are 8 neighbouring columns. The
//            register loops are unrolled by the composer: an accumulator array indexed with
//            run-time indices anywhere (even in the final store) lives in memory on lavapipe.
//   simt_n4  simt with B read 4 columns at a time (B contiguous along N, N and B's offsets
//            multiples of 4): invocation (ty, tx) keeps 8 rows and columns
//            n0 + 4 (tx + 8 j) .. + 3 for j < TN4, TM rows: an 8 TM x 32 TN4 tile per
//            workgroup. On lavapipe the 16-byte loads and the 8 x 8 register tile ran at three
//            times simt's rate.
//   simt_k4  simt with both operands contiguous along K (x W^T, as Linear computes), K and the
//            offsets multiples of 4: 4-element runs of A's rows and B's columns per load,
//            multiplied elementwise into vec4 partial sums summed at the end; TM x TN outputs
//            per invocation (rows m0 + i, columns n0 + 8 j), an 8 TM x 8 TN tile.
//   reg      128 x 128 tiles with 8 x 8 outputs per thread in named vec4 registers, read
//            from workgroup memory as vec4s (see the entry): the GPU kernel for f32.
//   splitk   one thread per element of C: the sum of the splits' partials, then the epilogue.
//            With RS = 1 (a weight gradient's product that also summed op(A)'s rows,
//            matmul_wide.wgsl RSUM) M more threads sum the row sums' partials (`rpart`, M
//            f32 a split) into `sums` from p.sum_off: one launch where the two sums took two
//            (24 of a GPT step's launches).
//
// Bindings: signature lines (bias is a dummy when has_bias is 0).
// Constants: BM, BN, BK, TM, TN.
// Loops (per invocation): main runs (BM BK / WG + 1) + (BN BK / WG + 1) + BK + 2 counted
// iterations per BK of its K range (the tile loads and the k loop; the TM x TN loops have
// constant trip counts); the host sizes kchunk so the total stays in the loop budget.
// splitk runs `splits` + 1.
// Constants of splitk: RS (0/1).

// The parameter block shared with the other matmul kernel (common.wgsl).
alias Params = MatmulParams;



//! entry main(a: data, b: data, bias: data, c: data mut)
//! check WG=256 BM=64 BN=64 BK=16 TM=4 TN=4
//! check WG=64 BM=32 BN=32 BK=16 TM=2 TN=2
//! check WG=256 BM=128 BN=128 BK=8 TM=8 TN=8
const TX: u32 = BN / TN;
const TY: u32 = BM / TM;

var<workgroup> As: array<f32, BK * BM>;
var<workgroup> Bs: array<f32, BK * BN>;

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let lid = ids.lid;
  let tx = lid % TX;
  let ty = lid / TX;
  let bt = ids.wid.z % p.batch;
  let bb = matmul_bias_base(bt);
  let kr = matmul_krange(ids.wid.z);
  let m0 = ids.wid.y * BM;
  let n0 = ids.wid.x * BN;
  let a_base = p.a_off + (bt % p.a_mod) * p.a_bs;
  let b_base = p.b_off + (bt % p.b_mod) * p.b_bs;

  var acc: array<f32, TM * TN>;
  for (var i = 0u; i < TM * TN; i = i + 1u) { acc[i] = 0.0; }

  for (var k0 = kr.x; k0 < kr.y; k0 = k0 + BK) {
    for (var e = lid; e < BM * BK; e = e + WG) {
      var mm: u32;
      var kk: u32;
      if (p.a_kfast != 0u) { mm = e / BK; kk = e % BK; } else { kk = e / BM; mm = e % BM; }
      let v = matmul_a(a_base, m0 + mm, k0 + kk, kr.y);
      As[kk * BM + mm] = v;
    }
    for (var e = lid; e < BN * BK; e = e + WG) {
      var nn: u32;
      var kk: u32;
      if (p.b_nfast != 0u) { kk = e / BN; nn = e % BN; } else { nn = e / BK; kk = e % BK; }
      let v = matmul_b(b_base, k0 + kk, n0 + nn, kr.y);
      Bs[kk * BN + nn] = v;
    }
    workgroupBarrier();
    for (var kk = 0u; kk < BK; kk = kk + 1u) {
      var ra: array<f32, TM>;
      var rb: array<f32, TN>;
      for (var i = 0u; i < TM; i = i + 1u) { ra[i] = As[kk * BM + ty + i * TY]; }
      for (var j = 0u; j < TN; j = j + 1u) { rb[j] = Bs[kk * BN + tx + j * TX]; }
      for (var i = 0u; i < TM; i = i + 1u) {
        for (var j = 0u; j < TN; j = j + 1u) {
          acc[i * TN + j] = fma(ra[i], rb[j], acc[i * TN + j]);
        }
      }
    }
    workgroupBarrier();
  }

  let c_base = p.c_off + ids.wid.z * p.m * p.n;
  for (var i = 0u; i < TM; i = i + 1u) {
    let gm = m0 + ty + i * TY;
    for (var j = 0u; j < TN; j = j + 1u) {
      let gn = n0 + tx + j * TX;
      if (gm < p.m && gn < p.n) {
        st_c(c_base + gm * p.n + gn, matmul_epilogue(acc[i * TN + j], gm, gn, bb));
      }
    }
  }
}

//! entry reg(a: data vec4, b: data vec4, bias: data, c: data mut)
//! prefers spirv
//! check WG=256 FUSE=0,5 GATHER=0,1,2 RM=64,128 RN=128
//! check WG=256 FUSE=0,5 GATHER=0,1,2 RM=64 RN=256
// 128 x 128 tiles for GPUs without tensor cores for the dtype (f32 products everywhere): 16 x 16
// threads, each holding 8 x 8 outputs in 16 named vec4 registers (rows 4 ty + i and
// 64 + 4 ty + i, columns 4 tx + 0..3 and 64 + 4 tx + 0..3). Per step of RBK = 16 along K the
// workgroup stages a 16 x 128 slice of each operand in workgroup memory as vec4s along M (A)
// and N (B), so a thread's step of k reads four 16-byte words and does 64 multiply-adds with
// them (`main` reads two scalars for every multiply-add). Columns split into halves 64 apart
// keep a subgroup's reads on distinct banks.
// Loads: threads 0..127 fetch A's slice, 128..255 B's, each a 4 x 4 block as four 16-byte
// loads along the operand's contiguous axis; a block whose contiguous axis is K is transposed
// in registers, so every workgroup-memory store is a whole vec4. The host takes this kernel
// only where every offset, pitch and contiguous extent is a multiple of 4 (aligned 16-byte
// loads), so a block is wholly inside the matrix or wholly outside (then zeros; `reg_blocks`).
// Each step loads its blocks at its top, not a step ahead into registers: the 16 registers
// a prefetch holds across the inner loop kept the driver at its 128-register cap, where it
// spent moves shuffling accumulators (read in the machine code); without them it uses about
// 108 and runs faster (the other workgroup on each core, presumably, multiplies while one
// waits for its loads; docs/performance.md, matmul).
// The epilogue choice is the constant FUSE (common.wgsl `matmul_fused`).
// Products with M <= 64 (such as a convolution's output channels) take tiles of RM = 64 rows,
// in one of two shapes (the host's choice, kernels/matmul.rs `out_tile`): RN = 256 keeps the
// 8 x 8 outputs a thread (rows 4 ty + i and 32 + 4 ty + i, columns 4 tx + 0..3 and 128 +
// 4 tx + 0..3, 32 threads along N), so a step of k still reads four 16-byte words for 64
// multiply-adds; each thread stages one of B's 256 blocks and one run of A's slice. RN = 128
// keeps the layout of 128 x 128: the rows 64 .. 127 are not multiplied, their blocks stage
// zeros, and a step of k does 32 multiply-adds for three reads.
// GATHER = 1 makes the product an implicit convolution: op(B) is not read from a matrix but
// gathered from an NCHW image, so no column matrix is ever written. B's runs of 4 are then
// along the output positions, and a thread's loads share one of their two halves across
// the whole K loop: a forward product's thread always loads the same 4 positions (N) for
// new taps (K), a weight gradient's the same 4 taps (N) at new positions (K). That half is
// worked out once before the loop (`reg_gather_setup`); per step only the other needs a
// division (`conv_fwd4`, `conv_wgt4`).
// GATHER = 2 gathers from a channels-last image instead (`conv_cl4`): 16-byte runs of 4
// channels, one load and one bounds test where the planar image takes four of each.
// `prefers spirv`: on Vulkan wgrad compiles it itself and asks for its loops to stay rolled
// (kernels/spirv.rs), which makes it faster; the f32 attention kernels, tried the same way,
// do not gain.
// The slices are indexed [k][column], not flat: the bounds clamp (naga's, on every index)
// then falls on k once a step of the inner loop instead of on each of its four reads, and
// NVIDIA's driver pads the rows (528-byte stride); both make the products faster
// (docs/performance.md, matmul).
const RBK: u32 = 16u;
// Threads along N and along M, the distance between a thread's two groups of 4 rows, and
// whether the second group is multiplied (not with RM = 64, RN = 128).
const TXN: u32 = RN / 8u;
const TYM: u32 = 256u / TXN;
const HI: bool = 4u * TYM < RM;
var<workgroup> Ar: array<array<vec4<f32>, 8u * TYM / 4u>, RBK>;
var<workgroup> Br: array<array<vec4<f32>, RN / 4u>, RBK>;

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let lid = ids.lid;
  let tx = lid % TXN;
  let ty = lid / TXN;
  let bt = ids.wid.z % p.batch;
  let bb = matmul_bias_base(bt);
  let kr = matmul_krange(ids.wid.z);
  let m0 = ids.wid.y * RM;
  let n0 = ids.wid.x * RN;
  let a_base = p.a_off + (bt % p.a_mod) * p.a_bs;
  let b_base = p.b_off + (bt % p.b_mod) * p.b_bs;
  // The block this thread stages: with RN = 128 threads 0 .. 127 A's, the rest B's; with
  // RN = 256 every thread one of B's, and one run of 4 of A's (`reg_a_run`).
  let two = RN == 256u;
  let s = reg_slot(!two && lid < 128u, select(lid % 128u, lid, two), m0, n0, a_base, b_base);
  var g = GatherSetup(vec4<i32>(0), vec4<i32>(0), vec4<u32>(0));
  if (GATHER != 0u && !s.is_a) { g = reg_gather_setup(s.base, gathers_forward(s), s.t0); }
  //! unroll i in 0..8
  var lo$i = vec4<f32>(0.0);
  var hi$i = vec4<f32>(0.0);
  //! end
  for (var k0 = kr.x; k0 < kr.y; k0 = k0 + RBK) {
    let r = reg_fetch(s, k0, kr.y, g);
    if (two) { reg_a_put(lid, reg_a_run(lid, m0, a_base, k0, kr.y)); }
    reg_stage(s, r);
    workgroupBarrier();
    for (var kk = 0u; kk < RBK; kk = kk + 1u) {
      let a0 = Ar[kk][ty];
      let b0 = Br[kk][tx];
      let b1 = Br[kk][TXN + tx];
      lo0u = fma(vec4<f32>(a0.x), b0, lo0u);
      hi0u = fma(vec4<f32>(a0.x), b1, hi0u);
      lo1u = fma(vec4<f32>(a0.y), b0, lo1u);
      hi1u = fma(vec4<f32>(a0.y), b1, hi1u);
      lo2u = fma(vec4<f32>(a0.z), b0, lo2u);
      hi2u = fma(vec4<f32>(a0.z), b1, hi2u);
      lo3u = fma(vec4<f32>(a0.w), b0, lo3u);
      hi3u = fma(vec4<f32>(a0.w), b1, hi3u);
      if (!HI) { continue; }
      let a1 = Ar[kk][TYM + ty];
      lo4u = fma(vec4<f32>(a1.x), b0, lo4u);
      hi4u = fma(vec4<f32>(a1.x), b1, hi4u);
      lo5u = fma(vec4<f32>(a1.y), b0, lo5u);
      hi5u = fma(vec4<f32>(a1.y), b1, hi5u);
      lo6u = fma(vec4<f32>(a1.z), b0, lo6u);
      hi6u = fma(vec4<f32>(a1.z), b1, hi6u);
      lo7u = fma(vec4<f32>(a1.w), b0, lo7u);
      hi7u = fma(vec4<f32>(a1.w), b1, hi7u);
    }
    workgroupBarrier();
  }
  let c_base = p.c_off + ids.wid.z * p.m * p.n;
  //! unroll i in 0..8
  if ($i < 4u || HI) {
    reg_store(c_base, m0 + ($i / 4u) * 4u * TYM + 4u * ty + $i % 4u, n0 + 4u * tx, lo$i, bb);
    reg_store(c_base, m0 + ($i / 4u) * 4u * TYM + 4u * ty + $i % 4u, n0 + RN / 2u + 4u * tx, hi$i, bb);
  }
  //! end
}

// A 4 x 4 block of an operand's slice that a thread stages each step: which operand, whether
// the tile's axis (M or N) is the contiguous one, q numbering 4-wide groups along that axis
// and kq along K, the matrix's base, the tile position t0 = 4 q past the tile's corner, and
// whether it lies in the tile (with RM = 64 and RN = 128, A's blocks of rows 64 .. 127 do
// not, and load nothing).
struct Slot {
  is_a: bool,
  fast: bool,
  q: u32,
  kq: u32,
  base: u32,
  t0: u32,
  live: bool,
}

// Block u of A's slice (0 .. 127, RN = 128 only) or B's (0 .. RN - 1): a slice RBK x
// extent holds extent / 4 groups along the tile's axis and 4 along K.
fn reg_slot(is_a: bool, u: u32, m0: u32, n0: u32, a_base: u32, b_base: u32) -> Slot {
  let fast = select(p.b_nfast != 0u, p.a_kfast == 0u, is_a);
  let groups = select(RN, 128u, is_a) / 4u;
  let q = select(u / 4u, u % groups, fast);
  let kq = select(u % 4u, u / groups, fast);
  let t0 = select(n0, m0, is_a) + 4u * q;
  return Slot(is_a, fast, q, kq, select(b_base, a_base, is_a), t0, !is_a || 4u * q < RM);
}

// The slot's block for the step at k0: gathered from the image (B of an implicit
// convolution) or read from the matrix.
fn reg_fetch(s: Slot, k0: u32, kend: u32, g: GatherSetup) -> array<vec4<f32>, 4> {
  if (GATHER == 2u && !s.is_a) {
    return conv_cl4(gathers_forward(s), s.base, k0 + 4u * s.kq, kend, g);
  }
  if (GATHER != 0u && !s.is_a) {
    let m = reg_gather(s.fast, s.base, k0 + 4u * s.kq, kend, g);
    return array<vec4<f32>, 4>(m[0], m[1], m[2], m[3]);
  }
  return reg_blocks(s.is_a, s.fast, s.live, s.base, s.t0, k0 + 4u * s.kq, kend);
}

// Stores a fetched block into the slices as whole vec4s along the tile's axis (transposed in
// registers where the operand is contiguous along K).
fn reg_stage(s: Slot, r: array<vec4<f32>, 4>) {
  if (s.fast) {
    //! unroll i in 0..4
    reg_put(s.is_a, 4u * s.kq + $i, s.q, r[$i]);
    //! end
  } else {
    reg_put(s.is_a, 4u * s.kq, s.q, vec4<f32>(r[0].x, r[1].x, r[2].x, r[3].x));
    reg_put(s.is_a, 4u * s.kq + 1u, s.q, vec4<f32>(r[0].y, r[1].y, r[2].y, r[3].y));
    reg_put(s.is_a, 4u * s.kq + 2u, s.q, vec4<f32>(r[0].z, r[1].z, r[2].z, r[3].z));
    reg_put(s.is_a, 4u * s.kq + 3u, s.q, vec4<f32>(r[0].w, r[1].w, r[2].w, r[3].w));
  }
}

// A thread's 4 x 4 block: vector i holds four elements along the operand's contiguous axis,
// starting at tile position t (M for A, N for B; t + i when that axis is K) and k (k + i when
// the tile's axis is the contiguous one). The host takes this kernel only where every
// contiguous extent, pitch and offset is a multiple of 4, and a split of K ends at a multiple
// of RBK, so a run lies wholly inside or outside the matrix: one test of its last element
// decides. No load sits under a branch of its own: a run outside reads index 0 and the
// select zeroes it. (A branch per load, even with a fallback that never runs, makes the
// product slower.)
fn reg_blocks(is_a: bool, tile_fast: bool, live: bool, base: u32, t: u32, k: u32, kend: u32) -> array<vec4<f32>, 4> {
  let ext = select(p.n, p.m, is_a);
  let st = select(p.sbn, p.sam, is_a);
  let sk = select(p.sbk, p.sak, is_a);
  // Along the contiguous axis a run spans 3 more positions.
  let t3 = select(0u, 3u, tile_fast);
  let k3 = 3u - t3;
  //! unroll i in 0..4
  let tt$i = select(t + $i, t, tile_fast);
  let kk$i = select(k, k + $i, tile_fast);
  let ok$i = live && tt$i + t3 < ext && kk$i + k3 < kend;
  let j$i = select(0u, (base + tt$i * st + kk$i * sk) / 4u, ok$i);
  //! end
  var v: array<vec4<f32>, 4>;
  if (is_a) {
    //! unroll i in 0..4
    v[$i] = ld4_a(j$i);
    //! end
  } else {
    //! unroll i in 0..4
    v[$i] = ld4_b(j$i);
    //! end
  }
  //! unroll i in 0..4
  v[$i] = select(vec4<f32>(0.0), v[$i], ok$i);
  //! end
  return v;
}

// An implicit convolution reads B = col (forward: col[kc, pos], runs along the positions
// N) or B = col^T (weight gradient: col[kc, pos] at (k, n) = (pos, kc), runs along the
// positions K) of the image at `base` (one image's channels of a group, [C, H, W]): kc =
// (c, ki, kj) is a channel and kernel tap, pos = (oh, ow) an output position, and the element
// is x[c, oh SH - PH + ki DH, ow SW - PW + kj DW], zero where that falls in the padding (or,
// for a mirrored window, the same with taps KH - 1 - ki and KW - 1 - kj: the host's
// `im_ph` .. `im_dw`).
// Positions run on across output rows, so the output width needs no alignment.
//
// The half of a thread's gathers fixed for the whole K loop: the input row and column where
// each of its 4 positions' window starts (forward), or each of its 4 taps' plane offset and
// offsets into the window (weight gradient). A position or tap past the matrix gets a row
// far below zero, which every load then reads as padding.
struct GatherSetup {
  ih: vec4<i32>,
  iw: vec4<i32>,
  plane: vec4<u32>,
}

const FAR: i32 = -1073741824;

// Whether slot `s` (B's) gathers a forward product's col rather than a weight gradient's
// col^T. A planar col is contiguous along the positions, a forward's N; a channels-last one
// along (tap, channel), a forward's K.
fn gathers_forward(s: Slot) -> bool {
  return s.fast == (GATHER == 1u);
}

fn reg_gather_setup(base: u32, forward: bool, t0: u32) -> GatherSetup {
  var g = GatherSetup(vec4<i32>(0), vec4<i32>(0), vec4<u32>(0));
  if (GATHER == 2u && !forward) {
    // Channels last, weight gradient: the thread's 4 columns t0 .. t0 + 3 are one tap's
    // channels, `plane.x` the first.
    let cn = p.n / p.im_kk;
    let tap = t0 / cn;
    let ki = tap / p.im_kw;
    g.plane.x = t0 - tap * cn;
    g.ih.x = select(FAR, i32(ki) * p.im_dh + p.im_ph, t0 < p.n);
    g.iw.x = i32(tap - ki * p.im_kw) * p.im_dw + p.im_pw;
    return g;
  }
  if (forward) {
    var oh = t0 / p.im_wo;
    var ow = t0 - oh * p.im_wo;
    //! unroll j in 0..4
    g.ih[$j] = select(FAR, i32(oh * p.im_sh) + p.im_ph, t0 + $j < p.n);
    g.iw[$j] = i32(ow * p.im_sw) + p.im_pw;
    ow = ow + 1u;
    if (ow == p.im_wo) { ow = 0u; oh = oh + 1u; }
    //! end
  } else {
    //! unroll j in 0..4
    {
      let kc = t0 + $j;
      let c = kc / p.im_kk;
      let tap = kc - c * p.im_kk;
      let ki = tap / p.im_kw;
      g.plane[$j] = base + c * p.im_h * p.im_w;
      g.ih[$j] = select(FAR, i32(ki) * p.im_dh + p.im_ph, kc < p.n);
      g.iw[$j] = i32(tap - ki * p.im_kw) * p.im_dw + p.im_pw;
    }
    //! end
  }
  return g;
}

// x at input row ih, column iw of the plane at `plane`, or 0 in the padding.
fn conv_tap(plane: u32, ih: i32, iw: i32) -> f32 {
  if (ih >= 0 && iw >= 0 && u32(ih) < p.im_h && u32(iw) < p.im_w) {
    return ld_b(plane + u32(ih) * p.im_w + u32(iw));
  }
  return 0.0;
}

// A thread's 4 runs of B for the step at k (column i of the result is run i).
fn reg_gather(forward: bool, base: u32, k: u32, kend: u32, g: GatherSetup) -> mat4x4<f32> {
  if (forward) { return conv_fwd4(base, k, kend, g); }
  return conv_wgt4(k, kend, g);
}

// Forward: taps kc0 .. kc0 + 3 (run i is tap kc0 + i at the thread's 4 positions); one
// division pair for the first tap, the rest by stepping (kj, then ki, then c).
fn conv_fwd4(base: u32, kc0: u32, kend: u32, g: GatherSetup) -> mat4x4<f32> {
  var m = mat4x4<f32>();
  var c = kc0 / p.im_kk;
  let tap = kc0 - c * p.im_kk;
  var ki = tap / p.im_kw;
  var kj = tap - ki * p.im_kw;
  //! unroll i in 0..4
  if (kc0 + $i < kend) {
    let plane = base + c * p.im_h * p.im_w;
    let ih = g.ih + vec4<i32>(i32(ki) * p.im_dh);
    let iw = g.iw + vec4<i32>(i32(kj) * p.im_dw);
    m[$i] = vec4<f32>(conv_tap(plane, ih.x, iw.x), conv_tap(plane, ih.y, iw.y),
                      conv_tap(plane, ih.z, iw.z), conv_tap(plane, ih.w, iw.w));
  }
  kj = kj + 1u;
  if (kj == p.im_kw) {
    kj = 0u;
    ki = ki + 1u;
    if (ki * p.im_kw == p.im_kk) { ki = 0u; c = c + 1u; }
  }
  //! end
  return m;
}

// Weight gradient: positions pos0 .. pos0 + 3 (element j of every run) of the thread's 4
// taps; one division for the first position.
fn conv_wgt4(pos0: u32, kend: u32, g: GatherSetup) -> mat4x4<f32> {
  var m = mat4x4<f32>();
  var oh = pos0 / p.im_wo;
  var ow = pos0 - oh * p.im_wo;
  //! unroll j in 0..4
  if (pos0 + $j < kend) {
    let ih = g.ih + vec4<i32>(i32(oh * p.im_sh));
    let iw = g.iw + vec4<i32>(i32(ow * p.im_sw));
    m[0][$j] = conv_tap(g.plane.x, ih.x, iw.x);
    m[1][$j] = conv_tap(g.plane.y, ih.y, iw.y);
    m[2][$j] = conv_tap(g.plane.z, ih.z, iw.z);
    m[3][$j] = conv_tap(g.plane.w, ih.w, iw.w);
  }
  ow = ow + 1u;
  if (ow == p.im_wo) { ow = 0u; oh = oh + 1u; }
  //! end
  return m;
}

// A thread's block from a channels-last image (GATHER = 2, [H, W, C] at `base`, C a
// multiple of 4, K or N ordered (tap, channel)): run j is 4 channels of one pixel. Forward:
// K = k .. k + 3 is one tap's 4 channels for all of the thread's 4 positions (run j at
// position j), so a step costs one division pair. Weight gradient: the thread's 4 columns
// are one tap's 4 channels (`reg_gather_setup`), run j at position k + j. Zero in the
// padding and past `kend`; the caller transposes a forward's runs (they lie along K).
fn conv_cl4(forward: bool, base: u32, k: u32, kend: u32, g: GatherSetup) -> array<vec4<f32>, 4> {
  let cn = select(p.n, p.k, forward) / p.im_kk;
  var ih = g.ih;
  var iw = g.iw;
  var ok = vec4<bool>(k < kend);
  var ch = g.plane.x;
  if (forward) {
    let tap = k / cn;
    let ki = tap / p.im_kw;
    ch = k - tap * cn;
    ih = g.ih + vec4<i32>(i32(ki) * p.im_dh);
    iw = g.iw + vec4<i32>(i32(tap - ki * p.im_kw) * p.im_dw);
  } else {
    var oh = k / p.im_wo;
    var ow = k - oh * p.im_wo;
    //! unroll j in 0..4
    ih[$j] = g.ih.x + i32(oh * p.im_sh);
    iw[$j] = g.iw.x + i32(ow * p.im_sw);
    ok[$j] = k + $j < kend;
    ow = ow + 1u;
    if (ow == p.im_wo) { ow = 0u; oh = oh + 1u; }
    //! end
  }
  var v: array<vec4<f32>, 4>;
  //! unroll j in 0..4
  let in$j = ok[$j] && u32(ih[$j]) < p.im_h && u32(iw[$j]) < p.im_w;
  let at$j = select(0u, (base + (u32(ih[$j]) * p.im_w + u32(iw[$j])) * cn + ch) / 4u, in$j);
  v[$j] = select(vec4<f32>(0.0), ld4_b(at$j), in$j);
  //! end
  return v;
}

// With RN = 256, run t (0 .. 255) of A's 16 x 64 slice for the step at k0: along K (row
// t / 4, K group t % 4) where A is contiguous along K, else along M (K row t / 16, M group
// t % 16); zero outside the matrix or the K range (runs lie wholly inside or outside, as in
// `reg_blocks`). One run a thread instead of a 4 x 4 block for a quarter of them: a second
// block in flight beside B's took registers the kernel does not have.
fn reg_a_run(t: u32, m0: u32, base: u32, k0: u32, kend: u32) -> vec4<f32> {
  let kfast = p.a_kfast != 0u;
  let m = m0 + select(4u * (t % 16u), t / 4u, kfast);
  let k = k0 + select(t / 16u, 4u * (t % 4u), kfast);
  let ok = select(m + 3u < p.m && k < kend, m < p.m && k + 3u < kend, kfast);
  let v = ld4_a(select(0u, (base + m * p.sam + k * p.sak) / 4u, ok));
  return select(vec4<f32>(0.0), v, ok);
}

// Stores run t of `reg_a_run` into A's slice (a run along K goes in element by element).
fn reg_a_put(t: u32, v: vec4<f32>) {
  if (p.a_kfast != 0u) {
    let m = t / 4u;
    let k = 4u * (t % 4u);
    //! unroll i in 0..4
    Ar[k + $i][m / 4u][m % 4u] = v[$i];
    //! end
  } else {
    Ar[t / 16u][t % 16u] = v;
  }
}

fn reg_put(is_a: bool, k: u32, at: u32, v: vec4<f32>) {
  if (is_a) { Ar[k][at] = v; } else { Br[k][at] = v; }
}

// Four outputs of `reg` at row gm, columns gn .. gn + 3, those inside C.
fn reg_store(c_base: u32, gm: u32, gn: u32, v: vec4<f32>, bb: u32) {
  if (gm >= p.m) { return; }
  for (var j = 0u; j < 4u; j = j + 1u) {
    if (gn + j < p.n) { st_c(c_base + gm * p.n + gn + j, matmul_fused(v[j], gm, gn + j, bb)); }
  }
}

//! entry simt(a: data, b: data, bias: data, c: data mut)
//! check WG=64 TM=4 TN=4 EPI=0,1
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let tx = ids.lid % 8u;
  let ty = ids.lid / 8u;
  let bt = ids.wid.z % p.batch;
  let bb = matmul_bias_base(bt);
  let kr = matmul_krange(ids.wid.z);
  let m0 = ids.wid.y * (8u * TM) + ty * TM;
  let n0 = ids.wid.x * (8u * TN) + tx;
  let a_base = p.a_off + (bt % p.a_mod) * p.a_bs;
  let b_base = p.b_off + (bt % p.b_mod) * p.b_bs;
  // Rows and columns past the edge are clamped to row / column 0: they compute row 0's (or
  // column 0's) values and store exactly those values there again, so every load and store
  // stays unconditional (see simt_store).
  var rows: array<u32, TM>;
  var cols: array<u32, TN>;
  var acc: array<f32, TM * TN>;
  //! unroll i in 0..TM
  rows[$i] = select(0u, m0 + $i, m0 + $i < p.m);
  //! end
  //! unroll j in 0..TN
  cols[$j] = select(0u, n0 + 8u * $j, n0 + 8u * $j < p.n);
  //! end
  //! unroll i in 0..TM
  //! unroll j in 0..TN
  acc[$i * TN + $j] = 0.0;
  //! end
  //! end
  for (var k = kr.x; k < kr.y; k = k + 1u) {
    //! unroll i in 0..TM
    let a$i = ld_a(a_base + rows[$i] * p.sam + k * p.sak);
    //! end
    //! unroll j in 0..TN
    let b$j = ld_b(b_base + k * p.sbk + cols[$j] * p.sbn);
    //! end
    //! unroll i in 0..TM
    //! unroll j in 0..TN
    acc[$i * TN + $j] = fma(a$i, b$j, acc[$i * TN + $j]);
    //! end
    //! end
  }
  let c_base = p.c_off + ids.wid.z * p.m * p.n;
  //! unroll i in 0..TM
  //! unroll j in 0..TN
  st_c(c_base + rows[$i] * p.n + cols[$j], simt_out(acc[$i * TN + $j], rows[$i], cols[$j], bb));
  //! end
  //! end
}

//! entry simt_n4(a: data vec4, b: data vec4, bias: data, c: data mut)
//! check WG=64 TM=8 TN4=2 EPI=0,1
//! check WG=64 TM=4 TN4=2 EPI=0,1
//! check WG=64 TM=2 TN4=1 EPI=0,1
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let tx = ids.lid % 8u;
  let ty = ids.lid / 8u;
  let bt = ids.wid.z % p.batch;
  let bb = matmul_bias_base(bt);
  let kr = matmul_krange(ids.wid.z);
  let m0 = ids.wid.y * (8u * TM) + ty * TM;
  let n0 = ids.wid.x * (32u * TN4) + 4u * tx;
  let a_base = p.a_off + (bt % p.a_mod) * p.a_bs;
  let b_base = p.b_off + (bt % p.b_mod) * p.b_bs;
  // Edge rows and column groups are clamped as in simt.
  var rows: array<u32, TM>;
  var cols: array<u32, TN4>;
  var acc: array<vec4<f32>, TM * TN4>;
  //! unroll i in 0..TM
  rows[$i] = select(0u, m0 + $i, m0 + $i < p.m);
  //! end
  //! unroll j in 0..TN4
  cols[$j] = select(0u, n0 + 32u * $j, n0 + 32u * $j < p.n);
  //! end
  //! unroll i in 0..TM
  //! unroll j in 0..TN4
  acc[$i * TN4 + $j] = vec4<f32>(0.0);
  //! end
  //! end
  for (var k = kr.x; k < kr.y; k = k + 1u) {
    let brow = b_base + k * p.sbk;
    //! unroll j in 0..TN4
    let b$j = ld4_b((brow + cols[$j]) >> 2u);
    //! end
    //! unroll i in 0..TM
    let a$i = vec4<f32>(ld_a(a_base + rows[$i] * p.sam + k * p.sak));
    //! unroll j in 0..TN4
    acc[$i * TN4 + $j] = fma(a$i, b$j, acc[$i * TN4 + $j]);
    //! end
    //! end
  }
  let c_base = p.c_off + ids.wid.z * p.m * p.n;
  //! unroll i in 0..TM
  //! unroll j in 0..TN4
  simt_store4(c_base + rows[$i] * p.n + cols[$j], rows[$i], cols[$j], bb, acc[$i * TN4 + $j]);
  //! end
  //! end
}

//! entry simt_k4(a: data vec4, b: data vec4, bias: data, c: data mut)
//! check WG=64 TM=4 TN=4 EPI=0,1
//! check WG=64 TM=2 TN=2 EPI=0,1
//! check WG=64 TM=1 TN=4 EPI=0,1
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let tx = ids.lid % 8u;
  let ty = ids.lid / 8u;
  let bt = ids.wid.z % p.batch;
  let bb = matmul_bias_base(bt);
  let kr = matmul_krange(ids.wid.z);
  let m0 = ids.wid.y * (8u * TM) + ty * TM;
  let n0 = ids.wid.x * (8u * TN) + tx;
  let a_base = p.a_off + (bt % p.a_mod) * p.a_bs;
  let b_base = p.b_off + (bt % p.b_mod) * p.b_bs;
  var rows: array<u32, TM>;
  var cols: array<u32, TN>;
  var acc: array<vec4<f32>, TM * TN>;
  //! unroll i in 0..TM
  rows[$i] = select(0u, m0 + $i, m0 + $i < p.m);
  //! end
  //! unroll j in 0..TN
  cols[$j] = select(0u, n0 + 8u * $j, n0 + 8u * $j < p.n);
  //! end
  //! unroll i in 0..TM
  //! unroll j in 0..TN
  acc[$i * TN + $j] = vec4<f32>(0.0);
  //! end
  //! end
  for (var k = kr.x; k < kr.y; k = k + 4u) {
    //! unroll i in 0..TM
    let a$i = ld4_a((a_base + rows[$i] * p.sam + k) >> 2u);
    //! end
    //! unroll j in 0..TN
    let b$j = ld4_b((b_base + cols[$j] * p.sbn + k) >> 2u);
    //! end
    //! unroll i in 0..TM
    //! unroll j in 0..TN
    acc[$i * TN + $j] = fma(a$i, b$j, acc[$i * TN + $j]);
    //! end
    //! end
  }
  let c_base = p.c_off + ids.wid.z * p.m * p.n;
  //! unroll i in 0..TM
  //! unroll j in 0..TN
  st_c(c_base + rows[$i] * p.n + cols[$j], simt_out(dot(acc[$i * TN + $j], vec4<f32>(1.0)), rows[$i], cols[$j], bb));
  //! end
  //! end
}

//! entry splitk(part: f32, bias: data, c: data mut, rpart: f32, sums: data mut)
//! check WG=256 RS=0,1
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  let total = p.batch * p.m * p.n;
  if (i >= total) {
    let j = i - total;
    if (RS == 0u || j >= p.m) { return; }
    var r = 0.0;
    for (var s = 0u; s < p.splits; s = s + 1u) { r = r + ld_rpart(s * p.m + j); }
    st_sums(p.sum_off + j, r);
    return;
  }
  var acc = 0.0;
  for (var s = 0u; s < p.splits; s = s + 1u) { acc = acc + ld_part(s * total + i); }
  let mn = udivmod(i, p.m * p.n);
  let rc = udivmod(mn.y, p.n);
  st_c(p.c_off + i, matmul_epilogue(acc, rc.x, rc.y, matmul_bias_base(mn.x)));
}
