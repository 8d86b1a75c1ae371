//! Losses: cross-entropy from logits, mean squared error.

use super::elementwise::float_only;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::loss as kl;
use crate::tensor::Tensor;
use crate::tensor::graph::{no_grad, record_fn};

/// Cross-entropy's gradient, softmax minus one-hot, from the dense logits and the saved row
/// statistics.
fn cross_entropy_grad(x: &Tensor, labels: &Tensor, stats: &Tensor, g: Tensor) -> Result<Tensor> {
    let (rows, classes) = (x.shape()[0], x.shape()[1]);
    let dx = Tensor::uninit(x.device(), x.shape(), x.dtype())?;
    let g = g.to_dtype(x.dtype())?.contiguous()?;
    let op = "cross_entropy backward";
    kl::backward(
        x.device(),
        x.dense_block(op)?,
        labels.dense_block(op)?,
        stats.dense_block(op)?,
        g.dense_block(op)?,
        dx.dense_block(op)?,
        x.dtype(),
        rows,
        classes,
    )?;
    Ok(dx)
}

/// The longest run of f32 logits [`Tensor::linear_cross_entropy`] holds at once, in bytes.
pub const LINEAR_CROSS_ENTROPY_CHUNK_BYTES: usize = 16 << 20;

/// Cross-entropy's forward kernel on `x` (logits \[rows, classes\]): the dense logits and
/// labels it ran on, each row's loss and the row statistics its gradient needs.
fn cross_entropy_forward(
    op: &'static str,
    x: &Tensor,
    labels: &Tensor,
) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
    float_only(op, x)?;
    if labels.dtype() != DType::U32 {
        return Err(Error::DType {
            op,
            expected: DType::U32,
            got: labels.dtype(),
        });
    }
    if x.rank() != 2 || labels.shape() != [x.shape()[0]] {
        return Err(Error::shape(
            op,
            format!(
                "logits {:?} with labels {:?}: want [rows, classes] and [rows]",
                x.shape(),
                labels.shape()
            ),
        ));
    }
    let (rows, classes) = (x.shape()[0], x.shape()[1]);
    if classes == 0 {
        return Err(Error::shape(op, "zero classes".to_string()));
    }
    let dev = x.device();
    if dev.is_checked() {
        crate::ops::embedding::check_indices(op, labels, classes)?;
    }
    let (x, labels) = (x.contiguous()?, labels.contiguous()?);
    let loss = Tensor::uninit(dev, &[rows], x.dtype())?;
    let stats = Tensor::uninit(dev, &[rows, 2], DType::F32)?;
    kl::forward(
        dev,
        x.dense_block(op)?,
        labels.dense_block(op)?,
        loss.dense_block(op)?,
        stats.dense_block(op)?,
        x.dtype(),
        rows,
        classes,
    )?;
    Ok((x, labels, loss, stats))
}

impl Tensor {
    /// Per-row cross-entropy of logits \[rows, classes\] against u32 class labels \[rows\]. A
    /// label outside 0..classes gives a NaN loss for its row, or an error naming the label on a
    /// checked device ([`DeviceOptions::checked`](crate::DeviceOptions::checked)).
    pub fn cross_entropy_rows(&self, labels: &Tensor) -> Result<Tensor> {
        let (x, labels, loss, stats) = cross_entropy_forward("cross_entropy", self, labels)?;
        // The node keeps the dense logits it ran on (the same tensor when it was dense).
        let rec = record_fn("cross_entropy", &x, move |x, g| {
            cross_entropy_grad(x, &labels, &stats, g)
        });
        Ok(loss.with_node(rec))
    }

    /// Mean cross-entropy of the logits `self W^T` (`self` \[rows, dim\], `weight`
    /// \[classes, dim\]) against u32 labels \[rows\], never holding every row's logits: a
    /// language model's output layer and loss in one op. The rows run in chunks of at most
    /// [`LINEAR_CROSS_ENTROPY_CHUNK_BYTES`] of f32 logits; each chunk's gradient (softmax minus
    /// one-hot) is multiplied into the gradients of `self` (and of `weight` when it needs one)
    /// before the next chunk, so the backward pass only scales them. For a vocabulary of
    /// 49,152 and 512 rows that is 12 MiB of logits instead of the 96 MiB of the whole f32
    /// logits and as much again for their gradient. The chunks' gradients are summed in the
    /// inputs' dtype, unscaled by the row count (which the backward pass applies), so f16 keeps
    /// their small entries.
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// use wgrad::{DType, Tensor};
    /// let dev = wgrad::Device::new()?;
    /// let h = dev.randn(&[6, 8], DType::F32)?.variable();
    /// let w = dev.randn(&[5, 8], DType::F32)?;
    /// let labels = Tensor::from_slice(&dev, &[0u32, 4, 2, 2, 1, 3], &[6])?;
    /// let fused = h.linear_cross_entropy(&w, &labels)?;
    /// let plain = h.linear(&w, None)?.cross_entropy(&labels)?;
    /// assert!((fused.to_scalar()? - plain.to_scalar()?).abs() < 1e-5);
    /// fused.backward()?; // h's gradient, as the plain composition gives it
    /// assert_eq!(h.grad().unwrap().shape(), &[6, 8]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn linear_cross_entropy(&self, weight: &Tensor, labels: &Tensor) -> Result<Tensor> {
        let op = "linear_cross_entropy";
        float_only(op, self)?;
        float_only(op, weight)?;
        crate::ops::elementwise::same_device(op, self, weight)?;
        if self.rank() != 2
            || weight.rank() != 2
            || weight.shape()[1] != self.shape()[1]
            || labels.shape() != [self.shape()[0]]
            || self.dtype() != weight.dtype()
        {
            return Err(Error::shape(
                op,
                format!(
                    "x {:?} {}, weight {:?} {}, labels {:?}: want [rows, dim], [classes, dim] \
                     of one dtype and [rows]",
                    self.shape(),
                    self.dtype(),
                    weight.shape(),
                    weight.dtype(),
                    labels.shape()
                ),
            ));
        }
        let (rows, classes) = (self.shape()[0], weight.shape()[0]);
        if rows == 0 {
            return Err(Error::shape(op, "zero rows"));
        }
        let wants_x = crate::tensor::graph::recording(&[self]);
        let wants_w = crate::tensor::graph::recording(&[weight]);
        let chunk = (LINEAR_CROSS_ENTROPY_CHUNK_BYTES / (4 * classes.max(1))).clamp(1, rows);
        let (mut losses, mut dxs) = (Vec::new(), Vec::new());
        let mut dw: Option<Tensor> = None;
        no_grad(|| -> Result<()> {
            for start in (0..rows).step_by(chunk) {
                let n = chunk.min(rows - start);
                let xc = self.narrow(0, start, n)?;
                let logits = xc.linear(weight, None)?.to_dtype(DType::F32)?;
                let lc = labels.narrow(0, start, n)?;
                let (logits, lc, loss, stats) = cross_entropy_forward(op, &logits, &lc)?;
                losses.push(loss);
                if !(wants_x || wants_w) {
                    continue;
                }
                let ones = Tensor::ones(self.device(), &[n], DType::F32)?;
                let d = cross_entropy_grad(&logits, &lc, &stats, ones)?;
                drop(logits);
                let d = d.to_dtype(self.dtype())?;
                if wants_x {
                    dxs.push(d.matmul(weight)?);
                }
                if wants_w {
                    // Summed across chunks in f32, returned in the weight's dtype.
                    let part = d.transpose(0, 1)?.matmul(&xc)?.to_dtype(DType::F32)?;
                    dw = Some(match dw.take() {
                        Some(acc) => acc.add(&part)?,
                        None => part,
                    });
                }
            }
            Ok(())
        })?;
        let refs: Vec<&Tensor> = losses.iter().collect();
        let mean = no_grad(|| Tensor::cat(&refs, 0)?.mean_all())?;
        if !(wants_x || wants_w) {
            return Ok(mean);
        }
        let dx = if wants_x {
            let refs: Vec<&Tensor> = dxs.iter().collect();
            Some(no_grad(|| Tensor::cat(&refs, 0))?)
        } else {
            None
        };
        let (x_dtype, w_dtype) = (self.dtype(), weight.dtype());
        // The node holds the weight only where it takes a gradient: a weight made for this op
        // alone (a quantized head, decoded) is freed with the op.
        let inputs: &[&Tensor] = if wants_w { &[self, weight] } else { &[self] };
        let node = crate::tensor::graph::record(op, inputs, move || {
            move |_: &[Tensor], _: &Tensor, g: Tensor| {
                // g is the mean's gradient; each row's share of it is g / rows.
                let scale = g.mul_scalar(1.0 / rows as f32)?;
                let by = |t: &Option<Tensor>, dtype: DType| -> Result<Option<Tensor>> {
                    t.as_ref()
                        .map(|t| t.mul(&scale.to_dtype(t.dtype())?)?.to_dtype(dtype))
                        .transpose()
                };
                let mut grads = vec![by(&dx, x_dtype)?];
                if wants_w {
                    grads.push(by(&dw, w_dtype)?);
                }
                Ok(grads)
            }
        });
        Ok(mean.with_node(node))
    }

    /// Mean cross-entropy of logits \[rows, classes\] against u32 labels \[rows\].
    pub fn cross_entropy(&self, labels: &Tensor) -> Result<Tensor> {
        self.cross_entropy_rows(labels)?.mean_all()
    }

    /// Mean squared error against `target` (same shape).
    pub fn mse_loss(&self, target: &Tensor) -> Result<Tensor> {
        if self.shape() != target.shape() {
            return Err(Error::shape(
                "mse_loss",
                format!("{:?} and {:?}", self.shape(), target.shape()),
            ));
        }
        self.sub(target)?.square()?.mean_all()
    }
}
