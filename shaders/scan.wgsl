// scan.wgsl: cumulative sums along an axis, forward or reversed, in two passes.
//
// x is dense [outer, len, inner], summed along the middle axis. The axis is cut into chunks
// of `chunk` positions, and thread (o, k, j) owns chunk k of the line (o, j):
//
//   totals  One thread per (o, k, j): the sum of its chunk, to part[o, k, j] (f32
//           [outer, nchunks, inner]). The host skips it when the axis is one chunk.
//   scan    One thread per (o, k, j): the chunk's offset (the totals of the chunks before it,
//           or after it when reversed), then a running sum over the chunk, each partial sum
//           written to y in the data's dtype.
//
// Sums are f32 whatever the dtype, and sequential within a line, so their rounding grows with
// the line's length as any sequential sum's does. Threads of one workgroup hold neighbouring
// j (coalesced reads) when inner is large; when inner is 1 they hold neighbouring chunks and
// each reads its own stretch of memory.
//
// Bindings: on the signature lines. Params: outer, len, inner, chunk, nchunks, reverse.
// Loops (per invocation): totals `chunk`; scan `nchunks + chunk`. The host keeps chunk at
// 4096 and nchunks at most LOOP_BUDGET - 4096 = 12,288 (an axis of up to 50M).
// Bounds: threads past outer * nchunks * inner return; positions stop at len.

struct Params {
  outer: u32,
  len: u32,
  inner: u32,
  chunk: u32,
  nchunks: u32,
  reverse: u32,
  _pad0: u32,
  _pad1: u32,
}

// (o, k, j) of thread i, laid out as part is: i = (o * nchunks + k) * inner + j.
fn owner(i: u32) -> vec3<u32> {
  let o_rest = udivmod(i, p.nchunks * p.inner);
  let k_j = udivmod(o_rest.y, p.inner);
  return vec3<u32>(o_rest.x, k_j.x, k_j.y);
}

// Element index of position q of line (o, j).
fn at(o: u32, q: u32, j: u32) -> u32 {
  return (o * p.len + q) * p.inner + j;
}

//! entry totals(x: data, part: f32 mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.outer * p.nchunks * p.inner) { return; }
  let okj = owner(i);
  let lo = okj.y * p.chunk;
  let hi = min(lo + p.chunk, p.len);
  var acc = 0.0;
  for (var q = lo; q < hi; q = q + 1u) {
    acc = acc + ld_x(at(okj.x, q, okj.z));
  }
  st_part(i, acc);
}

//! entry scan(x: data, part: f32, y: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.outer * p.nchunks * p.inner) { return; }
  let okj = owner(i);
  let o = okj.x;
  let k = okj.y;
  let j = okj.z;
  // The chunks before this one in the direction of the sum.
  var c0 = 0u;
  var c1 = k;
  if (p.reverse != 0u) {
    c0 = k + 1u;
    c1 = p.nchunks;
  }
  var acc = 0.0;
  for (var c = c0; c < c1; c = c + 1u) {
    acc = acc + ld_part((o * p.nchunks + c) * p.inner + j);
  }
  let lo = k * p.chunk;
  let hi = min(lo + p.chunk, p.len);
  for (var t = lo; t < hi; t = t + 1u) {
    let q = select(t, lo + hi - 1u - t, p.reverse != 0u);
    let e = at(o, q, j);
    acc = acc + ld_x(e);
    st_y(e, acc);
  }
}
