// reduce.wgsl: sum, max and min along one axis (mean is a scaled sum), and the index of the
// maximum or minimum.
//
// The input is viewed as [outer, len, inner] (the reduced axis in the middle). Long axes are
// cut into chunks of `chunk` elements so that no invocation loops more than the loop budget
// allows (see kernels/mod.rs): one pass writes a partial result per chunk, [outer, nchunks,
// inner] (f32), and the host reduces the partials again until one chunk remains. With one
// chunk the pass writes the final [outer, inner] in the output's dtype. All accumulation is in
// f32.
//
//   rows      inner == 1 (contiguous rows). One workgroup per (chunk c = wid.x, row
//             o = wid.y + 65535 wid.z); its WG threads stride over the chunk and combine with a
//             workgroup reduction. Output index o * nchunks + c.
//   cols      inner > 1. One thread per (o, c, i), flat over outer * nchunks * inner; it loops
//             over its chunk at stride inner (neighbouring threads read neighbouring addresses).
//   tiles     As cols, for GPUs: a workgroup per 32 columns of a chunk (see the entry).
//   tiles4    tiles by runs of 4 columns (inner a multiple of 4): 128 columns a workgroup.
//   arg_rows  As rows, keeping (value, index) pairs: the first index of the maximum (or minimum)
//             wins ties. A merge pass (p.merge == 1) reads pairs written by an earlier pass:
//             values from x, indices from pidx.
//   arg_cols  As cols, with pairs.
//
// NaN propagates as in PyTorch: a NaN anywhere in the reduced range makes max and min NaN,
// and argmax / argmin point at the first NaN.
//
// Bindings: signature lines. Params: outer, len, inner, op (RED_SUM, RED_MAX, RED_MIN,
// RED_AMAX: the max of |x|, whose partial results are non-negative, so a later pass folds
// them with the same op),
// scale (applied to sums in the final pass; 1 in partial passes), chunk, nchunks, init (the
// starting value: -inf for max, +inf for min, passed in because WGSL rejects an infinite
// constant), merge.
// Loops (per invocation): rows <= chunk / WG + 1 plus the block reduction (<= 2 log2 WG);
// cols <= chunk / 4 + 5; tiles and tiles4 <= chunk / 32 + 5 plus 3 for the lanes' reduction
// (the host keeps their chunk at most 65536). The host keeps chunk at 8192 with WG = 256 for rows and at 8192 for
// cols.
// Bounds: rows test each index against the chunk end; cols threads past the last output
// return (no barriers there).

struct Params {
  outer: u32,
  len: u32,
  inner: u32,
  op: u32,
  scale: f32,
  chunk: u32,
  nchunks: u32,
  init: f32,
  merge: u32,
  _pad0: u32,
  _pad1: u32,
  _pad2: u32,
}

// Columns of a `tiles` workgroup.
const TC: u32 = 32u;

// Folds v into acc for op; a NaN, once in, stays.
fn fold(acc: f32, v: f32) -> f32 {
  if (p.op == RED_SUM) { return acc + v; }
  if (isnan_(acc) || isnan_(v)) { return bitcast<f32>(0x7fc00000u + (bitcast<u32>(v) & 0u)); }
  if (p.op == RED_MAX) { return max(acc, v); }
  if (p.op == RED_AMAX) { return max(acc, abs(v)); }
  return min(acc, v);
}

// Whether candidate (v, i) beats the current best (bv, bi): NaN first, then the larger (max) or
// smaller (min) value, then the smaller index.
fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
  if (bi == 0xffffffffu) { return i != 0xffffffffu; }
  if (i == 0xffffffffu) { return false; }
  let vn = isnan_(v);
  let bn = isnan_(bv);
  if (vn || bn) { return vn && (!bn || i < bi); }
  if (v == bv) { return i < bi; }
  if (p.op == RED_MAX) { return v > bv; }
  return v < bv;
}

//! entry rows(x: data, y: data mut)
//! check WG=256
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  // Rows past 65535 continue on the z axis of the grid. The early return depends only on the
  // workgroup id, so the barriers in the reduction below stay in uniform control flow.
  let o = ids.wid.z * ids.nwg.y + ids.wid.y;
  if (o >= p.outer) { return; }
  let c = ids.wid.x;
  let start = c * p.chunk;
  let end = min(start + p.chunk, p.len);
  let base = o * p.len;
  var acc = select(p.init, 0.0, p.op == RED_SUM);
  var nan = 0.0;
  for (var l = start + ids.lid; l < end; l = l + WG) {
    acc = fold(acc, ld_x(base + l));
  }
  var r: f32;
  if (p.op == RED_SUM) {
    r = block_sum(acc, ids) * p.scale;
  } else {
    // Subgroup and workgroup max/min do not promise to keep NaN: count NaNs separately.
    nan = block_sum(select(0.0, 1.0, isnan_(acc)), ids);
    if (p.op == RED_MIN) { r = -block_max(-acc, ids); } else { r = block_max(acc, ids); }
    if (nan > 0.0) { r = bitcast<f32>(0x7fc00000u + (bitcast<u32>(r) & 0u)); }
  }
  if (ids.lid == 0u) { st_y(o * p.nchunks + c, r); }
}

//! entry cols(x: data, y: data mut)
//! check WG=256
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let t = flat_id(ids);
  if (t >= p.outer * p.nchunks * p.inner) { return; }
  let a = udivmod(t, p.inner);
  let i = a.y;
  let b = udivmod(a.x, p.nchunks);
  let c = b.y;
  let o = b.x;
  let start = c * p.chunk;
  let end = min(start + p.chunk, p.len);
  var idx = (o * p.len + start) * p.inner + i;
  var acc = select(p.init, 0.0, p.op == RED_SUM);
  // Four loads issued before they are folded (in order): one thread has one line, so a
  // rolled loop keeps one load in flight per thread and waits out its latency every row
  // (on GPUs this pass was latency-bound at a fraction of the memory bandwidth).
  var l = start;
  for (; l + 4u <= end; l = l + 4u) {
    let v0 = ld_x(idx);
    let v1 = ld_x(idx + p.inner);
    let v2 = ld_x(idx + 2u * p.inner);
    let v3 = ld_x(idx + 3u * p.inner);
    acc = fold(fold(fold(fold(acc, v0), v1), v2), v3);
    idx = idx + 4u * p.inner;
  }
  for (; l < end; l = l + 1u) {
    acc = fold(acc, ld_x(idx));
    idx = idx + p.inner;
  }
  if (p.op == RED_SUM) { acc = acc * p.scale; }
  st_y(t, acc);
}

//! entry tiles(x: data, y: data mut)
//! check WG=256
// cols for GPUs, in workgroups: workgroup (column tile wid.x, chunk row) takes TC = 32
// neighbouring columns of one chunk; its 8 row lanes take every 8th row, each lane reading its
// 32 columns of a row together (one 64- or 128-byte line a subgroup, where `cols` threads
// each walked one column alone and waited out every load's latency in turn). The 8 row lanes'
// results combine in workgroup memory. Row = wid.y + nwg.y wid.z = o * nchunks + c; tile
// columns past `inner` and rows past `outer` load nothing, take part in the barriers, and
// store nothing.
var<workgroup> tile_acc: array<f32, WG>;
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let col = ids.wid.x * TC + ids.lid % TC;
  let lane = ids.lid / TC;
  let oc = udivmod(ids.wid.z * ids.nwg.y + ids.wid.y, p.nchunks);
  let o = oc.x;
  let c = oc.y;
  let ok = col < p.inner && o < p.outer;
  var acc = select(p.init, 0.0, p.op == RED_SUM);
  if (ok) {
    let start = c * p.chunk;
    let end = min(start + p.chunk, p.len);
    let step = (WG / TC) * p.inner;
    var l = start + lane;
    var idx = (o * p.len + l) * p.inner + col;
    // Four rows' loads in flight before they are folded (in order).
    for (; l + 3u * (WG / TC) < end; l = l + 4u * (WG / TC)) {
      let v0 = ld_x(idx);
      let v1 = ld_x(idx + step);
      let v2 = ld_x(idx + 2u * step);
      let v3 = ld_x(idx + 3u * step);
      acc = fold(fold(fold(fold(acc, v0), v1), v2), v3);
      idx = idx + 4u * step;
    }
    for (; l < end; l = l + WG / TC) {
      acc = fold(acc, ld_x(idx));
      idx = idx + step;
    }
  }
  tile_acc[ids.lid] = acc;
  workgroupBarrier();
  for (var h = WG / TC / 2u; h > 0u; h = h / 2u) {
    if (lane < h) { tile_acc[ids.lid] = fold(tile_acc[ids.lid], tile_acc[ids.lid + h * TC]); }
    workgroupBarrier();
  }
  if (ok && lane == 0u) {
    var r = tile_acc[ids.lid];
    if (p.op == RED_SUM) { r = r * p.scale; }
    st_y((o * p.nchunks + c) * p.inner + col, r);
  }
}

//! entry tiles4(x: data vec4, y: data mut)
//! check WG=256
// tiles where inner is a multiple of 4: a lane takes a run of 4 columns, so a workgroup
// covers 4 TC = 128 columns and a subgroup reads 256 (f16) or 512 (f32) contiguous bytes of a
// row with each load, where `tiles` reads 64 or 128 with four times the loads and stays far
// below the memory bandwidth on long column sums such as the GPT's bias gradients.
// The same rows in the same order per column as `tiles`; runs past inner / 4 load nothing.
var<workgroup> tile_acc4: array<vec4<f32>, WG>;
fn fold4(acc: vec4<f32>, v: vec4<f32>) -> vec4<f32> {
  return vec4<f32>(fold(acc.x, v.x), fold(acc.y, v.y), fold(acc.z, v.z), fold(acc.w, v.w));
}
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let runs = p.inner / 4u;
  let run = ids.wid.x * TC + ids.lid % TC;
  let lane = ids.lid / TC;
  let oc = udivmod(ids.wid.z * ids.nwg.y + ids.wid.y, p.nchunks);
  let o = oc.x;
  let c = oc.y;
  let ok = run < runs && o < p.outer;
  var acc = vec4<f32>(select(p.init, 0.0, p.op == RED_SUM));
  if (ok) {
    let start = c * p.chunk;
    let end = min(start + p.chunk, p.len);
    let step = (WG / TC) * runs;
    var l = start + lane;
    var idx = (o * p.len + l) * runs + run;
    for (; l + 3u * (WG / TC) < end; l = l + 4u * (WG / TC)) {
      let v0 = ld4_x(idx);
      let v1 = ld4_x(idx + step);
      let v2 = ld4_x(idx + 2u * step);
      let v3 = ld4_x(idx + 3u * step);
      acc = fold4(fold4(fold4(fold4(acc, v0), v1), v2), v3);
      idx = idx + 4u * step;
    }
    for (; l < end; l = l + WG / TC) {
      acc = fold4(acc, ld4_x(idx));
      idx = idx + step;
    }
  }
  tile_acc4[ids.lid] = acc;
  workgroupBarrier();
  for (var h = WG / TC / 2u; h > 0u; h = h / 2u) {
    if (lane < h) { tile_acc4[ids.lid] = fold4(tile_acc4[ids.lid], tile_acc4[ids.lid + h * TC]); }
    workgroupBarrier();
  }
  if (ok && lane == 0u) {
    var r = tile_acc4[ids.lid];
    if (p.op == RED_SUM) { r = r * p.scale; }
    let at = (o * p.nchunks + c) * p.inner + 4u * run;
    st_y(at, r.x);
    st_y(at + 1u, r.y);
    st_y(at + 2u, r.z);
    st_y(at + 3u, r.w);
  }
}

//! entry arg_rows(x: data, pidx: u32, vals: f32 mut, idx: u32 mut)
//! check WG=256
var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let o = ids.wid.z * ids.nwg.y + ids.wid.y;
  if (o >= p.outer) { return; }
  let c = ids.wid.x;
  let start = c * p.chunk;
  let end = min(start + p.chunk, p.len);
  var bv = p.init;
  var bi = 0xffffffffu;
  for (var l = start + ids.lid; l < end; l = l + WG) {
    let v = ld_x(o * p.len + l);
    var i = l;
    if (p.merge != 0u) { i = ld_pidx(o * p.len + l); }
    if (better(v, i, bv, bi)) { bv = v; bi = i; }
  }
  best_v[ids.lid] = bv;
  best_i[ids.lid] = bi;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
    if (ids.lid < s) {
      let ov = best_v[ids.lid + s];
      let oi = best_i[ids.lid + s];
      if (better(ov, oi, best_v[ids.lid], best_i[ids.lid])) {
        best_v[ids.lid] = ov;
        best_i[ids.lid] = oi;
      }
    }
    workgroupBarrier();
  }
  if (ids.lid == 0u) {
    st_vals(o * p.nchunks + c, best_v[0]);
    st_idx(o * p.nchunks + c, best_i[0]);
  }
}

//! entry arg_cols(x: data, pidx: u32, vals: f32 mut, idx: u32 mut)
//! check WG=256
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let t = flat_id(ids);
  if (t >= p.outer * p.nchunks * p.inner) { return; }
  let a = udivmod(t, p.inner);
  let i = a.y;
  let b = udivmod(a.x, p.nchunks);
  let c = b.y;
  let o = b.x;
  let start = c * p.chunk;
  let end = min(start + p.chunk, p.len);
  var at = (o * p.len + start) * p.inner + i;
  var bv = p.init;
  var bi = 0xffffffffu;
  for (var l = start; l < end; l = l + 1u) {
    let v = ld_x(at);
    var ix = l;
    if (p.merge != 0u) { ix = ld_pidx(at); }
    if (better(v, ix, bv, bi)) { bv = v; bi = ix; }
    at = at + p.inner;
  }
  st_vals(t, bv);
  st_idx(t, bi);
}
