//! Layout ops: reshape, permute, transpose, broadcast and narrow are views (no copy; only the
//! layout changes), `contiguous` makes a dense copy of a view, `cat` and dtype conversion
//! write new tensors.

use crate::error::{Error, Result};
use crate::kernels::copy as kc;
use crate::layout::Dims;
use crate::tensor::graph::{record, record_fn};
use crate::tensor::{Tensor, check_numel};

/// Gradient of a concatenation along `axis`: the gradient's slices.
fn cat_grads(axis: usize, xs: &[Tensor], g: Tensor) -> Result<Vec<Option<Tensor>>> {
    let mut at = 0;
    let mut v = Vec::with_capacity(xs.len());
    for x in xs {
        let len = x.shape()[axis];
        v.push(Some(g.narrow(axis as isize, at, len)?));
        at += len;
    }
    Ok(v)
}

impl Tensor {
    /// The same elements in row-major order with a new shape (same count): a view when the
    /// strides allow (always for a contiguous tensor), else a dense copy.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        check_numel("reshape", self.shape(), shape)?;
        let (base, layout) = match self.layout().reshape(shape) {
            Some(l) => (self.clone(), l),
            None => {
                let base = self.contiguous()?;
                let l = base.layout().reshape(shape).ok_or_else(|| {
                    Error::Internal(format!("reshape of dense {:?} to {shape:?}", base.shape()))
                })?;
                (base, l)
            }
        };
        let rec = record_fn("reshape", &base, |x, g| g.reshape(x.shape()));
        Ok(base.view(layout, rec))
    }

    /// A dense copy when this is a view (a strided layout or an offset), else the same tensor.
    /// Kernels without strides run on dense tensors; ops call this for them.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.layout().is_dense() {
            return Ok(self.clone());
        }
        let out = self.dense_copy()?;
        Ok(out.with_node(record_fn("contiguous", self, |_, g| Ok(g))))
    }

    /// Converts to another dtype (a new tensor; the same handle when the dtype already matches).
    pub fn to_dtype(&self, dtype: crate::DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        let x = self.contiguous()?;
        let out = Tensor::uninit(self.device(), self.shape(), dtype)?;
        kc::cast(
            self.device(),
            x.dense_block("to_dtype")?,
            self.dtype(),
            out.dense_block("to_dtype")?,
            dtype,
            self.numel(),
        )?;
        let rec = if dtype.is_float() && self.dtype().is_float() {
            record_fn("to_dtype", self, |x, g| g.to_dtype(x.dtype()))
        } else {
            None
        };
        Ok(out.with_node(rec))
    }

    /// Overwrites this dense tensor's storage with `src` converted to its dtype (loading a
    /// checkpoint stored in another dtype). Not recorded for autograd.
    pub(crate) fn assign_cast(&self, src: &Tensor) -> Result<()> {
        if src.shape() != self.shape() {
            return Err(Error::shape(
                "assign",
                format!("{:?} into {:?}", src.shape(), self.shape()),
            ));
        }
        let x = src.contiguous()?;
        kc::cast(
            self.device(),
            x.dense_block("assign")?,
            src.dtype(),
            self.dense_block("assign")?,
            self.dtype(),
            self.numel(),
        )
    }

    /// A dense copy with its own storage.
    pub fn copy(&self) -> Result<Tensor> {
        let out = self.dense_copy()?;
        Ok(out.with_node(record_fn("copy", self, |_, g| Ok(g))))
    }

    /// Reorders dimensions (a view): output dimension `k` is input dimension `perm[k]`.
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
        let mut inv = vec![0; r];
        for (k, &p) in perm.iter().enumerate() {
            inv[p] = k;
        }
        let rec = record_fn("permute", self, move |_, g| g.permute(&inv));
        Ok(self.view(self.layout().permute(perm), rec))
    }

    /// Swaps two dimensions (negative counts from the end); a view.
    pub fn transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        let a = self.axis(a, "transpose")?;
        let b = self.axis(b, "transpose")?;
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// Repeats size-1 (or missing leading) dimensions up to `shape`; a view (stride 0).
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        if self.shape() == shape {
            return Ok(self.clone());
        }
        let Some(layout) = self.layout().broadcast_to(shape) else {
            return Err(Error::shape(
                "broadcast_to",
                format!("{:?} cannot broadcast to {shape:?}", self.shape()),
            ));
        };
        let rec = record_fn("broadcast_to", self, |x, g| g.sum_to(x.shape()));
        Ok(self.view(layout, rec))
    }

    /// `len` elements of `axis` starting at `start`; a view.
    pub fn narrow(&self, axis: isize, start: usize, len: usize) -> Result<Tensor> {
        let a = self.axis(axis, "narrow")?;
        if start.checked_add(len).is_none_or(|e| e > self.shape()[a]) {
            return Err(Error::shape(
                "narrow",
                format!(
                    "{start}..{} out of axis {a} of {:?}",
                    start.saturating_add(len),
                    self.shape()
                ),
            ));
        }
        // The gradient: zeros with the output's gradient written at the slice.
        let rec = record_fn("narrow", self, move |x, g| {
            let gx = Tensor::zeros(g.device(), x.shape(), g.dtype())?;
            gx.write_slice(&g, a, start)?;
            Ok(gx)
        });
        Ok(self.view(self.layout().narrow(a, start, len), rec))
    }

    /// Removes dimension `axis`, which must have size 1; a view.
    pub fn squeeze(&self, axis: isize) -> Result<Tensor> {
        let a = self.axis(axis, "squeeze")?;
        if self.shape()[a] != 1 {
            return Err(Error::shape(
                "squeeze",
                format!("axis {a} of {:?} is not 1", self.shape()),
            ));
        }
        let s: Dims = (self.shape().iter().enumerate())
            .filter(|&(k, _)| k != a)
            .map(|(_, &d)| d)
            .collect();
        self.reshape(&s)
    }

    /// Inserts a dimension of size 1 at `axis` (0..=rank); a view.
    pub fn unsqueeze(&self, axis: usize) -> Result<Tensor> {
        if axis > self.rank() {
            return Err(Error::invalid(
                "unsqueeze",
                format!("axis {axis} past rank {}", self.rank()),
            ));
        }
        let mut s = self.shape().to_vec();
        s.insert(axis, 1);
        self.reshape(&s)
    }

    /// Writes `src` into this (dense) tensor at `start` along `axis` (the gradient of narrow;
    /// also how `cat` fills its output). Not recorded.
    pub(crate) fn write_slice(&self, src: &Tensor, axis: usize, start: usize) -> Result<()> {
        self.dense_block("write_slice")?;
        let dst = self.layout().narrow(axis, start, src.shape()[axis]);
        kc::strided_layout(
            self.device(),
            src.block(),
            src.layout(),
            self.block(),
            &dst,
            self.dtype(),
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
        let rec = record("cat", xs, || {
            move |xs: &[Tensor], _: &Tensor, g| cat_grads(a, xs, g)
        });
        Ok(out.with_node(rec))
    }
}
