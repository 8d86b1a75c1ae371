// reduce.wgsl: sum and max (scaled, so mean is sum * 1/len) and argmax along one axis.
//
// The input is viewed as [outer, len, inner] (the reduced axis in the middle); the output is
// [outer, inner] (or [outer, nchunks] partials, see `rows`). All accumulation is in f32.
//
//   rows         inner == 1 (contiguous rows). One workgroup per (row o = wid.y + 65535 wid.z,
//                chunk c = wid.x); its WG threads stride over elements [c*chunk, min((c+1)*chunk, len))
//                and combine with a workgroup reduction. Output index o*nchunks + c. Large
//                rows are split into chunks so many workgroups share one row; the host runs a
//                second `rows` pass over the partials.
//   cols         inner > 1. One thread per output (o, i), flat over outer*inner; it loops over
//                the len elements at stride inner. Neighbouring threads read neighbouring
//                addresses (coalesced).
//   argmax_rows  inner == 1; one workgroup per row; u32 index of the first maximum.
//   argmax_cols  inner > 1; one thread per output.
//
// Bindings: reads x, writes y. Params: outer, len, inner, op (0 sum, 1 max), scale (f32
// applied to sums), chunk, nchunks.
// Bounds: rows threads test each index against the chunk end and len; cols threads past
// outer*inner return (after no barrier, since cols has none).

struct Params {
  outer: u32,
  len: u32,
  inner: u32,
  op: u32,
  scale: f32,
  chunk: u32,
  nchunks: u32,
  // -inf, passed in because WGSL rejects an infinite constant expression.
  ninf: f32,
}

//! entry rows
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
  var acc = 0.0;
  if (p.op == 1u) { acc = p.ninf; }
  for (var l = start + ids.lid; l < end; l = l + WG) {
    let v = ld_x(base + l);
    if (p.op == 1u) { acc = max(acc, v); } else { acc = acc + v; }
  }
  var r: f32;
  if (p.op == 1u) { r = block_max(acc, ids); } else { r = block_sum(acc, ids) * p.scale; }
  if (ids.lid == 0u) { st_y(o * p.nchunks + c, r); }
}

//! entry cols
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let t = flat_id(ids);
  if (t >= p.outer * p.inner) { return; }
  let o = t / p.inner;
  let i = t % p.inner;
  var idx = o * p.len * p.inner + i;
  var acc = 0.0;
  if (p.op == 1u) { acc = p.ninf; }
  for (var l = 0u; l < p.len; l = l + 1u) {
    let v = ld_x(idx);
    if (p.op == 1u) { acc = max(acc, v); } else { acc = acc + v; }
    idx = idx + p.inner;
  }
  if (p.op != 1u) { acc = acc * p.scale; }
  st_y(t, acc);
}

//! entry argmax_rows
var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let o = ids.wid.y * ids.nwg.x + ids.wid.x;
  let rows_ok = o < p.outer;
  var bv = p.ninf;
  var bi = 0xffffffffu;
  if (rows_ok) {
    for (var l = ids.lid; l < p.len; l = l + WG) {
      let v = ld_x(o * p.len + l);
      // NaN compares false, so NaNs never win; ties keep the first index seen per thread,
      // and the tree below keeps the smaller index.
      if (v > bv || bi == 0xffffffffu) { bv = v; bi = l; }
    }
  }
  best_v[ids.lid] = bv;
  best_i[ids.lid] = bi;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
    if (ids.lid < s) {
      let ov = best_v[ids.lid + s];
      let oi = best_i[ids.lid + s];
      let mine_v = best_v[ids.lid];
      let mine_i = best_i[ids.lid];
      let take = oi != 0xffffffffu && (mine_i == 0xffffffffu || ov > mine_v || (ov == mine_v && oi < mine_i));
      if (take) { best_v[ids.lid] = ov; best_i[ids.lid] = oi; }
    }
    workgroupBarrier();
  }
  if (rows_ok && ids.lid == 0u) { st_y(o, min(best_i[0], p.len - 1u)); }
}

//! entry argmax_cols
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let t = flat_id(ids);
  if (t >= p.outer * p.inner) { return; }
  let o = t / p.inner;
  let i = t % p.inner;
  var bv = p.ninf;
  var bi = 0u;
  for (var l = 0u; l < p.len; l = l + 1u) {
    let v = ld_x((o * p.len + l) * p.inner + i);
    if (v > bv || l == 0u) { bv = v; bi = l; }
  }
  st_y(t, bi);
}
