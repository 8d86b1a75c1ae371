// conv.wgsl: the data-movement half of convolution and pooling, NCHW.
//
// Convolution runs as im2col + matmul: `im2col` lays the input patches out as a column matrix
// [N, C*KH*KW, HO*WO] (rows ordered channel, kernel row, kernel column), so output channels
// come from one batched product with the weight [O, C/G * KH * KW] (matmul.wgsl with the
// batch index n*G + g). The gradient for the input goes back through `col2im`.
//
// All entries are one thread per element of the tensor they write, 1-D with flat_id; threads
// past the end return. Coordinates are derived from the thread index, and every input read is
// guarded by a range test of the (possibly negative, hence i32) input coordinate, which is how
// padding reads as zero (or as -inf for max pooling).
//
//   im2col       col[n, (c*KH + ki)*KW + kj, oh*WO + ow] = x[n, c, oh*SH - PH + ki*DH, ow*SW - PW + kj*DW]
//   col2im       dx[n, c, ih, iw] = sum over (ki, kj) whose output position (oh, ow) maps onto
//                (ih, iw) of dcol[...]; a gather, so no two threads write one element.
//   maxpool      y = max over the window (padding = -inf), and idx = ih*W + iw of the first
//                maximum (u32), kept for the backward pass.
//   maxpool_bwd  dx[n, c, ih, iw] = sum of dy over the windows covering (ih, iw) whose idx is
//                this position (a gather, deterministic).
//   avgpool      y = sum over the window / (KH*KW) (zero padding counts).
//   avgpool_bwd  dx = sum of dy / (KH*KW) over the windows covering the position.
//
// Bindings: signature lines.
// Params: n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo, n0 (im2col / col2im only).
// Loops (per invocation): im2col none; the others walk the window, kh (kw + 1) + 1, which the
// host keeps within the loop budget (windows up to about 127 x 127).

struct Params {
  n: u32,
  c: u32,
  h: u32,
  w: u32,
  kh: u32,
  kw: u32,
  sh: u32,
  sw: u32,
  ph: u32,
  pw: u32,
  dh: u32,
  dw: u32,
  ho: u32,
  wo: u32,
  // First image of this call: im2col reads x from image n0, col2im writes dx from image n0
  // (convolution runs in chunks of the batch to bound the column buffer).
  n0: u32,
  _pad: u32,
}

// The output index along one axis whose window puts tap `k` on input position `i`, or -1.
fn out_pos(i: u32, k: u32, pad: u32, stride: u32, dil: u32, size: u32) -> i32 {
  let t = i32(i) + i32(pad) - i32(k * dil);
  if (t < 0 || t % i32(stride) != 0) { return -1; }
  let o = t / i32(stride);
  if (o >= i32(size)) { return -1; }
  return o;
}

// The input position that tap `k` of output position `o` reads along one axis (may be
// negative or past the input: padding).
fn in_pos(o: u32, k: u32, pad: u32, stride: u32, dil: u32) -> i32 {
  return i32(o * stride + k * dil) - i32(pad);
}

//! entry im2col(x: data, col: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  let hw = p.ho * p.wo;
  let kk = p.kh * p.kw;
  if (i >= p.n * p.c * kk * hw) { return; }
  let s = i % hw;
  let t = i / hw;
  let ck = t % (p.c * kk);
  let nn = t / (p.c * kk);
  let ch = ck / kk;
  let r = ck % kk;
  let ih = in_pos(s / p.wo, r / p.kw, p.ph, p.sh, p.dh);
  let iw = in_pos(s % p.wo, r % p.kw, p.pw, p.sw, p.dw);
  var v = 0.0;
  if (ih >= 0 && ih < i32(p.h) && iw >= 0 && iw < i32(p.w)) {
    v = ld_x((((p.n0 + nn) * p.c + ch) * p.h + u32(ih)) * p.w + u32(iw));
  }
  st_col(i, v);
}

//! entry col2im(dcol: data, dx: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n * p.c * p.h * p.w) { return; }
  let iw = i % p.w;
  let ih = (i / p.w) % p.h;
  let ch = (i / (p.w * p.h)) % p.c;
  let nn = i / (p.w * p.h * p.c);
  let hw = p.ho * p.wo;
  let kk = p.kh * p.kw;
  var acc = 0.0;
  for (var ki = 0u; ki < p.kh; ki = ki + 1u) {
    let oh = out_pos(ih, ki, p.ph, p.sh, p.dh, p.ho);
    if (oh < 0) { continue; }
    for (var kj = 0u; kj < p.kw; kj = kj + 1u) {
      let ow = out_pos(iw, kj, p.pw, p.sw, p.dw, p.wo);
      if (ow < 0) { continue; }
      let row = (nn * p.c + ch) * kk + ki * p.kw + kj;
      acc = acc + ld_dcol(row * hw + u32(oh) * p.wo + u32(ow));
    }
  }
  st_dx(p.n0 * p.c * p.h * p.w + i, acc);
}

//! entry maxpool(x: data, y: data mut, idx: u32 mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n * p.c * p.ho * p.wo) { return; }
  let ow = i % p.wo;
  let oh = (i / p.wo) % p.ho;
  let plane = i / (p.wo * p.ho);
  var best = -3.4028234663852886e38;
  var at = 0xffffffffu;
  for (var ki = 0u; ki < p.kh; ki = ki + 1u) {
    let ih = in_pos(oh, ki, p.ph, p.sh, p.dh);
    if (ih < 0 || ih >= i32(p.h)) { continue; }
    for (var kj = 0u; kj < p.kw; kj = kj + 1u) {
      let iw = in_pos(ow, kj, p.pw, p.sw, p.dw);
      if (iw < 0 || iw >= i32(p.w)) { continue; }
      let pos = u32(ih) * p.w + u32(iw);
      let v = ld_x(plane * p.h * p.w + pos);
      if (v > best || at == 0xffffffffu) { best = v; at = pos; }
    }
  }
  st_y(i, best);
  st_idx(i, at);
}

//! entry maxpool_bwd(idx: u32, dy: data, dx: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n * p.c * p.h * p.w) { return; }
  let iw = i % p.w;
  let ih = (i / p.w) % p.h;
  let plane = i / (p.w * p.h);
  let pos = ih * p.w + iw;
  var acc = 0.0;
  for (var ki = 0u; ki < p.kh; ki = ki + 1u) {
    let oh = out_pos(ih, ki, p.ph, p.sh, p.dh, p.ho);
    if (oh < 0) { continue; }
    for (var kj = 0u; kj < p.kw; kj = kj + 1u) {
      let ow = out_pos(iw, kj, p.pw, p.sw, p.dw, p.wo);
      if (ow < 0) { continue; }
      let o = (plane * p.ho + u32(oh)) * p.wo + u32(ow);
      if (ld_idx(o) == pos) { acc = acc + ld_dy(o); }
    }
  }
  st_dx(i, acc);
}

//! entry avgpool(x: data, y: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n * p.c * p.ho * p.wo) { return; }
  let ow = i % p.wo;
  let oh = (i / p.wo) % p.ho;
  let plane = i / (p.wo * p.ho);
  var acc = 0.0;
  for (var ki = 0u; ki < p.kh; ki = ki + 1u) {
    let ih = in_pos(oh, ki, p.ph, p.sh, p.dh);
    if (ih < 0 || ih >= i32(p.h)) { continue; }
    for (var kj = 0u; kj < p.kw; kj = kj + 1u) {
      let iw = in_pos(ow, kj, p.pw, p.sw, p.dw);
      if (iw < 0 || iw >= i32(p.w)) { continue; }
      acc = acc + ld_x((plane * p.h + u32(ih)) * p.w + u32(iw));
    }
  }
  st_y(i, acc / f32(p.kh * p.kw));
}

//! entry avgpool_bwd(dy: data, dx: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  if (i >= p.n * p.c * p.h * p.w) { return; }
  let iw = i % p.w;
  let ih = (i / p.w) % p.h;
  let plane = i / (p.w * p.h);
  var acc = 0.0;
  for (var ki = 0u; ki < p.kh; ki = ki + 1u) {
    let oh = out_pos(ih, ki, p.ph, p.sh, p.dh, p.ho);
    if (oh < 0) { continue; }
    for (var kj = 0u; kj < p.kw; kj = kj + 1u) {
      let ow = out_pos(iw, kj, p.pw, p.sw, p.dw, p.wo);
      if (ow < 0) { continue; }
      acc = acc + ld_dy((plane * p.ho + u32(oh)) * p.wo + u32(ow));
    }
  }
  st_dx(i, acc / f32(p.kh * p.kw));
}
