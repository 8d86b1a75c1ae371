// optim.wgsl: fused optimizer updates (one dispatch per parameter, or per four where the
// adapter binds enough storage buffers), gradient norms, and the
// device-side decision of a guarded step (clip, skip on overflow, loss-scale update), so a
// training step needs no read-back.
//
// Update entries are one thread per parameter element; threads past n return (each touches
// only its own element). `sgd` and `adam` take one tensor (1-D with flat_id); `sgd4` and
// `adam4` take up to four, laid out as sumsq lays them out (`group_slot`; has_master is a bit
// per tensor): one dispatch a tensor (76 AdamW dispatches in the GPT, mostly small tensors)
// costs the step its launches rather than its bytes. All optimizer state is f32 on the
// device. The gradient
// is multiplied by `gmul` and by the step's control word ctl[CTL_MUL] first, which folds
// loss-scale removal (1/scale) and global-norm clipping into the same pass; when
// ctl[CTL_STEPPED] is 0 (the gradients held inf or NaN) the update leaves everything as it
// was. A plain step binds a control block of (multiplier 1, stepped 1). With `has_master`,
// the f32 master weight is the one updated and the (f16) parameter receives its rounded copy;
// otherwise the parameter itself is updated.
//
//   sgd    g += wd * w;  b = momentum * b + g (when momentum > 0);
//          g = nesterov ? g + momentum * b : b;  w -= lr * g
//   adam   (AdamW when decoupled: w -= lr * wd * w, else g += wd * w)
//          m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//          w -= lr * (m * c1) / (sqrt(v * c2) + eps),  c1 = 1/(1 - b1^t), c2 = 1/(1 - b2^t)
//   sumsq  Up to four tensors a dispatch (x0u .. x3u; sumsq16 sixteen, where the adapter
//          binds them: 76 dispatches of mostly small gradients cost the GPT step more than
//          their arithmetic), one workgroup per chunk of
//          WG * 8 elements of one of them, in order: the f32 sum of squares of its chunk,
//          written to partial[out_off + wid]. Accumulating in f32 keeps an f16 gradient's
//          squares from overflowing; an inf or NaN anywhere makes the sum inf or NaN, which
//          is how overflow is detected.
//   decide One workgroup: sums the n partials of every gradient, and writes the step's
//          decision into ctl (the CTL_* slots, declared by kernels/optim.rs): the gradient
//          norm in unscaled units, norm = sqrt(sum) gmul / scale; when it is finite, the
//          multiplier gmul / scale * clip (clip = max_norm / (norm + 1e-6) when norm >
//          max_norm > 0, else 1), stepped = 1, and one more clean step (the scale grows by
//          `growth` after `interval` of them); otherwise multiplier 0, stepped = 0, the scale
//          times `backoff`, the clean count reset and one more skipped step.
//
// Bindings: signature lines. (When there is no master weight or no momentum, a dummy block
// is bound and never touched.)
// Loops: sumsq 8 (a constant trip count); decide n / WG + 1 plus the block reduction (the
// host keeps n under the loop budget); the updates none but group_slot's (count - 1).

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
  out_off: u32,    // sumsq: where its partials start
  max_norm: f32,   // decide: clip threshold (0: no clipping)
  growth: f32,     // decide: scale multiplier after `interval` clean steps
  backoff: f32,    // decide: scale multiplier after an overflow
  interval: u32,   // decide
  wtot: u32,       // grouped entries: the group's workgroups (a 2-D grid may launch more)
  _pad0: u32,
  _pad1: u32,
  // Grouped entries (sgd4, adam4, sumsq, sumsq16): tensor k's element count, ns[k / 4][k % 4]
  // (group_n), and the first workgroup of its chunks, ws[k / 4][k % 4] (group_w).
  ns: array<vec4<u32>, 4>,
  ws: array<vec4<u32>, 4>,
}

// The updates of one element, shared by the one-tensor entries and the grouped ones. `g` is
// already multiplied by gmul and the control word.
fn sgd_rule(w0: f32, g0: f32, b0: f32) -> vec2<f32> {
  var g = g0 + p.wd * w0;
  var b = b0;
  if (p.beta1 > 0.0) {
    b = p.beta1 * b0 + g;
    if (p.nesterov != 0u) { g = g + p.beta1 * b; } else { g = b; }
  }
  return vec2<f32>(w0 - p.lr * g, b);
}

fn adam_rule(w0: f32, g0: f32, m0: f32, v0: f32) -> vec3<f32> {
  var w = w0;
  var g = g0;
  if (p.decoupled != 0u) {
    w = w - p.lr * p.wd * w;
  } else {
    g = g + p.wd * w;
  }
  let m = p.beta1 * m0 + (1.0 - p.beta1) * g;
  let v = p.beta2 * v0 + (1.0 - p.beta2) * g * g;
  w = w - p.lr * (m * p.c1) / (sqrt(v * p.c2) + p.eps);
  return vec3<f32>(w, m, v);
}

fn group_n(k: u32) -> u32 { return p.ns[k / 4u][k % 4u]; }
fn group_w(k: u32) -> u32 { return p.ws[k / 4u][k % 4u]; }

// Which tensor of a group of `count` workgroup `wg` works on, and its place among that
// tensor's workgroups: tensor k owns workgroups [group_w(k), group_w(k + 1)) (the last range
// is open; a tensor missing from a group, or empty, owns none). Uniform across the workgroup.
fn group_slot(wg: u32, count: u32) -> vec2<u32> {
  var k = 0u;
  for (var j = 1u; j < count; j = j + 1u) {
    if (wg >= group_w(j)) { k = j; }
  }
  return vec2<u32>(k, wg - group_w(k));
}

//! entry sgd(g: data, w: data mut, master: f32 mut, buf: f32 mut, ctl: f32)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n || ld_ctl(CTL_STEPPED) == 0.0) { return; }
  // With a master copy, the dummy-or-master binding is read either way (it is valid memory).
  let has_master = (p.has_master & 1u) != 0u;
  let w = select(ld_w(i), ld_master(i), has_master);
  var b = 0.0;
  if (p.beta1 > 0.0) { b = ld_buf(i); }
  let r = sgd_rule(w, ld_g(i) * (p.gmul * ld_ctl(CTL_MUL)), b);
  if (p.beta1 > 0.0) { st_buf(i, r.y); }
  if (has_master) { st_master(i, r.x); }
  st_w(i, r.x);
}

//! entry adam(g: data, w: data mut, master: f32 mut, m: f32 mut, v: f32 mut, ctl: f32)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n || ld_ctl(CTL_STEPPED) == 0.0) { return; }
  // With a master copy, the dummy-or-master binding is read either way (it is valid memory).
  let has_master = (p.has_master & 1u) != 0u;
  let w = select(ld_w(i), ld_master(i), has_master);
  let r = adam_rule(w, ld_g(i) * (p.gmul * ld_ctl(CTL_MUL)), ld_m(i), ld_v(i));
  st_m(i, r.y);
  st_v(i, r.z);
  if (has_master) { st_master(i, r.x); }
  st_w(i, r.x);
}

//! entry sgd4(g0u: data, par0u: data mut, master0u: f32 mut, buf0u: f32 mut, g1u: data, par1u: data mut, master1u: f32 mut, buf1u: f32 mut, g2u: data, par2u: data mut, master2u: f32 mut, buf2u: f32 mut, g3u: data, par3u: data mut, master3u: f32 mut, buf3u: f32 mut, ctl: f32)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  if (ld_ctl(CTL_STEPPED) == 0.0) { return; }
  let at = group_slot(ids.wid.y * ids.nwg.x + ids.wid.x, 4u);
  let i = at.y * WG + ids.lid;
  let gm = p.gmul * ld_ctl(CTL_MUL);
  //! unroll k in 0..4
  if (at.x == $k && i < group_n($k)) {
    let has_master = (p.has_master & (1u << $k)) != 0u;
    let w = select(ld_par$k(i), ld_master$k(i), has_master);
    var b = 0.0;
    if (p.beta1 > 0.0) { b = ld_buf$k(i); }
    let r = sgd_rule(w, ld_g$k(i) * gm, b);
    if (p.beta1 > 0.0) { st_buf$k(i, r.y); }
    if (has_master) { st_master$k(i, r.x); }
    st_par$k(i, r.x);
  }
  //! end
}

//! entry adam4(g0u: data, par0u: data mut, master0u: f32 mut, m0u: f32 mut, v0u: f32 mut, g1u: data, par1u: data mut, master1u: f32 mut, m1u: f32 mut, v1u: f32 mut, g2u: data, par2u: data mut, master2u: f32 mut, m2u: f32 mut, v2u: f32 mut, g3u: data, par3u: data mut, master3u: f32 mut, m3u: f32 mut, v3u: f32 mut, ctl: f32)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  if (ld_ctl(CTL_STEPPED) == 0.0) { return; }
  let at = group_slot(ids.wid.y * ids.nwg.x + ids.wid.x, 4u);
  let i = at.y * WG + ids.lid;
  let gm = p.gmul * ld_ctl(CTL_MUL);
  //! unroll k in 0..4
  if (at.x == $k && i < group_n($k)) {
    let has_master = (p.has_master & (1u << $k)) != 0u;
    let w = select(ld_par$k(i), ld_master$k(i), has_master);
    let r = adam_rule(w, ld_g$k(i) * gm, ld_m$k(i), ld_v$k(i));
    st_m$k(i, r.y);
    st_v$k(i, r.z);
    if (has_master) { st_master$k(i, r.x); }
    st_par$k(i, r.x);
  }
  //! end
}

//! entry sumsq(x0u: data, x1u: data, x2u: data, x3u: data, partial: f32 mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let wg = ids.wid.y * ids.nwg.x + ids.wid.x;
  let at = group_slot(wg, 4u);
  var s = 0.0;
  //! unroll k in 0..4
  if (at.x == $k) {
    for (var j = 0u; j < 8u; j = j + 1u) {
      let i = (at.y * 8u + j) * WG + ids.lid;
      if (i < group_n($k)) {
        let x = ld_x$k(i);
        s = s + x * x;
      }
    }
  }
  //! end
  let t = block_sum(s, ids);
  if (ids.lid == 0u && wg < p.wtot) { st_partial(p.out_off + wg, t); }
}

//! entry sumsq16(x0u: data, x1u: data, x2u: data, x3u: data, x4u: data, x5u: data, x6u: data, x7u: data, x8u: data, x9u: data, x10u: data, x11u: data, x12u: data, x13u: data, x14u: data, x15u: data, partial: f32 mut)
// sumsq for 16 tensors, where the adapter binds 17 storage buffers.
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let wg = ids.wid.y * ids.nwg.x + ids.wid.x;
  let at = group_slot(wg, 16u);
  var s = 0.0;
  //! unroll k in 0..16
  if (at.x == $k) {
    for (var j = 0u; j < 8u; j = j + 1u) {
      let i = (at.y * 8u + j) * WG + ids.lid;
      if (i < group_n($k)) {
        let x = ld_x$k(i);
        s = s + x * x;
      }
    }
  }
  //! end
  let t = block_sum(s, ids);
  if (ids.lid == 0u && wg < p.wtot) { st_partial(p.out_off + wg, t); }
}

//! entry decide(partial: f32, ctl: f32 mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  var s = 0.0;
  for (var i = ids.lid; i < p.n; i = i + WG) {
    s = s + ld_partial(i);
  }
  let t = block_sum(s, ids);
  if (ids.lid != 0u) { return; }
  let scale = ld_ctl(CTL_SCALE);
  let norm = sqrt(t) * p.gmul / scale;
  // NaN fails both comparisons, so it is not finite either.
  let finite = norm >= 0.0 && norm <= 3.4028235e38;
  var clip = 1.0;
  if (finite && p.max_norm > 0.0 && norm > p.max_norm) { clip = p.max_norm / (norm + 1e-6); }
  st_ctl(CTL_NORM, norm);
  st_ctl(CTL_CLIP, clip);
  if (finite) {
    st_ctl(CTL_MUL, p.gmul / scale * clip);
    st_ctl(CTL_STEPPED, 1.0);
    let clean = ld_ctl(CTL_CLEAN) + 1.0;
    if (clean >= f32(p.interval)) {
      st_ctl(CTL_SCALE, scale * p.growth);
      st_ctl(CTL_CLEAN, 0.0);
    } else {
      st_ctl(CTL_CLEAN, clean);
    }
  } else {
    st_ctl(CTL_MUL, 0.0);
    st_ctl(CTL_STEPPED, 0.0);
    st_ctl(CTL_SCALE, scale * p.backoff);
    st_ctl(CTL_CLEAN, 0.0);
    st_ctl(CTL_SKIPPED, ld_ctl(CTL_SKIPPED) + 1.0);
  }
}
