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
//   fwd_vec, bwd_vec  The same with one subgroup per row and the row in registers, for rows
//        of a multiple of 4 up to 4 NV subgroup widths (see the entries).
//
// Bindings: signature lines. Params: rows, len, log (0/1).
// Loops (per invocation): fwd 2 len / WG + 2 plus two block reductions, bwd the same; the
// host caps len at 2^20 (kernels::softmax::MAX_ROW), 8192 iterations per loop at WG = 256.
// fwd_vec and bwd_vec none.
// Bounds: the per-row early return depends only on the workgroup id, so the barriers inside
// block_max / block_sum stay in uniform control flow; element loops test i < len.

struct Params {
  rows: u32,
  len: u32,
  log: u32,
  _pad: u32,
}

// The lowest finite f32: the starting maximum (as row_max_sumexp), and the value of runs past
// the row, whose exp() is then 0 beside any real element.
const LOWEST: f32 = -3.4028234663852886e38;

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


//! entry fwd_vec(x: data vec4, y: data mut vec4)
//! requires subgroups
//! check WG=32,128 NV=1,16
// fwd for rows whose length is a multiple of 4, at most 4 NV subgroup widths: a subgroup per
// row (row = workgroup x num_subgroups + subgroup id), each lane holding its NV runs of 4
// (runs lane, lane + subgroup size, ...) in registers, read once with their loads issued
// together; the maximum and the sum by subgroupMax and subgroupAdd, where `fwd` takes a
// workgroup and two block reductions per row, slow on short rows such as the GPT's 384. The
// same results up to the order of the sum.
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let r = subgroup_row(ids);
  if (r >= p.rows) { return; }
  let q = p.len / 4u;
  let base = r * q;
  var m = LOWEST;
  //! unroll k in 0..NV
  let j$k = ids.sg_lane + $k * ids.sg_size;
  let ok$k = j$k < q;
  let x$k = select(vec4<f32>(LOWEST), ld4_x(base + select(0u, j$k, ok$k)), ok$k);
  m = max(m, max(max(x$k.x, x$k.y), max(x$k.z, x$k.w)));
  //! end
  let mx = subgroupMax(m);
  var s = vec4<f32>(0.0);
  //! unroll k in 0..NV
  let e$k = select(vec4<f32>(0.0), exp(x$k - mx), ok$k);
  s = s + e$k;
  //! end
  let sum = subgroupAdd(s.x + s.y + s.z + s.w);
  let inv = 1.0 / sum;
  let lsum = log(sum);
  //! unroll k in 0..NV
  if (ok$k) {
    if (p.log != 0u) {
      st4_y(base + j$k, (x$k - mx) - lsum);
    } else {
      st4_y(base + j$k, e$k * inv);
    }
  }
  //! end
}

//! entry bwd_vec(y: data vec4, dy: data vec4, dx: data mut vec4)
//! requires subgroups
//! check WG=32,128 NV=1,16
// bwd with one subgroup per row and the row in registers, as fwd_vec.
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let r = subgroup_row(ids);
  if (r >= p.rows) { return; }
  let q = p.len / 4u;
  let base = r * q;
  var acc = vec4<f32>(0.0);
  //! unroll k in 0..NV
  let j$k = ids.sg_lane + $k * ids.sg_size;
  let ok$k = j$k < q;
  let at$k = base + select(0u, j$k, ok$k);
  let g$k = select(vec4<f32>(0.0), ld4_dy(at$k), ok$k);
  let y$k = select(vec4<f32>(0.0), ld4_y(at$k), ok$k);
  if (p.log != 0u) { acc = acc + g$k; } else { acc = acc + g$k * y$k; }
  //! end
  let t = subgroupAdd(acc.x + acc.y + acc.z + acc.w);
  //! unroll k in 0..NV
  if (ok$k) {
    if (p.log != 0u) {
      st4_dx(base + j$k, g$k - exp(y$k) * t);
    } else {
      st4_dx(base + j$k, y$k * (g$k - t));
    }
  }
  //! end
}
