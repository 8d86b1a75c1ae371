// matmul_coop.wgsl: the same product as matmul.wgsl on cooperative matrices (tensor cores):
// 16x16x16 multiply-adds with f16 inputs and f32 accumulators.
//
// Same parameters, strides, batching and epilogue as matmul.wgsl. Requires SHADER_F16, the
// 16x16 f16 -> f32 cooperative-matrix configuration, and a subgroup size of 32 (WG = 256 is 8
// subgroups; the host only picks this kernel on such adapters).
//
// Tiling: a workgroup computes a 128 x 128 tile of C. Each step along K copies a 128 x 32 tile
// of A and a 32 x 128 tile of B into workgroup memory as f16 (zero past M, N, K, which is what
// makes any shape work: the matrix loads themselves cannot be bounds-checked). Subgroup s
// owns rows 32*(s/2) .. +32 and columns 64*(s%2) .. +64 of the tile: a 2 x 4 grid of 16 x 16
// accumulators. Workgroup-memory rows are padded (SA = 40, SB = 136 halves) so the matrix
// loads of neighbouring rows fall in different banks; the strides are constants, which is
// also what naga's SPIR-V writer needs for cooperative loads.
//
// Epilogue: each subgroup stores one accumulator at a time to its own 16 x 16 f32 patch of
// workgroup memory, then its 32 lanes apply bias and activation and write the 256 values with
// bounds checks, converting to C's dtype. Every subgroup flushes its tiles in the same order,
// so a workgroup barrier (uniform) separates the matrix store from the lanes' reads; subgroup
// barriers would need wgpu's separate SUBGROUP_BARRIER feature.
//
// This is the fallback for operands matmul_tc.wgsl cannot take (contiguous extents, pitches
// or offsets not multiples of 4).
//
// Split-K as in matmul.wgsl: workgroup z = s * batch + b covers one K range; with splits > 1
// the partials are raw f32 and matmul.wgsl's `splitk` finishes them.
//
// Bindings: signature lines. Constants: none beyond WG. The subgroup index is lid / 32:
// subgroups of a 1-D workgroup are consecutive runs of local_invocation_index.
// Loops (per invocation): 2 (BM BK / WG + 1) + 1 = 35 per 32 of K plus 72 in the epilogue.
// The host sizes kchunk to the budget.

// The parameter block shared with the other matmul kernel (common.wgsl).
alias Params = MatmulParams;

const BM: u32 = 128u;
const BN: u32 = 128u;
const BK: u32 = 32u;
const SA: u32 = 40u;
const SB: u32 = 136u;

var<workgroup> As: array<f16, BM * SA>;
var<workgroup> Bs: array<f16, BK * SB>;
var<workgroup> Cs: array<f32, 8u * 256u>;


// Writes one 16 x 16 accumulator of subgroup `sg` whose top-left is (gm0, gn0) in C.
fn flush_tile(acc: coop_mat16x16<f32, C>, sg: u32, lane: u32, c_base: u32, gm0: u32, gn0: u32, bb: u32) {
  coopStoreT(acc, &Cs[sg * 256u], 16u);
  workgroupBarrier();
  for (var e = lane; e < 256u; e = e + 32u) {
    let gm = gm0 + e / 16u;
    let gn = gn0 + e % 16u;
    if (gm < p.m && gn < p.n) {
      st_c(c_base + gm * p.n + gn, matmul_epilogue(Cs[sg * 256u + e], gm, gn, bb));
    }
  }
  workgroupBarrier();
}

//! entry main(a: data, b: data, bias: data, c: data mut)
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
  let wr = (sg / 2u) * 32u;
  let wc = (sg % 2u) * 64u;

  var c00 = coop_mat16x16<f32, C>();
  var c01 = coop_mat16x16<f32, C>();
  var c02 = coop_mat16x16<f32, C>();
  var c03 = coop_mat16x16<f32, C>();
  var c10 = coop_mat16x16<f32, C>();
  var c11 = coop_mat16x16<f32, C>();
  var c12 = coop_mat16x16<f32, C>();
  var c13 = coop_mat16x16<f32, C>();

  for (var k0 = kr.x; k0 < kr.y; k0 = k0 + BK) {
    for (var e = lid; e < BM * BK; e = e + WG) {
      var mm: u32;
      var kk: u32;
      if (p.a_kfast != 0u) { mm = e / BK; kk = e % BK; } else { kk = e / BM; mm = e % BM; }
      let v = matmul_a(a_base, m0 + mm, k0 + kk, kr.y);
      As[mm * SA + kk] = f16(v);
    }
    for (var e = lid; e < BN * BK; e = e + WG) {
      var nn: u32;
      var kk: u32;
      if (p.b_nfast != 0u) { kk = e / BN; nn = e % BN; } else { nn = e / BK; kk = e % BK; }
      let v = matmul_b(b_base, k0 + kk, n0 + nn, kr.y);
      Bs[kk * SB + nn] = f16(v);
    }
    workgroupBarrier();
    for (var kk = 0u; kk < BK; kk = kk + 16u) {
      let a0 = coopLoadT<coop_mat16x16<f16, A>>(&As[wr * SA + kk], SA);
      let a1 = coopLoadT<coop_mat16x16<f16, A>>(&As[(wr + 16u) * SA + kk], SA);
      let b0 = coopLoadT<coop_mat16x16<f16, B>>(&Bs[kk * SB + wc], SB);
      let b1 = coopLoadT<coop_mat16x16<f16, B>>(&Bs[kk * SB + wc + 16u], SB);
      let b2 = coopLoadT<coop_mat16x16<f16, B>>(&Bs[kk * SB + wc + 32u], SB);
      let b3 = coopLoadT<coop_mat16x16<f16, B>>(&Bs[kk * SB + wc + 48u], SB);
      c00 = coopMultiplyAdd(a0, b0, c00);
      c01 = coopMultiplyAdd(a0, b1, c01);
      c02 = coopMultiplyAdd(a0, b2, c02);
      c03 = coopMultiplyAdd(a0, b3, c03);
      c10 = coopMultiplyAdd(a1, b0, c10);
      c11 = coopMultiplyAdd(a1, b1, c11);
      c12 = coopMultiplyAdd(a1, b2, c12);
      c13 = coopMultiplyAdd(a1, b3, c13);
    }
    workgroupBarrier();
  }

  let c_base = p.c_off + ids.wid.z * p.m * p.n;
  let r0 = m0 + wr;
  let q0 = n0 + wc;
  flush_tile(c00, sg, lane, c_base, r0, q0, bb);
  flush_tile(c01, sg, lane, c_base, r0, q0 + 16u, bb);
  flush_tile(c02, sg, lane, c_base, r0, q0 + 32u, bb);
  flush_tile(c03, sg, lane, c_base, r0, q0 + 48u, bb);
  flush_tile(c10, sg, lane, c_base, r0 + 16u, q0, bb);
  flush_tile(c11, sg, lane, c_base, r0 + 16u, q0 + 16u, bb);
  flush_tile(c12, sg, lane, c_base, r0 + 16u, q0 + 32u, bb);
  flush_tile(c13, sg, lane, c_base, r0 + 16u, q0 + 48u, bb);
}
