// softmax.wgsl: softmax and log-softmax along the last axis, forward and backward.
//
// One workgroup per row (row r = wid.y * nwg.x + wid.x, so more than 65535 rows fold onto a
// 2-D grid); its WG threads stride over the row's `len` elements, so rows of any length work
// (1 to millions), with WG picked by the host from 32 to 256 to fit short rows.
//
//   fwd  The row's max and sum of exp in one read (row_max_sumexp in common.wgsl: online
//        pairs per thread, combined with block_max then block_sum); a second read writes
//        exp(x - max) / sum, or (x - max) - log sum for log-softmax (subtracting the max
//        first keeps the difference exact; x - (max + log sum) would round at the size of
//        the max: rows near -30000 lost three digits).
//        Subtracting the row maximum keeps every exp() in [0, 1] (no overflow).
//   bwd  softmax:      dx = y * (dy - sum(dy * y))
//        log-softmax:  dx = dy - exp(y) * sum(dy)
//        from the saved output y; one reduction, then one elementwise pass.
//
// Bindings: signature lines. Params: rows, len, log (0/1).
// Loops (per invocation): fwd 2 len / WG + 2 plus two block reductions, bwd the same; the
// host caps len at 2^20 (kernels::softmax::MAX_ROW), 8192 iterations per loop at WG = 256.
// Bounds: the per-row early return depends only on the workgroup id, so the barriers inside
// block_max / block_sum stay in uniform control flow; element loops test i < len.

struct Params {
  rows: u32,
  len: u32,
  log: u32,
  _pad: u32,
}

//! entry fwd(x: data, y: data mut)
//! check WG=32,64,128,256
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let r = ids.wid.y * ids.nwg.x + ids.wid.x;
  if (r >= p.rows) { return; }
  let base = r * p.len;
  let st = row_max_sumexp(base, p.len, ids);
  let mx = st.x;
  let sum = st.y;
  let inv = 1.0 / sum;
  let lsum = log(sum);
  for (var i = ids.lid; i < p.len; i = i + WG) {
    let v = ld_x(base + i);
    if (p.log != 0u) {
      st_y(base + i, (v - mx) - lsum);
    } else {
      st_y(base + i, exp(v - mx) * inv);
    }
  }
}

//! entry bwd(y: data, dy: data, dx: data mut)
//! check WG=32,64,128,256
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let r = ids.wid.y * ids.nwg.x + ids.wid.x;
  if (r >= p.rows) { return; }
  let base = r * p.len;
  var acc = 0.0;
  for (var i = ids.lid; i < p.len; i = i + WG) {
    let g = ld_dy(base + i);
    if (p.log != 0u) { acc = acc + g; } else { acc = acc + g * ld_y(base + i); }
  }
  let t = block_sum(acc, ids);
  for (var i = ids.lid; i < p.len; i = i + WG) {
    let g = ld_dy(base + i);
    let y = ld_y(base + i);
    if (p.log != 0u) {
      st_dx(base + i, g - exp(y) * t);
    } else {
      st_dx(base + i, y * (g - t));
    }
  }
}
