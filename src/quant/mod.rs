//! Matrices kept on the device in a quantized block format, as published models ship them.
//!
//! A [`QuantMatrix`] holds a [rows, cols] weight in one of ggml's block formats
//! ([`QuantFormat`]: Q4_0, Q4_1, Q8_0), each block of 32 consecutive values of a row stored as
//! a scale (and a minimum) and 4- or 8-bit integers. It is never expanded for inference: a
//! product with a few rows of activations (a decode step) decodes the blocks in registers and
//! reads each weight byte once; a product with many rows (a prompt's prefill) decodes the
//! matrix into a temporary buffer in the activations' dtype and runs the tiled product, which
//! for many rows costs less than decoding in every tile. The device holds the file's bytes,
//! regrouped so that every load is an aligned word: the quants of all blocks, then one word of
//! scales a block (Q4_1: 20 bytes a block, as in the file; Q4_0 and Q8_0 carry two more).
//!
//! ```
//! use wgrad::quant::{QuantFormat, QuantMatrix};
//! use wgrad::Device;
//!
//! # fn main() -> wgrad::Result<()> {
//! let dev = Device::new()?;
//! let values: Vec<f32> = (0..4 * 64).map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0).collect();
//! let w = QuantMatrix::quantize(&dev, QuantFormat::Q8_0, &values, 4, 64)?;
//! let x = dev.tensor(&vec![1.0f32; 64], &[1, 64])?;
//! let y = w.forward(&x)?.to_vec::<f32>()?; // x W^T: [1, 4]
//! let exact: f32 = values[..64].iter().sum();
//! assert!((y[0] - exact).abs() < 0.1);
//! # Ok(())
//! # }
//! ```

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::gguf::GgmlType;
use crate::kernels::quant::{self as kq, Fmt, QuantArgs};
use crate::tensor::Tensor;
use crate::tensor::graph::{no_grad, record_fn, recording};
use half::f16;

/// Values a block holds.
pub const BLOCK: usize = 32;

/// A block format a [`QuantMatrix`] keeps on the device (ggml's names and layouts).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// f16 scale d, 4-bit q: value d (q - 8). 18 bytes a block in a file.
    Q4_0,
    /// f16 scale d and minimum m, 4-bit q: value d q + m. 20 bytes a block.
    Q4_1,
    /// f16 scale d, 8-bit signed q: value d q. 34 bytes a block.
    Q8_0,
}

impl QuantFormat {
    /// The format of a GGUF tensor type, where a `QuantMatrix` can keep it.
    pub fn from_ggml(t: GgmlType) -> Option<QuantFormat> {
        match t {
            GgmlType::Q4_0 => Some(QuantFormat::Q4_0),
            GgmlType::Q4_1 => Some(QuantFormat::Q4_1),
            GgmlType::Q8_0 => Some(QuantFormat::Q8_0),
            _ => None,
        }
    }

    /// The GGUF tensor type.
    pub fn ggml_type(self) -> GgmlType {
        match self {
            QuantFormat::Q4_0 => GgmlType::Q4_0,
            QuantFormat::Q4_1 => GgmlType::Q4_1,
            QuantFormat::Q8_0 => GgmlType::Q8_0,
        }
    }

    /// Bytes a block takes in a GGUF file.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantFormat::Q4_0 => 18,
            QuantFormat::Q4_1 => 20,
            QuantFormat::Q8_0 => 34,
        }
    }

    fn fmt(self) -> Fmt {
        match self {
            QuantFormat::Q4_0 => Fmt::Q4_0,
            QuantFormat::Q4_1 => Fmt::Q4_1,
            QuantFormat::Q8_0 => Fmt::Q8_0,
        }
    }
}

/// Blocks in GGUF's layout of `values` (a multiple of 32 of them), by ggml's reference
/// rounding: Q8_0 scales a block's largest magnitude to 127; Q4_0 maps the value of largest
/// magnitude to -8; Q4_1 spans the block's minimum to maximum in 15 steps.
pub fn quantize_blocks(format: QuantFormat, values: &[f32]) -> Result<Vec<u8>> {
    if !values.len().is_multiple_of(BLOCK) {
        return Err(Error::shape(
            "quantize",
            format!(
                "{} values is not a whole number of 32-value blocks",
                values.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(values.len() / BLOCK * format.block_bytes());
    for b in values.chunks_exact(BLOCK) {
        match format {
            QuantFormat::Q8_0 => {
                let amax = b.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                out.extend(b.iter().map(|v| (v * id).round() as i8 as u8));
            }
            QuantFormat::Q4_0 => {
                let max = b
                    .iter()
                    .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                let q = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
                out.extend((0..16).map(|j| q(b[j]) | (q(b[j + 16]) << 4)));
            }
            QuantFormat::Q4_1 => {
                let min = b.iter().fold(f32::INFINITY, |m, &v| m.min(v));
                let max = b.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
                let q = |v: f32| (((v - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                out.extend((0..16).map(|j| q(b[j]) | (q(b[j + 16]) << 4)));
            }
        }
    }
    Ok(out)
}

/// What [`QuantMatrix::forward_with`] computes around the product `x W^T`: an RMSNorm of x
/// before it, a gated unit after it, a residual added.
#[derive(Clone, Copy, Default)]
pub struct Fusion<'a> {
    /// `x` replaced by `rms_norm(x, gain, eps)` (the gain has `cols` elements).
    pub norm: Option<(&'a Tensor, f32)>,
    /// The matrix's rows are a gate's then an up projection's, and the result is
    /// `silu(x W_gate^T) * (x W_up^T)` (SwiGLU), of half the rows.
    pub glu: bool,
    /// Added to the result (of the result's shape and dtype).
    pub residual: Option<&'a Tensor>,
}

/// A [rows, cols] matrix on the device in a quantized block format (see the module docs).
/// Cloning is cheap (the storage is shared).
#[derive(Clone)]
pub struct QuantMatrix {
    format: QuantFormat,
    rows: usize,
    cols: usize,
    /// The quants, u32 words.
    qs: Tensor,
    /// One word a block: the f16 scale in the low half, the minimum (Q4_1) in the high one.
    sc: Tensor,
}

impl QuantMatrix {
    /// A matrix from blocks in GGUF's layout (`rows * cols / 32` blocks, rows in order, as
    /// [`GgufFile::tensor_bytes`](crate::gguf::GgufFile::tensor_bytes) gives them).
    pub fn from_blocks(
        dev: &Device,
        format: QuantFormat,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<QuantMatrix> {
        let op = "QuantMatrix::from_blocks";
        if !cols.is_multiple_of(BLOCK) || rows == 0 {
            return Err(Error::shape(
                op,
                format!("[{rows}, {cols}]: want rows > 0 and columns a multiple of 32"),
            ));
        }
        let blocks = rows
            .checked_mul(cols / BLOCK)
            .ok_or_else(|| Error::shape(op, format!("[{rows}, {cols}] is too large")))?;
        let want = blocks.checked_mul(format.block_bytes());
        if want != Some(bytes.len()) {
            return Err(Error::shape(
                op,
                format!(
                    "{} bytes for [{rows}, {cols}] in {format:?}, which takes {} blocks of {}",
                    bytes.len(),
                    blocks,
                    format.block_bytes()
                ),
            ));
        }
        let wpb = format.fmt().words_per_block();
        let mut qs = Vec::with_capacity(blocks * wpb);
        let mut sc = Vec::with_capacity(blocks);
        let word =
            |b: &[u8], at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        for b in bytes.chunks_exact(format.block_bytes()) {
            let d = u16::from_le_bytes([b[0], b[1]]) as u32;
            let (m, quants) = match format {
                QuantFormat::Q4_1 => (u16::from_le_bytes([b[2], b[3]]) as u32, &b[4..]),
                QuantFormat::Q4_0 | QuantFormat::Q8_0 => (0, &b[2..]),
            };
            sc.push(d | (m << 16));
            qs.extend((0..wpb).map(|w| word(quants, 4 * w)));
        }
        Ok(QuantMatrix {
            format,
            rows,
            cols,
            qs: Tensor::from_slice(dev, &qs, &[qs.len()])?,
            sc: Tensor::from_slice(dev, &sc, &[sc.len()])?,
        })
    }

    /// `values` ([rows, cols], row-major) quantized on the host ([`quantize_blocks`]).
    pub fn quantize(
        dev: &Device,
        format: QuantFormat,
        values: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<QuantMatrix> {
        if rows.checked_mul(cols) != Some(values.len()) {
            return Err(Error::shape(
                "QuantMatrix::quantize",
                format!("{} values for [{rows}, {cols}]", values.len()),
            ));
        }
        let bytes = quantize_blocks(format, values)?;
        QuantMatrix::from_blocks(dev, format, &bytes, rows, cols)
    }

    /// The block format.
    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// [rows, cols].
    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }

    /// Bytes on the device.
    pub fn nbytes(&self) -> u64 {
        self.qs.nbytes() + self.sc.nbytes()
    }

    /// The device it is on.
    pub fn device(&self) -> &Device {
        self.qs.device()
    }

    fn args(&self) -> Result<QuantArgs<'_>> {
        let op = "quantized matrix";
        Ok(QuantArgs {
            qs: self.qs.dense_block(op)?,
            sc: self.sc.dense_block(op)?,
            fmt: self.format.fmt(),
            rows: self.rows,
            cols: self.cols,
        })
    }

    /// The matrix decoded, [rows, cols] in `dtype`.
    pub fn dequantize(&self, dtype: DType) -> Result<Tensor> {
        if !dtype.is_float() {
            return Err(Error::invalid(
                "QuantMatrix::dequantize",
                format!("decodes to a float dtype, not {dtype}"),
            ));
        }
        let y = Tensor::uninit(self.device(), &[self.rows, self.cols], dtype)?;
        kq::dequant(
            self.device(),
            self.args()?,
            y.dense_block("dequantize")?,
            dtype,
        )?;
        Ok(y)
    }

    /// `x W^T` for `x` [..., cols] (f32, f16 or bf16): [..., rows] in x's dtype. Gradients
    /// flow to `x` (the matrix is constant).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with(x, Fusion::default())
    }

    /// `res + x W^T`, with `res` of the result's shape and dtype.
    pub fn forward_add(&self, x: &Tensor, res: &Tensor) -> Result<Tensor> {
        self.forward_with(
            x,
            Fusion {
                residual: Some(res),
                ..Fusion::default()
            },
        )
    }

    /// The product with what [`Fusion`] asks for around it: one kernel where the product runs
    /// as a matrix-vector one (at most 8 rows of x, no gradients recorded), else the same
    /// arithmetic composed of [`Tensor::rms_norm`], the product, [`Tensor::silu`] and adds.
    ///
    /// ```
    /// use wgrad::quant::{Fusion, QuantFormat, QuantMatrix};
    /// use wgrad::Device;
    ///
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = Device::new()?;
    /// // A SwiGLU projection of width 32 to 2 outputs: gate rows, then up rows.
    /// let w: Vec<f32> = (0..4 * 32).map(|i| (i % 5) as f32 / 4.0).collect();
    /// let gate_up = QuantMatrix::quantize(&dev, QuantFormat::Q8_0, &w, 4, 32)?;
    /// let x = dev.tensor(&vec![0.5f32; 32], &[1, 32])?;
    /// let gain = dev.tensor(&vec![1.0f32; 32], &[32])?;
    /// let fused = Fusion { norm: Some((&gain, 1e-5)), glu: true, ..Fusion::default() };
    /// let y = gate_up.forward_with(&x, fused)?; // silu(n W_gate^T) * (n W_up^T), n = RMSNorm(x)
    /// assert_eq!(y.shape(), &[1, 2]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn forward_with(&self, x: &Tensor, f: Fusion<'_>) -> Result<Tensor> {
        let op = "quantized linear";
        if !x.dtype().is_float() {
            return Err(Error::invalid(
                op,
                format!("x is {}, not a float", x.dtype()),
            ));
        }
        if x.rank() == 0 || x.shape()[x.rank() - 1] != self.cols {
            return Err(Error::shape(
                op,
                format!(
                    "x {:?} against a [{}, {}] matrix",
                    x.shape(),
                    self.rows,
                    self.cols
                ),
            ));
        }
        crate::ops::elementwise::same_device(op, x, &self.qs)?;
        let out_rows = if f.glu {
            if !self.rows.is_multiple_of(2) {
                return Err(Error::shape(
                    op,
                    format!(
                        "a gated unit needs an even number of rows, not {}",
                        self.rows
                    ),
                ));
            }
            self.rows / 2
        } else {
            self.rows
        };
        let mut shape = x.shape().to_vec();
        let last = shape.len() - 1;
        shape[last] = out_rows;
        if let Some(r) = f.residual {
            crate::ops::elementwise::same_device(op, r, &self.qs)?;
            if r.shape() != shape.as_slice() || r.dtype() != x.dtype() {
                return Err(Error::shape(
                    op,
                    format!(
                        "residual {:?} {} where the product is {shape:?} {}",
                        r.shape(),
                        r.dtype(),
                        x.dtype()
                    ),
                ));
            }
        }
        if let Some((g, _)) = f.norm {
            crate::ops::elementwise::same_device(op, g, &self.qs)?;
            if g.shape() != [self.cols] || g.dtype() != x.dtype() {
                return Err(Error::shape(
                    op,
                    format!(
                        "norm gain {:?} {} for rows of {} {}",
                        g.shape(),
                        g.dtype(),
                        self.cols,
                        x.dtype()
                    ),
                ));
            }
        }
        let m = x.numel() / self.cols;
        let tracked = recording(&[x])
            || f.residual.is_some_and(|r| recording(&[r]))
            || f.norm.is_some_and(|(g, _)| recording(&[g]));
        if m > kq::MATVEC_MAX_BATCH || tracked || m == 0 {
            return self.composed(x, f);
        }
        let xc = x.contiguous()?;
        let rc = f.residual.map(Tensor::contiguous).transpose()?;
        let gc = f.norm.map(|(g, _)| g.contiguous()).transpose()?;
        let y = Tensor::uninit(x.device(), &shape, x.dtype())?;
        let fused = kq::Fused {
            norm: match (&gc, f.norm) {
                (Some(g), Some((_, eps))) => Some((g.dense_block(op)?, eps)),
                _ => None,
            },
            glu: f.glu,
            res: rc.as_ref().map(|r| r.dense_block(op)).transpose()?,
        };
        kq::matvec(
            x.device(),
            self.args()?,
            xc.dense_block(op)?,
            fused,
            y.dense_block(op)?,
            x.dtype(),
            m,
        )?;
        Ok(y)
    }

    /// [`forward_with`](QuantMatrix::forward_with) composed of basic ops on the decoded
    /// matrix: the path for many rows of x (the tiled product beats decoding in every tile)
    /// and for recorded gradients.
    fn composed(&self, x: &Tensor, f: Fusion<'_>) -> Result<Tensor> {
        let h = match f.norm {
            Some((g, eps)) => x.rms_norm(g, eps)?,
            None => x.clone(),
        };
        let mut y = self.product(&h)?;
        if f.glu {
            y = y.swiglu_halves()?;
        }
        match f.residual {
            Some(r) => r.add(&y),
            None => Ok(y),
        }
    }

    /// `h W^T` through the decoded matrix, which is dropped as soon as the product is made:
    /// the recorded node keeps only this (quantized) matrix and decodes it again for the
    /// input gradient, `g W`. A frozen quantized base so holds no dense copy of any matrix
    /// between the forward and the backward pass.
    fn product(&self, h: &Tensor) -> Result<Tensor> {
        let y = no_grad(|| h.linear(&self.dequantize(h.dtype())?, None))?;
        let w = self.clone();
        let node = record_fn("quantized linear", h, move |h, g| {
            let g2 = g.contiguous()?.reshape(&[g.numel() / w.rows, w.rows])?;
            g2.matmul(&w.dequantize(g.dtype())?)?.reshape(h.shape())
        });
        Ok(y.with_node(node))
    }

    /// Rows `indices` (u32, any shape) of the matrix decoded to `dtype`: an embedding
    /// lookup, [indices..., cols]. An index past the rows reads as NaN, or is an error on a
    /// checked device.
    pub fn embedding(&self, indices: &Tensor, dtype: DType) -> Result<Tensor> {
        let op = "quantized embedding";
        if indices.dtype() != DType::U32 {
            return Err(Error::DType {
                op,
                expected: DType::U32,
                got: indices.dtype(),
            });
        }
        if !dtype.is_float() {
            return Err(Error::invalid(
                op,
                format!("decodes to a float dtype, not {dtype}"),
            ));
        }
        if self.device().is_checked() {
            crate::ops::embedding::check_indices(op, indices, self.rows)?;
        }
        let mut shape = indices.shape().to_vec();
        shape.push(self.cols);
        let idx = indices.contiguous()?;
        let y = Tensor::uninit(self.device(), &shape, dtype)?;
        kq::rows(
            self.device(),
            self.args()?,
            idx.dense_block(op)?,
            y.dense_block(op)?,
            dtype,
            indices.numel(),
        )?;
        Ok(y)
    }
}

impl std::fmt::Debug for QuantMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QuantMatrix({:?}, [{}, {}], {} bytes)",
            self.format,
            self.rows,
            self.cols,
            self.nbytes()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_match_the_gguf_decoder() {
        // quantize_blocks' bytes, decoded by the GGUF reader, are within a step of the input.
        let values: Vec<f32> = (0..96)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect();
        for f in [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0] {
            let bytes = quantize_blocks(f, &values).unwrap_or_default();
            assert_eq!(bytes.len(), 3 * f.block_bytes());
            let back = crate::gguf::dequantize(f.ggml_type(), &bytes, 96).unwrap_or_default();
            let step = if f == QuantFormat::Q8_0 {
                3.0 / 127.0
            } else {
                6.0 / 7.0
            };
            for (a, b) in values.iter().zip(&back) {
                assert!((a - b).abs() <= step, "{f:?}: {a} came back as {b}");
            }
        }
    }
}
