//! ggml's tensor element formats and their decoders to f32.
//!
//! A tensor of a block format is a sequence of fixed-size blocks, each holding
//! [`GgmlType::block_size`] values in [`GgmlType::type_size`] bytes; a row's length is a
//! multiple of the block size, so blocks never straddle rows. All multi-byte fields are
//! little-endian; `f16` is IEEE half precision. "Super-block" formats (`_K`) hold 256 values in
//! sub-blocks of 16 or 32 that share scales quantized against the super-block's `d` (and `dmin`).
//!
//! Each decoder below documents its block's byte layout and computes the value in the same
//! f32 operations, in the same order, as ggml's reference decoders, so results are bit-identical
//! to them (and to the `gguf` Python package's): the scale products are rounded to f32 first,
//! then multiplied by the quant, then the minimum (if any) is subtracted or added.

use crate::error::{Error, Result};
use half::f16;

/// The element formats a GGUF tensor can be stored in (ggml's `ggml_type`), with their ids.
///
/// Every id ggml currently assigns is known, so a file holding formats wgrad does not decode
/// still opens and its other tensors still read; [`GgmlType::can_dequantize`] says which ones
/// [`dequantize`] handles.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GgmlType {
    /// IEEE single precision.
    F32,
    /// IEEE half precision.
    F16,
    /// 32 values: f16 scale, 4-bit quants with offset 8.
    Q4_0,
    /// 32 values: f16 scale and minimum, 4-bit quants.
    Q4_1,
    /// 32 values: f16 scale, 5-bit quants with offset 16.
    Q5_0,
    /// 32 values: f16 scale and minimum, 5-bit quants.
    Q5_1,
    /// 32 values: f16 scale, 8-bit signed quants.
    Q8_0,
    /// 32 values: f16 scale and sum, 8-bit quants (an intermediate of dot products).
    Q8_1,
    /// 256 values: 2-bit quants, 4-bit sub-block scales and minima.
    Q2_K,
    /// 256 values: 3-bit quants, 6-bit sub-block scales.
    Q3_K,
    /// 256 values: 4-bit quants, 6-bit sub-block scales and minima.
    Q4_K,
    /// 256 values: 5-bit quants, 6-bit sub-block scales and minima.
    Q5_K,
    /// 256 values: 6-bit quants, 8-bit sub-block scales.
    Q6_K,
    /// 256 values: f32 scale, 8-bit quants, sums of 16.
    Q8_K,
    /// Importance-matrix 2-bit format (grid lookups).
    IQ2_XXS,
    /// Importance-matrix 2-bit format (grid lookups).
    IQ2_XS,
    /// Importance-matrix 3-bit format (grid lookups).
    IQ3_XXS,
    /// Importance-matrix 1-bit format (grid lookups).
    IQ1_S,
    /// 32 values: non-linear 4-bit codebook.
    IQ4_NL,
    /// Importance-matrix 3-bit format (grid lookups).
    IQ3_S,
    /// Importance-matrix 2-bit format (grid lookups).
    IQ2_S,
    /// 256 values: non-linear 4-bit codebook.
    IQ4_XS,
    /// 8-bit signed integer.
    I8,
    /// 16-bit signed integer.
    I16,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// IEEE double precision.
    F64,
    /// Importance-matrix 1-bit format (grid lookups).
    IQ1_M,
    /// bfloat16: the upper half of an f32.
    BF16,
    /// Ternary format, base-3 packed.
    TQ1_0,
    /// Ternary format, 2 bits a value.
    TQ2_0,
    /// 32 values: e8m0 shared exponent, e2m1 values (OCP microscaling).
    MXFP4,
    /// 64 values: e4m3 sub-block scales, e2m1 values.
    NVFP4,
    /// 128 values: f16 scale, 1-bit quants.
    Q1_0,
}

/// `(type, id, name, values per block, bytes per block)` for every known type.
const TABLE: [(GgmlType, u32, &str, usize, usize); 34] = {
    use GgmlType::*;
    [
        (F32, 0, "F32", 1, 4),
        (F16, 1, "F16", 1, 2),
        (Q4_0, 2, "Q4_0", 32, 18),
        (Q4_1, 3, "Q4_1", 32, 20),
        (Q5_0, 6, "Q5_0", 32, 22),
        (Q5_1, 7, "Q5_1", 32, 24),
        (Q8_0, 8, "Q8_0", 32, 34),
        (Q8_1, 9, "Q8_1", 32, 40),
        (Q2_K, 10, "Q2_K", 256, 84),
        (Q3_K, 11, "Q3_K", 256, 110),
        (Q4_K, 12, "Q4_K", 256, 144),
        (Q5_K, 13, "Q5_K", 256, 176),
        (Q6_K, 14, "Q6_K", 256, 210),
        (Q8_K, 15, "Q8_K", 256, 292),
        (IQ2_XXS, 16, "IQ2_XXS", 256, 66),
        (IQ2_XS, 17, "IQ2_XS", 256, 74),
        (IQ3_XXS, 18, "IQ3_XXS", 256, 98),
        (IQ1_S, 19, "IQ1_S", 256, 50),
        (IQ4_NL, 20, "IQ4_NL", 32, 18),
        (IQ3_S, 21, "IQ3_S", 256, 110),
        (IQ2_S, 22, "IQ2_S", 256, 82),
        (IQ4_XS, 23, "IQ4_XS", 256, 136),
        (I8, 24, "I8", 1, 1),
        (I16, 25, "I16", 1, 2),
        (I32, 26, "I32", 1, 4),
        (I64, 27, "I64", 1, 8),
        (F64, 28, "F64", 1, 8),
        (IQ1_M, 29, "IQ1_M", 256, 56),
        (BF16, 30, "BF16", 1, 2),
        (TQ1_0, 34, "TQ1_0", 256, 54),
        (TQ2_0, 35, "TQ2_0", 256, 66),
        (MXFP4, 39, "MXFP4", 32, 17),
        (NVFP4, 40, "NVFP4", 64, 36),
        (Q1_0, 41, "Q1_0", 128, 18),
    ]
};

impl GgmlType {
    fn row(self) -> (GgmlType, u32, &'static str, usize, usize) {
        // Every variant has exactly one row; the fallback only satisfies the type checker.
        TABLE
            .iter()
            .copied()
            .find(|r| r.0 == self)
            .unwrap_or((self, u32::MAX, "?", 1, 1))
    }

    /// The type with ggml id `id`, or `None` for an id ggml does not assign (or no longer does:
    /// 4 and 5 were Q4_2 and Q4_3, 31 to 33 and 36 to 38 repacked variants, all removed).
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|r| r.1 == id).map(|r| r.0)
    }

    /// ggml's id of the type, as stored in a GGUF tensor table.
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// ggml's name of the type ("Q4_K").
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Values per block (1 for the plain formats).
    pub fn block_size(self) -> usize {
        self.row().3
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.row().4
    }

    /// Whether [`dequantize`] decodes this type.
    pub fn can_dequantize(self) -> bool {
        use GgmlType::*;
        matches!(
            self,
            F32 | F16
                | BF16
                | F64
                | I8
                | I16
                | I32
                | I64
                | Q4_0
                | Q4_1
                | Q5_0
                | Q5_1
                | Q8_0
                | Q2_K
                | Q3_K
                | Q4_K
                | Q5_K
                | Q6_K
                | Q8_K
        )
    }

    /// Bytes that `n` values take, or `None` when `n` is not a whole number of blocks or the
    /// size overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let block = self.block_size() as u64;
        if !n.is_multiple_of(block) {
            return None;
        }
        (n / block).checked_mul(self.type_size() as u64)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Decodes `n` values of type `ty` from `bytes` (exactly [`GgmlType::bytes_for`]`(n)` bytes).
///
/// An `n` that is not a whole number of blocks, a byte count that does not match it, or a type
/// without a decoder ([`GgmlType::can_dequantize`]) is an [`Error::Invalid`].
pub fn dequantize(ty: GgmlType, bytes: &[u8], n: usize) -> Result<Vec<f32>> {
    check(ty, bytes, n)?;
    let mut out = vec![0.0f32; n];
    decode(ty, bytes, &mut out);
    Ok(out)
}

/// Decodes `out.len()` values of type `ty` from `bytes` into `out`, without allocating: for
/// decoding a large tensor a row or a slice of rows at a time. The same checks as
/// [`dequantize`].
pub fn dequantize_into(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    check(ty, bytes, out.len())?;
    decode(ty, bytes, out);
    Ok(())
}

fn check(ty: GgmlType, bytes: &[u8], n: usize) -> Result<()> {
    const OP: &str = "gguf::dequantize";
    if !ty.can_dequantize() {
        return Err(Error::invalid(OP, format!("no decoder for {ty}")));
    }
    let Some(need) = ty.bytes_for(n as u64) else {
        return Err(Error::invalid(
            OP,
            format!(
                "{n} values are not a whole number of {ty} blocks of {}",
                ty.block_size()
            ),
        ));
    };
    if bytes.len() as u64 != need {
        return Err(Error::invalid(
            OP,
            format!(
                "{n} values of {ty} take {need} bytes, given {}",
                bytes.len()
            ),
        ));
    }
    Ok(())
}

/// Runs `f` on each block of `B` bytes and its `N` outputs. The callers have checked that the
/// lengths agree, so the remainders are empty.
fn blocks<const B: usize, const N: usize>(
    bytes: &[u8],
    out: &mut [f32],
    f: impl Fn(&[u8; B], &mut [f32; N]),
) {
    let (bs, _) = bytes.as_chunks::<B>();
    let (ys, _) = out.as_chunks_mut::<N>();
    for (b, y) in bs.iter().zip(ys) {
        f(b, y);
    }
}

fn decode(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    use GgmlType::*;
    match ty {
        F32 => blocks::<4, 1>(bytes, out, |b, y| y[0] = f32::from_le_bytes(*b)),
        F16 => blocks::<2, 1>(bytes, out, |b, y| y[0] = f16::from_le_bytes(*b).to_f32()),
        // bf16 is the upper half of an f32: widening is exact (NaN payloads included).
        BF16 => blocks::<2, 1>(bytes, out, |b, y| {
            y[0] = f32::from_bits((u16::from_le_bytes(*b) as u32) << 16)
        }),
        F64 => blocks::<8, 1>(bytes, out, |b, y| y[0] = f64::from_le_bytes(*b) as f32),
        I8 => blocks::<1, 1>(bytes, out, |b, y| y[0] = b[0] as i8 as f32),
        I16 => blocks::<2, 1>(bytes, out, |b, y| y[0] = i16::from_le_bytes(*b) as f32),
        I32 => blocks::<4, 1>(bytes, out, |b, y| y[0] = i32::from_le_bytes(*b) as f32),
        I64 => blocks::<8, 1>(bytes, out, |b, y| y[0] = i64::from_le_bytes(*b) as f32),
        Q4_0 => blocks(bytes, out, q4_0),
        Q4_1 => blocks(bytes, out, q4_1),
        Q5_0 => blocks(bytes, out, q5_0),
        Q5_1 => blocks(bytes, out, q5_1),
        Q8_0 => blocks(bytes, out, q8_0),
        Q2_K => blocks(bytes, out, q2_k),
        Q3_K => blocks(bytes, out, q3_k),
        Q4_K => blocks(bytes, out, q4_k),
        Q5_K => blocks(bytes, out, q5_k),
        Q6_K => blocks(bytes, out, q6_k),
        Q8_K => blocks(bytes, out, q8_k),
        // check() refused the rest.
        _ => {}
    }
}

fn h(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Q4_0, 18 bytes: `d: f16 | qs: [u8; 16]`. Value `j` (j < 16) is the low nibble of `qs[j]`,
/// value `j + 16` its high nibble; `x = d * (q - 8)`.
fn q4_0(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = h(b, 0);
    for j in 0..16 {
        let q = b[2 + j];
        y[j] = d * ((q & 0xF) as i32 - 8) as f32;
        y[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
    }
}

/// Q4_1, 20 bytes: `d: f16 | m: f16 | qs: [u8; 16]`, nibbles as Q4_0; `x = d * q + m`.
fn q4_1(b: &[u8; 20], y: &mut [f32; 32]) {
    let (d, m) = (h(b, 0), h(b, 2));
    for j in 0..16 {
        let q = b[4 + j];
        y[j] = d * (q & 0xF) as f32 + m;
        y[j + 16] = d * (q >> 4) as f32 + m;
    }
}

/// The fifth bits of Q5_0 and Q5_1: bit `i` of the little-endian u32 `qh` is the high bit of
/// value `i`.
fn q5(qs: &[u8], qh: u32, j: usize) -> (u8, u8) {
    let q = qs[j];
    let lo = (q & 0xF) | ((((qh >> j) & 1) as u8) << 4);
    let hi = (q >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    (lo, hi)
}

/// Q5_0, 22 bytes: `d: f16 | qh: u32 | qs: [u8; 16]`. Low four bits as Q4_0's nibbles, the
/// fifth bit of value `i` is bit `i` of `qh`; `x = d * (q - 16)`.
fn q5_0(b: &[u8; 22], y: &mut [f32; 32]) {
    let d = h(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for j in 0..16 {
        let (lo, hi) = q5(&b[6..], qh, j);
        y[j] = d * (lo as i32 - 16) as f32;
        y[j + 16] = d * (hi as i32 - 16) as f32;
    }
}

/// Q5_1, 24 bytes: `d: f16 | m: f16 | qh: u32 | qs: [u8; 16]`, quants as Q5_0 without the
/// offset; `x = d * q + m`.
fn q5_1(b: &[u8; 24], y: &mut [f32; 32]) {
    let (d, m) = (h(b, 0), h(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for j in 0..16 {
        let (lo, hi) = q5(&b[8..], qh, j);
        y[j] = d * lo as f32 + m;
        y[j + 16] = d * hi as f32 + m;
    }
}

/// Q8_0, 34 bytes: `d: f16 | qs: [i8; 32]`; `x = q * d`.
fn q8_0(b: &[u8; 34], y: &mut [f32; 32]) {
    let d = h(b, 0);
    for j in 0..32 {
        y[j] = (b[2 + j] as i8) as f32 * d;
    }
}

/// Q2_K, 84 bytes: `scales: [u8; 16] | qs: [u8; 64] | d: f16 | dmin: f16`.
///
/// Value `i = 128 h + 32 s + l` (h < 2, s < 4, l < 32) is bits `2s..2s+2` of `qs[32 h + l]`; it
/// belongs to sub-block `i / 16`, whose scale byte holds a 4-bit scale (low nibble) and a 4-bit
/// minimum (high nibble); `x = (d * scale) * q - dmin * min`.
fn q2_k(b: &[u8; 84], y: &mut [f32; 256]) {
    let (d, dmin) = (h(b, 80), h(b, 82));
    for (i, v) in y.iter_mut().enumerate() {
        let (hh, s, l) = (i / 128, (i % 128) / 32, i % 32);
        let q = (b[16 + 32 * hh + l] >> (2 * s)) & 3;
        let sc = b[i / 16];
        let dl = d * (sc & 0xF) as f32;
        let ml = dmin * (sc >> 4) as f32;
        *v = dl * q as f32 - ml;
    }
}

/// Q3_K, 110 bytes: `hmask: [u8; 32] | qs: [u8; 64] | scales: [u8; 12] | d: f16`.
///
/// Value `i = 128 h + 32 s + l` has low bits `2s..2s+2` of `qs[32 h + l]` and high bit
/// `i / 32` of `hmask[l]`; a clear high bit subtracts 4, so `q` is in `-4..4`. The sixteen 6-bit
/// scales are packed as: scale `k` has low nibble from `scales[k % 8]` (low nibble for k < 8,
/// high for k >= 8) and high two bits `2 (k / 4)..` of `scales[8 + k % 4]`, stored with offset
/// 32. Sub-block `i / 16`; `x = (d * (scale - 32)) * q`.
fn q3_k(b: &[u8; 110], y: &mut [f32; 256]) {
    let d = h(b, 108);
    let sc = &b[96..108];
    let mut scale = [0f32; 16];
    for (k, s) in scale.iter_mut().enumerate() {
        let lo = (sc[k % 8] >> (4 * (k / 8))) & 0xF;
        let hi = (sc[8 + k % 4] >> (2 * (k / 4))) & 3;
        *s = d * ((lo | (hi << 4)) as i32 - 32) as f32;
    }
    for (i, v) in y.iter_mut().enumerate() {
        let (hh, s, l) = (i / 128, (i % 128) / 32, i % 32);
        let lo = ((b[32 + 32 * hh + l] >> (2 * s)) & 3) as i32;
        let high = (b[l] >> (i / 32)) & 1;
        let q = if high == 0 { lo - 4 } else { lo };
        *v = scale[i / 16] * q as f32;
    }
}

/// The eight 6-bit scales and minima of Q4_K and Q5_K, packed in 12 bytes: for `j < 4`, scale
/// `j` is the low six bits of byte `j` and minimum `j` those of byte `j + 4`; for `j >= 4`, the
/// low four bits come from the low (scale) and high (minimum) nibble of byte `j + 4`, and the
/// top two bits from bits 6-7 of byte `j - 4` (scale) and `j` (minimum).
fn scale_min_k4(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q4_K, 144 bytes: `d: f16 | dmin: f16 | scales: [u8; 12] | qs: [u8; 128]`.
///
/// Value `i = 64 c + 32 s + l` (c < 4, s < 2, l < 32) is nibble `s` of `qs[32 c + l]`, in
/// sub-block `j = i / 32` with the scale and minimum of [`scale_min_k4`];
/// `x = (d * scale) * q - dmin * min`.
fn q4_k(b: &[u8; 144], y: &mut [f32; 256]) {
    let (d, dmin) = (h(b, 0), h(b, 2));
    for (j, sub) in y.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min_k4(&b[4..16], j);
        let (dl, ml) = (d * sc as f32, dmin * m as f32);
        let (c, s) = (j / 2, j % 2);
        for (l, v) in sub.iter_mut().enumerate() {
            let q = (b[16 + 32 * c + l] >> (4 * s)) & 0xF;
            *v = dl * q as f32 - ml;
        }
    }
}

/// Q5_K, 176 bytes: `d: f16 | dmin: f16 | scales: [u8; 12] | qh: [u8; 32] | qs: [u8; 128]`.
///
/// Low four bits as Q4_K's quants; the fifth bit of value `i` is bit `i / 32` of `qh[i % 32]`;
/// `x = (d * scale) * q - dmin * min`.
fn q5_k(b: &[u8; 176], y: &mut [f32; 256]) {
    let (d, dmin) = (h(b, 0), h(b, 2));
    for (j, sub) in y.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min_k4(&b[4..16], j);
        let (dl, ml) = (d * sc as f32, dmin * m as f32);
        let (c, s) = (j / 2, j % 2);
        for (l, v) in sub.iter_mut().enumerate() {
            let lo = (b[48 + 32 * c + l] >> (4 * s)) & 0xF;
            let hi = (b[16 + l] >> j) & 1;
            *v = dl * (lo | (hi << 4)) as f32 - ml;
        }
    }
}

/// Q6_K, 210 bytes: `ql: [u8; 128] | qh: [u8; 64] | scales: [i8; 16] | d: f16`.
///
/// Value `i = 128 h + 64 s + l` (h < 2, s < 2, l < 64) has low nibble `s` of `ql[64 h + l]`;
/// writing `i = 128 h + 32 t + m` (t < 4, m < 32), its high two bits are bits `2t..2t+2` of
/// `qh[32 h + m]`. Stored with offset 32, sub-block `i / 16`; `x = (d * scale) * (q - 32)`.
fn q6_k(b: &[u8; 210], y: &mut [f32; 256]) {
    let d = h(b, 208);
    for (i, v) in y.iter_mut().enumerate() {
        let hh = i / 128;
        let r = i % 128;
        let lo = (b[64 * hh + r % 64] >> (4 * (r / 64))) & 0xF;
        let hi = (b[128 + 32 * hh + r % 32] >> (2 * (r / 32))) & 3;
        let q = (lo | (hi << 4)) as i32 - 32;
        let scale = d * (b[192 + i / 16] as i8) as f32;
        *v = scale * q as f32;
    }
}

/// Q8_K, 292 bytes: `d: f32 | qs: [i8; 256] | bsums: [i16; 16]` (the sums of each 16 quants,
/// for dot products; not needed to decode); `x = d * q`.
fn q8_k(b: &[u8; 292], y: &mut [f32; 256]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (i, v) in y.iter_mut().enumerate() {
        *v = d * (b[4 + i] as i8) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gguf_table_is_consistent() {
        for (ty, id, name, block, size) in TABLE {
            assert_eq!(GgmlType::from_id(id), Some(ty));
            assert_eq!(
                (ty.id(), ty.name(), ty.block_size(), ty.type_size()),
                (id, name, block, size)
            );
        }
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 42, u32::MAX] {
            assert_eq!(GgmlType::from_id(id), None);
        }
    }

    #[test]
    fn gguf_q4_0_by_hand() {
        // d = 0.5; quant byte 0x1F: value 0 is 15 - 8 = 7, value 16 is 1 - 8 = -7.
        let mut b = vec![0u8; 18];
        b[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        b[2] = 0x1F;
        let y = dequantize(GgmlType::Q4_0, &b, 32).unwrap();
        assert_eq!(y[0], 3.5);
        assert_eq!(y[16], -3.5);
        assert_eq!(y[1], -4.0); // a zero nibble is -8
    }

    #[test]
    fn gguf_q5_0_high_bits() {
        // qh bit 0 and bit 16 set: values 0 and 16 gain 16 and read as q = 0.
        let mut b = vec![0u8; 22];
        b[..2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
        b[2..6].copy_from_slice(&(1u32 | 1 << 16).to_le_bytes());
        let y = dequantize(GgmlType::Q5_0, &b, 32).unwrap();
        assert_eq!((y[0], y[16], y[1]), (0.0, 0.0, -16.0));
    }

    #[test]
    fn gguf_sizes_are_checked() {
        assert!(dequantize(GgmlType::Q4_K, &[0; 144], 255).is_err());
        assert!(dequantize(GgmlType::Q4_K, &[0; 143], 256).is_err());
        assert!(dequantize(GgmlType::IQ2_XXS, &[0; 66], 256).is_err());
        let mut out = [1f32; 256];
        dequantize_into(GgmlType::Q4_K, &[0; 144], &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 0.0));
        assert_eq!(GgmlType::Q6_K.bytes_for(512), Some(420));
        assert_eq!(GgmlType::Q6_K.bytes_for(100), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
    }
}
