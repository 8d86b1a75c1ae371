// norm.wgsl: LayerNorm and RMSNorm over the last axis, forward and backward.
//
// Rows of length `len` (the normalised axis); gamma and beta have `len` elements.
//
//   fwd        One workgroup per row (row folded over a 2-D grid as in softmax.wgsl).
//              LayerNorm: mean, then the variance as the mean of (x - mean)^2 (two reads of
//              the row: numerically safer than E[x^2] - E[x]^2), rstd = 1/sqrt(var + eps),
//              y = (x - mean) * rstd * gamma + beta. RMSNorm (rms = 1): mean is 0, var is the
//              mean of x^2, no beta. Saves mean and rstd per row (f32) for the backward pass.
//   bwd_x      One workgroup per row: with xhat = (x - mean) * rstd and g = dy * gamma,
//              dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); for RMSNorm the mean(g)
//              term is absent.
//   bwd_params One thread per column c, looping over the rows (neighbouring threads read
//              neighbouring columns): dgamma[c] = sum_r dy * xhat, dbeta[c] = sum_r dy.
//
// Bindings: fwd reads x, gamma, beta (a dummy for RMSNorm), writes y, mean, rstd;
// bwd_x reads x, dy, gamma, mean, rstd, writes dx; bwd_params reads x, dy, mean, rstd, writes
// dgamma, dbeta. Params: rows, len, eps, rms (0/1).
// Bounds: per-row early returns depend only on the workgroup id (uniform for the barriers in
// the reductions); element loops test i < len; bwd_params threads past len return.

struct Params {
  rows: u32,
  len: u32,
  eps: f32,
  rms: u32,
}

//! entry fwd
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let r = ids.wid.y * ids.nwg.x + ids.wid.x;
  if (r >= p.rows) { return; }
  let base = r * p.len;
  let inv_len = 1.0 / f32(p.len);
  var mean = 0.0;
  if (p.rms == 0u) {
    var s = 0.0;
    for (var i = ids.lid; i < p.len; i = i + WG) { s = s + ld_x(base + i); }
    mean = block_sum(s, ids) * inv_len;
  }
  var q = 0.0;
  for (var i = ids.lid; i < p.len; i = i + WG) {
    let d = ld_x(base + i) - mean;
    q = q + d * d;
  }
  let rstd = inverseSqrt(block_sum(q, ids) * inv_len + p.eps);
  for (var i = ids.lid; i < p.len; i = i + WG) {
    var v = (ld_x(base + i) - mean) * rstd * ld_gamma(i);
    if (p.rms == 0u) { v = v + ld_beta(i); }
    st_y(base + i, v);
  }
  if (ids.lid == 0u) {
    st_mean(r, mean);
    st_rstd(r, rstd);
  }
}

//! entry bwd_x
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let r = ids.wid.y * ids.nwg.x + ids.wid.x;
  if (r >= p.rows) { return; }
  let base = r * p.len;
  let mean = ld_mean(r);
  let rstd = ld_rstd(r);
  var sg = 0.0;
  var sgx = 0.0;
  for (var i = ids.lid; i < p.len; i = i + WG) {
    let g = ld_dy(base + i) * ld_gamma(i);
    let xh = (ld_x(base + i) - mean) * rstd;
    sg = sg + g;
    sgx = sgx + g * xh;
  }
  let inv_len = 1.0 / f32(p.len);
  var mg = block_sum(sg, ids) * inv_len;
  let mgx = block_sum(sgx, ids) * inv_len;
  if (p.rms != 0u) { mg = 0.0; }
  for (var i = ids.lid; i < p.len; i = i + WG) {
    let g = ld_dy(base + i) * ld_gamma(i);
    let xh = (ld_x(base + i) - mean) * rstd;
    st_dx(base + i, rstd * (g - mg - xh * mgx));
  }
}

//! entry bwd_params
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let c = flat_id(ids);
  if (c >= p.len) { return; }
  var dg = 0.0;
  var db = 0.0;
  for (var r = 0u; r < p.rows; r = r + 1u) {
    let dy = ld_dy(r * p.len + c);
    let xh = (ld_x(r * p.len + c) - ld_mean(r)) * ld_rstd(r);
    dg = dg + dy * xh;
    db = db + dy;
  }
  st_dgamma(c, dg);
  st_dbeta(c, db);
}
