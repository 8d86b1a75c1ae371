// matmul_wide.wgsl: C[b] = act(op(A)[b] x op(B)[b] + bias) on cooperative matrices (tensor
// cores): the f16 product on adapters that take wgrad's own SPIR-V (kernels/spirv.rs,
// `Caps::spirv`), and the bf16 one where the device has bf16 matrices (the same kernel, its
// operand matrices retyped to bf16), with the parameters, batching, split-K and fused epilogue of
// matmul_tc.wgsl (MatmulParams), whose `main` and `direct` serve other adapters and layouts.
// A workgroup of 4 subgroups (WG = 128, subgroup size 32) computes a 128 x 128 tile of C;
// each subgroup owns a 64 x 64 block, 4 x 4 accumulators of 16 x 16 f32. RM = 64 (products
// with M <= 64, such as a convolution's 64 output channels) makes the tile 64 x 128, each
// subgroup's block 64 x 32: the rows past M are neither multiplied nor kept. RM = 256
// (`Config::CoopWideTall`) makes it 256 x 128 with 8 subgroups (WG = 256) of 64 x 64 each,
// in K steps of 32 or 48: see "Traffic"; RM = 128 with WG = 256 (`Config::CoopWideFlat`)
// 128 x 256 the same way, and with RN = 192 (`Config::CoopWideMid`) 128 x 192, 8 subgroups
// of 64 x 48 (see "Eight subgroups").
//
// 16-byte runs. Operands move as runs of 8 halves carried in vec4<f32> (bits moved, never
// computed on): one 16-byte load from the buffer, one 16-byte store into workgroup memory,
// and fragments loaded as coop_mat16x16<f32, A / B> through 16-byte elements, types that
// kernels/spirv.rs turns into f16 fragments. WGSL alone allows at most 8-byte elements
// under a fragment load; with 16-byte ones NVIDIA's driver reads fragments with ldmatrix.
//
// Steps. K goes in steps of KW = 64 through one buffer per operand: each invocation loads its
// 8 runs of A and 8 of B for the next step into registers before the current step's products
// and stores them after (two barriers a step). That beats double-buffered steps of 32 (one
// barrier a step, 48 KiB), and, for 256 x 128 tiles, double-buffered steps of 16 with the
// loads two or three steps ahead. Loaded a third of a step earlier (before the last 16 of
// K's products, with no register copies waiting on them in the driver's code), the runs
// gain nothing (docs/performance.md, matmul).
//
// Traffic. A 128 x 128 tile reads 1/64 byte a flop from the buffers; 256 x 128 and 128 x 256
// tiles read 3/4 of that, but in 48 KiB of workgroup memory only in K steps of 32 or 48 (A and
// B of K 64 would take 54 KiB with their padding). Steps of 48 (42 KiB) run where no operand
// is k-fast (A^T B) and for A B, whose k-fast A's 6 runs a row are loaded 4 + 2 (see `runs`);
// x W^T, both operands k-fast, steps by 32 (by 48 it runs slower). The loop is not bound
// by the rate L2 serves its loads: with the same 36 KiB in flight a core, plain loads draw
// about twice what these tiles draw from L2 (examples/load_rate.rs). Yet left out (timing
// probes), the loads take a fifth to a quarter of the loop's time; loads that hit L1 cost
// only a little less, and loads issued earlier no less (see Steps), so the cost is not their
// latency. A k-fast operand costs more: A B runs slower than A^T B at every K (so not for
// A's row pitch), and 128 x 256 tiles, loading half as many rows of A, serve it better
// (matmul.rs `flat_pays`). The layouts, orders and staging tried against it are in
// docs/performance.md (matmul).
//
// Addressing is worked out once per invocation: its runs of an operand lie a fixed number of
// rows apart, so run i of a step is at g0 + i gi + step gk in the buffer and s0 + i SIA
// (SIB) in the tile, with SIA, SIB constants of the layout; it is inside the matrix when
// bit i of a row mask is set and its K offset is below the K left. An invocation whose runs
// are all inside loads them without selects. Computed per load (as `main` does), the address
// and bounds arithmetic outnumbered the products 4 to 1 in the driver's machine code of the
// loop.
//
// Ceilings: the fragment loads from workgroup memory alone take about a fifth of the rate
// the products reach with their fragments loaded once (docs/performance.md, matmul).
//
// Pitches count runs of 8: k-fast rows KW + 8 halves, m- or n-fast rows BM (BN) + 8, so the 8
// rows of 16 bytes a fragment load reads at once fall in distinct banks.
//
// Epilogue: from registers (REGS = 1, see `write_frag`) where the host knows the driver's
// fragment layout and tiles have 128 rows or more; elsewhere see `write_half`: the tiles'
// memory stages the outputs once the loop is done.
// The staged epilogue can take a third of a K = 384 product's time, and its stores to
// memory little of that: what costs is rounds with subgroups idle. So eight-subgroup tiles
// write four 64 x 16 quarters, all subgroups at once (see main), not two 64 x 32 halves a
// subgroup with half the subgroups idle each round (docs/performance.md, matmul).
//
// Bounds: runs are wholly inside or outside the matrix (contiguous extents, pitches and
// offsets multiples of 8, checked by the host); runs outside load as zero and add nothing;
// outputs past M or N are not stored.
//
// Loops (per invocation): 1 per KW of K, plus up to 204 in the staged epilogue: per half 17
// for a lane's 16 output rows (eight subgroups: per quarter 9 for 8 rows), up to 5 more a
// row where N is not a multiple of 4 (outputs stored one by one), and 5 for the bias (REGS
// has none); 9 more for RSUM's row sums, 17 at 128 x 256 and 128 x 192 (matmul.rs
// `Config::kchunk` keeps 256).
//
// GATHER = 1 makes the product an implicit convolution: op(B) is the column matrix of NHWC
// images, never written. TB = 1 is a forward product (B = col, K x positions); TB = 0 a
// weight gradient's (B = col^T, positions x K, see `Taps`). With K ordered (tap, channel) its k-fast runs of 8
// are 8 channels of one input pixel, 16 bytes in the image, so they load as before, only
// from a computed address. An invocation's 8 runs of B lie at 8 fixed output positions
// (rows of op(B)^T) for the whole loop and at one K offset a step: the positions' input
// pixels at tap (0, 0) are worked out once (`pixels`), and a step adds one tap offset to
// all 8 (`gathered`). Pixels outside the image (padding) load as zero. The host needs the
// channels a multiple of 8 (a run never straddles two taps) and one group.

alias Params = MatmulParams;

//! entry main(a: half raw16, b: half raw16, bias: data mut, c: data mut vec4)
//! requires spirv
//! check WG=128 TA=0 TB=0,1 FUSE=0,5 GATHER=0,1 RM=64 RN=128 RSUM=0 REGS=0
//! check WG=128 TA=1 TB=0,1 FUSE=0,5 GATHER=0 RM=64 RN=128 RSUM=0,1 REGS=0
//! check WG=128 TA=0 TB=0,1 FUSE=0,5 GATHER=0,1 RM=128 RN=128 RSUM=0 REGS=0,1
//! check WG=128 TA=1 TB=0,1 FUSE=0,5 GATHER=0 RM=128 RN=128 RSUM=0,1 REGS=0,1
//! check WG=256 TA=0,1 TB=0,1 FUSE=0,5 GATHER=0 RM=256 RN=128 RSUM=0 REGS=0,1
//! check WG=256 TA=1 TB=0,1 FUSE=0 GATHER=0 RM=256 RN=128 RSUM=1 REGS=0,1
//! check WG=256 TA=0,1 TB=0,1 FUSE=0,5 GATHER=0 RM=128 RN=256 RSUM=0 REGS=0,1
//! check WG=256 TA=1 TB=0,1 FUSE=0 GATHER=0 RM=128 RN=256 RSUM=1 REGS=0,1
//! check WG=256 TA=0,1 TB=0,1 FUSE=0,5 GATHER=0 RM=128 RN=192 RSUM=0 REGS=0,1
//! check WG=256 TA=1 TB=0,1 FUSE=0 GATHER=0 RM=128 RN=192 RSUM=1 REGS=0,1
// The tile is RM x RN (BM x BN; RM = 64 computes a 128 x 128 tile's first 64 rows), its
// subgroups BM / 64 a column of SW-wide blocks. Eight subgroups (WG = 256, E8): RM = 256
// makes 256 x 128 tiles, RM = 128 128 x 256 ones (`Config::CoopWideFlat`, for products with
// few rows and many columns), in K steps of 32 (in RM = 128's 36 KiB) where B is k-fast
// (x W^T), or 48 (42 KiB) where it is not (A B; A^T B, a weight gradient's layout): see
// "Traffic"; RN = 192
// 128 x 192 ones (`Config::CoopWideMid`), subgroups of 64 x 48, in K steps of 64 (46 KiB).
// Why eight subgroups of 64 x 48 and not six of 64 x 64: a core's four schedulers each have
// their own tensor cores, and a workgroup's subgroups are dealt to them in turn, so six put
// two on two schedulers and one on the others; each step then takes as long as two
// subgroups' products, three quarters of the core's rate at best (docs/performance.md,
// matmul).
const E8: u32 = WG / 256u;
const R256: u32 = RM / 256u;
const BM: u32 = 128u + 128u * R256;
const BN: u32 = RN;
// Subgroups across the tile's columns, each SW columns wide, FJ fragments of 16.
const SGN: u32 = WG / 32u / (BM / 64u);
const SW: u32 = select(BN / SGN, 32u, RM == 64u);
const FJ: u32 = SW / 16u;
const KW: u32 = select(64u - E8 * (16u + 16u * TB), 64u, BN == 192u);
// Steps of 48 or 64 multiply their last 16 of K after the first barrier (see the loop),
// which shortens them; steps of 32 (256 x 128 tiles with a k-fast B) are too short to gain
// and run slower so (docs/performance.md, matmul).
const LATE: bool = KW > 32u;
// Pitches in runs of 8: k-fast rows, A's m-fast K rows, B's n-fast K rows.
const PK8: u32 = KW / 8u + 1u;
const PMA8: u32 = BM / 8u + 1u;
const PMN8: u32 = BN / 8u + 1u;
// Runs an invocation loads of A and of B a step, and how far apart they lie: RSK rows of a
// k-fast tile, RSA (RSB) K rows of an m-fast (n-fast) one.
const RSK: u32 = select(WG / (KW / 8u), 64u, KW == 48u);
// K steps of 48 split a k-fast A's 6 runs a row in two: runs 0 .. N1A - 1 by 4 lanes a row,
// RSK = 64 rows apart, the rest by 2 lanes a row, 128 rows apart (see `runs`). N1 = 8: not
// split (B never is: a k-fast B steps by 32).
const N1A: u32 = select(8u, BM / 64u, (KW == 48u) & (TA == 0u));
const N1B: u32 = 8u;
const RSA: u32 = WG / (BM / 8u);
const RSB: u32 = WG / (BN / 8u);
const NA: u32 = select(BM / RSK + select(0u, BM / 128u, N1A < 8u), (KW + RSA - 1u) / RSA, TA == 1u);
const NB: u32 = select(BN / RSK, (KW + RSB - 1u) / RSB, TB == 0u);
// An m- or n-fast tile whose runs a K row do not divide WG (BN = 192: 24 runs, 10 K rows a
// pass) ends in a partial pass: its last run exists only where its K row is below KW. The
// invocations past the last whole row of a pass (240 .. 255) load and store the same runs
// as invocations 0 .. 15 one pass later, with the same values.
const PA: bool = (TA == 1u) & (NA * RSA > KW);
const PB: bool = (TB == 0u) & (NB * RSB > KW);
// Distance in the tile between an invocation's runs, and their K offsets (see `Runs`): fixed
// by the layouts, so stores and bounds take immediate offsets instead of registers.
const SIA: u32 = (1u - TA) * RSK * PK8 + TA * RSA * PMA8;
const SIB: u32 = TB * RSK * PK8 + (1u - TB) * RSB * PMN8;
const KIA: u32 = TA * RSA;
const KIB: u32 = (1u - TB) * RSB;
// A's tile, then B's at TB8; after the last step, the epilogue's staging (`write_half`).
const TB8: u32 = BM * PK8;
// (At least 4 x HALF: the epilogue stages four 64 x 32 halves at once; eight subgroups a
// 64 x 16 quarter each, Q16 a subgroup.)
var<workgroup> Ts: array<vec4<f32>, max((BM + BN) * PK8, select(2304u, WG / 32u * Q16, WG > 128u))>;
// The tile's bias (FUSE's): BN values along N, or BM along M with bias_rows, staged at the
// start (see write_half).
var<workgroup> Bs: array<f32, 256>;

// Where an invocation's runs of one operand's tile are (see the header), for the
// first step of its K range: in the buffer, g0 + i gi, then gk further each step; in the
// tile, s0 + i SIA (SIB). Run i lies inside the matrix when bit i of `mask` is set and
// k_lo + i KIA (KIB) < the K left from the step's start.
struct Runs {
  g0: u32,
  gi: u32,
  gk: u32,
  s0: u32,
  mask: u32,
  k_lo: u32,
  // A split k-fast tile's runs from N1 on (see N1A): their first's distance from run 0 in
  // the buffer (d2) and tile (sd2), wrapping, and their K offset.
  d2: u32,
  sd2: u32,
  k2: u32,
}

// Run i's place in the buffer (g the step's run 0), in the tile (si the layout's distance,
// SIA or SIB), and its K offset (ki: KIA or KIB); n1 is N1A or N1B. i and n1 are constants
// where these are called, so the selects fold.
fn run_at(o: Runs, g: u32, i: u32, n1: u32) -> u32 {
  return select(g + i * o.gi, g + o.d2 + (i - n1) * 2u * o.gi, i >= n1);
}

fn run_tile(o: Runs, i: u32, si: u32, n1: u32) -> u32 {
  return select(o.s0 + i * si, o.s0 + o.sd2 + (i - n1) * 2u * si, i >= n1);
}

fn run_k(o: Runs, i: u32, ki: u32, n1: u32) -> u32 {
  return select(o.k_lo + i * ki, o.k2, i >= n1);
}

// The runs of an operand whose tile is `rows` x K (rows along M or N, starting at `r0`, of
// `extent`) at `base` with row pitch `pr` and K pitch `pk`; k-fast when `kfast`; `count`
// runs an invocation. Run v = lid + WG i: a k-fast tile has KW / 8 runs a row (rows
// lid / (KW / 8) + RSK i, but for rows of 4 runs, see below), an m- or n-fast one rows / 8 a
// K row (K rows lid / (rows / 8) + WG / (rows / 8) i).
fn runs(kfast: bool, rows: u32, count: u32, n1: u32, lid: u32, base: u32, r0: u32, extent: u32, pr: u32, pk: u32, k0: u32) -> Runs {
  // Zero-initialised (WGSL's rule for `var`): d2, sd2 and k2 stay 0 unless the tile is split.
  var o: Runs;
  if (kfast) {
    // Rows of 4 runs (KW = 32, pitch 5 runs): a subgroup's 8 rows are dealt so that each
    // quarter of it (the 8 lanes whose 16-byte stores go to memory together) holds rows r
    // and r + 4, whose runs fall in distinct banks; rows r and r + 1 (lanes in order) would
    // share one, and every store take two passes (docs/performance.md, matmul).
    let per = KW / 8u;
    let split = n1 < 8u;
    let r4 = (lid / 32u) * 8u + (lid % 32u) / 8u + 4u * ((lid / 4u) % 2u);
    let r = select(lid / per, r4, (per == 4u) | split);
    let q8 = select(lid % per, lid % 4u, split);
    let q = q8 * 8u;
    o.g0 = (base + (r0 + r) * pr + k0 + q) / 8u;
    o.gi = RSK / 8u * pr;
    o.gk = KW / 8u;
    o.s0 = r * PK8 + q8;
    // Split (KW = 48, pitch 7): the last 2 runs of each row by 2 lanes, a subgroup's 16 rows
    // dealt so that each quarter holds rows r, r + 2, r + 4, r + 6, in distinct banks.
    let l = lid % 32u;
    let r2 = (lid / 32u) * 16u + (l / 16u) * 8u + (l / 8u) % 2u + 2u * ((l % 8u) / 2u);
    let q2 = 4u + l % 2u;
    if (split) {
      o.d2 = (base + (r0 + r2) * pr + k0 + q2 * 8u) / 8u - o.g0;
      o.sd2 = r2 * PK8 + q2 - o.s0;
      o.k2 = q2 * 8u;
    }
    o.mask = 0u;
    // Bits past `count` are set: those runs do not exist.
    //! unroll i in 0..8
    let row$i = select(r0 + r + RSK * $i, r0 + r2 + 128u * ($i - n1), $i >= n1);
    o.mask = o.mask | select(0u, 1u << $i, ($i >= count) | (row$i < extent));
    //! end
    o.k_lo = q;
  } else {
    let per = rows / 8u;
    let r = lid / per;
    let q = (lid % per) * 8u;
    o.g0 = (base + (k0 + r) * pk + r0 + q) / 8u;
    o.gi = WG / per * pk / 8u;
    o.gk = KW / 8u * pk;
    o.s0 = r * (per + 1u) + lid % per;
    o.mask = select(0u, 0xffu, r0 + q < extent);
    o.k_lo = r;
  }
  return o;
}

// The implicit convolution's runs of B (GATHER = 1, see the header), by run i: the input
// row and column its output position reads at tap (0, 0) (`FAR` rows for positions past N,
// so every tap falls outside), and that pixel's first run of 8 channels in the buffer,
// image base included (any value where outside; never loaded).
struct Pixels {
  y: array<i32, 8>,
  x: array<i32, 8>,
  at: array<i32, 8>,
}

const FAR: i32 = -1073741824;

// Invocation `lid`'s pixels for the workgroup's positions from `n0`, in the image whose runs
// start at run `base8`: run i is position n0 + lid / 8 + 16 i (the k-fast tile's rows).
fn pixels(lid: u32, n0: u32, base8: u32) -> Pixels {
  var o: Pixels;
  let runs_px = p.k / p.im_kk / 8u;
  //! unroll i in 0..8
  let pos$i = n0 + lid / 8u + 16u * $i;
  let oh$i = pos$i / p.im_wo;
  o.y[$i] = select(FAR, i32(oh$i * p.im_sh) + p.im_ph, pos$i < p.n);
  o.x[$i] = i32((pos$i - oh$i * p.im_wo) * p.im_sw) + p.im_pw;
  o.at[$i] = (o.y[$i] * i32(p.im_w) + o.x[$i]) * i32(runs_px) + i32(base8);
  //! end
  return o;
}

// The 8 runs at `px`'s pixels for K index `k`, the first of a run of 8 channels (zero where
// k >= kend): one tap and channel run for all 8 pixels, one division pair a step.
fn gathered(px: Pixels, k: u32, kend: u32) -> array<vec4<f32>, 8> {
  let runs_px = p.k / p.im_kk / 8u;
  let tap = k / (runs_px * 8u);
  let run = (k - tap * runs_px * 8u) / 8u;
  let ki = tap / p.im_kw;
  let dy = i32(ki) * p.im_dh;
  let dx = i32(tap - ki * p.im_kw) * p.im_dw;
  let d = (dy * i32(p.im_w) + dx) * i32(runs_px) + i32(run);
  let kin = k < kend;
  var o: array<vec4<f32>, 8>;
  //! unroll i in 0..8
  let ok$i = kin & (u32(px.y[$i] + dy) < p.im_h) & (u32(px.x[$i] + dx) < p.im_w);
  o[$i] = select(vec4<f32>(0.0), b[select(0u, u32(px.at[$i] + d), ok$i)], ok$i);
  //! end
  return o;
}

// A weight gradient's runs of B (GATHER = 1, TB = 0): op(B) is col^T, its K rows the output
// positions and its columns (tap, channel), so an invocation's 8 runs (K rows lid / 16 + 8 i
// of each step, columns from n0 + (lid % 16) 8) share one tap and channel run for the whole
// loop and step through positions. Each run keeps its position's output row and column,
// moved on by the step's 64 positions without dividing (`next_taps`).
struct Taps {
  oh: array<u32, 8>,
  ow: array<u32, 8>,
  // The tap's input offsets at output (0, 0), its channel run (image base included), and
  // whether the column is inside N.
  dy: i32,
  dx: i32,
  run: u32,
  ok: bool,
}

fn taps(lid: u32, n0: u32, k0: u32, base8: u32) -> Taps {
  var o: Taps;
  let runs_px = p.n / p.im_kk / 8u;
  let col = n0 + (lid % 16u) * 8u;
  let tap = col / (runs_px * 8u);
  let ki = tap / p.im_kw;
  o.dy = i32(ki) * p.im_dh + p.im_ph;
  o.dx = i32(tap - ki * p.im_kw) * p.im_dw + p.im_pw;
  o.run = base8 + (col - tap * runs_px * 8u) / 8u;
  o.ok = col < p.n;
  //! unroll i in 0..8
  let pos$i = k0 + lid / 16u + 8u * $i;
  o.oh[$i] = pos$i / p.im_wo;
  o.ow[$i] = pos$i - o.oh[$i] * p.im_wo;
  //! end
  return o;
}

// `t` a step (KW positions) on.
fn next_taps(t: Taps) -> Taps {
  var o = t;
  let rows = KW / p.im_wo;
  let cols = KW - rows * p.im_wo;
  //! unroll i in 0..8
  let ow$i = t.ow[$i] + cols;
  let wrap$i = ow$i >= p.im_wo;
  o.ow[$i] = select(ow$i, ow$i - p.im_wo, wrap$i);
  o.oh[$i] = t.oh[$i] + rows + select(0u, 1u, wrap$i);
  //! end
  return o;
}

// The 8 runs at `t`'s positions, of which K row `k` is run 0's (runs at K >= kend load as
// zero).
fn gathered_taps(t: Taps, k: u32, kend: u32) -> array<vec4<f32>, 8> {
  let runs_px = p.n / p.im_kk / 8u;
  var o: array<vec4<f32>, 8>;
  //! unroll i in 0..8
  let y$i = i32(t.oh[$i] * p.im_sh) + t.dy;
  let x$i = i32(t.ow[$i] * p.im_sw) + t.dx;
  let ok$i = t.ok & (k + 8u * $i < kend) & (u32(y$i) < p.im_h) & (u32(x$i) < p.im_w);
  let at$i = t.run + (u32(y$i) * p.im_w + u32(x$i)) * runs_px;
  o[$i] = select(vec4<f32>(0.0), b[select(0u, at$i, ok$i)], ok$i);
  //! end
  return o;
}

// Epilogue staging: a subgroup's 64 x 32 half of its outputs as rows of PO = 9 runs of 4
// f32 (8 used; the ninth staggers the rows across banks), HALF runs a subgroup.
const PO: u32 = 9u;
const HALF: u32 = 576u;
// Eight subgroups' quarters: 64 rows of PQ = 5 runs of 4 (4 used), Q16 runs a subgroup.
const PQ: u32 = 5u;
const Q16: u32 = 320u;

// Writes the 64 x 32 outputs subgroup `sg` staged, whose top-left is (gm0, gn0): bias,
// activation (FUSE, as common.wgsl `matmul_fused`) and C's dtype, 4 outputs a lane and
// store, stored as one vec4 where N and C's offset allow. Strips of two accumulators through
// an 8 KiB buffer (matmul_tc.wgsl `write_strip`) take 16 barriers a workgroup; this takes 3,
// which tells on short products such as the GPT's K = 384 ones (docs/performance.md, matmul).
//
// The bias comes from Bs, which every workgroup fills before its loop: loaded here from
// memory, every lane of the workgroup would wait for it at once, which about doubles what a
// bias costs a short product (docs/performance.md, matmul). (tm0, tn0) is (gm0, gn0) in the
// tile.
fn write_half(sg: u32, lane: u32, c_base: u32, gm0: u32, gn0: u32, tm0: u32, tn0: u32) {
  write_part(sg * HALF, PO, true, lane, c_base, gm0, gn0, tm0, tn0);
}

// The 64 x 32 (`wide`) or 64 x 16 outputs staged from Ts[at0] in rows of `pitch` runs of 4.
fn write_part(at0: u32, pitch: u32, wide: bool, lane: u32, c_base: u32, gm0: u32, gn0: u32, tm0: u32, tn0: u32) {
  let whole = (p.n % 4u == 0u) & (p.c_off % 4u == 0u);
  // Lanes a row: lane + 32 t writes row (lane + 32 t) / lr, columns c .. c + 3.
  let lr = select(4u, 8u, wide);
  let c = (lane % lr) * 4u;
  let gn = gn0 + c;
  let col_bias = ((FUSE & 1u) != 0u) & (p.bias_rows == 0u);
  var b4 = vec4<f32>(0.0);
  if (col_bias) {
    b4 = vec4<f32>(Bs[tn0 + c], Bs[tn0 + c + 1u], Bs[tn0 + c + 2u], Bs[tn0 + c + 3u]);
  }
  let row_bias = ((FUSE & 1u) != 0u) & !col_bias;
  let act = FUSE >> 1u;
  for (var e = lane; e < 64u * lr; e = e + 32u) {
    let r = e / lr;
    let gm = gm0 + r;
    if (gm < p.m && gn < p.n) {
      var x = Ts[at0 + r * pitch + c / 4u] + b4;
      if (row_bias) { x = x + vec4<f32>(Bs[tm0 + r]); }
      let at = c_base + gm * p.n + gn;
      if (whole) {
        let v = vec4<f32>(
          matmul_act(x.x, act),
          matmul_act(x.y, act),
          matmul_act(x.z, act),
          matmul_act(x.w, act),
        );
        st4_c(at / 4u, v);
      } else {
        for (var j = 0u; j < 4u && gn + j < p.n; j = j + 1u) {
          st_c(at + j, matmul_act(x[j], act));
        }
      }
    }
  }
}

// REGS = 1: a subgroup writes its 16 x 16 accumulators from registers, where the driver's
// layout is the one kernels/coop_layout.rs calls quad rows (NVIDIA's; the host checks it):
// lane l holds rows l / 4 and l / 4 + 8, each at columns 2 (l % 4) .. + 1 and 8 further. One
// exchange with the neighbouring lane (xor 1) gives every lane 4 adjacent columns of both
// rows: an even lane keeps its columns 2 q .. + 1 and takes the odd lane's next two, an odd
// lane takes the even lane's 8 + 2 (q - 1) .. + 1 and keeps its own after them. A quad then
// stores a row's 16 outputs, whole sectors, with no workgroup memory and no barrier; the
// staged epilogue (`write_part`) takes 2 barriers a round of stores, FJ rounds with eight
// subgroups.
// Against the staged epilogue this speeds the 256 x 128 products, fused ones most, and
// leaves 128 x 128 ones as they are (docs/performance.md, matmul). The stores carry no
// one-by-one fallback (N not a multiple of 4) and no bias reads of their own: 32 unrolled
// stores each with both made the GPT's products slower in the training step, though not in
// the bench, which repeats one product.
fn write_frag(m: coop_mat16x16<f32, C>, lane: u32, c_base: u32, gm0: u32, gn0: u32, tm0: u32, b4: vec4<f32>) {
  let odd = (lane & 1u) == 1u;
  let lo = vec4<f32>(coop_get0u(m), coop_get1u(m), coop_get4u(m), coop_get5u(m));
  let hi = vec4<f32>(coop_get2u(m), coop_get3u(m), coop_get6u(m), coop_get7u(m));
  // The pair each lane's neighbour needs: an even lane's high columns, an odd lane's low.
  let got = subgroupShuffleXor(select(hi, lo, odd), 1u);
  let top = select(vec4<f32>(lo.xy, got.xy), vec4<f32>(got.xy, hi.xy), odd);
  let bot = select(vec4<f32>(lo.zw, got.zw), vec4<f32>(got.zw, hi.zw), odd);
  let r = lane / 4u;
  let gn = gn0 + frag_col(lane);
  write4(top, c_base, gm0 + r, gn, tm0 + r, b4);
  write4(bot, c_base, gm0 + r + 8u, gn, tm0 + r + 8u, b4);
}

// The first of the 4 adjacent columns of a 16 x 16 accumulator lane `lane` writes after
// `write_frag`'s exchange (its bias too): an even lane its own 2 (l % 4), an odd lane the
// even lane's high pair, 8 + 2 (l % 4 - 1).
fn frag_col(lane: u32) -> u32 {
  return select(2u * (lane % 4u), 6u + 2u * (lane % 4u), (lane & 1u) == 1u);
}

// Outputs (gm, gn .. gn + 3) plus the column bias `b4` or row tm's: activation and C's dtype
// as `write_part`; only where N and C's offset are multiples of 4 (the host's rule for REGS).
fn write4(x0: vec4<f32>, c_base: u32, gm: u32, gn: u32, tm: u32, b4: vec4<f32>) {
  if (gm >= p.m || gn >= p.n) { return; }
  var x = x0 + b4;
  if (((FUSE & 1u) != 0u) & (p.bias_rows != 0u)) { x = x + vec4<f32>(Bs[tm]); }
  let act = FUSE >> 1u;
  st4_c((c_base + gm * p.n + gn) / 4u, vec4<f32>(matmul_act(x.x, act), matmul_act(x.y, act), matmul_act(x.z, act), matmul_act(x.w, act)));
}

// RSUM = 1 (m-fast A, no bias): the product also sums op(A)'s rows over its K range, a bias's
// gradient beside its weight's (dW = dY^T X, db = dY's column sums), from the runs of A each
// invocation loads, whose 8 halves are 8 rows of op(A): `halves` widens a run. In the first
// column of workgroups each invocation keeps 8 sums for the whole loop; the RSA invocations
// that share rows add theirs in the tiles' memory after it and write them to `bias` from
// p.sum_off (split: f32 partials at s m + row of a buffer of their own, which the `splitk`
// pass that sums C's partials also sums, matmul.wgsl RS). Cheaper than a column sum's two
// passes over dY. (Merging them leaves a step fewer launches, and with fewer than 256 a
// step's work would sit unsubmitted while its update waits, but for readback.rs handing
// recorded work over before waiting.)
fn halves(x: vec4<f32>, hi: bool) -> vec4<f32> {
  let w0 = bitcast<u32>(select(x.x, x.z, hi));
  let w1 = bitcast<u32>(select(x.y, x.w, hi));
  // A bf16 is the high half of an f32.
  if (a_bf16) {
    return bitcast<vec4<f32>>(vec4<u32>(w0 << 16u, w0 & 0xffff0000u, w1 << 16u, w1 & 0xffff0000u));
  }
  return vec4<f32>(unpack2x16float(w0), unpack2x16float(w1));
}

// Fragment of op(A): rows r.. r+15, columns kk.. kk+15 of the tile.
fn frag_a(r: u32, kk: u32) -> coop_mat16x16<f32, A> {
  if (TA == 0u) { return coopLoadT<coop_mat16x16<f32, A>>(&Ts[r * PK8 + kk / 8u], PK8); }
  return coopLoad<coop_mat16x16<f32, A>>(&Ts[kk * PMA8 + r / 8u], PMA8);
}

// Fragment of op(B): rows kk.. kk+15, columns q.. q+15.
fn frag_b(kk: u32, q: u32) -> coop_mat16x16<f32, B> {
  if (TB == 0u) { return coopLoadT<coop_mat16x16<f32, B>>(&Ts[TB8 + kk * PMN8 + q / 8u], PMN8); }
  return coopLoad<coop_mat16x16<f32, B>>(&Ts[TB8 + q * PK8 + kk / 8u], PK8);
}

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let lid = ids.lid;
  let sg = lid / 32u;
  let lane = lid % 32u;
  let bt = ids.wid.z % p.batch;
  let bb = matmul_bias_base(bt);
  let kr = matmul_krange(ids.wid.z);
  let m0 = ids.wid.y * BM;
  let n0 = ids.wid.x * BN;
  // RM = 64: the four subgroups side by side, 64 x 32 each.
  let wr = select((sg / SGN) * 64u, 0u, RM == 64u);
  let wc = select((sg % SGN) * SW, sg * 32u, RM == 64u);
  let a_base = p.a_off + (bt % p.a_mod) * p.a_bs;
  let b_base = p.b_off + (bt % p.b_mod) * p.b_bs;
  let ra = runs(TA == 0u, BM, NA, N1A, lid, a_base, m0, p.m, p.sam, p.sak, kr.x);
  let rb = runs(TB == 1u, BN, NB, N1B, lid, b_base, n0, p.n, p.sbn, p.sbk, kr.x);
  // Which of the invocation's runs exist (see PA, PB).
  //! unroll i in 0..8
  let exa$i = ($i < NA) & (!PA | ($i + 1u < NA) | (ra.k_lo + $i * KIA < KW));
  let exb$i = ($i < NB) & (!PB | ($i + 1u < NB) | (rb.k_lo + $i * KIB < KW));
  //! end
  // The bias for the epilogue, one value a thread; the loop's barriers publish it.
  if ((FUSE & 1u) != 0u) {
    let rows = p.bias_rows != 0u;
    let at = select(n0, m0, rows) + lid;
    let ok = at < select(p.n, p.m, rows) & (rows | (lid < BN));
    Bs[lid] = select(0.0, ld_bias(bb + select(0u, at, ok)), ok);
  }

  //! unroll i in 0..4
  //! unroll j in 0..4
  var c$i$j = coop_mat16x16<f32, C>();
  //! end
  //! end

  // The first step's tiles: 1024 runs of A and 1024 of B, 8 each an invocation.
  var ga = ra.g0;
  var gb = rb.g0;
  var left = kr.y - kr.x;
  var px: Pixels;
  var tp: Taps;
  if (GATHER == 1u && TB == 1u) { px = pixels(lid, n0, b_base / 8u); }
  if (GATHER == 1u && TB == 0u) { tp = taps(lid, n0, kr.x, b_base / 8u); }
  let kq = (lid % 8u) * 8u;
  let kr16 = lid / 16u;
  //! unroll i in 0..8
  let oka$i = exa$i & (((ra.mask >> $i) & 1u) != 0u) & (run_k(ra, $i, KIA, N1A) < left);
  var xa$i = select(vec4<f32>(0.0), a[select(0u, run_at(ra, ga, $i, N1A), oka$i)], oka$i);
  let okb$i = (GATHER == 0u) & exb$i & (((rb.mask >> $i) & 1u) != 0u) & (run_k(rb, $i, KIB, N1B) < left);
  var xb$i = select(vec4<f32>(0.0), b[select(0u, run_at(rb, gb, $i, N1B), okb$i)], okb$i);
  //! end
  if (GATHER == 1u && TB == 1u) {
    let g = gathered(px, kr.x + kq, kr.y);
    //! unroll i in 0..8
    xb$i = g[$i];
    //! end
  }
  if (GATHER == 1u && TB == 0u) {
    let g = gathered_taps(tp, kr.x + kr16, kr.y);
    //! unroll i in 0..8
    xb$i = g[$i];
    //! end
  }
  // (The same for the whole workgroup.)
  let sums = (RSUM == 1u) & (ids.wid.x == 0u);
  var rs0 = vec4<f32>(0.0);
  var rs1 = vec4<f32>(0.0);
  //! unroll i in 0..8
  if (exa$i) { Ts[run_tile(ra, $i, SIA, N1A)] = xa$i; }
  if (exb$i) { Ts[TB8 + run_tile(rb, $i, SIB, N1B)] = xb$i; }
  if (sums & exa$i) {
    rs0 = rs0 + halves(xa$i, false);
    rs1 = rs1 + halves(xa$i, true);
  }
  //! end
  workgroupBarrier();

  for (var k0 = kr.x; k0 < kr.y; k0 = k0 + KW) {
    let more = k0 + KW < kr.y;
    if (more) {
      ga = ga + ra.gk;
      gb = gb + rb.gk;
      left = left - KW;
      // Runs wholly inside (every workgroup's but the edges' and a K range's last step)
      // load without bounds or zeroing.
      if (ra.mask == 0xffu && left >= KW) {
        //! unroll i in 0..8
        if (exa$i) { xa$i = a[run_at(ra, ga, $i, N1A)]; }
        //! end
      } else {
        //! unroll i in 0..8
        let na$i = exa$i & (((ra.mask >> $i) & 1u) != 0u) & (run_k(ra, $i, KIA, N1A) < left);
        xa$i = select(vec4<f32>(0.0), a[select(0u, run_at(ra, ga, $i, N1A), na$i)], na$i);
        //! end
      }
      if (GATHER == 1u && TB == 1u) {
        let g = gathered(px, k0 + KW + kq, kr.y);
        //! unroll i in 0..8
        xb$i = g[$i];
        //! end
      } else if (GATHER == 1u) {
        tp = next_taps(tp);
        let g = gathered_taps(tp, k0 + KW + kr16, kr.y);
        //! unroll i in 0..8
        xb$i = g[$i];
        //! end
      } else if (rb.mask == 0xffu && left >= KW) {
        //! unroll i in 0..8
        if (exb$i) { xb$i = b[run_at(rb, gb, $i, N1B)]; }
        //! end
      } else {
        //! unroll i in 0..8
        let nb$i = exb$i & (((rb.mask >> $i) & 1u) != 0u) & (run_k(rb, $i, KIB, N1B) < left);
        xb$i = select(vec4<f32>(0.0), b[select(0u, run_at(rb, gb, $i, N1B), nb$i)], nb$i);
        //! end
      }
    }
    // Every 16 of the step's K, but the last where LATE.
    //! unroll s in 0..4
    if (($s * 16u < KW) & (!LATE | (($s + 1u) * 16u < KW))) {
      //! unroll i in 0..4
      let a$s$i = frag_a(wr + $i * 16u, $s * 16u);
      let b$s$i = frag_b($s * 16u, wc + min($i, FJ - 1u) * 16u);
      //! end
      //! unroll i in 0..4
      //! unroll j in 0..4
      if ($j < FJ) { c$i$j = coopMultiplyAdd(a$s$i, b$s$j, c$i$j); }
      //! end
      //! end
    }
    //! end
    // LATE: the last 16's fragments are read before the barrier and multiplied after it,
    // while other subgroups store the next step's tiles (unused otherwise).
    //! unroll i in 0..4
    let al$i = frag_a(wr + $i * 16u, KW - 16u);
    let bl$i = frag_b(KW - 16u, wc + min($i, FJ - 1u) * 16u);
    //! end
    // `more` is the same for the whole workgroup: the barriers stay uniform.
    workgroupBarrier();
    if (more) {
      //! unroll i in 0..8
      if (exa$i) { Ts[run_tile(ra, $i, SIA, N1A)] = xa$i; }
      if (exb$i) { Ts[TB8 + run_tile(rb, $i, SIB, N1B)] = xb$i; }
      if (sums & exa$i) {
        rs0 = rs0 + halves(xa$i, false);
        rs1 = rs1 + halves(xa$i, true);
      }
      //! end
    }
    if (LATE) {
      //! unroll i in 0..4
      //! unroll j in 0..4
      if ($j < FJ) { c$i$j = coopMultiplyAdd(al$i, bl$j, c$i$j); }
      //! end
      //! end
    }
    workgroupBarrier();
  }

  if (RSUM == 1u) {
    // Invocation lid's sums are of rows (lid % (BM / 8)) 8 .. + 8, partial t = lid / (BM / 8).
    Ts[2u * lid] = rs0;
    Ts[2u * lid + 1u] = rs1;
    workgroupBarrier();
    if (sums & (lid < BM) & (m0 + lid < p.m)) {
      var sum = 0.0;
      for (var t = 0u; t < RSA; t = t + 1u) {
        sum = sum + Ts[2u * (t * (BM / 8u) + lid / 8u) + (lid % 8u) / 4u][lid % 4u];
      }
      st_bias(p.sum_off + select(0u, ids.wid.z * p.m, p.raw != 0u) + m0 + lid, sum);
    }
    workgroupBarrier();
  }

  let c_base = p.c_off + ids.wid.z * p.m * p.n;
  if (REGS == 1u) {
    // Straight from the accumulators (see `write_frag`): no staging, no barriers.
    let col_bias = ((FUSE & 1u) != 0u) & (p.bias_rows == 0u);
    let bc = wc + frag_col(lane);
    //! unroll j in 0..4
    if ($j < FJ) {
      var b$j = vec4<f32>(0.0);
      if (col_bias) {
        let t$j = bc + $j * 16u;
        b$j = vec4<f32>(Bs[t$j], Bs[t$j + 1u], Bs[t$j + 2u], Bs[t$j + 3u]);
      }
      //! unroll i in 0..4
      write_frag(c$i$j, lane, c_base, m0 + wr + $i * 16u, n0 + wc + $j * 16u, wr + $i * 16u, b$j);
      //! end
    }
    //! end
    return;
  }
  // The loop ended with a barrier: every subgroup is done with the tiles, which now stage
  // the output, each subgroup's 64 x 32 halves in turn.
  if (RM == 64u) {
    //! unroll i in 0..4
    coopStoreT(c$i0u, &Ts[sg * HALF + $i * 16u * PO], PO);
    coopStoreT(c$i1u, &Ts[sg * HALF + $i * 16u * PO + 4u], PO);
    //! end
    workgroupBarrier();
    write_half(sg, lane, c_base, m0, n0 + wc, 0u, wc);
    return;
  }
  if (WG > 128u) {
    // Eight subgroups' 64 x 32 halves do not fit the tiles' memory at once; their 64 x 16
    // quarters do (Q16 runs a subgroup): FJ rounds with every subgroup writing, where
    // halves take four with half of them idle, which tells on the GPT's K = 384 forward
    // products and their fused linear layers (docs/performance.md, matmul). Reading a lane's
    // 16 rows first and storing after (the loop written out) makes them slower instead.
    //! unroll j in 0..4
    if ($j < FJ) {
      //! unroll i in 0..4
      coopStoreT(c$i$j, &Ts[sg * Q16 + $i * 16u * PQ], PQ);
      //! end
      workgroupBarrier();
      write_part(sg * Q16, PQ, false, lane, c_base, m0 + wr, n0 + wc + $j * 16u, wr, wc + $j * 16u);
      workgroupBarrier();
    }
    //! end
    return;
  }
  //! unroll i in 0..4
  coopStoreT(c$i0u, &Ts[sg * HALF + $i * 16u * PO], PO);
  coopStoreT(c$i1u, &Ts[sg * HALF + $i * 16u * PO + 4u], PO);
  //! end
  workgroupBarrier();
  write_half(sg, lane, c_base, m0 + wr, n0 + wc, wr, wc);
  workgroupBarrier();
  //! unroll i in 0..4
  coopStoreT(c$i2u, &Ts[sg * HALF + $i * 16u * PO], PO);
  coopStoreT(c$i3u, &Ts[sg * HALF + $i * 16u * PO + 4u], PO);
  //! end
  workgroupBarrier();
  write_half(sg, lane, c_base, m0 + wr, n0 + wc + 32u, wr, wc + 32u);
}
