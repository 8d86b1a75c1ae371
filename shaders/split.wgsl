// split.wgsl: f32 products as three f16 products on tensor cores (MatmulPrecision::High).
//
// An f32 product C = op(A) op(B) is computed as C' = op(A3) op(B3), an f16 product over 3 K
// with f32 accumulation, where
//
//   A3 = [Ah | Ah | Al]   (the three parts side by side along K)
//   B3 = [Bh ; Bl ; Bh]
//
// so that C' = Ah Bh + Ah Bl + Al Bh. Each line of an operand (a row of op(A), a column of
// op(B): the values that meet one output row or column) is first scaled by a power of two s
// that puts its largest magnitude in [2^14, 2^15), inside f16's range with room to spare;
// then hi = f16(x s) and lo = f16(x s - hi). hi + lo keeps about 22 of x's 24 significant
// bits (lo's own rounding), and the product drops only lo x lo, about 2^-22 of each term.
// The scaling is exact (a power of two), so the f32 result is C'[m, n] / (s_a[m] s_b[n]),
// applied as one change of exponent (`ldexp`): the two scales multiplied first, or applied
// one after the other, could leave f32's range where the result does not.
//
//   parts  One thread per 4 elements of a padded operand: writes their three f16 parts, and
//          (at k = 0) the line's -log2(s), an integer kept as f32. The parts keep the
//          operand's orientation (a k-fast operand gives k-fast parts), so the product reads
//          them with the same transposes, and both extents are padded to multiples of 8 with
//          zeros: the tensor-core product then takes its 16-byte runs whatever the shape.
//          Padding lines past L are zeros too (their outputs are computed and dropped).
//   join   One thread per output element: C = act(C' / (s_a s_b) + bias), from the padded C'.
//
// Non-finite inputs: a line whose largest magnitude (`amax`, the host's max of |x| along K,
// which keeps NaN) is inf or NaN gets parts of 0 and a -log2(s) of NaN, so its outputs are
// NaN where an f32 product would give inf or NaN. Finite values cannot overflow: after
// scaling they are below 2^15. A line of zeros gets s = 1.
//
// Layouts (parts): x is read at x_off + mat x_bs + line s_line + k s_k. With kfast the parts
// are [mat, lines8, 3 k8] (k fastest), else [mat, 3 k8, lines8] (lines fastest); a thread's
// index follows the fast axis, so reads and writes coalesce whichever axis x has contiguous.
//
// Bindings: on the signature lines (bias is a dummy when has_bias is 0). Loops: none.
// Bounds: threads past the padded extent (parts) or the output (join) return at once.

struct Params {
  // parts
  nmat: u32,
  lines: u32,
  k: u32,
  lines8: u32,
  k8: u32,
  x_off: u32,
  x_bs: u32,
  s_line: u32,
  s_k: u32,
  kfast: u32,
  // 0 for A's [hi, hi, lo], 1 for B's [hi, lo, hi].
  order: u32,
  // join: C is [batch, m, n], C' [batch, m8, n8]; a line's -log2(s) is at ea_bs b + m
  // (eb_bs b + n).
  batch: u32,
  m: u32,
  n: u32,
  m8: u32,
  n8: u32,
  ea_bs: u32,
  eb_bs: u32,
  has_bias: u32,
  act: u32,
}

// x rounded to the nearest f16 (ties to even), as an f32; x finite and below f16's largest.
// Integer arithmetic on the bits, because a driver may treat a round trip through f16 as the
// identity: NVIDIA's did (pack2x16float then unpack2x16float), which left every lo part 0.
// f16 keeps 11 significant bits down to 2^-14 and a fixed step of 2^-24 below it.
fn to_half(x: f32) -> f32 {
  if (abs(x) < 6.103515625e-5) {
    return round(x * 16777216.0) * 5.9604644775390625e-8;
  }
  let b = bitcast<u32>(x);
  return bitcast<f32>((b + 0xfffu + ((b >> 13u) & 1u)) & 0xffffe000u);
}

// The power of two n with amax 2^n in [2^14, 2^15) (clamped to f32's exponents: a line of
// subnormals scales by 2^127 and stays small), or 0 for zero; amax finite.
fn scale_exp(amax: f32) -> i32 {
  let e = i32((bitcast<u32>(amax) >> 23u) & 0xffu);
  if (amax == 0.0) { return 0; }
  return min(141 - e, 127);
}

//! entry parts(x: f32, amax: f32, hl: f16 mut vec4, ex: f32 mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  // Four neighbours along the fast axis a thread (padded extents are multiples of 8, so
  // they share the other coordinate, and their parts are 4 neighbouring halves).
  let i = 4u * flat_id(ids);
  let per = p.lines8 * p.k8;
  if (i >= p.nmat * per) { return; }
  let mat = i / per;
  let r = i - mat * per;
  var line = r / p.k8;
  var k = r - line * p.k8;
  var dline = 0u;
  var dk = 1u;
  if (p.kfast == 0u) {
    k = r / p.lines8;
    line = r - k * p.lines8;
    dline = 1u;
    dk = 0u;
  }
  var hi = vec4<f32>(0.0);
  var lo = vec4<f32>(0.0);
  for (var q = 0u; q < 4u; q = q + 1u) {
    let ln = line + q * dline;
    let kk = k + q * dk;
    if (ln < p.lines) {
      let amax = ld_amax(mat * p.lines + ln);
      let finite = ((bitcast<u32>(amax) >> 23u) & 0xffu) != 0xffu;
      let n = select(0, scale_exp(amax), finite);
      if (kk < p.k && finite) {
        let v = ld_x(p.x_off + mat * p.x_bs + ln * p.s_line + kk * p.s_k) * ldexp(f32(1.0), n);
        hi[q] = to_half(v);
        lo[q] = to_half(v - hi[q]);
      }
      if (kk == 0u) {
        st_ex(mat * p.lines + ln, select(bitcast<f32>(0x7fc00000u), f32(-n), finite));
      }
    }
  }
  // Where part j of (line, k) goes, in runs of 4.
  var base = (mat * p.lines8 + line) * 3u * p.k8 + k;
  var step = p.k8;
  if (p.kfast == 0u) {
    base = (mat * 3u * p.k8 + k) * p.lines8 + line;
    step = p.k8 * p.lines8;
  }
  let b_order = p.order != 0u;
  st4_hl(base / 4u, hi);
  st4_hl((base + step) / 4u, select(hi, lo, b_order));
  st4_hl((base + 2u * step) / 4u, select(lo, hi, b_order));
}

//! entry join(cp: f32, ea: f32, eb: f32, bias: data, c: data mut)
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let i = flat_id(ids);
  let mn = p.m * p.n;
  if (i >= p.batch * mn) { return; }
  let b = i / mn;
  let r = i - b * mn;
  let m = r / p.n;
  let n = r - m * p.n;
  let e = ld_ea(b * p.ea_bs + m) + ld_eb(b * p.eb_bs + n);
  // e is in [-254, 226]; ldexp promises results only for exponents inside f32's own, so it
  // goes in two steps in the same direction (an overflow or underflow of the first is one of
  // the result).
  let e1 = clamp(e, -126.0, 127.0);
  var v = ldexp(ldexp(ld_cp((b * p.m8 + m) * p.n8 + n), i32(e1)), i32(e - e1));
  if (isnan_(e)) { v = e; }
  if (p.has_bias != 0u) { v = v + ld_bias(n); }
  if (p.act == ACT_RELU) { v = max(v, 0.0); }
  if (p.act == ACT_GELU) { v = 0.5 * v * (1.0 + erf_(v * 0.7071067811865476)); }
  st_c(i, v);
}
