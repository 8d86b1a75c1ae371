//! A data loader that prepares and uploads the next batches while the current step runs.
//!
//! Worker threads collate samples into host buffers and upload them through the device's
//! staging memory (the upload is recorded in the ordered command stream, so it is safe to use
//! the tensor as soon as it arrives). The training thread only receives ready GPU tensors:
//! with enough prefetch, a step costs max(compute, host preparation) rather than their sum.

use super::dataset::Dataset;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

/// How batches are formed and how far ahead they are prepared.
#[derive(Clone, Debug)]
pub struct LoaderOptions {
    /// Samples per batch.
    pub batch_size: usize,
    /// Visit samples in a seeded random order each epoch.
    pub shuffle: bool,
    /// Seed of the shuffle (each epoch mixes in its number).
    pub seed: u64,
    /// Drop a last batch smaller than `batch_size`.
    pub drop_last: bool,
    /// Threads collating and uploading batches (0: the training thread does it).
    pub workers: usize,
    /// Batches each worker may have ready ahead of the training thread.
    pub prefetch: usize,
}

impl Default for LoaderOptions {
    fn default() -> Self {
        LoaderOptions {
            batch_size: 64,
            shuffle: true,
            seed: 0,
            drop_last: false,
            workers: 2,
            prefetch: 2,
        }
    }
}

/// One batch on the device: features [batch, x_shape...] and labels [batch, y_shape...].
pub struct Batch {
    /// Features.
    pub x: Tensor,
    /// Labels (u32).
    pub y: Tensor,
    /// Dataset indices of the samples, in batch order.
    pub indices: Vec<usize>,
}

/// Batches of a dataset on a device.
///
/// ```
/// use wgrad::data::{Batch, DataLoader, InMemory, LoaderOptions};
/// # fn main() -> wgrad::Result<()> {
/// let dev = wgrad::Device::new()?;
/// // Six samples of two features each, with a class label apiece.
/// let x: Vec<f32> = (0..12).map(|v| v as f32).collect();
/// let ds = InMemory::new(x, vec![0, 1, 0, 1, 0, 1], &[2])?;
/// let opts = LoaderOptions { batch_size: 4, seed: 1, ..Default::default() };
/// let loader = DataLoader::new(&dev, ds, opts)?;
/// assert_eq!(loader.batches_per_epoch(), 2); // 4 + 2
///
/// let batches = loader.epoch(0).collect::<wgrad::Result<Vec<Batch>>>()?;
/// assert_eq!(batches[0].x.shape(), [4, 2]); // on the device
/// assert_eq!(batches[1].y.shape(), [2]);
/// // Shuffled, and every sample once; a sample's features stay with its label.
/// let mut seen: Vec<usize> = batches.iter().flat_map(|b| b.indices.clone()).collect();
/// let first = &batches[0];
/// assert_eq!(first.x.to_vec::<f32>()?[0], 2.0 * first.indices[0] as f32);
/// assert_eq!(first.y.to_vec::<u32>()?[0], first.indices[0] as u32 % 2);
/// seen.sort();
/// assert_eq!(seen, [0, 1, 2, 3, 4, 5]);
/// assert_eq!(loader.order(0), loader.order(0)); // an epoch's order is reproducible
/// # Ok(())
/// # }
/// ```
pub struct DataLoader<D: Dataset> {
    ds: Arc<D>,
    dev: Device,
    opts: LoaderOptions,
}

/// splitmix64: a small, well-mixed generator for the shuffle.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E3779B97F4A7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
    z ^ (z >> 31)
}

impl<D: Dataset> DataLoader<D> {
    /// A loader; errors on a zero batch size.
    pub fn new(dev: &Device, ds: D, opts: LoaderOptions) -> Result<Self> {
        if opts.batch_size == 0 {
            return Err(Error::invalid("DataLoader", "batch size 0"));
        }
        Ok(DataLoader {
            ds: Arc::new(ds),
            dev: dev.clone(),
            opts,
        })
    }

    /// The dataset.
    pub fn dataset(&self) -> &D {
        &self.ds
    }

    /// The options.
    pub fn options(&self) -> &LoaderOptions {
        &self.opts
    }

    /// Batches in one epoch.
    pub fn batches_per_epoch(&self) -> usize {
        let n = self.ds.len();
        if self.opts.drop_last {
            n / self.opts.batch_size
        } else {
            n.div_ceil(self.opts.batch_size)
        }
    }

    /// The order samples are visited in during `epoch` (Fisher-Yates on a seeded generator).
    pub fn order(&self, epoch: u64) -> Vec<usize> {
        let n = self.ds.len();
        let mut v: Vec<usize> = (0..n).collect();
        if self.opts.shuffle {
            let mut s = mix(self.opts.seed ^ mix(epoch));
            for i in (1..n).rev() {
                s = mix(s);
                let j = (s % (i as u64 + 1)) as usize;
                v.swap(i, j);
            }
        }
        v
    }

    fn plan(&self, epoch: u64) -> Vec<Vec<usize>> {
        let order = self.order(epoch);
        let mut out: Vec<Vec<usize>> = order
            .chunks(self.opts.batch_size)
            .map(|c| c.to_vec())
            .collect();
        if self.opts.drop_last && out.last().is_some_and(|b| b.len() < self.opts.batch_size) {
            out.pop();
        }
        out
    }

    /// The batches of `epoch`, in order. With workers, they are prepared ahead.
    pub fn epoch(&self, epoch: u64) -> Epoch<D> {
        let plan = Arc::new(self.plan(epoch));
        let workers = self.opts.workers.min(plan.len());
        let mut rx = Vec::new();
        let mut handles = Vec::new();
        for w in 0..workers {
            let (tx, r): (SyncSender<Result<Batch>>, Receiver<Result<Batch>>) =
                sync_channel(self.opts.prefetch.max(1));
            let (ds, dev, plan) = (Arc::clone(&self.ds), self.dev.clone(), Arc::clone(&plan));
            handles.push(std::thread::spawn(move || {
                for b in (w..plan.len()).step_by(workers) {
                    let batch = make_batch(&*ds, &dev, &plan[b]);
                    // The receiver went away (the epoch was dropped): stop quietly.
                    if tx.send(batch).is_err() {
                        return;
                    }
                }
            }));
            rx.push(r);
        }
        Epoch {
            ds: Arc::clone(&self.ds),
            dev: self.dev.clone(),
            plan,
            next: 0,
            rx,
            handles,
        }
    }
}

/// Collates the samples `indices` and uploads them.
pub(crate) fn make_batch<D: Dataset + ?Sized>(
    ds: &D,
    dev: &Device,
    indices: &[usize],
) -> Result<Batch> {
    let xs = ds.x_shape();
    let ys = ds.y_shape();
    let (xn, yn) = (xs.iter().product::<usize>(), ys.iter().product::<usize>());
    let b = indices.len();
    let mut x = vec![<D::X as bytemuck::Zeroable>::zeroed(); b * xn];
    let mut y = vec![0u32; b * yn];
    for (k, &i) in indices.iter().enumerate() {
        ds.get(
            i,
            &mut x[k * xn..(k + 1) * xn],
            &mut y[k * yn..(k + 1) * yn],
        )?;
    }
    let mut xshape = vec![b];
    xshape.extend(xs);
    let mut yshape = vec![b];
    yshape.extend(ys);
    Ok(Batch {
        x: Tensor::from_slice(dev, &x, &xshape)?,
        y: Tensor::from_slice(dev, &y, &yshape)?,
        indices: indices.to_vec(),
    })
}

/// An epoch in progress: an iterator of batches.
pub struct Epoch<D: Dataset> {
    ds: Arc<D>,
    dev: Device,
    plan: Arc<Vec<Vec<usize>>>,
    next: usize,
    rx: Vec<Receiver<Result<Batch>>>,
    handles: Vec<JoinHandle<()>>,
}

impl<D: Dataset> Iterator for Epoch<D> {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if self.next >= self.plan.len() {
            return None;
        }
        let b = self.next;
        self.next += 1;
        if self.rx.is_empty() {
            return Some(make_batch(&*self.ds, &self.dev, &self.plan[b]));
        }
        let w = b % self.rx.len();
        Some(self.rx[w].recv().unwrap_or_else(|_| {
            Err(Error::invalid(
                "DataLoader",
                "a worker thread stopped (it panicked)",
            ))
        }))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.plan.len() - self.next;
        (left, Some(left))
    }
}

impl<D: Dataset> Drop for Epoch<D> {
    fn drop(&mut self) {
        // Closing the channels makes blocked workers return; then wait for them.
        self.rx.clear();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}
