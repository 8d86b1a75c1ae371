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
//              term is absent. With `res`, dx also adds the gradient x already has (a
//              residual stream's, from the skip connection), which was an add of its own.
//   fwd_rows, bwd_x_rows  The same with one subgroup per row (below), for short rows.
//   fwd_vec    fwd_rows with the row in registers, for rows of a multiple of 4 up to 4 NV
//              subgroup widths (NV up to 16: 2048 on 32-wide subgroups).
//   bwd_x_params_vec  bwd_x_rows the same way, RPS rows a subgroup, which also sums the
//              parameter gradients' terms of its workgroup's rows into one chunk (below): one
//              pass where a dx kernel and bwd_params4 made two.
//   bwd_params One thread per (column c, chunk of `rchunk` rows): the chunk's sums of
//              dy * xhat and of dy, written as f32 partials part[0, k, c] and part[1, k, c];
//              bwd_params_sum sums the chunks into dgamma and dbeta. Chunks bound each
//              thread's loop and give the device rows x len / rchunk threads instead of len.
//
// Bindings: signature lines (beta is a dummy for RMSNorm, res one without `res`). Params:
// rows, len, eps, rms (0/1), rchunk, nchunks, res (0/1).
// Loops (per invocation): fwd three strides over the row (3 (len / WG + 1)), bwd_x two, plus
// block reductions; the host caps len at 2^20. fwd_vec none, bwd_x_params_vec RPS + 4 (the
// host keeps it in the loop budget). bwd_params
// rchunk / 2 + 2 (64 rows a chunk), bwd_params4 rchunk / 4 + 5 (32 rows), bwd_params_sum
// nchunks / 8 + 9 (the host keeps it in the loop budget).
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
  res: u32,        // bwd_x*: 1 adds `res` (the gradient x already has) into dx
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
  let r = subgroup_row(ids);
  if (r >= p.rows) { return; }
  norm_fwd_row(r, ids.sg_lane, ids.sg_size, ids);
}

//! entry bwd_x(x: data, dy: data, gamma: data, stats: f32, res: data, dx: data mut)
//! check WG=32,64,128,256
fn row_sum(v: f32, ids: Ids) -> f32 { return block_sum(v, ids); }

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let r = ids.wid.y * ids.nwg.x + ids.wid.x;
  if (r >= p.rows) { return; }
  norm_bwd_row(r, ids.lid, WG, ids);
}

//! entry bwd_x_rows(x: data, dy: data, gamma: data, stats: f32, res: data, dx: data mut)
//! requires subgroups
//! check WG=32,64,128,256
// bwd_x with one subgroup per row (see fwd_rows).
fn row_sum(v: f32, ids: Ids) -> f32 { return subgroupAdd(v); }

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let r = subgroup_row(ids);
  if (r >= p.rows) { return; }
  norm_bwd_row(r, ids.sg_lane, ids.sg_size, ids);
}

//! entry fwd_vec(x: data vec4, gamma: data vec4, beta: data vec4, y: data mut vec4, stats: f32 mut)
//! requires subgroups
//! check WG=32,128 NV=1,16
// fwd_rows where the row's length is a multiple of 4 and at most 4 NV subgroup widths: each
// lane holds its NV runs of 4 (runs lane, lane + subgroup size, ...) in registers, read once
// as 8- or 16-byte loads issued together, where fwd_rows reads the row three times element
// by element, each pass a loop that waits for its own loads. The same corrected two-pass
// arithmetic, summed in another order. Runs past the row load nothing and add zeros.
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let r = subgroup_row(ids);
  if (r >= p.rows) { return; }
  let q = p.len / 4u;
  let base = r * q;
  let inv_len = 1.0 / f32(p.len);
  //! unroll k in 0..NV
  let j$k = ids.sg_lane + $k * ids.sg_size;
  let ok$k = j$k < q;
  let x$k = select(vec4<f32>(0.0), ld4_x(base + select(0u, j$k, ok$k)), ok$k);
  //! end
  var m0 = 0.0;
  if (p.rms == 0u) {
    var s = vec4<f32>(0.0);
    //! unroll k in 0..NV
    s = s + x$k;
    //! end
    m0 = subgroupAdd(s.x + s.y + s.z + s.w) * inv_len;
  }
  var sd = vec4<f32>(0.0);
  var sq = vec4<f32>(0.0);
  //! unroll k in 0..NV
  let d$k = select(vec4<f32>(0.0), x$k - m0, ok$k);
  sd = sd + d$k;
  sq = sq + d$k * d$k;
  //! end
  var corr = 0.0;
  if (p.rms == 0u) { corr = subgroupAdd(sd.x + sd.y + sd.z + sd.w) * inv_len; }
  let var_ = max(subgroupAdd(sq.x + sq.y + sq.z + sq.w) * inv_len - corr * corr, 0.0);
  let rstd = inverseSqrt(var_ + p.eps);
  //! unroll k in 0..NV
  if (ok$k) {
    var v = (d$k - corr) * rstd * ld4_gamma(j$k);
    if (p.rms == 0u) { v = v + ld4_beta(j$k); }
    st4_y(base + j$k, v);
  }
  //! end
  if (ids.sg_lane == 0u) {
    st_stats(3u * r, m0);
    st_stats(3u * r + 1u, corr);
    st_stats(3u * r + 2u, rstd);
  }
}

//! entry bwd_x_params_vec(x: data vec4, dy: data vec4, gamma: data vec4, stats: f32, res: data vec4, dx: data mut vec4, part: f32 mut)
//! requires subgroups
//! check WG=32,128 NV=1,16 RPS=8,64
// bwd_x_rows with the row in registers, as fwd_vec (x, dy and gamma read once), over RPS rows
// a subgroup, which also keeps its rows' sums of dy xhat and dy (the parameter gradients'
// terms, as bwd_params4) in registers: x and dy are read once for dx, dgamma and dbeta, where
// bwd_params4 reads them again in a launch of its own (a launch per normalisation in a
// training step). The workgroup's
// 4 subgroups (the host's ROWS_PER_WG, each WG / 4 lanes) add their sums in turn in workgroup
// memory; the last writes chunk w (the workgroup's 4 RPS rows) as part[w, c] (dgamma's) and
// part[nchunks + w, c] (dbeta's) for bwd_params_sum. Rows past the last add nothing; every
// subgroup reaches every barrier.
const SGW: u32 = WG / 4u;
var<workgroup> pacc: array<vec4<f32>, 2u * NV * SGW>;

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let w = ids.wid.y * ids.nwg.x + ids.wid.x;
  let q = p.len / 4u;
  let lane = ids.sg_lane;
  //! unroll k in 0..NV
  let j$k = lane + $k * SGW;
  let ok$k = j$k < q;
  let at$k = select(0u, j$k, ok$k);
  let gm$k = select(vec4<f32>(0.0), ld4_gamma(at$k), ok$k);
  var dg$k = vec4<f32>(0.0);
  var db$k = vec4<f32>(0.0);
  //! end
  let inv_len = 1.0 / f32(p.len);
  for (var i = 0u; i < RPS; i = i + 1u) {
    // The same for the whole subgroup: its subgroupAdds stay uniform.
    let r = (w * 4u + ids.sg_id) * RPS + i;
    if (r < p.rows) {
      let base = r * q;
      let m0 = ld_stats(3u * r);
      let corr = ld_stats(3u * r + 1u);
      let rstd = ld_stats(3u * r + 2u);
      var sg = vec4<f32>(0.0);
      var sgx = vec4<f32>(0.0);
      //! unroll k in 0..NV
      let dy$k = select(vec4<f32>(0.0), ld4_dy(base + at$k), ok$k);
      let xh$k = select(vec4<f32>(0.0), ((ld4_x(base + at$k) - m0) - corr) * rstd, ok$k);
      let g$k = dy$k * gm$k;
      sg = sg + g$k;
      sgx = sgx + g$k * xh$k;
      dg$k = dg$k + dy$k * xh$k;
      db$k = db$k + dy$k;
      //! end
      var mg = subgroupAdd(sg.x + sg.y + sg.z + sg.w) * inv_len;
      let mgx = subgroupAdd(sgx.x + sgx.y + sgx.z + sgx.w) * inv_len;
      if (p.rms != 0u) { mg = 0.0; }
      //! unroll k in 0..NV
      if (ok$k) {
        var d$k = rstd * (g$k - mg - xh$k * mgx);
        if (p.res != 0u) { d$k = d$k + ld4_res(base + j$k); }
        st4_dx(base + j$k, d$k);
      }
      //! end
    }
  }
  // Subgroups 0 .. 3 add their sums in turn; the last writes the chunk.
  for (var s = 0u; s < 4u; s = s + 1u) {
    if (ids.sg_id == s) {
      //! unroll k in 0..NV
      if (s > 0u) {
        dg$k = dg$k + pacc[2u * ($k * SGW + lane)];
        db$k = db$k + pacc[2u * ($k * SGW + lane) + 1u];
      }
      if (s < 3u) {
        pacc[2u * ($k * SGW + lane)] = dg$k;
        pacc[2u * ($k * SGW + lane) + 1u] = db$k;
      } else if (ok$k & (w < p.nchunks)) {
        //! unroll e in 0..4
        st_part(w * p.len + 4u * j$k + $e, dg$k[$e]);
        st_part((p.nchunks + w) * p.len + 4u * j$k + $e, db$k[$e]);
        //! end
      }
      //! end
    }
    workgroupBarrier();
  }
}

//! entry bwd_params4(x: data vec4, dy: data vec4, stats: f32, part: f32 mut)
// bwd_params by runs of 4 columns where len is a multiple of 4: one thread per (run j, chunk
// k), four rows at a time with their 8- or 16-byte loads issued together (bwd_params reads
// 2 or 4 bytes a load). The same sums in the same order per column.
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let q = p.len / 4u;
  let t = flat_id(ids);
  if (t >= q * p.nchunks) { return; }
  let kj = udivmod(t, q);
  let j = kj.y;
  let k = kj.x;
  let r0 = k * p.rchunk;
  let r1 = min(r0 + p.rchunk, p.rows);
  var dg = vec4<f32>(0.0);
  var db = vec4<f32>(0.0);
  var r = r0;
  for (; r + 4u <= r1; r = r + 4u) {
    //! unroll i in 0..4
    let dy$i = ld4_dy((r + $i) * q + j);
    let x$i = ld4_x((r + $i) * q + j);
    //! end
    //! unroll i in 0..4
    let xh$i = ((x$i - ld_stats(3u * (r + $i))) - ld_stats(3u * (r + $i) + 1u)) * ld_stats(3u * (r + $i) + 2u);
    dg = dg + dy$i * xh$i;
    db = db + dy$i;
    //! end
  }
  for (; r < r1; r = r + 1u) {
    let dy = ld4_dy(r * q + j);
    let xh = ((ld4_x(r * q + j) - ld_stats(3u * r)) - ld_stats(3u * r + 1u)) * ld_stats(3u * r + 2u);
    dg = dg + dy * xh;
    db = db + dy;
  }
  //! unroll i in 0..4
  st_part(k * p.len + 4u * j + $i, dg[$i]);
  st_part((p.nchunks + k) * p.len + 4u * j + $i, db[$i]);
  //! end
}

//! entry bwd_params_sum(part: f32, dgamma: data mut, dbeta: data mut)
//! check WG=256
// The chunk sums of bwd_params(4) into dgamma and dbeta, each its own tensor: the outputs
// o = s len + c (s = 0 for gamma, 1 for beta; beta's only without rms) go 32 to a workgroup,
// one a lane, and the workgroup's 8 groups of 32 lanes take every 8th chunk each,
// then add their 8 sums in order in workgroup memory. A general reduce took two passes here,
// and beta's gradient, the second row of one [2, len] result, a copy of its own.
var<workgroup> psum: array<f32, 256>;

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let lane = ids.lid % 32u;
  let grp = ids.lid / 32u;
  let o = (ids.wid.y * ids.nwg.x + ids.wid.x) * 32u + lane;
  let outs = select(2u, 1u, p.rms != 0u) * p.len;
  let s = o / max(p.len, 1u);
  let c = o - s * p.len;
  var t = 0.0;
  if (o < outs) {
    for (var k = grp; k < p.nchunks; k = k + 8u) {
      t = t + ld_part((s * p.nchunks + k) * p.len + c);
    }
  }
  psum[ids.lid] = t;
  workgroupBarrier();
  if (grp != 0u || o >= outs) { return; }
  var sum = 0.0;
  for (var g = 0u; g < 8u; g = g + 1u) {
    sum = sum + psum[g * 32u + lane];
  }
  if (s == 0u) { st_dgamma(c, sum); } else { st_dbeta(c, sum); }
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
