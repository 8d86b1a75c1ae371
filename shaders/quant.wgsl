// quant.wgsl: products with, and reads of, a quantized matrix kept in its block format.
//
// A quantized matrix W is [rows, cols], cols a multiple of 32, in blocks of 32 consecutive
// values of a row (ggml's Q4_0, Q4_1 and Q8_0). Each block has a scale d and, for Q4_1, a
// minimum m (f16); its values are
//
//   Q4_0  d (q - 8),  q = 4 bits     Q4_1  d q + m,  q = 4 bits     Q8_0  d q,  q = 8 bits signed
//
// Storage (two u32 arrays, the block's bytes regrouped so every load is an aligned word):
//   qs  the quants, blocks in row order; a 4-bit block is 4 words, an 8-bit block 8. The
//       bytes are the file's: in a 4-bit block, byte j holds value j in its low nibble and
//       value j + 16 in its high one; in an 8-bit block, byte j holds value j.
//   sc  one word a block: pack2x16float(d, m), m = 0 for Q4_0 and Q8_0.
// FMT (compile-time) picks the format: 0 Q4_0, 1 Q4_1, 2 Q8_0.
//
//   matvec  y[b, r] = res[b, r] (when RES) + sum_k x'[b, k] W[r, k], for `m` rows b of x (a
//           decode step's batch), where x' = x, or with NORM x' = RMSNorm(x) gamma (eps from
//           the parameters; the rms is taken over the whole row by every workgroup). With GLU
//           the matrix has 2 rows output rows, gate then up, and
//           y[b, r] = res + silu(x' W[r]) (x' W[rows + r]): SwiGLU in the same pass.
//           A workgroup of WG threads computes R output rows for MB rows b; thread t walks
//           words t, t + WG, ... of each weight row (consecutive threads read consecutive
//           words), decodes them in registers and accumulates d (sum q x) + m (sum x) a block
//           for each (b, weight row) in f32. The WG partial sums are then added in workgroup
//           memory by one thread each, in thread order. Every weight byte is read once, and
//           decoded once, per MB rows of x.
//   dequant y[r, k] = W[r, k]: one thread a word (8 values of a 4-bit block, 4 of an 8-bit).
//   rows    y[t, k] = W[idx[t], k], an embedding lookup: one thread a word of an output row;
//           an index past the rows gives NaN (as embedding.wgsl).
//
// Bindings: signature lines (gamma is a dummy without NORM, res without RES). Params: rows
// (output rows), cols, m (rows of x), n (indices of `rows`), eps (NORM).
// Loops (per invocation): matvec MB (cols / (4 WG) + 1) with NORM, cols / (WG * values a
// word) + 1 over words (constant-bounded loops over NR and MB inside), 2 WG for each of the
// MB R / WG outputs a thread sums; the host keeps them within the budget. dequant and rows
// none.
// Bounds: matvec's threads past the last row or batch row compute on row 0 (or b 0) and skip
// the store, so every thread reaches the barrier; dequant and rows return past the end.

struct Params {
  rows: u32,
  cols: u32,
  m: u32,
  n: u32,
  eps: f32,
  _pad0: u32,
  _pad1: u32,
  _pad2: u32,
}

// Words a block's quants take.
fn words_per_block() -> u32 {
  if (FMT == 2u) { return 8u; }
  return 4u;
}

// (d, m) of block `blk`, with Q4_0's offset folded into m: d (q - 8) = d q - 8 d.
fn scale_min(s: u32) -> vec2<f32> {
  let dm = unpack2x16float(s);
  if (FMT == 0u) { return vec2<f32>(dm.x, -8.0 * dm.x); }
  return dm;
}

// The four 4-bit quants in the low (shift 0) or high (shift 4) nibbles of a word's bytes.
fn nibbles(w: u32, shift: u32) -> vec4<f32> {
  return vec4<f32>(
    f32((w >> shift) & 15u),
    f32((w >> (shift + 8u)) & 15u),
    f32((w >> (shift + 16u)) & 15u),
    f32((w >> (shift + 24u)) & 15u),
  );
}

// The four signed 8-bit quants of a word.
fn bytes_i8(w: u32) -> vec4<f32> {
  return vec4<f32>(
    f32(extractBits(i32(w), 0u, 8u)),
    f32(extractBits(i32(w), 8u, 8u)),
    f32(extractBits(i32(w), 16u, 8u)),
    f32(extractBits(i32(w), 24u, 8u)),
  );
}

// Word `w` of a block decoded with its (d, m) into y at the block's offset `base` plus the
// word's values: 4 values (8-bit) or 8 (4-bit: 4 at base, 4 at base + 16). Every entry binds y.
fn store_word(base: u32, w: u32, dm: vec2<f32>) {
  if (FMT == 2u) {
    let v = bytes_i8(w) * dm.x;
    st_y(base, v.x);
    st_y(base + 1u, v.y);
    st_y(base + 2u, v.z);
    st_y(base + 3u, v.w);
  } else {
    let lo = nibbles(w, 0u) * dm.x + dm.y;
    let hi = nibbles(w, 4u) * dm.x + dm.y;
    st_y(base, lo.x);
    st_y(base + 1u, lo.y);
    st_y(base + 2u, lo.z);
    st_y(base + 3u, lo.w);
    st_y(base + 16u, hi.x);
    st_y(base + 17u, hi.y);
    st_y(base + 18u, hi.z);
    st_y(base + 19u, hi.w);
  }
}

//! entry matvec(qs: u32, sc: u32, x: data vec4, gamma: data vec4, res: data, y: data mut)
//! check WG=32,64 FMT=0,1,2 MB=1,4 R=1,2 NORM=0,1 GLU=0,1 RES=0,1
// Weight rows a workgroup reads: its R output rows, and with GLU the R up-projection rows.
const NR: u32 = R * (1u + GLU);
var<workgroup> partial: array<f32, WG * MB * NR>;

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let groups_r = (p.rows + R - 1u) / R;
  let g = ids.wid.y * ids.nwg.x + ids.wid.x;
  let r0 = (g % groups_r) * R;
  let b0 = (g / groups_r) * MB;
  let wpb = words_per_block();
  let nb = p.cols / 32u;
  let words = nb * wpb;
  let cols4 = p.cols / 4u;
  // With NORM, each row b of x scaled by 1 / rms(x[b]) (RMSNorm without its gain, which
  // multiplies x below): every workgroup sums the squares itself.
  var rstd: array<f32, MB>;
  for (var bb = 0u; bb < MB; bb = bb + 1u) {
    rstd[bb] = 1.0;
    if (NORM == 1u) {
      let b = min(b0 + bb, p.m - 1u);
      var ss = 0.0;
      for (var k = ids.lid; k < cols4; k = k + WG) {
        let v = ld4_x(b * cols4 + k);
        ss = ss + dot(v, v);
      }
      rstd[bb] = inverseSqrt(block_sum(ss, ids) / f32(p.cols) + p.eps);
    }
  }
  // Weight row of slot i: the output rows, then (GLU) the same rows of the second half.
  var wrow: array<u32, NR>;
  for (var i = 0u; i < NR; i = i + 1u) {
    if (i < R) {
      wrow[i] = min(r0 + i, p.rows - 1u);
    } else {
      wrow[i] = min(r0 + i - R, p.rows - 1u) + p.rows;
    }
  }
  var acc: array<f32, MB * NR>; // zero-initialised
  for (var j = ids.lid; j < words; j = j + WG) {
    let blk = j / wpb;
    let wi = j % wpb;
    // The word's first values in a row of x, in vec4s: values 4 wi .. 4 wi + 3 of the block
    // (for 4-bit blocks, the high nibbles' are 16 further, 4 vec4s on).
    let xa = blk * 8u + wi;
    // The word of each weight row decoded once, for all MB rows of x: its quants as f32
    // (4-bit: low nibbles in wlo, high in whi; 8-bit: wlo) and its block's (d, m).
    var wlo: array<vec4<f32>, NR>;
    var whi: array<vec4<f32>, NR>;
    var dm: array<vec2<f32>, NR>;
    for (var i = 0u; i < NR; i = i + 1u) {
      let q = ld_qs(wrow[i] * words + j);
      dm[i] = scale_min(ld_sc(wrow[i] * nb + blk));
      if (FMT == 2u) {
        wlo[i] = bytes_i8(q);
      } else {
        wlo[i] = nibbles(q, 0u);
        whi[i] = nibbles(q, 4u);
      }
    }
    var glo = vec4<f32>(1.0);
    var ghi = vec4<f32>(1.0);
    if (NORM == 1u) {
      glo = ld4_gamma(xa);
      if (FMT != 2u) { ghi = ld4_gamma(xa + 4u); }
    }
    for (var bb = 0u; bb < MB; bb = bb + 1u) {
      let b = min(b0 + bb, p.m - 1u);
      if (FMT == 2u) {
        let xv = ld4_x(b * cols4 + xa) * glo;
        let sx = xv.x + xv.y + xv.z + xv.w;
        for (var i = 0u; i < NR; i = i + 1u) {
          acc[bb * NR + i] = acc[bb * NR + i] + dm[i].x * dot(wlo[i], xv) + dm[i].y * sx;
        }
      } else {
        // Word wi holds values 4 wi .. 4 wi + 3 (low nibbles) and 16 + 4 wi .. (high).
        let lo = ld4_x(b * cols4 + xa) * glo;
        let hi = ld4_x(b * cols4 + xa + 4u) * ghi;
        let sx = lo.x + lo.y + lo.z + lo.w + hi.x + hi.y + hi.z + hi.w;
        for (var i = 0u; i < NR; i = i + 1u) {
          let s = dot(wlo[i], lo) + dot(whi[i], hi);
          acc[bb * NR + i] = acc[bb * NR + i] + dm[i].x * s + dm[i].y * sx;
        }
      }
    }
  }
  for (var i = 0u; i < MB * NR; i = i + 1u) { partial[i * WG + ids.lid] = acc[i]; }
  workgroupBarrier();
  // Output (bb, rr) = o is thread o mod WG's: MB R may pass WG.
  for (var o = ids.lid; o < MB * R; o = o + WG) {
    let bb = o / R;
    let rr = o % R;
    let b = b0 + bb;
    let r = r0 + rr;
    if (b < p.m && r < p.rows) {
      let at = (bb * NR + rr) * WG;
      var s = 0.0;
      for (var t = 0u; t < WG; t = t + 1u) { s = s + partial[at + t]; }
      s = s * rstd[bb];
      if (GLU == 1u) {
        var u = 0.0;
        for (var t = 0u; t < WG; t = t + 1u) { u = u + partial[at + R * WG + t]; }
        u = u * rstd[bb];
        s = s / (1.0 + exp(-s)) * u;
      }
      if (RES == 1u) { s = s + ld_res(b * p.rows + r); }
      st_y(b * p.rows + r, s);
    }
  }
}

//! entry dequant(qs: u32, sc: u32, y: data mut)
//! check WG=256 FMT=0,1,2
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let j = flat_id(ids);
  let wpb = words_per_block();
  if (j >= p.rows * (p.cols / 32u) * wpb) { return; }
  let blk = j / wpb;
  let wi = j % wpb;
  let dm = scale_min(ld_sc(blk));
  let w = ld_qs(j);
  let base = blk * 32u + wi * 4u;
  store_word(base, w, dm);
}

//! entry rows(qs: u32, sc: u32, idx: u32, y: data mut)
//! check WG=256 FMT=0,1,2
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  let wpb = words_per_block();
  let words = (p.cols / 32u) * wpb;
  if (i >= p.n * words) { return; }
  let t = i / words;
  let j = i % words;
  let r = ld_idx(t);
  let wi = j % wpb;
  let base = t * p.cols + (j / wpb) * 32u + wi * 4u;
  if (r >= p.rows) {
    let nan = bitcast<f32>(0x7fc00000u + r * 0u);
    for (var k = 0u; k < 4u; k = k + 1u) {
      st_y(base + k, nan);
      if (FMT != 2u) { st_y(base + 16u + k, nan); }
    }
    return;
  }
  let blk = r * (p.cols / 32u) + j / wpb;
  let dm = scale_min(ld_sc(blk));
  let w = ld_qs(r * words + j);
  store_word(base, w, dm);
}
