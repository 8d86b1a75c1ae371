// matmul.wgsl: C[b] = act(op(A)[b] x op(B)[b] + bias), tiled in workgroup memory.
//
// Shapes: op(A) is M x K, op(B) is K x N, C is M x N (row-major, contiguous per batch).
// Transposes cost nothing: A's element (m, k) is read at a_off + m*sam + k*sak and B's (k, n)
// at b_off + k*sbk + n*sbn, so a transposed operand just swaps its two strides.
// Batches: workgroup z is the batch index b. An operand's offset is
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
// Epilogue: + bias[n] when has_bias, then act (0 none, 1 relu, 2 gelu (erf form)), stored as
// C's dtype. Accumulation is always f32.
//
// Bindings: a, b, bias (read; a dummy when has_bias is 0), c (write).
// Constants: BM, BN, BK, TM, TN.

// The parameter block shared with the other matmul kernel (common.wgsl).
alias Params = MatmulParams;

const TX: u32 = BN / TN;
const TY: u32 = BM / TM;

var<workgroup> As: array<f32, BK * BM>;
var<workgroup> Bs: array<f32, BK * BN>;


//! entry main
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let lid = ids.lid;
  let tx = lid % TX;
  let ty = lid / TX;
  let bt = ids.wid.z;
  let m0 = ids.wid.y * BM;
  let n0 = ids.wid.x * BN;
  let a_base = p.a_off + (bt % p.a_mod) * p.a_bs;
  let b_base = p.b_off + (bt % p.b_mod) * p.b_bs;

  var acc: array<f32, TM * TN>;
  for (var i = 0u; i < TM * TN; i = i + 1u) { acc[i] = 0.0; }

  for (var k0 = 0u; k0 < p.k; k0 = k0 + BK) {
    for (var e = lid; e < BM * BK; e = e + WG) {
      var mm: u32;
      var kk: u32;
      if (p.a_kfast != 0u) { mm = e / BK; kk = e % BK; } else { kk = e / BM; mm = e % BM; }
      let v = matmul_a(a_base, m0 + mm, k0 + kk);
      As[kk * BM + mm] = v;
    }
    for (var e = lid; e < BN * BK; e = e + WG) {
      var nn: u32;
      var kk: u32;
      if (p.b_nfast != 0u) { kk = e / BN; nn = e % BN; } else { nn = e / BK; kk = e % BK; }
      let v = matmul_b(b_base, k0 + kk, n0 + nn);
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

  let c_base = p.c_off + bt * p.m * p.n;
  for (var i = 0u; i < TM; i = i + 1u) {
    let gm = m0 + ty + i * TY;
    for (var j = 0u; j < TN; j = j + 1u) {
      let gn = n0 + tx + j * TX;
      if (gm < p.m && gn < p.n) {
        st_c(c_base + gm * p.n + gn, matmul_epilogue(acc[i * TN + j], gn));
      }
    }
  }
}
