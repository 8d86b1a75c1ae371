//! Training on more than one device: data parallelism ([`DataParallel`]: one replica per
//! device, gradients averaged after each backward pass), model splitting ([`Pipeline`]:
//! stages on different devices, micro-batches flowing through them), and, with the `mpi`
//! feature, data parallelism across processes and hosts (`MpiGroup`, under `mpirun`).
//!
//! wgpu has no peer-to-peer copies, so everything between devices goes through host memory:
//! a read-back on one device, an upload on the other. Both designs hide part of that cost
//! behind computation, and say how much they could not hide (the time the host waited on
//! transfers is reported).
//!
//! Several devices may sit on one adapter (`Device::with_options` twice), which is how the
//! tests run this on a CPU-only machine.

mod bucket;
mod data;
#[cfg(feature = "mpi")]
mod mpi;
mod pipeline;

pub use data::{DataParallel, StepReport};
#[cfg(feature = "mpi")]
pub use mpi::MpiGroup;
pub use pipeline::{Pipeline, PipelineReport};

use crate::device::Device;
use crate::error::{Error, Result};

/// Opens one device per entry of a comma-separated list of adapter indices (`"0,1"`, in
/// `Device::all()`'s order; an index may repeat: two devices on one adapter).
pub fn open_devices(list: &str) -> Result<Vec<Device>> {
    let mut out = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let i: usize = part.parse().map_err(|_| {
            Error::invalid(
                "devices",
                format!("{part:?} in {list:?} is not an adapter index"),
            )
        })?;
        out.push(Device::with_index(i)?);
    }
    if out.is_empty() {
        return Err(Error::invalid(
            "devices",
            format!("{list:?} names no adapter"),
        ));
    }
    Ok(out)
}
