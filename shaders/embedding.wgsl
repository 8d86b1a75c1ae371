// embedding.wgsl: row gather and its gradient (scatter-add), deterministic.
//
// Table w is [vocab, dim]; idx is u32 [n].
//
//   gather        One thread per output element (n * dim): y[t, d] = w[idx[t], d]; an index
//                 past the vocabulary gives NaN (see loss.wgsl for why not a silent 0).
//   scatter_rows  One thread per (row v, column d) of dw, looping over all n indices and
//                 summing dy[t, d] where idx[t] == v. No atomics, so the result is the same on
//                 every run; v * d threads, n reads of idx each (broadcast, cached). Suits small
//                 vocabularies (characters, classes).
//   scatter_cols  One thread per column d, looping over t: dw[idx[t], d] += dy[t, d]. Only
//                 that thread writes column d, so again no races. Suits large vocabularies
//                 (dw must be zeroed first).
//
// Bindings: gather reads w, idx, writes y; scatter_* read idx, dy, write dw (scatter_cols
// also reads it). Params: n, dim, vocab.
// Bounds: threads past their range return; indices are range-checked before use.

struct Params {
  n: u32,
  dim: u32,
  vocab: u32,
}

//! entry gather
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n * p.dim) { return; }
  let t = i / p.dim;
  let d = i % p.dim;
  let v = ld_idx(t);
  if (v < p.vocab) {
    st_y(i, ld_w(v * p.dim + d));
  } else {
    st_y(i, bitcast<f32>(0x7fc00000u + v * 0u));
  }
}

//! entry scatter_rows
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.vocab * p.dim) { return; }
  let v = i / p.dim;
  let d = i % p.dim;
  var acc = 0.0;
  for (var t = 0u; t < p.n; t = t + 1u) {
    if (ld_idx(t) == v) { acc = acc + ld_dy(t * p.dim + d); }
  }
  st_dw(i, acc);
}

//! entry scatter_cols
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let d = flat_id(ids);
  if (d >= p.dim) { return; }
  for (var t = 0u; t < p.n; t = t + 1u) {
    let v = ld_idx(t);
    if (v < p.vocab) {
      let j = v * p.dim + d;
      st_dw(j, ld_dw(j) + ld_dy(t * p.dim + d));
    }
  }
}
