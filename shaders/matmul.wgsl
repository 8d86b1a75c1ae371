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
//   splitk   one thread per element of C: the sum of the splits' partials, then the epilogue.
//
// Bindings: signature lines (bias is a dummy when has_bias is 0).
// Constants: BM, BN, BK, TM, TN.
// Loops (per invocation): main runs (BM BK / WG + 1) + (BN BK / WG + 1) + BK + 2 counted
// iterations per BK of its K range (the tile loads and the k loop; the TM x TN loops have
// constant trip counts); the host sizes kchunk so the total stays in the loop budget.
// splitk runs `splits` + 1.

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
        st_c(c_base + gm * p.n + gn, matmul_epilogue(acc[i * TN + j], gn));
      }
    }
  }
}

//! entry splitk(part: f32, bias: data, c: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  let total = p.batch * p.m * p.n;
  if (i >= total) { return; }
  var acc = 0.0;
  for (var s = 0u; s < p.splits; s = s + 1u) { acc = acc + ld_part(s * total + i); }
  st_c(p.c_off + i, matmul_epilogue(acc, i % p.n));
}
