//! Moving tensors between devices. wgpu has no peer-to-peer copies, so a transfer is a
//! read-back into host memory on the source device and an upload on the destination.
//!
//! The backward pass of a transfer moves the gradient back to the source device, so one graph
//! can span several devices (a model split into pipeline stages) and `backward` walks it.
//! [`Tensor::to_device_async`] returns while the read-back is in flight, so the source device
//! can be given more work (the next micro-batch) before the host waits for the bytes.

use crate::device::{Device, Readback};
use crate::error::Result;
use crate::tensor::Tensor;
use crate::tensor::graph::record_fn;
use std::time::{Duration, Instant};

/// A transfer in flight: the read-back from the source device has been queued.
pub struct Transfer {
    src: Tensor,
    dst: Device,
    bytes: Readback<u8>,
}

impl Transfer {
    /// Waits for the bytes and uploads them to the destination: the tensor there (recorded for
    /// autograd like [`Tensor::to_device`]).
    pub fn wait(self) -> Result<Tensor> {
        self.wait_timed().map(|(t, _)| t)
    }

    /// [`Transfer::wait`], also returning how long the host waited for the read-back.
    pub fn wait_timed(self) -> Result<(Tensor, Duration)> {
        let out = Tensor::uninit(&self.dst, self.src.shape(), self.src.dtype())?;
        let t0 = Instant::now();
        let mut waited = Duration::ZERO;
        // Uploaded straight from the source's mapped staging memory: no vector between.
        self.bytes.wait_with(|bytes| {
            waited = t0.elapsed();
            out.write_bytes(bytes)
        })??;
        let rec = record_fn("to_device", &self.src, |x, g| g.to_device(x.device()));
        Ok((out.with_node(rec), waited))
    }
}

impl Tensor {
    /// This tensor on `dev` (the same handle when it is already there): read back to the
    /// host and uploaded. Differentiable: the gradient comes back to this tensor's device.
    pub fn to_device(&self, dev: &Device) -> Result<Tensor> {
        if self.device().same(dev) {
            return Ok(self.clone());
        }
        self.to_device_async(dev)?.wait()
    }

    /// Starts moving this tensor to `dev`: the read-back is queued on this tensor's device
    /// and the call returns at once; [`Transfer::wait`] finishes the move.
    pub fn to_device_async(&self, dev: &Device) -> Result<Transfer> {
        Ok(Transfer {
            src: self.clone(),
            dst: dev.clone(),
            bytes: self.read_bytes_async()?,
        })
    }
}
