// matmul_tc.wgsl: C[b] = act(op(A)[b] x op(B)[b] + bias) on cooperative matrices (tensor
// cores), f16 operands, f32 accumulation, for training's products (x W^T forward; g W and
// g^T x backward) where matmul_wide.wgsl cannot run: adapters that do not take wgrad's own
// SPIR-V, and operands whose runs are multiples of 4 but not of 8 (`wide` runs well ahead of
// these two: docs/performance.md, matmul). Same parameters,
// batching, split-K and epilogue as matmul.wgsl (MatmulParams). A workgroup of 4 subgroups
// (WG = 128, subgroup size 32) computes a 128 x 128 tile of C; each subgroup owns a 64 x 64
// block: 4 x 4 accumulators of 16 x 16 f32, so one fragment of A serves 4 products and one
// of B serves 4.
//
//   main    Operands in runs of 4 halves along their contiguous axis (that axis's extent, the
//           row pitches and all offsets multiples of 4). Per K step of 32 the workgroup stages
//           a 128 x 32 tile of op(A) and a 32 x 128 tile of op(B) in workgroup memory, each in
//           the operand's own orientation (TA / TB: k-fast or m-fast A, n-fast or k-fast B),
//           and the fragment loads pick the row- or column-major form, so every transpose
//           runs the same code. Double-buffered: each invocation loads the next tile's runs
//           into registers before the multiplies and stores them after, and one barrier per
//           step separates the two uses of each buffer. Runs are stored as arrays of 4 halves
//           (one store each): stored as single halves, the workgroup stores bound the whole
//           product (with the stores skipped, a wrong result for the measurement, the rest
//           ran several times faster). naga offers no wider store into memory a cooperative
//           load can read (no size-changing bitcast, no pointer to a vector's component, a
//           load's matrix type follows its pointer's). Runs of 8 halves (half the stores)
//           measure the same as runs of 4.
//   direct  No workgroup memory: each subgroup loads its fragments straight from the buffers
//           and the caches serve the reuse (M, N, K multiples of 16, pitches and offsets of
//           16-byte rows; the pitches SAG / SBG are pipeline constants, which naga's
//           cooperative loads need). Tiles past the edge are
//           clamped back inside and recompute the last tile. It beats `main` where B is n-fast
//           (g W, g^T x) and loses where B is k-fast (x W^T) (docs/performance.md, matmul).
//
// Bounds. In `main` a run is wholly inside or outside the matrix, and runs outside
// load as zero (they add nothing); stores past M or N are skipped.
//
// Epilogue. Each subgroup stores a strip of its accumulators (two in `main`, whose tiles
// leave 8 KiB of the 48 KiB; one in `direct`) row-major to its own patch of workgroup
// memory; its 32 lanes then add the bias, apply the activation and convert to C's dtype (or
// store the raw f32 partial sum of a K split), each lane 4 consecutive outputs of a row at a
// time: one read of workgroup memory and one store of 4 (C is bound as vec4; where N or C's
// offset is not a multiple of 4, the run's outputs inside C are stored one by one, as
// components of the vectors). Stored one output per lane and step, the epilogue's stores
// take a large share of `main`'s time on short products (the GPT's forward products,
// K = 384). Which of these apply is the launch constant FUSE (common.wgsl `matmul_fused`):
// read from the parameters per element, the same choices cost a large share too; `main`
// flushing one accumulator at a time (32 barriers instead of 16) is slower on the same
// products (docs/performance.md, matmul). All subgroups flush the same number of strips, so
// the workgroup barriers around each are reached uniformly.
//
// Loops (per invocation): 1 per 32 of K (16 for `direct`), plus the epilogue's: a strip
// takes one iteration per run a lane stores and one to leave, and up to 5 more a run where
// N is not a multiple of 4 (outputs stored one by one): up to 200 for `main`'s 8 strips of
// two, 208 for `direct`'s 16 of one (matmul.rs `Config::kchunk` keeps 256).

alias Params = MatmulParams;

const BM: u32 = 128u;
const BN: u32 = 128u;
const BK: u32 = 32u;
// Row pitches in workgroup memory (halves): a k-fast tile row holds BK (+8), an m- or n-fast
// tile row holds BM or BN (+8).
const PK: u32 = 40u;
const PMN: u32 = 136u;
// Halves per buffer: max(BM * PK, BK * PMN).
const TILE: u32 = 5120u;

// Writes the strip of `nt` accumulators (16 x 16 nt) that subgroup `sg` has just stored
// row-major at Cst[sg * 64 nt] (runs of 4; row pitch 4 nt runs; each entry declares Cst for
// its strips). Its top-left is row gm0; column tile t of it starts at min(qb + 16 t, qmax)
// (`direct` clamps tiles past N back inside; `main` skips them). Lane l writes run l, l + 32,
// ...: consecutive lanes on consecutive runs of a row.
fn write_strip(nt: u32, sg: u32, lane: u32, c_base: u32, gm0: u32, qb: u32, qmax: u32, bb: u32) {
  workgroupBarrier();
  let runs = nt * 4u;
  // Whole runs of C are vec4s where N and C's offset are multiples of 4; elsewhere (the GPT's
  // 65-wide logits) each output goes alone.
  let whole = (p.n % 4u == 0u) & (p.c_off % 4u == 0u);
  for (var e = lane; e < 16u * runs; e = e + 32u) {
    let r = e / runs;
    let c = (e % runs) * 4u;
    let gm = gm0 + r;
    let gn = min(qb + c - c % 16u, qmax) + c % 16u;
    if (gm < p.m && gn < p.n) {
      let x = Cst[sg * 16u * runs + e];
      let at = c_base + gm * p.n + gn;
      if (whole) {
        let v = vec4<f32>(
          matmul_fused(x[0], gm, gn, bb),
          matmul_fused(x[1], gm, gn + 1u, bb),
          matmul_fused(x[2], gm, gn + 2u, bb),
          matmul_fused(x[3], gm, gn + 3u, bb),
        );
        st4_c(at / 4u, v);
      } else {
        for (var j = 0u; j < 4u && gn + j < p.n; j = j + 1u) {
          st_c(at + j, matmul_fused(x[j], gm, gn + j, bb));
        }
      }
    }
  }
  workgroupBarrier();
}

//! entry main(a: f16 vec4, b: f16 vec4, bias: data, c: data mut vec4)
//! check WG=128 TA=0 TB=0 FUSE=0,5
//! check WG=128 TA=0 TB=1 FUSE=0,5
//! check WG=128 TA=1 TB=0 FUSE=0,5
//! check WG=128 TA=1 TB=1 FUSE=0,5
// Runs of 4 halves, one store each; fragments load through a pointer to a run's first half.
var<workgroup> As: array<array<f16, 4>, 2560>;
var<workgroup> Bs: array<array<f16, 4>, 2560>;
var<workgroup> Cst: array<array<f32, 4>, 512>;

// The v-th run of 4 halves of op(A)'s tile at (m0, k0) (a k-fast tile has 8 runs a row, an
// m-fast one 32), or zeros outside the matrix.
fn fetch_a(base: u32, m0: u32, k0: u32, kend: u32, v: u32) -> vec4<f16> {
  var idx: u32;
  var ok: bool;
  if (TA == 0u) {
    let r = v / 8u;
    let q = (v % 8u) * 4u;
    ok = m0 + r < p.m && k0 + q < kend;
    idx = base + (m0 + r) * p.sam + k0 + q;
  } else {
    let r = v / 32u;
    let q = (v % 32u) * 4u;
    ok = k0 + r < kend && m0 + q < p.m;
    idx = base + (k0 + r) * p.sak + m0 + q;
  }
  return select(vec4<f16>(0.0h), a[select(0u, idx, ok) / 4u], ok);
}

// The v-th run of 4 halves of op(B)'s tile at (k0, n0), or zeros outside the matrix.
fn fetch_b(base: u32, k0: u32, n0: u32, kend: u32, v: u32) -> vec4<f16> {
  var idx: u32;
  var ok: bool;
  if (TB == 0u) {
    let r = v / 32u;
    let q = (v % 32u) * 4u;
    ok = k0 + r < kend && n0 + q < p.n;
    idx = base + (k0 + r) * p.sbk + n0 + q;
  } else {
    let r = v / 8u;
    let q = (v % 8u) * 4u;
    ok = n0 + r < p.n && k0 + q < kend;
    idx = base + (n0 + r) * p.sbn + k0 + q;
  }
  return select(vec4<f16>(0.0h), b[select(0u, idx, ok) / 4u], ok);
}

// Where run v of a tile starts in its buffer: row-major over the operand's own layout.
fn tile_at(buf: u32, v: u32, kfast: bool) -> u32 {
  if (kfast) { return buf * TILE + (v / 8u) * PK + (v % 8u) * 4u; }
  return buf * TILE + (v / 32u) * PMN + (v % 32u) * 4u;
}

fn put_a(o: u32, h: vec4<f16>) {
  As[o >> 2u] = array<f16, 4>(h.x, h.y, h.z, h.w);
}

fn put_b(o: u32, h: vec4<f16>) {
  Bs[o >> 2u] = array<f16, 4>(h.x, h.y, h.z, h.w);
}

// Fragment of op(A): rows r.. r+15, columns kk.. kk+15 of the tile in buffer `buf`.
fn frag_a(buf: u32, r: u32, kk: u32) -> coop_mat16x16<f16, A> {
  if (TA == 0u) { return coopLoadT<coop_mat16x16<f16, A>>(&As[(buf * TILE + r * PK + kk) >> 2u][0], PK); }
  return coopLoad<coop_mat16x16<f16, A>>(&As[(buf * TILE + kk * PMN + r) >> 2u][0], PMN);
}

// Fragment of op(B): rows kk.. kk+15, columns q.. q+15.
fn frag_b(buf: u32, kk: u32, q: u32) -> coop_mat16x16<f16, B> {
  if (TB == 0u) { return coopLoadT<coop_mat16x16<f16, B>>(&Bs[(buf * TILE + kk * PMN + q) >> 2u][0], PMN); }
  return coopLoad<coop_mat16x16<f16, B>>(&Bs[(buf * TILE + q * PK + kk) >> 2u][0], PK);
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
  let a_base = p.a_off + (bt % p.a_mod) * p.a_bs;
  let b_base = p.b_off + (bt % p.b_mod) * p.b_bs;
  let wr = (sg / 2u) * 64u;
  let wc = (sg % 2u) * 64u;

  //! unroll i in 0..4
  //! unroll j in 0..4
  var c$i$j = coop_mat16x16<f32, C>();
  //! end
  //! end

  // The first tile, straight into buffer 0.
  //! unroll i in 0..8
  var ra$i = fetch_a(a_base, m0, kr.x, kr.y, lid + $i * WG);
  var rb$i = fetch_b(b_base, kr.x, n0, kr.y, lid + $i * WG);
  put_a(tile_at(0u, lid + $i * WG, TA == 0u), ra$i);
  put_b(tile_at(0u, lid + $i * WG, TB == 1u), rb$i);
  //! end
  workgroupBarrier();

  var buf = 0u;
  for (var k0 = kr.x; k0 < kr.y; k0 = k0 + BK) {
    let more = k0 + BK < kr.y;
    if (more) {
      //! unroll i in 0..8
      ra$i = fetch_a(a_base, m0, k0 + BK, kr.y, lid + $i * WG);
      rb$i = fetch_b(b_base, k0 + BK, n0, kr.y, lid + $i * WG);
      //! end
    }
    //! unroll s in 0..2
    //! unroll i in 0..4
    let a$s$i = frag_a(buf, wr + $i * 16u, $s * 16u);
    let b$s$i = frag_b(buf, $s * 16u, wc + $i * 16u);
    //! end
    //! unroll i in 0..4
    //! unroll j in 0..4
    c$i$j = coopMultiplyAdd(a$s$i, b$s$j, c$i$j);
    //! end
    //! end
    //! end
    if (more) {
      //! unroll i in 0..8
      put_a(tile_at(buf ^ 1u, lid + $i * WG, TA == 0u), ra$i);
      put_b(tile_at(buf ^ 1u, lid + $i * WG, TB == 1u), rb$i);
      //! end
    }
    workgroupBarrier();
    buf = buf ^ 1u;
  }

  let c_base = p.c_off + ids.wid.z * p.m * p.n;
  // Strips of two accumulators: Cst takes the 8 KiB left of the 48 KiB after the tiles.
  //! unroll i in 0..4
  coopStoreT(c$i0u, &Cst[sg * 128u][0], 32u);
  coopStoreT(c$i1u, &Cst[sg * 128u + 4u][0], 32u);
  write_strip(2u, sg, lane, c_base, m0 + wr + $i * 16u, n0 + wc, 0xffffffffu, bb);
  coopStoreT(c$i2u, &Cst[sg * 128u][0], 32u);
  coopStoreT(c$i3u, &Cst[sg * 128u + 4u][0], 32u);
  write_strip(2u, sg, lane, c_base, m0 + wr + $i * 16u, n0 + wc + 32u, 0xffffffffu, bb);
  //! end
}

//! entry direct(a: f16, b: f16, bias: data, c: data mut vec4)
//! check WG=128 SAG=64 SBG=128 TA=0 TB=0 FUSE=0,5
//! check WG=128 SAG=256 SBG=64 TA=1 TB=1 FUSE=0,5
// Fragments straight from the buffers (see the header).
//
// Epilogue one accumulator at a time: strips of four (8 barriers instead of 32) gain nothing
// here, where `main` gains from strips of two.
var<workgroup> Cst: array<array<f32, 4>, 256>;

fn gload_a(base: u32, m: u32, k: u32) -> coop_mat16x16<f16, A> {
  if (TA == 0u) { return coopLoadT<coop_mat16x16<f16, A>>(&a[base + m * SAG + k], SAG); }
  return coopLoad<coop_mat16x16<f16, A>>(&a[base + k * SAG + m], SAG);
}

fn gload_b(base: u32, k: u32, n: u32) -> coop_mat16x16<f16, B> {
  if (TB == 0u) { return coopLoadT<coop_mat16x16<f16, B>>(&b[base + k * SBG + n], SBG); }
  return coopLoad<coop_mat16x16<f16, B>>(&b[base + n * SBG + k], SBG);
}

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let lid = ids.lid;
  let sg = lid / 32u;
  let lane = lid % 32u;
  let bt = ids.wid.z % p.batch;
  let bb = matmul_bias_base(bt);
  let kr = matmul_krange(ids.wid.z);
  let a_base = p.a_off + (bt % p.a_mod) * p.a_bs;
  let b_base = p.b_off + (bt % p.b_mod) * p.b_bs;
  let rb = ids.wid.y * BM + (sg / 2u) * 64u;
  let qb = ids.wid.x * BN + (sg % 2u) * 64u;
  //! unroll i in 0..4
  let r$i = min(rb + $i * 16u, p.m - 16u);
  let q$i = min(qb + $i * 16u, p.n - 16u);
  //! end
  //! unroll i in 0..4
  //! unroll j in 0..4
  var c$i$j = coop_mat16x16<f32, C>();
  //! end
  //! end
  for (var k = kr.x; k < kr.y; k = k + 16u) {
    //! unroll i in 0..4
    let a$i = gload_a(a_base, r$i, k);
    let b$i = gload_b(b_base, k, q$i);
    //! end
    //! unroll i in 0..4
    //! unroll j in 0..4
    c$i$j = coopMultiplyAdd(a$i, b$j, c$i$j);
    //! end
    //! end
  }
  let c_base = p.c_off + ids.wid.z * p.m * p.n;
  //! unroll i in 0..4
  //! unroll j in 0..4
  coopStoreT(c$i$j, &Cst[sg * 64u][0], 16u);
  write_strip(1u, sg, lane, c_base, r$i, q$j, p.n - 16u, bb);
  //! end
  //! end
}
