//! Fitting training into a memory budget (the largest batch that fits, a batch size that
//! follows the memory left) and resumable training checkpoints ([`resume`]).
//!
//! [`find_batch_size`] searches, before training, for the largest batch whose step fits the
//! device's budget, by running trial steps and catching [`Error::OutOfMemory`];
//! [`DynamicBatch`] adjusts the batch size during training from the peak memory of each
//! step. [`save_checkpoint`] writes the parameters, the optimizer's state, the loss scaler,
//! the device's random state and the caller's [`Progress`] to one safetensors file;
//! [`load_checkpoint`] restores all of it so the run continues as if it had not stopped, and
//! [`load_weights`] takes only the parameters (for inference).

pub mod resume;

pub use resume::{Progress, load_checkpoint, load_weights, save_checkpoint};

use crate::device::Device;
use crate::error::{Error, Result};

/// The largest batch size in [1, max] for which `trial(batch)` succeeds under the device's
/// budget: doubles from 1 until a trial runs out of memory, then bisects between the last
/// success and the first failure. The cache is emptied before each trial, so every trial
/// starts from the same memory state. A trial should run one full step (forward, backward,
/// optimizer) and drop what it allocated; errors other than out-of-memory are returned.
///
/// ```
/// # fn main() -> wgrad::Result<()> {
/// let dev = wgrad::Device::new()?;
/// dev.set_memory_limit(Some(64 << 20)); // a 64 MiB budget
/// // A stand-in for a training step whose batch of b samples takes b MiB.
/// let best = wgrad::train::find_batch_size(&dev, 1000, |b| {
///     dev.zeros(&[b, 1 << 18], wgrad::DType::F32).map(drop)
/// })?;
/// assert!((32..=64).contains(&best));
/// # Ok(())
/// # }
/// ```
pub fn find_batch_size(
    dev: &Device,
    max: usize,
    mut trial: impl FnMut(usize) -> Result<()>,
) -> Result<usize> {
    let mut run = |b: usize| -> Result<bool> {
        dev.sync()?;
        dev.empty_cache();
        match trial(b) {
            Ok(()) => {
                dev.sync()?;
                Ok(true)
            }
            Err(e) if e.is_oom() => Ok(false),
            Err(e) => Err(e),
        }
    };
    let mut good = 0usize;
    let mut bad = None;
    let mut b = 1usize;
    while b <= max {
        if run(b)? {
            good = b;
            b *= 2;
        } else {
            bad = Some(b);
            break;
        }
    }
    if good == 0 {
        return Err(Error::OutOfMemory {
            requested: 0,
            limit: dev.memory_stats().limit,
            allocated: dev.memory_stats().allocated,
            reserved: dev.memory_stats().reserved,
            largest_free: dev.memory_stats().largest_free,
        });
    }
    let mut hi = bad.unwrap_or(max + 1).min(max + 1);
    while hi - good > 1 {
        let mid = good + (hi - good) / 2;
        if run(mid)? {
            good = mid;
        } else {
            hi = mid;
        }
    }
    dev.empty_cache();
    Ok(good)
}

/// A batch size that adapts to the memory left under the budget: after each step, when less
/// than `shrink_below` (20%) of the budget was free at the step's peak, the batch shrinks by
/// a quarter; when more than `grow_above` (70%) was free, it grows by a quarter.
#[derive(Clone, Debug)]
pub struct DynamicBatch {
    /// Current batch size.
    pub size: usize,
    /// Never below this.
    pub min: usize,
    /// Never above this.
    pub max: usize,
    /// Shrink when the free fraction at peak falls under this.
    pub shrink_below: f64,
    /// Grow when the free fraction at peak rises over this.
    pub grow_above: f64,
}

impl DynamicBatch {
    /// Starting at `size`, within [min, max].
    pub fn new(size: usize, min: usize, max: usize) -> Self {
        DynamicBatch {
            size: size.clamp(min.max(1), max.max(1)),
            min: min.max(1),
            max: max.max(1),
            shrink_below: 0.2,
            grow_above: 0.7,
        }
    }

    /// Adjusts from the device's peak since the last call (which it resets) and returns the
    /// next batch size. Without a budget the size stays.
    pub fn adjust(&mut self, dev: &Device) -> usize {
        let s = dev.memory_stats();
        dev.reset_peak();
        if s.limit == u64::MAX || s.limit == 0 {
            return self.size;
        }
        let free = 1.0 - s.peak_reserved.max(s.peak_allocated) as f64 / s.limit as f64;
        self.adjust_for(free)
    }

    /// The rule on its own: `free` is the fraction of the budget free at the last step's peak.
    pub fn adjust_for(&mut self, free: f64) -> usize {
        if free < self.shrink_below {
            self.size = (self.size - self.size / 4).max(self.min);
        } else if free > self.grow_above {
            self.size = (self.size + (self.size / 4).max(1)).min(self.max);
        }
        self.size
    }
}
