//! Multi-head self-attention on the fused attention kernel, and a pre-norm transformer block.

use super::layers::{Activation, Dropout};
use super::linear::Linear;
use super::module::{Module, prefixed};
use super::norm::LayerNorm;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::AttentionOpts;
use crate::tensor::Tensor;

/// Self-attention over [batch, seq, dim]: one fused QKV projection, the flash-style attention
/// kernel (scores never stored), an output projection.
pub struct MultiHeadAttention {
    /// [3 dim, dim] QKV projection.
    pub qkv: Linear,
    /// [dim, dim] output projection.
    pub out: Linear,
    /// Number of heads (dim must divide evenly).
    pub heads: usize,
    /// Mask future positions.
    pub causal: bool,
    /// Dropout on the attention weights while training (inside the fused kernel; nanoGPT's
    /// `attn_dropout`). 0 unless set with [`MultiHeadAttention::with_dropout`].
    pub attn_drop: Dropout,
}

impl MultiHeadAttention {
    /// `heads` heads over `dim` features.
    pub fn new(
        dev: &Device,
        dim: usize,
        heads: usize,
        causal: bool,
        dtype: DType,
    ) -> Result<MultiHeadAttention> {
        if heads == 0 || !dim.is_multiple_of(heads) {
            return Err(Error::invalid(
                "MultiHeadAttention",
                format!("{dim} features do not split into {heads} heads"),
            ));
        }
        Ok(MultiHeadAttention {
            qkv: Linear::new(dev, dim, 3 * dim, true, dtype)?,
            out: Linear::new(dev, dim, dim, true, dtype)?,
            heads,
            causal,
            attn_drop: Dropout::new(0.0),
        })
    }

    /// Drops attention weights with probability `p` while training.
    pub fn with_dropout(mut self, p: f32) -> Result<MultiHeadAttention> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::invalid(
                "MultiHeadAttention",
                format!("dropout probability {p} is not in [0, 1)"),
            ));
        }
        self.attn_drop = Dropout::new(p);
        Ok(self)
    }
}

impl Module for MultiHeadAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() != 3 {
            return Err(Error::shape(
                "MultiHeadAttention",
                format!("input {:?} must be [batch, seq, dim]", x.shape()),
            ));
        }
        // One fused QKV projection; the attention kernels read its heads in place, write the
        // output with the heads merged, and the backward pass writes the three gradients
        // into one tensor shaped as the projection.
        let opts = AttentionOpts {
            causal: self.causal,
            dropout: if self.attn_drop.training() {
                self.attn_drop.p
            } else {
                0.0
            },
            ..Default::default()
        };
        let o = Tensor::attention_qkv(&self.qkv.forward(x)?, self.heads, opts)?;
        self.out.forward(&o)
    }

    fn params(&self) -> Vec<(String, Tensor)> {
        let mut v = prefixed("qkv", self.qkv.params());
        v.extend(prefixed("out", self.out.params()));
        v
    }

    fn train(&self, on: bool) {
        self.attn_drop.train(on);
    }
}

/// Pre-norm transformer block: `x + attn(ln1(x))`, then `x + mlp(ln2(x))` with a 4x GELU MLP.
///
/// ```
/// use wgrad::nn::{Module, TransformerBlock};
/// use wgrad::{DType, Tensor};
/// # fn main() -> wgrad::Result<()> {
/// let dev = wgrad::Device::new()?;
/// // Width 16, 2 heads, causal, no dropout.
/// let block = TransformerBlock::new(&dev, 16, 2, true, 0.0, DType::F32)?;
/// let x = dev.randn(&[2, 5, 16], DType::F32)?; // [batch, seq, dim]
/// let y = block.forward(&x)?;
/// assert_eq!(y.shape(), [2, 5, 16]);
///
/// // Causal: changing the last position leaves the first one's output alone.
/// let x2 = Tensor::cat(&[&x.narrow(1, 0, 4)?, &dev.randn(&[2, 1, 16], DType::F32)?], 1)?;
/// let first = |t: &Tensor| t.narrow(1, 0, 1)?.to_vec::<f32>();
/// let (a, b) = (first(&y)?, first(&block.forward(&x2)?)?);
/// assert!(a.iter().zip(&b).all(|(p, q)| (p - q).abs() < 1e-5));
/// # Ok(())
/// # }
/// ```
pub struct TransformerBlock {
    /// First norm.
    pub ln1: LayerNorm,
    /// Attention.
    pub attn: MultiHeadAttention,
    /// Second norm.
    pub ln2: LayerNorm,
    /// MLP expansion.
    pub fc1: Linear,
    /// MLP projection.
    pub fc2: Linear,
    /// Dropout on both residual branches (the attention weights get the same probability).
    pub drop: Dropout,
}

impl TransformerBlock {
    /// A block of width `dim` with `heads` heads.
    pub fn new(
        dev: &Device,
        dim: usize,
        heads: usize,
        causal: bool,
        dropout: f32,
        dtype: DType,
    ) -> Result<TransformerBlock> {
        Ok(TransformerBlock {
            ln1: LayerNorm::new(dev, dim, dtype)?,
            attn: MultiHeadAttention::new(dev, dim, heads, causal, dtype)?.with_dropout(dropout)?,
            ln2: LayerNorm::new(dev, dim, dtype)?,
            fc1: Linear::new(dev, dim, 4 * dim, true, dtype)?,
            fc2: Linear::new(dev, 4 * dim, dim, true, dtype)?,
            drop: Dropout::new(dropout),
        })
    }
}

impl Module for TransformerBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // Each residual add takes its branch's dropout in the same pass (`add_dropout`).
        let p = if self.drop.training() {
            self.drop.p
        } else {
            0.0
        };
        let x = x.add_dropout(&self.attn.forward(&self.ln1.forward(x)?)?, p)?;
        let m = self
            .fc2
            .forward(&Activation::Gelu.forward(&self.fc1.forward(&self.ln2.forward(&x)?)?)?)?;
        x.add_dropout(&m, p)
    }

    fn params(&self) -> Vec<(String, Tensor)> {
        let mut v = prefixed("ln1", self.ln1.params());
        v.extend(prefixed("attn", self.attn.params()));
        v.extend(prefixed("ln2", self.ln2.params()));
        v.extend(prefixed("fc1", self.fc1.params()));
        v.extend(prefixed("fc2", self.fc2.params()));
        v
    }

    fn train(&self, on: bool) {
        self.drop.train(on);
        self.attn.train(on);
    }
}
