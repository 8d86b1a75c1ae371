// optim.wgsl: fused optimizer updates (one dispatch per parameter) and gradient norms.
//
// Update entries are one thread per parameter element, 1-D with flat_id; threads past n return
// (each touches only its own element). All optimizer state is f32 on the device. The gradient
// is multiplied by `gmul` first, which folds loss-scale removal (1/scale) and global-norm
// clipping into the same pass. With `has_master`, the f32 master weight is the one updated and
// the (f16) parameter receives its rounded copy; otherwise the parameter itself is updated.
//
//   sgd    g += wd * w;  b = momentum * b + g (when momentum > 0);
//          g = nesterov ? g + momentum * b : b;  w -= lr * g
//   adam   (AdamW when decoupled: w -= lr * wd * w, else g += wd * w)
//          m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//          w -= lr * (m * c1) / (sqrt(v * c2) + eps),  c1 = 1/(1 - b1^t), c2 = 1/(1 - b2^t)
//   sumsq  One workgroup per chunk of WG * 8 elements: the f32 sum of squares of its chunk,
//          written to partial[wid] (the host sums the partials). Accumulating in f32 keeps an
//          f16 gradient's squares from overflowing; an inf or NaN anywhere makes the sum inf
//          or NaN, which is how the loss scaler detects overflow.
//
// Bindings: signature lines. (When there is no master weight or no momentum, a dummy block
// is bound and never touched.)
// Loops: sumsq 8 (a constant trip count); the updates none.

struct Params {
  n: u32,
  lr: f32,
  gmul: f32,
  wd: f32,
  beta1: f32,      // adam; sgd's momentum
  beta2: f32,      // adam
  eps: f32,
  c1: f32,
  c2: f32,
  has_master: u32,
  decoupled: u32,  // adam: AdamW's decoupled weight decay
  nesterov: u32,   // sgd
}

//! entry sgd(g: data, w: data mut, master: f32 mut, buf: f32 mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  // With a master copy, the dummy-or-master binding is read either way (it is valid memory).
  let has_master = p.has_master != 0u;
  var w = select(ld_w(i), ld_master(i), has_master);
  var g = ld_g(i) * p.gmul + p.wd * w;
  if (p.beta1 > 0.0) {
    let b = p.beta1 * ld_buf(i) + g;
    st_buf(i, b);
    if (p.nesterov != 0u) { g = g + p.beta1 * b; } else { g = b; }
  }
  w = w - p.lr * g;
  if (has_master) { st_master(i, w); }
  st_w(i, w);
}

//! entry adam(g: data, w: data mut, master: f32 mut, m: f32 mut, v: f32 mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  // With a master copy, the dummy-or-master binding is read either way (it is valid memory).
  let has_master = p.has_master != 0u;
  var w = select(ld_w(i), ld_master(i), has_master);
  var g = ld_g(i) * p.gmul;
  if (p.decoupled != 0u) {
    w = w - p.lr * p.wd * w;
  } else {
    g = g + p.wd * w;
  }
  let m = p.beta1 * ld_m(i) + (1.0 - p.beta1) * g;
  let v = p.beta2 * ld_v(i) + (1.0 - p.beta2) * g * g;
  st_m(i, m);
  st_v(i, v);
  w = w - p.lr * (m * p.c1) / (sqrt(v * p.c2) + p.eps);
  if (has_master) { st_master(i, w); }
  st_w(i, w);
}

//! entry sumsq(x: data, partial: f32 mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let wg = ids.wid.y * ids.nwg.x + ids.wid.x;
  let start = wg * WG * 8u;
  var s = 0.0;
  for (var j = 0u; j < 8u; j = j + 1u) {
    let i = start + j * WG + ids.lid;
    if (i < p.n) {
      let x = ld_x(i);
      s = s + x * x;
    }
  }
  let t = block_sum(s, ids);
  if (ids.lid == 0u) { st_partial(wg, t); }
}
