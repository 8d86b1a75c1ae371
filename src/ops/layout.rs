//! Layout ops that move elements: permute, transpose, broadcast, narrow, concatenate.
//! Each is one strided-copy kernel into a new contiguous tensor.

use crate::autograd::{Op, record};
use crate::error::{Error, Result};
use crate::kernels::copy::{self as kc, View};
use crate::tensor::Tensor;

/// Row-major element strides of `shape`.
pub(crate) fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1] * shape[k + 1];
    }
    s
}

impl Tensor {
    /// Reorders dimensions: output dimension `k` is input dimension `perm[k]`.
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        let r = self.rank();
        let mut seen = vec![false; r];
        if perm.len() != r
            || perm
                .iter()
                .any(|&p| p >= r || std::mem::replace(&mut seen[p], true))
        {
            return Err(Error::invalid(
                "permute",
                format!("{perm:?} is not a permutation of {r} axes"),
            ));
        }
        let xs = contiguous_strides(self.shape());
        let dims: Vec<usize> = perm.iter().map(|&p| self.shape()[p]).collect();
        let strides: Vec<usize> = perm.iter().map(|&p| xs[p]).collect();
        let out = Tensor::uninit(self.device(), &dims, self.dtype())?;
        kc::strided(
            self.device(),
            self.block(),
            View {
                strides: &strides,
                offset: 0,
            },
            out.block(),
            View {
                strides: &contiguous_strides(&dims),
                offset: 0,
            },
            self.dtype(),
            &dims,
        )?;
        let rec = record(&[self], || Op::Permute {
            x: self.clone(),
            perm: perm.to_vec(),
        });
        Ok(out.with_op(rec))
    }

    /// Swaps two dimensions (negative counts from the end).
    pub fn transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        let a = self.axis(a, "transpose")?;
        let b = self.axis(b, "transpose")?;
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// Repeats size-1 (or missing leading) dimensions up to `shape`.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        if self.shape() == shape {
            return Ok(self.clone());
        }
        let ok = shape.len() >= self.rank()
            && self
                .shape()
                .iter()
                .rev()
                .zip(shape.iter().rev())
                .all(|(&a, &b)| a == b || a == 1);
        if !ok {
            return Err(Error::shape(
                "broadcast_to",
                format!("{:?} cannot broadcast to {shape:?}", self.shape()),
            ));
        }
        let strides = crate::kernels::elementwise::broadcast_strides(self.shape(), shape);
        let out = Tensor::uninit(self.device(), shape, self.dtype())?;
        kc::strided(
            self.device(),
            self.block(),
            View {
                strides: &strides,
                offset: 0,
            },
            out.block(),
            View {
                strides: &contiguous_strides(shape),
                offset: 0,
            },
            self.dtype(),
            shape,
        )?;
        let rec = record(&[self], || Op::Expand { x: self.clone() });
        Ok(out.with_op(rec))
    }

    /// `len` elements of `axis` starting at `start`.
    pub fn narrow(&self, axis: isize, start: usize, len: usize) -> Result<Tensor> {
        let a = self.axis(axis, "narrow")?;
        if start + len > self.shape()[a] {
            return Err(Error::shape(
                "narrow",
                format!(
                    "{start}..{} out of axis {a} of {:?}",
                    start + len,
                    self.shape()
                ),
            ));
        }
        let xs = contiguous_strides(self.shape());
        let mut dims = self.shape().to_vec();
        dims[a] = len;
        let out = Tensor::uninit(self.device(), &dims, self.dtype())?;
        kc::strided(
            self.device(),
            self.block(),
            View {
                strides: &xs,
                offset: start * xs[a],
            },
            out.block(),
            View {
                strides: &contiguous_strides(&dims),
                offset: 0,
            },
            self.dtype(),
            &dims,
        )?;
        let rec = record(&[self], || Op::Narrow {
            x: self.clone(),
            axis: a,
            start,
        });
        Ok(out.with_op(rec))
    }

    /// Writes `src` into a copy of `self` at `start` along `axis` (the gradient of narrow;
    /// also how `cat` fills its output).
    pub(crate) fn write_slice(&self, src: &Tensor, axis: usize, start: usize) -> Result<()> {
        let ys = contiguous_strides(self.shape());
        kc::strided(
            self.device(),
            src.block(),
            View {
                strides: &contiguous_strides(src.shape()),
                offset: 0,
            },
            self.block(),
            View {
                strides: &ys,
                offset: start * ys[axis],
            },
            self.dtype(),
            src.shape(),
        )
    }

    /// Concatenates tensors along `axis`.
    pub fn cat(xs: &[&Tensor], axis: isize) -> Result<Tensor> {
        let Some(first) = xs.first() else {
            return Err(Error::invalid("cat", "no tensors"));
        };
        let a = first.axis(axis, "cat")?;
        let mut dims = first.shape().to_vec();
        dims[a] = 0;
        for t in xs {
            let compatible = t.rank() == first.rank()
                && t.dtype() == first.dtype()
                && t.shape()
                    .iter()
                    .zip(first.shape())
                    .enumerate()
                    .all(|(k, (x, y))| k == a || x == y);
            if !compatible {
                return Err(Error::shape(
                    "cat",
                    format!(
                        "{:?} and {:?} ({}, {}) along axis {a}",
                        first.shape(),
                        t.shape(),
                        first.dtype(),
                        t.dtype()
                    ),
                ));
            }
            dims[a] += t.shape()[a];
        }
        let out = Tensor::uninit(first.device(), &dims, first.dtype())?;
        let mut at = 0;
        for t in xs {
            out.write_slice(t, a, at)?;
            at += t.shape()[a];
        }
        let rec = record(xs, || Op::Cat {
            xs: xs.iter().map(|t| (*t).clone()).collect(),
            axis: a,
        });
        Ok(out.with_op(rec))
    }
}
