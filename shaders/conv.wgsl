// conv.wgsl: the data-movement half of convolution and pooling, NCHW.
//
// Convolution runs as im2col + matmul: `im2col` lays the input patches out as a column matrix
// [N, C*KH*KW, HO*WO] (rows ordered channel, kernel row, kernel column), so output channels
// come from one batched product with the weight [O, C/G * KH * KW] (matmul.wgsl with the
// batch index n*G + g). The gradient for the input goes back through `col2im`.
//
// Every entry runs on a 3-D grid: x tiles one plane of the tensor it writes (EPT x WG positions
// per workgroup, EPT per thread at stride WG: fewer, fuller workgroups ran these kernels 1.5x
// faster on lavapipe), y is the plane's row (a channel, or for im2col a channel x kernel-tap row) from
// p.row0 on, z the image from p.n0 on. So the only per-element index arithmetic is splitting
// a plane position into (row, column), one division; the channel and tap decompositions are
// the same for a whole workgroup. Threads past the plane return. Input reads are guarded by a
// range test of the (possibly negative, hence i32) input coordinate, which is how padding reads
// as zero (or as -inf for max pooling).
//
//   im2col       col[n, (c*KH + ki)*KW + kj, oh*WO + ow] = x[n, c, oh*SH - PH + ki*DH, ow*SW - PW + kj*DW]
//   col2im       dx[n, c, ih, iw] = sum over (ki, kj) whose output position (oh, ow) maps onto
//                (ih, iw) of dcol[...]; a gather, so no two threads write one element.
//   maxpool      y = max over the window (padding = -inf), and idx = ih*W + iw of the first
//                maximum (u32), kept for the backward pass.
//   maxpool_bwd  dx[n, c, ih, iw] = sum of dy over the windows covering (ih, iw) whose idx is
//                this position (a gather, deterministic).
//   maxpool_bwd_tiled  For windows that tile the input exactly (stride = kernel, no padding, no
//                dilation, H and W multiples of the window): one thread per window writes its
//                kh x kw inputs, dy at idx and 0 elsewhere; every input is written once.
//   avgpool      y = sum over the window / (KH*KW) (zero padding counts).
//   avgpool_bwd  dx = sum of dy / (KH*KW) over the windows covering the position.
//
// Bindings: signature lines.
// Params: n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo, n0 (the dispatch's first image),
// row0 (its first plane row), nc0 (the image of the column buffer's first rows).
// Loops (per invocation): im2col none; the others walk the window once per position,
// EPT (kh (kw + 1) + 1), which the host keeps within the loop budget (windows up to about
// 63 x 63).

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
  n0: u32,
  row0: u32,
  _pad0: u32,
  // The image the column buffer's first rows belong to (im2col, col2im).
  nc0: u32,
  _pad1: u32,
  _pad2: u32,
}

// The output index along one axis whose window puts tap `k` on input position `i`, or -1.
fn out_pos(i: u32, k: u32, pad: u32, stride: u32, dil: u32, size: u32) -> i32 {
  let t = i32(i) + i32(pad) - i32(k * dil);
  if (t < 0) { return -1; }
  var o = u32(t);
  if (stride != 1u) {
    let qr = udivmod(u32(t), stride);
    if (qr.y != 0u) { return -1; }
    o = qr.x;
  }
  if (o >= size) { return -1; }
  return i32(o);
}

// The input position that tap `k` of output position `o` reads along one axis (may be
// negative or past the input: padding).
fn in_pos(o: u32, k: u32, pad: u32, stride: u32, dil: u32) -> i32 {
  return i32(o * stride + k * dil) - i32(pad);
}

//! entry im2col(x: data, col: data mut)
//! check WG=64 EPT=4
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let hw = p.ho * p.wo;
  let kk = p.kh * p.kw;
  let ck = p.row0 + ids.wid.y;
  let img = p.n0 + ids.wid.z;
  let nn = img - p.nc0;
  // Uniform across the workgroup.
  let ch = ck / kk;
  let r = ck % kk;
  let ki = r / p.kw;
  let kj = r % p.kw;
  let xbase = (img * p.c + ch) * p.h;
  let cbase = (nn * p.c * kk + ck) * hw;
  //! unroll j in 0..EPT
  {
    let s = (ids.wid.x * EPT + $j) * WG + ids.lid;
    if (s < hw) {
      let o = udivmod(s, p.wo);
      let ih = in_pos(o.x, ki, p.ph, p.sh, p.dh);
      let iw = in_pos(o.y, kj, p.pw, p.sw, p.dw);
      var v = 0.0;
      if (ih >= 0 && ih < i32(p.h) && iw >= 0 && iw < i32(p.w)) {
        v = ld_x((xbase + u32(ih)) * p.w + u32(iw));
      }
      st_col(cbase + s, v);
    }
  }
  //! end
}

//! entry col2im(dcol: data, dx: data mut)
//! check WG=64 EPT=4
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  //! unroll j in 0..EPT
  {
    let s = (ids.wid.x * EPT + $j) * WG + ids.lid;
    if (s < p.h * p.w) {
      let ch = p.row0 + ids.wid.y;
      let img = p.n0 + ids.wid.z;
      let nn = img - p.nc0;
      let hw = p.ho * p.wo;
      let kk = p.kh * p.kw;
      let iq = udivmod(s, p.w);
      let ih = iq.x;
      let iw = iq.y;
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
      st_dx((img * p.c + ch) * p.h * p.w + s, acc);
    }
  }
  //! end
}

//! entry maxpool(x: data, y: data mut, idx: u32 mut)
//! check WG=64 EPT=4
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  //! unroll j in 0..EPT
  {
    let s = (ids.wid.x * EPT + $j) * WG + ids.lid;
    if (s < p.ho * p.wo) {
      let plane = (p.n0 + ids.wid.z) * p.c + p.row0 + ids.wid.y;
      let oq = udivmod(s, p.wo);
      var best = -3.4028234663852886e38;
      var at = 0xffffffffu;
      for (var ki = 0u; ki < p.kh; ki = ki + 1u) {
        let ih = in_pos(oq.x, ki, p.ph, p.sh, p.dh);
        if (ih < 0 || ih >= i32(p.h)) { continue; }
        for (var kj = 0u; kj < p.kw; kj = kj + 1u) {
          let iw = in_pos(oq.y, kj, p.pw, p.sw, p.dw);
          if (iw < 0 || iw >= i32(p.w)) { continue; }
          let pos = u32(ih) * p.w + u32(iw);
          let v = ld_x(plane * p.h * p.w + pos);
          if (v > best || at == 0xffffffffu) { best = v; at = pos; }
        }
      }
      let o = plane * p.ho * p.wo + s;
      st_y(o, best);
      st_idx(o, at);
    }
  }
  //! end
}

//! entry maxpool_bwd(idx: u32, dy: data, dx: data mut)
//! check WG=64 EPT=4
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  //! unroll j in 0..EPT
  {
    let s = (ids.wid.x * EPT + $j) * WG + ids.lid;
    if (s < p.h * p.w) {
      let plane = (p.n0 + ids.wid.z) * p.c + p.row0 + ids.wid.y;
      let iq = udivmod(s, p.w);
      let ih = iq.x;
      let iw = iq.y;
      var acc = 0.0;
      for (var ki = 0u; ki < p.kh; ki = ki + 1u) {
        let oh = out_pos(ih, ki, p.ph, p.sh, p.dh, p.ho);
        if (oh < 0) { continue; }
        for (var kj = 0u; kj < p.kw; kj = kj + 1u) {
          let ow = out_pos(iw, kj, p.pw, p.sw, p.dw, p.wo);
          if (ow < 0) { continue; }
          let o = (plane * p.ho + u32(oh)) * p.wo + u32(ow);
          if (ld_idx(o) == s) { acc = acc + ld_dy(o); }
        }
      }
      st_dx(plane * p.h * p.w + s, acc);
    }
  }
  //! end
}

//! entry maxpool_bwd_tiled(idx: u32, dy: data, dx: data mut)
//! check WG=64 EPT=4
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let plane = (p.n0 + ids.wid.z) * p.c + p.row0 + ids.wid.y;
  //! unroll j in 0..EPT
  {
    let s = (ids.wid.x * EPT + $j) * WG + ids.lid;
    if (s < p.ho * p.wo) {
      let oq = udivmod(s, p.wo);
      let o = plane * p.ho * p.wo + s;
      let at = ld_idx(o);
      let g = ld_dy(o);
      let ih0 = oq.x * p.kh;
      let iw0 = oq.y * p.kw;
      for (var ki = 0u; ki < p.kh; ki = ki + 1u) {
        for (var kj = 0u; kj < p.kw; kj = kj + 1u) {
          let pos = (ih0 + ki) * p.w + iw0 + kj;
          st_dx(plane * p.h * p.w + pos, select(0.0, g, pos == at));
        }
      }
    }
  }
  //! end
}

//! entry avgpool(x: data, y: data mut)
//! check WG=64 EPT=4
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  //! unroll j in 0..EPT
  {
    let s = (ids.wid.x * EPT + $j) * WG + ids.lid;
    if (s < p.ho * p.wo) {
      let plane = (p.n0 + ids.wid.z) * p.c + p.row0 + ids.wid.y;
      let oq = udivmod(s, p.wo);
      var acc = 0.0;
      for (var ki = 0u; ki < p.kh; ki = ki + 1u) {
        let ih = in_pos(oq.x, ki, p.ph, p.sh, p.dh);
        if (ih < 0 || ih >= i32(p.h)) { continue; }
        for (var kj = 0u; kj < p.kw; kj = kj + 1u) {
          let iw = in_pos(oq.y, kj, p.pw, p.sw, p.dw);
          if (iw < 0 || iw >= i32(p.w)) { continue; }
          acc = acc + ld_x((plane * p.h + u32(ih)) * p.w + u32(iw));
        }
      }
      st_y(plane * p.ho * p.wo + s, acc / f32(p.kh * p.kw));
    }
  }
  //! end
}

//! entry avgpool_bwd(dy: data, dx: data mut)
//! check WG=64 EPT=4
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  //! unroll j in 0..EPT
  {
    let s = (ids.wid.x * EPT + $j) * WG + ids.lid;
    if (s < p.h * p.w) {
      let plane = (p.n0 + ids.wid.z) * p.c + p.row0 + ids.wid.y;
      let iq = udivmod(s, p.w);
      var acc = 0.0;
      for (var ki = 0u; ki < p.kh; ki = ki + 1u) {
        let oh = out_pos(iq.x, ki, p.ph, p.sh, p.dh, p.ho);
        if (oh < 0) { continue; }
        for (var kj = 0u; kj < p.kw; kj = kj + 1u) {
          let ow = out_pos(iq.y, kj, p.pw, p.sw, p.dw, p.wo);
          if (ow < 0) { continue; }
          acc = acc + ld_dy((plane * p.ho + u32(oh)) * p.wo + u32(ow));
        }
      }
      st_dx(plane * p.h * p.w + s, acc / f32(p.kh * p.kw));
    }
  }
  //! end
}
