// loss.wgsl: cross-entropy from logits, forward and backward.
//
// Logits x are [rows, classes]; labels are u32 [rows].
//
//   fwd  One workgroup per row (folded over a 2-D grid). lse = max + log(sum exp(x - max))
//        from row_max_sumexp (common.wgsl), as softmax.wgsl; loss[r] = lse - x[label].
//        A label >= classes gives a NaN loss (the host cannot see labels without a
//        read-back; NaN makes the mistake visible instead of silently training on garbage).
//        Saves lse[r] (f32).
//   bwd  One thread per logit: dx = g[r] * (exp(x - lse[r]) - (c == label[r])), where g is
//        the gradient of the per-row loss.
//
// Bindings: fwd reads x, labels, writes loss, lse; bwd reads x, labels, lse, g, writes dx.
// Params: rows, classes.
// Bounds: fwd's early return is per workgroup (uniform for the reductions); bwd threads past
// rows * classes return; the label is only used to index x after the range check.

struct Params {
  rows: u32,
  classes: u32,
}

//! entry fwd
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let r = ids.wid.y * ids.nwg.x + ids.wid.x;
  if (r >= p.rows) { return; }
  let base = r * p.classes;
  let st = row_max_sumexp(base, p.classes, ids);
  let mx = st.x;
  let sum = st.y;
  if (ids.lid == 0u) {
    let lse = mx + log(sum);
    let label = ld_labels(r);
    var loss = lse;
    if (label < p.classes) {
      loss = lse - ld_x(base + label);
    } else {
      loss = bitcast<f32>(0x7fc00000u + label * 0u);
    }
    st_loss(r, loss);
    st_lse(r, lse);
  }
}

//! entry bwd
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.rows * p.classes) { return; }
  let r = i / p.classes;
  let c = i % p.classes;
  let onehot = select(0.0, 1.0, ld_labels(r) == c);
  st_dx(i, ld_g(r) * (exp(ld_x(i) - ld_lse(r)) - onehot));
}
