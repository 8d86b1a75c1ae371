// norm.wgsl: LayerNorm and RMSNorm over the last axis, forward and backward.
//
// Rows of length `len` (the normalised axis); gamma and beta have `len` elements.
//
//   fwd        One workgroup per row (row folded over a 2-D grid as in softmax.wgsl).
//              LayerNorm, by the corrected two-pass algorithm: m0 = mean(x); then with
//              d = x - m0, corr = mean(d) and var = mean(d^2) - corr^2. The first pass's
//              rounding error is what corr removes, and d is exact-ish (x and m0 are close),
//              so the variance does not cancel even for rows like -1000 +- 1, where
//              E[x^2] - E[x]^2 is all noise and a plain two-pass mean is off by its rounding.
//              rstd = 1/sqrt(var + eps), y = ((x - m0) - corr) * rstd * gamma + beta.
//              RMSNorm (rms = 1): m0 = corr = 0, var = mean(x^2), no beta.
//              Saves (m0, corr, rstd) per row (f32) for the backward pass, which recomputes
//              xhat = ((x - m0) - corr) * rstd the same way: a single f32 mean would round at
//              the size of the mean and put that error into every xhat.
//   bwd_x      One workgroup per row: with xhat and g = dy * gamma,
//              dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); for RMSNorm the mean(g)
//              term is absent.
//   fwd_rows, bwd_x_rows  The same with one subgroup per row (below), for short rows.
//   bwd_params One thread per (column c, chunk of `rchunk` rows): the chunk's sums of
//              dy * xhat and of dy, written as f32 partials part[0, k, c] and part[1, k, c];
//              the host sums the chunks (a reduce pass) into dgamma and dbeta. Chunks bound
//              each thread's loop and give the device rows x len / rchunk threads instead of
//              len.
//
// Bindings: signature lines (beta is a dummy for RMSNorm). Params: rows, len, eps, rms (0/1),
// rchunk, nchunks.
// Loops (per invocation): fwd three strides over the row (3 (len / WG + 1)), bwd_x two, plus
// block reductions; the host caps len at 2^20. bwd_params rchunk / 2 + 2 (64 rows a chunk).
// Bounds: per-row early returns depend only on the workgroup id (uniform for the barriers in
// the reductions), in the *_rows entries on the subgroup's (uniform for its subgroupAdd);
// element loops test i < len; bwd_params threads past the last return.

struct Params {
  rows: u32,
  len: u32,
  eps: f32,
  rms: u32,
  rchunk: u32,
  nchunks: u32,
  _pad0: u32,
  _pad1: u32,
}

//! entry fwd(x: data, gamma: data, beta: data, y: data mut, stats: f32 mut)
//! check WG=32,64,128,256
fn row_sum(v: f32, ids: Ids) -> f32 { return block_sum(v, ids); }

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let r = ids.wid.y * ids.nwg.x + ids.wid.x;
  if (r >= p.rows) { return; }
  norm_fwd_row(r, ids.lid, WG, ids);
}

//! entry fwd_rows(x: data, gamma: data, beta: data, y: data mut, stats: f32 mut)
//! requires subgroups
//! check WG=32,64,128,256
// fwd with one subgroup per row, for rows of up to 1024 elements on adapters with one
// subgroup size: the same arithmetic, reduced with subgroupAdd instead of workgroup barriers
// (a GPT's 384-wide rows left each workgroup of `fwd` waiting on three block reductions for
// 3 elements a thread). Row r = workgroup x num_subgroups + subgroup id.
fn row_sum(v: f32, ids: Ids) -> f32 { return subgroupAdd(v); }

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let r = (ids.wid.y * ids.nwg.x + ids.wid.x) * ids.sg_num + ids.sg_id;
  if (r >= p.rows) { return; }
  norm_fwd_row(r, ids.sg_lane, ids.sg_size, ids);
}

//! entry bwd_x(x: data, dy: data, gamma: data, stats: f32, dx: data mut)
//! check WG=32,64,128,256
fn row_sum(v: f32, ids: Ids) -> f32 { return block_sum(v, ids); }

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let r = ids.wid.y * ids.nwg.x + ids.wid.x;
  if (r >= p.rows) { return; }
  norm_bwd_row(r, ids.lid, WG, ids);
}

//! entry bwd_x_rows(x: data, dy: data, gamma: data, stats: f32, dx: data mut)
//! requires subgroups
//! check WG=32,64,128,256
// bwd_x with one subgroup per row (see fwd_rows).
fn row_sum(v: f32, ids: Ids) -> f32 { return subgroupAdd(v); }

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let r = (ids.wid.y * ids.nwg.x + ids.wid.x) * ids.sg_num + ids.sg_id;
  if (r >= p.rows) { return; }
  norm_bwd_row(r, ids.sg_lane, ids.sg_size, ids);
}

//! entry bwd_params(x: data, dy: data, stats: f32, part: f32 mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let t = flat_id(ids);
  if (t >= p.len * p.nchunks) { return; }
  let kc = udivmod(t, p.len);
  let c = kc.y;
  let k = kc.x;
  let r0 = k * p.rchunk;
  let r1 = min(r0 + p.rchunk, p.rows);
  var dg = 0.0;
  var db = 0.0;
  // Rows two at a time, their loads issued before use: one thread walks a whole column
  // chunk, and a rolled loop waited out each row's load latency.
  var r = r0;
  for (; r + 2u <= r1; r = r + 2u) {
    let dy0 = ld_dy(r * p.len + c);
    let dy1 = ld_dy((r + 1u) * p.len + c);
    let x0 = ld_x(r * p.len + c);
    let x1 = ld_x((r + 1u) * p.len + c);
    let xh0 = ((x0 - ld_stats(3u * r)) - ld_stats(3u * r + 1u)) * ld_stats(3u * r + 2u);
    let xh1 = ((x1 - ld_stats(3u * r + 3u)) - ld_stats(3u * r + 4u)) * ld_stats(3u * r + 5u);
    dg = dg + dy0 * xh0;
    db = db + dy0;
    dg = dg + dy1 * xh1;
    db = db + dy1;
  }
  for (; r < r1; r = r + 1u) {
    let dy = ld_dy(r * p.len + c);
    let xh = ((ld_x(r * p.len + c) - ld_stats(3u * r)) - ld_stats(3u * r + 1u)) * ld_stats(3u * r + 2u);
    dg = dg + dy * xh;
    db = db + dy;
  }
  st_part(k * p.len + c, dg);
  st_part((p.nchunks + k) * p.len + c, db);
}
