//! Data parallelism across processes and hosts on MPI (feature `mpi`, off by default; Open
//! MPI or any MPI the `mpi` crate builds against). `mpirun -np N program` starts one process
//! per GPU; each builds its model on its own device, [`MpiGroup::broadcast_params`] makes
//! the weights equal, and [`MpiGroup::backward`] replaces `loss.backward()`: gradient buckets
//! are read back as the backward pass completes them (as in [`DataParallel`](super::DataParallel)),
//! then summed across processes with `MPI_Allreduce` in f32 and averaged. MPI does the
//! networking; wgrad adds none of its own.

use super::bucket::{Tracker, bucket_dtype, buckets, flatten, set_grads, widen_into};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use mpi::collective::SystemOperation;
use mpi::traits::{Communicator, CommunicatorCollectives, Root};
use std::time::{Duration, Instant};

/// This process's place in an MPI job, and the gradient exchange between the processes.
pub struct MpiGroup {
    world: mpi::topology::SimpleCommunicator,
    bucket_bytes: u64,
    // Finalises MPI when dropped: declared last, so it goes after the communicator.
    _universe: mpi::environment::Universe,
}

impl MpiGroup {
    /// Initialises MPI (once per process; a second call is an error). Without `mpirun` the
    /// process is a group of one.
    pub fn init() -> Result<MpiGroup> {
        let universe = mpi::initialize()
            .ok_or_else(|| Error::invalid("MpiGroup::init", "MPI is already initialised"))?;
        Ok(MpiGroup {
            world: universe.world(),
            bucket_bytes: 4 << 20,
            _universe: universe,
        })
    }

    /// This process's rank, 0 .. size.
    pub fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    /// Processes in the job.
    pub fn size(&self) -> usize {
        self.world.size() as usize
    }

    /// The rank among the processes on this host (Open MPI's and MPICH's launchers say it;
    /// otherwise the global rank): the adapter index a process should open.
    pub fn local_rank(&self) -> usize {
        [
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "MPI_LOCALRANKID",
            "SLURM_LOCALID",
        ]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.parse().ok())
        .unwrap_or_else(|| self.rank())
    }

    /// Gradient bytes per bucket (default 4 MiB).
    pub fn set_bucket_bytes(&mut self, bytes: u64) {
        self.bucket_bytes = bytes;
    }

    /// Copies rank 0's parameter values to every process.
    pub fn broadcast_params(&self, params: &[(String, Tensor)]) -> Result<()> {
        let root = self.world.process_at_rank(0);
        for (_, p) in params {
            let mut bytes = if self.rank() == 0 {
                p.read_bytes_async()?.wait()?
            } else {
                vec![0u8; p.dtype().bytes(p.numel()) as usize]
            };
            root.broadcast_into(&mut bytes[..]);
            if self.rank() != 0 {
                p.write_bytes(&bytes)?;
            }
        }
        Ok(())
    }

    /// `loss.backward()`, then every parameter's gradient becomes the mean over the processes.
    /// Buckets are read back as the backward pass completes them. Returns the time spent
    /// waiting for read-backs and in `MPI_Allreduce`.
    pub fn backward(&self, loss: &Tensor, params: &[(String, Tensor)]) -> Result<Duration> {
        let bks = buckets(params, self.bucket_bytes);
        let mut tracker = Tracker::new(params, &bks);
        let mut reads: Vec<Option<crate::device::Readback<u8>>> =
            (0..bks.len()).map(|_| None).collect();
        loss.backward_hooked(&mut |leaf| {
            if let Some(b) = tracker.complete(leaf) {
                reads[b] = Some(flatten(params, &bks[b])?.read_bytes_async()?);
            }
            Ok(())
        })?;
        let t0 = Instant::now();
        let inv = 1.0 / self.size() as f32;
        // Buffers kept across the buckets: fresh memory per bucket costs page faults.
        let (mut local, mut sum) = (Vec::new(), Vec::new());
        for (b, ps) in bks.iter().enumerate() {
            let rb = match reads[b].take() {
                Some(rb) => rb,
                None => {
                    // Parameters the loss did not use: zero gradients, as on every process.
                    for &i in ps {
                        let p = &params[i].1;
                        if p.grad().is_none() {
                            p.set_grad(Some(Tensor::zeros(p.device(), p.shape(), p.dtype())?));
                        }
                    }
                    flatten(params, ps)?.read_bytes_async()?
                }
            };
            let dtype = bucket_dtype(params, ps);
            rb.wait_with(|bytes| widen_into(bytes, dtype, &mut local))?;
            sum.clear();
            sum.resize(local.len(), 0.0);
            self.world
                .all_reduce_into(&local[..], &mut sum[..], SystemOperation::sum());
            sum.iter_mut().for_each(|s| *s *= inv);
            let dev = params[ps[0]].1.device();
            set_grads(params, ps, &Tensor::from_slice(dev, &sum, &[sum.len()])?)?;
        }
        Ok(t0.elapsed())
    }

    /// The mean of `x` over the processes (for logging a loss).
    pub fn mean(&self, x: f32) -> f32 {
        let mut s = 0.0f32;
        self.world
            .all_reduce_into(&x, &mut s, SystemOperation::sum());
        s / self.size() as f32
    }

    /// Whether every process holds exactly the same parameter values (a checksum of the bytes,
    /// compared through MPI).
    pub fn params_identical(&self, params: &[(String, Tensor)]) -> Result<bool> {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for (_, p) in params {
            for byte in p.read_bytes_async()?.wait()? {
                h = (h ^ byte as u64).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        let (mut lo, mut hi) = (0u64, 0u64);
        self.world
            .all_reduce_into(&h, &mut lo, SystemOperation::min());
        self.world
            .all_reduce_into(&h, &mut hi, SystemOperation::max());
        Ok(lo == hi)
    }
}
