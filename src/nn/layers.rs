//! Parameter-free layers and the embedding table.

use super::module::Module;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;
use std::sync::atomic::{AtomicBool, Ordering};

pub use crate::ops::Activation;

impl Module for Activation {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.apply(x)
    }
    fn params(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}

/// Dropout with probability `p` while training; the identity in evaluation.
pub struct Dropout {
    /// Drop probability.
    pub p: f32,
    training: AtomicBool,
}

impl Dropout {
    /// Dropout, starting in training mode.
    pub fn new(p: f32) -> Dropout {
        Dropout {
            p,
            training: AtomicBool::new(true),
        }
    }

    /// Whether it drops (training mode) or passes values through (evaluation).
    pub fn training(&self) -> bool {
        self.training.load(Ordering::Relaxed)
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.training.load(Ordering::Relaxed) {
            x.dropout(self.p)
        } else {
            Ok(x.clone())
        }
    }
    fn params(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
    fn train(&self, on: bool) {
        self.training.store(on, Ordering::Relaxed);
    }
}

/// Max pooling over square windows.
pub struct MaxPool2d {
    /// Window size.
    pub k: usize,
    /// Stride.
    pub stride: usize,
    /// Padding.
    pub padding: usize,
}

impl Module for MaxPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.max_pool2d(
            (self.k, self.k),
            (self.stride, self.stride),
            (self.padding, self.padding),
        )
    }
    fn params(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}

/// Average pooling over square windows.
pub struct AvgPool2d {
    /// Window size.
    pub k: usize,
    /// Stride.
    pub stride: usize,
    /// Padding.
    pub padding: usize,
}

impl Module for AvgPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.avg_pool2d(
            (self.k, self.k),
            (self.stride, self.stride),
            (self.padding, self.padding),
        )
    }
    fn params(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}

/// Flattens everything after the first axis.
pub struct Flatten;

impl Module for Flatten {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let n = x.shape().first().copied().unwrap_or(1);
        x.reshape(&[n, x.numel() / n.max(1)])
    }
    fn params(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}

/// A table of `vocab` vectors of `dim` looked up by u32 indices.
///
/// ```
/// use wgrad::nn::{Embedding, Module};
/// # fn main() -> wgrad::Result<()> {
/// let dev = wgrad::Device::new()?;
/// let emb = Embedding::new(&dev, 10, 4, wgrad::DType::F32)?;
/// let ids = dev.tensor(&[2u32, 7, 2], &[3])?;
/// let v = emb.forward(&ids)?;
/// assert_eq!(v.shape(), [3, 4]);
/// let (rows, table) = (v.to_vec::<f32>()?, emb.weight.to_vec::<f32>()?);
/// assert_eq!(rows[..4], table[8..12]); // row 0 is the table's row 2
/// assert_eq!(rows[..4], rows[8..]); // and so is row 2
///
/// // A batch of sequences: [batch, seq] ids give [batch, seq, dim].
/// let batch = dev.tensor(&[1u32, 2, 3, 4, 5, 6], &[2, 3])?;
/// assert_eq!(emb.forward(&batch)?.shape(), [2, 3, 4]);
/// # Ok(())
/// # }
/// ```
pub struct Embedding {
    /// [vocab, dim], initialised N(0, 1) as in PyTorch.
    pub weight: Tensor,
}

impl Embedding {
    /// A new table.
    pub fn new(dev: &Device, vocab: usize, dim: usize, dtype: DType) -> Result<Embedding> {
        Ok(Embedding {
            weight: Tensor::randn(dev, &[vocab, dim], 0.0, 1.0, dtype)?.variable(),
        })
    }

    /// Looks up `indices` (u32, any shape).
    pub fn lookup(&self, indices: &Tensor) -> Result<Tensor> {
        self.weight.embedding(indices)
    }
}

impl Module for Embedding {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.lookup(x)
    }
    fn params(&self) -> Vec<(String, Tensor)> {
        vec![("weight".into(), self.weight.clone())]
    }
}
