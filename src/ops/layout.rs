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
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let x = dev.tensor(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    /// let r = x.reshape(&[3, 2])?;
    /// assert!(r.same_storage(&x)); // a view: nothing copied
    /// assert_eq!(r.to_vec::<f32>()?, x.to_vec::<f32>()?);
    /// let t = x.transpose(0, 1)?.reshape(&[6])?; // strides that do not allow it: a copy
    /// assert!(!t.same_storage(&x));
    /// assert_eq!(t.to_vec::<f32>()?, [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    /// # Ok(())
    /// # }
    /// ```
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
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let v: Vec<f32> = (0..24).map(|i| i as f32).collect();
    /// let x = dev.tensor(&v, &[2, 3, 4])?;
    /// let p = x.permute(&[2, 0, 1])?; // [4, 2, 3]: p[k][i][j] = x[i][j][k]
    /// assert_eq!(p.shape(), [4, 2, 3]);
    /// assert!(p.same_storage(&x) && !p.is_contiguous());
    /// assert_eq!(p.to_vec::<f32>()?[..3], [0.0, 4.0, 8.0]); // x[0][0][0], x[0][1][0], x[0][2][0]
    /// # Ok(())
    /// # }
    /// ```
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
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let x = dev.tensor(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    /// let t = x.transpose(0, -1)?;
    /// assert_eq!(t.shape(), [3, 2]);
    /// assert_eq!(t.strides(), [1, 3]); // the same storage, read column by column
    /// assert_eq!(t.to_vec::<f32>()?, [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    /// # Ok(())
    /// # }
    /// ```
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
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let x = dev.tensor(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    /// let cols = x.narrow(1, 1, 2)?; // columns 1 and 2
    /// assert_eq!(cols.shape(), [2, 2]);
    /// assert!(cols.same_storage(&x));
    /// assert_eq!(cols.to_vec::<f32>()?, [2.0, 3.0, 5.0, 6.0]);
    /// assert!(x.narrow(1, 2, 2).is_err()); // past the end of the axis
    /// # Ok(())
    /// # }
    /// ```
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

    /// Inserts a dimension of size 1 at `axis`; a view. `axis` counts from the front in
    /// `0..=rank`, or from the back when negative (`-1` appends a last dimension).
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let x = dev.zeros(&[2, 3], wgrad::DType::F32)?;
    /// assert_eq!(x.unsqueeze(0)?.shape(), &[1, 2, 3]);
    /// assert_eq!(x.unsqueeze(-1)?.shape(), &[2, 3, 1]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn unsqueeze(&self, axis: isize) -> Result<Tensor> {
        let rank = self.rank() as isize;
        let at = if axis < 0 { axis + rank + 1 } else { axis };
        if !(0..=rank).contains(&at) {
            return Err(Error::invalid(
                "unsqueeze",
                format!("axis {axis} outside -{}..={rank}", rank + 1),
            ));
        }
        let mut s = self.shape().to_vec();
        s.insert(at as usize, 1);
        self.reshape(&s)
    }

    /// Row `index` along the first axis, without that axis (`x.get(i)` of a `[n, d]` tensor
    /// is its `[d]` row); a view.
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let x = dev.tensor(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2])?;
    /// assert_eq!(x.get(1)?.to_vec::<f32>()?, vec![3.0, 4.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn get(&self, index: usize) -> Result<Tensor> {
        let Some(&n) = self.shape().first() else {
            return Err(Error::invalid("get", "a scalar has no rows"));
        };
        if index >= n {
            return Err(Error::invalid(
                "get",
                format!("row {index} of {n} in {:?}", self.shape()),
            ));
        }
        self.narrow(0, index, 1)?.squeeze(0)
    }

    /// Stacks tensors of one shape along a new axis `axis` (`0..=rank`, negative from the
    /// back): n tensors of `[a, b]` stacked at 0 give `[n, a, b]`.
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let a = dev.tensor(&[1.0f32, 2.0], &[2])?;
    /// let b = dev.tensor(&[3.0f32, 4.0], &[2])?;
    /// let s = wgrad::Tensor::stack(&[&a, &b], 1)?;
    /// assert_eq!(s.shape(), &[2, 2]);
    /// assert_eq!(s.to_vec::<f32>()?, vec![1.0, 3.0, 2.0, 4.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn stack(xs: &[&Tensor], axis: isize) -> Result<Tensor> {
        let Some(first) = xs.first() else {
            return Err(Error::invalid("stack", "no tensors"));
        };
        if let Some(t) = xs.iter().find(|t| t.shape() != first.shape()) {
            return Err(Error::shape(
                "stack",
                format!("{:?} beside {:?}", t.shape(), first.shape()),
            ));
        }
        let rank = first.rank() as isize;
        let at = if axis < 0 { axis + rank + 1 } else { axis };
        if !(0..=rank).contains(&at) {
            return Err(Error::invalid(
                "stack",
                format!("axis {axis} outside -{}..={rank}", rank + 1),
            ));
        }
        let parts = xs
            .iter()
            .map(|t| t.unsqueeze(at))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Tensor> = parts.iter().collect();
        Tensor::cat(&refs, at)
    }

    /// Splits along `axis` into pieces of `size` (the last one shorter when `size` does not
    /// divide the axis); views.
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let x = dev.tensor(&[0.0f32, 1.0, 2.0, 3.0, 4.0], &[5])?;
    /// let parts = x.split(2, 0)?;
    /// let lens: Vec<usize> = parts.iter().map(|p| p.shape()[0]).collect();
    /// assert_eq!(lens, vec![2, 2, 1]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn split(&self, size: usize, axis: isize) -> Result<Vec<Tensor>> {
        let a = self.axis(axis, "split")?;
        if size == 0 {
            return Err(Error::invalid("split", "pieces of size 0"));
        }
        let n = self.shape()[a];
        (0..n)
            .step_by(size)
            .map(|start| self.narrow(a as isize, start, size.min(n - start)))
            .collect()
    }

    /// Splits along `axis` into `chunks` pieces of equal size (the last one shorter when they
    /// do not divide the axis), as PyTorch's `chunk`; views.
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let qkv = dev.zeros(&[4, 3 * 8], wgrad::DType::F32)?;
    /// let parts = qkv.chunk(3, -1)?;
    /// assert_eq!(parts.len(), 3);
    /// assert_eq!(parts[2].shape(), &[4, 8]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn chunk(&self, chunks: usize, axis: isize) -> Result<Vec<Tensor>> {
        let a = self.axis(axis, "chunk")?;
        if chunks == 0 {
            return Err(Error::invalid("chunk", "0 chunks"));
        }
        let n = self.shape()[a];
        self.split(n.div_ceil(chunks).max(1), axis)
    }

    /// Copies `src` (this view's shape and dtype, any layout) into the elements this view
    /// covers, in place: a key/value cache's new positions. Not recorded for autograd.
    pub(crate) fn assign(&self, src: &Tensor) -> Result<()> {
        if src.shape() != self.shape() || src.dtype() != self.dtype() {
            return Err(Error::shape(
                "assign",
                format!(
                    "{:?} {} into {:?} {}",
                    src.shape(),
                    src.dtype(),
                    self.shape(),
                    self.dtype()
                ),
            ));
        }
        kc::strided_layout(
            self.device(),
            src.block(),
            src.layout(),
            self.block(),
            self.layout(),
            self.dtype(),
        )
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
