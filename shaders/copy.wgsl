// copy.wgsl: element copies with dtype conversion.
//
// Entry points (one thread per element, 1-D over `n`, flat_id on a grid folded to 2-D; threads
// past `n` return, the only check needed because each thread touches only its own element):
//   cast     y[i] = x[i] for contiguous tensors, converting between f32, f16 and u32 through
//            the prelude's float views (ldf_/stf_). Also plain copy when the dtypes match.
//   strided  y[yoff + sum_k c_k * ys_k] = x[xoff + sum_k c_k * xs_k], where (c_0..c_{r-1}) is
//            the i-th coordinate of the iteration shape `dims` (row-major). Zero strides
//            broadcast. This single kernel is transpose, permute, expand, slice and
//            slice-assign (concatenation). Rank is at most 6.
//   strided_u32  the same for u32 tensors (exact for every value; the float view is not).
//   words    y[i] = x[i] on raw 32-bit words: a same-dtype copy of any tensor, bit for bit.
//   transpose  the strided copy of a batched 2-D transpose (a matrix made dense from its
//            transposed view; NCHW to NHWC and back): through a 32 x 32 tile in workgroup
//            memory, so reads run along x's contiguous axis and writes along y's (one thread
//            per element would read the x side 2-64 bytes a cache line).
//
// Bindings: reads `x`, writes `y` (signature lines).
// Params: n, rank, xoff, yoff, then dims, x strides and y strides as two vec4<u32> each
// (uniform arrays need 16-byte elements).
// Loops: strided_offsets runs `rank` (<= 6) iterations; nothing else loops (transpose's 4
// rows a thread are unrolled).

struct Params {
  n: u32,
  rank: u32,
  xoff: u32,
  yoff: u32,
  dims: array<vec4<u32>, 2>,
  xs: array<vec4<u32>, 2>,
  ys: array<vec4<u32>, 2>,
}

// Source and destination element offsets of the i-th element of the iteration shape.
fn strided_offsets(i: u32) -> vec2<u32> {
  var rem = i;
  var xi = p.xoff;
  var yi = p.yoff;
  // Peel coordinates from the innermost dimension outwards.
  for (var k = i32(p.rank) - 1; k >= 0; k = k - 1) {
    let d = p.dims[k / 4][k % 4];
    let qr = udivmod(rem, d);
    let c = qr.y;
    rem = qr.x;
    xi = xi + c * p.xs[k / 4][k % 4];
    yi = yi + c * p.ys[k / 4][k % 4];
  }
  return vec2<u32>(xi, yi);
}

//! entry cast(x: any, y: any mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  stf_y(i, ldf_x(i));
}

//! entry strided(x: data, y: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  let o = strided_offsets(i);
  stf_y(o.y, ldf_x(o.x));
}

//! entry strided_u32(x: u32, y: u32 mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  let o = strided_offsets(i);
  st_y(o.y, ld_x(o.x));
}

//! entry words(x: u32, y: u32 mut)
// 32-bit words from word xoff on to word yoff on (a same-dtype copy of contiguous runs: two
// halves a thread for f16).
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n) { return; }
  st_y(p.yoff + i, ld_x(p.xoff + i));
}

//! entry transpose(x: data, y: data mut)
// Element (b, i, j) of dims = [B, P, Q] (dims[0].xyz) is x[xoff + b xs.x + i + j xs.y] and
// y[yoff + b ys.x + i ys.y + j]: x contiguous along i, y along j. Workgroup (i / 32, j / 32,
// b) of 256 threads moves a 32 x 32 tile, 4 rows a thread each way; the tile's rows are 33
// wide so the column reads fall in distinct banks.
var<workgroup> tile: array<f32, 1056>;

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let tx = ids.lid % 32u;
  let ty = ids.lid / 32u;
  let i0 = ids.wid.x * 32u;
  let j0 = ids.wid.y * 32u;
  let b = ids.wid.z;
  let np = p.dims[0].y;
  let nq = p.dims[0].z;
  let xb = p.xoff + b * p.xs[0].x;
  let yb = p.yoff + b * p.ys[0].x;
  //! unroll r in 0..4
  let jr$r = j0 + ty + 8u * $r;
  if (i0 + tx < np && jr$r < nq) {
    tile[(ty + 8u * $r) * 33u + tx] = ldf_x(xb + i0 + tx + jr$r * p.xs[0].y);
  }
  //! end
  workgroupBarrier();
  //! unroll r in 0..4
  let iw$r = i0 + ty + 8u * $r;
  if (iw$r < np && j0 + tx < nq) {
    stf_y(yb + iw$r * p.ys[0].y + j0 + tx, tile[tx * 33u + ty + 8u * $r]);
  }
  //! end
}
