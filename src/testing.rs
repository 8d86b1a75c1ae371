//! Hooks for this crate's own tests and benchmarks, kept out of the documented API: they
//! reach below the tensor level (raw blocks, uninitialised storage) on purpose.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Copies `src` into `dst` with the driver's buffer copy (not a kernel); both must be dense,
/// hold the same number of bytes and live in different pages. For measuring memory bandwidth.
pub fn raw_copy(src: &Tensor, dst: &Tensor) -> Result<()> {
    if src.nbytes() != dst.nbytes() {
        return Err(Error::shape(
            "raw_copy",
            format!("{} vs {} bytes", src.nbytes(), dst.nbytes()),
        ));
    }
    src.device().copy_blocks(
        src.dense_block("raw_copy")?,
        dst.dense_block("raw_copy")?,
        src.nbytes(),
    )
}

/// An uninitialised tensor (poisoned when the device poisons); for tests of poisoning.
pub fn poison_probe(dev: &Device, shape: &[usize], dtype: DType) -> Result<Tensor> {
    Tensor::uninit(dev, shape, dtype)
}

/// Allocates and frees one block of `bytes`; returns its offset (allocation-latency bench).
pub fn bench_alloc(dev: &Device, bytes: u64) -> Result<u64> {
    let b = dev.alloc(bytes)?;
    Ok(b.offset())
}

/// Makes every decode step's attention split the cache every `span` positions (a multiple of
/// 64), as GPUs do, on any adapter; `None` restores the adapter's own choice. Process-wide:
/// for tests of the split path on a CPU adapter.
pub fn force_decode_span(span: Option<usize>) {
    crate::kernels::decode::force_span(span);
}
