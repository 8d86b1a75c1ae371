// index.wgsl: gather and scatter-add along an axis, and the ranks top-k selects by.
//
// The data is dense [outer, len, inner] with the indexed axis in the middle; the index tensor
// is dense [outer, klen, inner] (or [klen] shared by every (o, i) when `flat` is 1: index_select).
//
//   gather   One thread per (o, k, i): y[o, k, i] = x[o, idx(o, k, i), i]; an index past
//            `len` reads NaN (a checked device refuses it on the host first).
//   scatter  One thread per (o, a, i) of the output: the sum over k in [c0, c1) of
//            src[o, k, i] where idx(o, k, i) == a, added to a base. Each output element is
//            owned by one thread and summed in k order, so the result is deterministic and
//            needs no float atomics (WGSL has none). mode 0: y = sum; 1: y = base + sum;
//            2: y = y + sum (the later chunks of a long index axis, which the host sums in
//            an f32 y and converts once at the end).
//   rank     Top-k along the last axis of dense [outer, len] rows: one thread per element
//            counts the elements of [c0, c1) that come before it in sorted order (greater
//            when `flat` is 1, smaller when 0; NaN is the largest value; ties by position), so
//            ranks are a permutation of 0..len. mode 0 writes the count, 2 adds it.
//   pick     One thread per element: the element of rank r < klen is output r of its row.
//
// Bindings: on the signature lines. Params: outer, len, klen, inner, c0, c1, mode, flat.
// Loops (per invocation): scatter and rank `c1 - c0` (the host keeps it at 8,192 and splits
// longer axes into dispatches); gather and pick none.
// Bounds: threads past the output's size return; scatter ignores indices past len.

struct Params {
  outer: u32,
  len: u32,
  klen: u32,
  inner: u32,
  c0: u32,
  c1: u32,
  mode: u32,
  flat: u32,
}

// Index position (o, k, i) of the index tensor.
fn idx_at(o: u32, k: u32, i: u32) -> u32 {
  if (p.flat != 0u) { return k; }
  return (o * p.klen + k) * p.inner + i;
}

//! entry gather(x: data, idx: u32, y: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let t = flat_id(ids);
  if (t >= p.outer * p.klen * p.inner) { return; }
  let o_rest = udivmod(t, p.klen * p.inner);
  let k_i = udivmod(o_rest.y, p.inner);
  let j = ld_idx(idx_at(o_rest.x, k_i.x, k_i.y));
  if (j >= p.len) {
    st_y(t, bitcast<f32>(0x7fc00000u));
    return;
  }
  st_y(t, ld_x((o_rest.x * p.len + j) * p.inner + k_i.y));
}

//! entry scatter(base: data, idx: u32, src: data, y: any mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let t = flat_id(ids);
  if (t >= p.outer * p.len * p.inner) { return; }
  let o_rest = udivmod(t, p.len * p.inner);
  let a_i = udivmod(o_rest.y, p.inner);
  var acc = 0.0;
  for (var k = p.c0; k < p.c1; k = k + 1u) {
    if (ld_idx(idx_at(o_rest.x, k, a_i.y)) == a_i.x) {
      acc = acc + ld_src((o_rest.x * p.klen + k) * p.inner + a_i.y);
    }
  }
  if (p.mode == 1u) {
    acc = ld_base(t) + acc;
  } else if (p.mode == 2u) {
    acc = ldf_y(t) + acc;
  }
  stf_y(t, acc);
}

//! entry rank(x: data, rank: u32 mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let t = flat_id(ids);
  if (t >= p.outer * p.len) { return; }
  let r_e = udivmod(t, p.len);
  let row = r_e.x * p.len;
  let v = ld_x(t);
  let vnan = isnan_(v);
  var n = 0u;
  for (var j = p.c0; j < p.c1; j = j + 1u) {
    let w = ld_x(row + j);
    let wnan = isnan_(w);
    // w comes first: NaN above everything, then by value in the asked direction, then by
    // position among equals.
    var first = false;
    if (wnan != vnan) {
      // NaN counts as the largest value, as PyTorch's topk has it.
      first = select(vnan, wnan, p.flat != 0u);
    } else if (!wnan && w != v) {
      first = select((w < v), (w > v), p.flat != 0u);
    } else {
      first = j < r_e.y;
    }
    n = n + select(0u, 1u, first);
  }
  if (p.mode == 2u) { n = n + ld_rank(t); }
  st_rank(t, n);
}

//! entry pick(rank: u32, idx: u32 mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let t = flat_id(ids);
  if (t >= p.outer * p.len) { return; }
  let r_e = udivmod(t, p.len);
  let r = ld_rank(t);
  if (r < p.klen) { st_idx(r_e.x * p.klen + r, r_e.y); }
}
