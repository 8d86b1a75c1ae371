// coop_layout.wgsl: which row and column each element of an invocation's share of a 16 x 16
// cooperative matrix holds, for the f32 accumulator (C) and the f16 A operand. SPIR-V lets a
// kernel read and write those elements (common.wgsl `coop_get<E>`, `coop_set<E>`) but leaves
// their placement to the driver; kernels that work on rows of an accumulator in registers
// (attention_coop.wgsl `fwd_reg`) run only where kernels/coop_layout.rs found the layout they
// assume.
//
// `operands` is never read: the launch binds it as f16 or bf16 to say which the A matrix
// holds (bf16: kernels/spirv.rs `bf16_halves` makes the module's 16-bit values bf16).
//
// One subgroup of 32: element E of lane l is set to l 8 + E in both matrices, which are then
// stored row-major; out[r 16 + c] names the (lane, element) holding C's (r, c), out[256 + r 16
// + c] A's (exact in f16: at most 255), and out[512 + l 8 + E] reads C's element back with
// coop_get<E> (it must give l 8 + E).
//
// Loops (per invocation): 8.

struct Params {
  n: u32,
}

var<workgroup> Cs: array<f32, 256>;
var<workgroup> As: array<f16, 256>;

//! entry probe(out: f32 mut, operands: half)
//! requires spirv
//! check WG=32
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let l = ids.lid;
  var c = coop_mat16x16<f32, C>();
  var a = coop_mat16x16<f16, A>();
  //! unroll e in 0..8
  c = coop_set$e(c, f32(l * 8u + $e));
  a = coop_seta$e(a, f16(l * 8u + $e));
  //! end
  coopStoreT(c, &Cs[0], 16u);
  coopStoreT(a, &As[0], 16u);
  workgroupBarrier();
  for (var i = l; i < 256u; i = i + 32u) {
    st_out(i, Cs[i]);
    st_out(256u + i, f32(As[i]));
  }
  //! unroll e in 0..8
  st_out(512u + l * 8u + $e, coop_get$e(c));
  //! end
}
