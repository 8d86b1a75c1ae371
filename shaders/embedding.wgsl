// embedding.wgsl: row gather and its gradient (scatter-add), deterministic.
//
// Table w is [vocab, dim]; idx is u32 [n].
//
//   gather        One thread per output element (n * dim): y[t, d] = w[idx[t], d]; an index
//                 past the vocabulary gives NaN (see loss.wgsl for why not a silent 0; a
//                 checked device refuses such indices before the launch).
//   scatter_rows  One thread per (chunk k of positions, row v, column d): the sum of dy[t, d]
//                 over the chunk's positions t with idx[t] == v, written to part[k, v, d]
//                 (f32); the host sums the chunks (a reduce pass). No atomics, so the result
//                 is the same on every run. Every thread reads its chunk's indices (broadcast,
//                 cached): suits small vocabularies (characters, classes).
//   scatter_tab   As scatter_rows, for vocabularies whose [vocab, 32] f32 table fits the
//                 workgroup memory: a workgroup of 32 threads per (32 columns, chunk k), each
//                 thread walking the chunk's positions once and adding dy[t, d] to row idx[t]
//                 of its own column of the table (see the entry), then writing part[k, v, d]
//                 for every row. n x dim additions where scatter_rows makes vocab x n x dim
//                 comparisons.
//   scatter_cols  One thread per column d, walking positions t0 .. t1:
//                 acc[idx[t], d] += dy[t, d] (f32). Only that thread writes column d, so again
//                 no races; the host runs one dispatch per chunk of positions, in order, on
//                 the same accumulator. Suits large vocabularies (acc starts at zero).
//
// Bindings: signature lines. Params: n, dim, vocab, t0, t1 (scatter_cols' positions),
// pchunk, nchunks (scatter_rows' chunks of positions).
// Loops (per invocation): gather none; scatter_rows pchunk / 4 + 5; scatter_tab 2 vocab +
// pchunk / 4 + 7; scatter_cols t1 - t0 + 1. The host keeps pchunk and t1 - t0 at most 8192
// and scatter_tab's vocab at most 256 (the rows' chunks shorter on GPUs, for parallelism).
// Bounds: threads past their range return; indices are range-checked before use.

struct Params {
  n: u32,
  dim: u32,
  vocab: u32,
  t0: u32,
  t1: u32,
  pchunk: u32,
  nchunks: u32,
  _pad: u32,
}

//! entry gather(w: data, idx: u32, y: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n * p.dim) { return; }
  let td = udivmod(i, p.dim);
  let t = td.x;
  let d = td.y;
  let v = ld_idx(t);
  if (v < p.vocab) {
    st_y(i, ld_w(v * p.dim + d));
  } else {
    st_y(i, bitcast<f32>(0x7fc00000u + v * 0u));
  }
}

//! entry scatter_rows(idx: u32, dy: data, part: f32 mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  let per_chunk = p.vocab * p.dim;
  if (i >= per_chunk * p.nchunks) { return; }
  let kj = udivmod(i, per_chunk);
  let k = kj.x;
  let j = kj.y;
  let vd = udivmod(j, p.dim);
  let v = vd.x;
  let d = vd.y;
  let t0 = k * p.pchunk;
  let t1 = min(t0 + p.pchunk, p.n);
  var acc = 0.0;
  // Four indices loaded before they are tested (the sum stays in position order).
  var t = t0;
  for (; t + 4u <= t1; t = t + 4u) {
    let i0 = ld_idx(t);
    let i1 = ld_idx(t + 1u);
    let i2 = ld_idx(t + 2u);
    let i3 = ld_idx(t + 3u);
    if (i0 == v) { acc = acc + ld_dy(t * p.dim + d); }
    if (i1 == v) { acc = acc + ld_dy((t + 1u) * p.dim + d); }
    if (i2 == v) { acc = acc + ld_dy((t + 2u) * p.dim + d); }
    if (i3 == v) { acc = acc + ld_dy((t + 3u) * p.dim + d); }
  }
  for (; t < t1; t = t + 1u) {
    if (ld_idx(t) == v) { acc = acc + ld_dy(t * p.dim + d); }
  }
  st_part(i, acc);
}

//! entry scatter_tab(idx: u32, dy: data, part: f32 mut)
//! check WG=32 VT=32,256
// Workgroup (wid.x, wid.y) = (columns 32 wid.x .., chunk k of positions). Thread lid owns column
// d = 32 wid.x + lid and column lid of `tab`, VT rows of 32 (VT >= vocab, a power of two): it
// zeroes its rows, adds dy[t, d] to row idx[t] for t in the chunk in order (indices past the
// vocabulary skipped, as scatter_rows never matches them), and writes its vocab rows out. No
// thread reads or writes another's column, so no barriers; the 32 threads of a workgroup add
// to the same row at once, 32 consecutive words (distinct banks).
var<workgroup> tab: array<f32, VT * 32u>;
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let d = ids.wid.x * 32u + ids.lid;
  if (d >= p.dim) { return; }
  let k = ids.wid.y;
  for (var v = 0u; v < p.vocab; v = v + 1u) { tab[v * 32u + ids.lid] = 0.0; }
  let t0 = k * p.pchunk;
  let t1 = min(t0 + p.pchunk, p.n);
  var t = t0;
  // Four positions' indices and values loaded before they are added (in order).
  for (; t + 4u <= t1; t = t + 4u) {
    let i0 = ld_idx(t);
    let i1 = ld_idx(t + 1u);
    let i2 = ld_idx(t + 2u);
    let i3 = ld_idx(t + 3u);
    let y0 = ld_dy(t * p.dim + d);
    let y1 = ld_dy((t + 1u) * p.dim + d);
    let y2 = ld_dy((t + 2u) * p.dim + d);
    let y3 = ld_dy((t + 3u) * p.dim + d);
    if (i0 < p.vocab) { tab[i0 * 32u + ids.lid] = tab[i0 * 32u + ids.lid] + y0; }
    if (i1 < p.vocab) { tab[i1 * 32u + ids.lid] = tab[i1 * 32u + ids.lid] + y1; }
    if (i2 < p.vocab) { tab[i2 * 32u + ids.lid] = tab[i2 * 32u + ids.lid] + y2; }
    if (i3 < p.vocab) { tab[i3 * 32u + ids.lid] = tab[i3 * 32u + ids.lid] + y3; }
  }
  for (; t < t1; t = t + 1u) {
    let i = ld_idx(t);
    if (i < p.vocab) { tab[i * 32u + ids.lid] = tab[i * 32u + ids.lid] + ld_dy(t * p.dim + d); }
  }
  for (var v = 0u; v < p.vocab; v = v + 1u) {
    st_part((k * p.vocab + v) * p.dim + d, tab[v * 32u + ids.lid]);
  }
}

//! entry scatter_cols(idx: u32, dy: data, acc: f32 mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let d = flat_id(ids);
  if (d >= p.dim) { return; }
  for (var t = p.t0; t < p.t1; t = t + 1u) {
    let v = ld_idx(t);
    if (v < p.vocab) {
      let j = v * p.dim + d;
      st_acc(j, ld_acc(j) + ld_dy(t * p.dim + d));
    }
  }
}
