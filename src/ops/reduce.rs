//! Reductions: sum, mean, max, min, argmax, argmin, var and std along an axis or over
//! everything.

use super::elementwise::float_only;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::reduce::{self as kr, ReduceOp};
use crate::layout::Dims;
use crate::tensor::Tensor;
use crate::tensor::graph::record_fn;

/// A scaled sum's gradient: the output gradient repeated along the axis, times the scale.
fn sum_grad(x: &Tensor, axis: usize, scale: f32, g: Tensor) -> Result<Tensor> {
    let mut keep = x.shape().to_vec();
    keep[axis] = 1;
    let gx = g.reshape(&keep)?.broadcast_to(x.shape())?;
    if scale == 1.0 {
        Ok(gx)
    } else {
        gx.mul_scalar(scale)
    }
}

/// A max's (or min's) gradient: split evenly among the elements equal to the result.
fn extremum_grad(x: &Tensor, axis: usize, out: &Tensor, g: Tensor) -> Result<Tensor> {
    let mut keep = x.shape().to_vec();
    keep[axis] = 1;
    let mask = x.eq(&out.reshape(&keep)?)?;
    let count = mask.sum(axis as isize, true)?;
    mask.mul(&g.reshape(&keep)?.div(&count)?)
}

/// [outer, len, inner] around `axis`.
pub(crate) fn split3(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}

fn reduced_shape(shape: &[usize], axis: usize, keepdim: bool) -> Dims {
    (shape.iter().enumerate())
        .filter(|&(k, _)| keepdim || k != axis)
        .map(|(k, &d)| if k == axis { 1 } else { d })
        .collect()
}

impl Tensor {
    fn reduce_axis(
        &self,
        axis: isize,
        keepdim: bool,
        op: ReduceOp,
        scale: f32,
        name: &'static str,
    ) -> Result<Tensor> {
        float_only(name, self)?;
        let a = self.axis(axis, name)?;
        let (outer, len, inner) = split3(self.shape(), a);
        let shape = reduced_shape(self.shape(), a, keepdim);
        if len == 0 {
            // As PyTorch: the sum of nothing is 0 and its mean 0/0 = NaN; a maximum or
            // minimum of nothing does not exist.
            if op != ReduceOp::Sum {
                return Err(Error::invalid(
                    name,
                    format!("reducing an empty axis {a} of {:?}", self.shape()),
                ));
            }
            let v = if scale.is_finite() { 0.0 } else { f32::NAN };
            let out = Tensor::full(self.device(), &shape, v, self.dtype())?;
            let rec = record_fn(name, self, move |x, g| sum_grad(x, a, 0.0, g));
            return Ok(out.with_node(rec));
        }
        let x = self.contiguous()?;
        let out = Tensor::uninit(self.device(), &shape, self.dtype())?;
        kr::reduce(
            self.device(),
            op,
            scale,
            x.dense_block(name)?,
            self.dtype(),
            out.dense_block(name)?,
            self.dtype(),
            outer,
            len,
            inner,
        )?;
        let rec = match op {
            ReduceOp::Sum => record_fn(name, self, move |x, g| sum_grad(x, a, scale, g)),
            ReduceOp::Max | ReduceOp::Min => {
                let saved = out.detach();
                record_fn(name, self, move |x, g| extremum_grad(x, a, &saved, g))
            }
            // Internal (`abs_max`), never differentiated.
            ReduceOp::AbsMax => None,
        };
        Ok(out.with_node(rec))
    }

    /// max |x| along `axis`, with NaN winning; not recorded (the scales of split f32
    /// products, `ops::matmul`).
    pub(crate) fn abs_max(&self, axis: isize) -> Result<Tensor> {
        self.detach()
            .reduce_axis(axis, false, ReduceOp::AbsMax, 1.0, "abs_max")
    }

    /// Sum along `axis` (negative counts from the end).
    /// An empty axis sums to 0.
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let x = dev.tensor(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    /// assert_eq!(x.sum(0, false)?.to_vec::<f32>()?, [5.0, 7.0, 9.0]);
    /// let rows = x.sum(-1, true)?; // keepdim: [2, 1], ready to broadcast against x
    /// assert_eq!(rows.shape(), [2, 1]);
    /// assert_eq!(x.sub(&rows)?.to_vec::<f32>()?, [-5.0, -4.0, -3.0, -11.0, -10.0, -9.0]);
    /// assert_eq!(x.max(1, false)?.to_vec::<f32>()?, [3.0, 6.0]);
    /// assert_eq!(x.argmax(0, false)?.to_vec::<u32>()?, [1, 1, 1]);
    /// assert_eq!(x.sum_all()?.to_scalar()?, 21.0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn sum(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce_axis(axis, keepdim, ReduceOp::Sum, 1.0, "sum")
    }

    /// Mean along `axis`; the mean of an empty axis is NaN.
    pub fn mean(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        let a = self.axis(axis, "mean")?;
        let len = self.shape()[a];
        let scale = if len == 0 { f32::NAN } else { 1.0 / len as f32 };
        self.reduce_axis(axis, keepdim, ReduceOp::Sum, scale, "mean")
    }

    /// Maximum along `axis` (NaN if the range holds a NaN); the gradient is split evenly among
    /// tied maxima. An empty axis is an error.
    pub fn max(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce_axis(axis, keepdim, ReduceOp::Max, 1.0, "max")
    }

    /// Minimum along `axis` (NaN if the range holds a NaN); the gradient is split evenly among
    /// tied minima. An empty axis is an error.
    pub fn min(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce_axis(axis, keepdim, ReduceOp::Min, 1.0, "min")
    }

    /// Variance along `axis` with `correction` (1: the unbiased estimate, as PyTorch's
    /// default; 0: the population variance). Two passes, the mean first and then the mean
    /// squared deviation, so a large common offset does not cancel the result away. An axis
    /// of at most `correction` elements gives NaN (0 / 0) or infinity, as in PyTorch.
    pub fn var(&self, axis: isize, correction: usize, keepdim: bool) -> Result<Tensor> {
        let a = self.axis(axis, "var")?;
        let n = self.shape()[a] as f32;
        let dev = self.sub(&self.mean(axis, true)?)?;
        let ss = dev.square()?.sum(axis, keepdim)?;
        ss.mul_scalar(1.0 / (n - correction as f32).max(0.0))
    }

    /// Standard deviation along `axis`: the square root of [`var`](Tensor::var).
    pub fn std(&self, axis: isize, correction: usize, keepdim: bool) -> Result<Tensor> {
        self.var(axis, correction, keepdim)?.sqrt()
    }

    /// Sum of every element, shape `[]`.
    pub fn sum_all(&self) -> Result<Tensor> {
        self.reshape(&[self.numel()])?.sum(0, false)
    }

    /// Mean of every element, shape `[]`.
    pub fn mean_all(&self) -> Result<Tensor> {
        self.reshape(&[self.numel()])?.mean(0, false)
    }

    /// Maximum of every element, shape `[]`.
    pub fn max_all(&self) -> Result<Tensor> {
        self.reshape(&[self.numel()])?.max(0, false)
    }

    fn arg_reduce(
        &self,
        axis: isize,
        keepdim: bool,
        op: ReduceOp,
        name: &'static str,
    ) -> Result<Tensor> {
        float_only(name, self)?;
        let a = self.axis(axis, name)?;
        let (outer, len, inner) = split3(self.shape(), a);
        if len == 0 {
            return Err(Error::invalid(
                name,
                format!("empty axis {a} of {:?}", self.shape()),
            ));
        }
        let x = self.contiguous()?;
        let out = Tensor::uninit(
            self.device(),
            &reduced_shape(self.shape(), a, keepdim),
            DType::U32,
        )?;
        kr::arg_reduce(
            self.device(),
            op,
            x.dense_block(name)?,
            out.dense_block(name)?,
            self.dtype(),
            outer,
            len,
            inner,
        )?;
        Ok(out)
    }

    /// Index of the first maximum along `axis` (of the first NaN, if any), as u32; not
    /// differentiable.
    pub fn argmax(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.arg_reduce(axis, keepdim, ReduceOp::Max, "argmax")
    }

    /// Index of the first minimum along `axis` (of the first NaN, if any), as u32.
    pub fn argmin(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.arg_reduce(axis, keepdim, ReduceOp::Min, "argmin")
    }

    /// Sums broadcast dimensions away so the result has `target`'s shape: the gradient of a
    /// broadcast.
    pub fn sum_to(&self, target: &[usize]) -> Result<Tensor> {
        if self.shape() == target {
            return Ok(self.clone());
        }
        if target.len() > self.rank() {
            return Err(Error::shape(
                "sum_to",
                format!("{:?} cannot be summed to {target:?}", self.shape()),
            ));
        }
        let lead = self.rank() - target.len();
        let mut t = self.clone();
        if lead > 0 {
            let outer: usize = self.shape()[..lead].iter().product();
            let mut s = vec![outer];
            s.extend_from_slice(&self.shape()[lead..]);
            t = t.reshape(&s)?.sum(0, false)?;
        }
        for (k, &d) in target.iter().enumerate() {
            if d == 1 && t.shape()[k] != 1 {
                t = t.sum(k as isize, true)?;
            } else if d != t.shape()[k] {
                return Err(Error::shape(
                    "sum_to",
                    format!("{:?} cannot be summed to {target:?}", self.shape()),
                ));
            }
        }
        t.reshape(target)
    }
}
