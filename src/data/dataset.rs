//! The dataset trait and an in-memory dataset.

use crate::dtype::Element;
use crate::error::{Error, Result};
use std::sync::Arc;

/// Samples by index. Each sample is a feature array of `x_shape()` elements of type `X`
/// (f32 pixels, u32 tokens...) and a label array of `y_shape()` u32 values (`[]` for one
/// class label, `[seq]` for next-token targets).
pub trait Dataset: Send + Sync + 'static {
    /// Feature element type.
    type X: Element;
    /// Number of samples.
    fn len(&self) -> usize;
    /// True when there are no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Shape of one sample's features.
    fn x_shape(&self) -> Vec<usize>;
    /// Shape of one sample's labels.
    fn y_shape(&self) -> Vec<usize>;
    /// Writes sample `index` into `x` (x_shape elements) and `y` (y_shape elements).
    fn get(&self, index: usize, x: &mut [Self::X], y: &mut [u32]) -> Result<()>;
}

/// Samples held in host memory: features row-major, one label each.
pub struct InMemory<X: Element> {
    x: Arc<Vec<X>>,
    y: Arc<Vec<u32>>,
    shape: Vec<usize>,
    indices: Vec<usize>,
}

impl<X: Element> InMemory<X> {
    /// `x` holds `y.len()` samples of `shape` each.
    pub fn new(x: Vec<X>, y: Vec<u32>, shape: &[usize]) -> Result<Self> {
        let per: usize = shape.iter().product();
        if x.len() != per * y.len() {
            return Err(Error::shape(
                "InMemory",
                format!(
                    "{} feature values for {} samples of {shape:?}",
                    x.len(),
                    y.len()
                ),
            ));
        }
        let n = y.len();
        Ok(InMemory {
            x: Arc::new(x),
            y: Arc::new(y),
            shape: shape.to_vec(),
            indices: (0..n).collect(),
        })
    }

    /// The samples whose positions are in `range`, sharing storage (train / held-out splits).
    pub fn subset(&self, range: std::ops::Range<usize>) -> Result<Self> {
        if range.end > self.indices.len() {
            return Err(Error::invalid(
                "subset",
                format!("{range:?} out of {} samples", self.indices.len()),
            ));
        }
        Ok(InMemory {
            x: Arc::clone(&self.x),
            y: Arc::clone(&self.y),
            shape: self.shape.clone(),
            indices: self.indices[range].to_vec(),
        })
    }
}

impl<X: Element> Dataset for InMemory<X> {
    type X = X;
    fn len(&self) -> usize {
        self.indices.len()
    }
    fn x_shape(&self) -> Vec<usize> {
        self.shape.clone()
    }
    fn y_shape(&self) -> Vec<usize> {
        Vec::new()
    }
    fn get(&self, index: usize, x: &mut [X], y: &mut [u32]) -> Result<()> {
        let Some(&i) = self.indices.get(index) else {
            return Err(Error::invalid(
                "dataset",
                format!("index {index} out of {}", self.indices.len()),
            ));
        };
        let per = x.len();
        x.copy_from_slice(&self.x[i * per..(i + 1) * per]);
        y[0] = self.y[i];
        Ok(())
    }
}
