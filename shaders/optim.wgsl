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
// Bindings: sgd reads g, writes w, master, buf; adam reads g, writes w, master, m, v; sumsq
// reads x, writes partial. (When there is no master weight or no momentum, a dummy block is
// bound and never touched.)

struct Params {
  n: u32,
  lr: f32,
  gmul: f32,
  wd: f32,
  a: f32,          // sgd: momentum; adam: beta1
  b: f32,          // sgd: nesterov (0/1); adam: beta2
  eps: f32,
  c1: f32,
  c2: f32,
  flags: u32,      // bit 0: has_master, bit 1: decoupled weight decay (adam)
}

//! entry sgd
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  // With a master copy, the dummy-or-master binding is read either way (it is valid memory).
  let has_master = (p.flags & 1u) != 0u;
  var w = select(ld_w(i), ld_master(i), has_master);
  var g = ld_g(i) * p.gmul + p.wd * w;
  if (p.a > 0.0) {
    let b = p.a * ld_buf(i) + g;
    st_buf(i, b);
    if (p.b != 0.0) { g = g + p.a * b; } else { g = b; }
  }
  w = w - p.lr * g;
  if (has_master) { st_master(i, w); }
  st_w(i, w);
}

//! entry adam
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  // With a master copy, the dummy-or-master binding is read either way (it is valid memory).
  let has_master = (p.flags & 1u) != 0u;
  var w = select(ld_w(i), ld_master(i), has_master);
  var g = ld_g(i) * p.gmul;
  if ((p.flags & 2u) != 0u) {
    w = w - p.lr * p.wd * w;
  } else {
    g = g + p.wd * w;
  }
  let m = p.a * ld_m(i) + (1.0 - p.a) * g;
  let v = p.b * ld_v(i) + (1.0 - p.b) * g * g;
  st_m(i, m);
  st_v(i, v);
  w = w - p.lr * (m * p.c1) / (sqrt(v * p.c2) + p.eps);
  if (has_master) { st_master(i, w); }
  st_w(i, w);
}

//! entry sumsq
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
