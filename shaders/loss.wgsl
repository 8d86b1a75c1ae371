// loss.wgsl: cross-entropy from logits, forward and backward.
//
// Logits x are [rows, classes]; labels are u32 [rows].
//
//   fwd  One workgroup per row (folded over a 2-D grid). The row's max m and s = sum exp(x - m)
//        from row_max_sumexp (common.wgsl), as softmax.wgsl; loss[r] = log s + (m - x[label]),
//        in that order so nothing rounds at the size of the logits (m - x[label] is exact
//        for close values; m + log s - x[label] lost digits for logits near -30000).
//        A label >= classes gives a NaN loss (the host cannot see labels without a
//        read-back; NaN makes the mistake visible instead of silently training on garbage;
//        a checked device refuses such labels before the launch). Saves (m, log s) per row
//        as f32 pairs.
//   bwd  One thread per logit: dx = g[r] * (exp((x - m) - log s) - (c == label[r])), where g
//        is the gradient of the per-row loss.
//
// Bindings: signature lines. Params: rows, classes.
// Loops (per invocation): fwd one stride over the row (classes / WG + 1) plus two block
// reductions; the host caps classes at 2^20. bwd none.
// Bounds: fwd's early return is per workgroup (uniform for the reductions); bwd threads past
// rows * classes return; the label is only used to index x after the range check.

struct Params {
  rows: u32,
  classes: u32,
}

//! entry fwd(x: data, labels: u32, loss: data mut, stats: f32 mut)
//! check WG=32,64,128,256
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let r = ids.wid.y * ids.nwg.x + ids.wid.x;
  if (r >= p.rows) { return; }
  let base = r * p.classes;
  let st = row_max_sumexp(base, p.classes, ids);
  let mx = st.x;
  let sum = st.y;
  if (ids.lid == 0u) {
    let lsum = log(sum);
    let label = ld_labels(r);
    var loss: f32;
    if (label < p.classes) {
      loss = lsum + (mx - ld_x(base + label));
    } else {
      loss = bitcast<f32>(0x7fc00000u + label * 0u);
    }
    st_loss(r, loss);
    st_stats(2u * r, mx);
    st_stats(2u * r + 1u, lsum);
  }
}

//! entry bwd(x: data, labels: u32, stats: f32, g: data, dx: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.rows * p.classes) { return; }
  let rc = udivmod(i, p.classes);
  let r = rc.x;
  let c = rc.y;
  let onehot = select(0.0, 1.0, ld_labels(r) == c);
  let pr = exp((ld_x(i) - ld_stats(2u * r)) - ld_stats(2u * r + 1u));
  st_dx(i, ld_g(r) * (pr - onehot));
}
