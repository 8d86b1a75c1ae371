//! Data parallelism in one process: a replica of the model on each device, each fed its own
//! shard of the batch on its own thread, gradients averaged across replicas after every
//! backward pass.
//!
//! Gradients travel in buckets of parameters (about [`DataParallel::DEFAULT_BUCKET_BYTES`]
//! each, counted in f32, filled from the last parameter backwards, the order the backward
//! pass finishes them). A replica queues the read-back of a bucket the moment the last of its
//! gradients is complete ([`Tensor::backward_hooked`]) and goes on queueing the rest of its
//! backward pass, so the device copies the early buckets out while it computes the late
//! gradients. The calling thread waits for the buckets once every replica has queued its
//! whole backward pass (waiting earlier, on a device another thread is still submitting to,
//! gains nothing: docs/performance.md, multi-GPU), then, on one thread per replica,
//! uploads each
//! replica's bucket to every other device straight from its mapped read-back memory. Each
//! device then averages the replicas' buckets itself. Buckets of f16 (bf16) parameters travel
//! as f16 (bf16), half the bytes of f32.
//!
//! The host does no arithmetic: each device sums the buckets in replica order, in f32, and
//! scales by 1/n, so replicas on identical adapters compute bit-identical means and keep
//! bit-identical parameters.
//!
//! The replicas alone scale with the devices; the exchange costs a roughly fixed time a
//! step, so the speed-up grows with the batch a device (docs/performance.md, multi-GPU).
//! Every step drains the devices: the update needs every replica's gradients, and the host
//! is the only path between the devices (wgpu has no peer-to-peer copies).

use super::bucket::{Tracker, buckets, flatten, set_grads};
use crate::device::{Device, Readback};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::nn::Module;
use crate::tensor::Tensor;
use std::collections::HashMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What one [`DataParallel::step`] did.
#[derive(Clone, Debug)]
pub struct StepReport {
    /// Each replica's loss (one element, on its device, not read back: reading it waits for
    /// the step to finish), in device order.
    pub losses: Vec<Tensor>,
    /// Wall time of the step (forward, backward, exchange).
    pub total: Duration,
    /// Wall time until every replica had queued its forward and backward passes (the host's
    /// own work; the devices run behind it).
    pub queued: Duration,
    /// Wall time until the last gradient bucket of every replica was back on the host: about
    /// when the devices finished the backward pass.
    pub last_bucket: Duration,
    /// Time the host spent blocked waiting for gradient read-backs: the part of the exchange
    /// the computation did not hide.
    pub exchange_wait: Duration,
    /// Time the host spent queueing the devices' sums of the buckets and setting the
    /// gradients.
    pub exchange_sum: Duration,
    /// Time the host spent copying each replica's buckets to the other devices.
    pub exchange_upload: Duration,
    /// Buckets exchanged.
    pub buckets: usize,
    /// Bytes of gradients each replica sent (16-bit for f16 and bf16 models, else f32).
    pub bytes: u64,
}

/// One replica per device; see the module documentation.
///
/// Two devices on one adapter behave as two GPUs would (slower), so this runs anywhere:
///
/// ```
/// use wgrad::nn::{Linear, Module};
/// use wgrad::parallel::DataParallel;
/// use wgrad::{DType, Device};
/// # fn main() -> wgrad::Result<()> {
/// let devices = vec![Device::new()?, Device::new()?];
/// let dp = DataParallel::new(devices, |dev| Linear::new(dev, 2, 1, false, DType::F32))?;
/// let weights = |r: usize| dp.replicas()[r].1.weight.to_vec::<f32>();
/// assert_eq!(weights(0)?, weights(1)?); // every replica starts from replica 0's weights
///
/// // One shard of the batch per replica; each replica's loss is the sum of its outputs.
/// let shards = [[1.0f32, 0.0], [0.0, 1.0]];
/// let report = dp.step(&shards, |_, model, x| {
///     let x = model.weight.device().tensor(x, &[1, 2])?;
///     model.forward(&x)?.sum_all()
/// })?;
/// assert_eq!(report.losses.len(), 2);
/// // Each replica's own gradient was its shard; both now hold the mean.
/// for (_, model) in dp.replicas() {
///     assert_eq!(model.weight.grad().unwrap().to_vec::<f32>()?, [0.5, 0.5]);
/// }
/// # Ok(())
/// # }
/// ```
pub struct DataParallel<M: Module> {
    replicas: Vec<(Device, M)>,
    /// Parameters of each replica, in one order.
    params: Vec<Vec<(String, Tensor)>>,
    /// Parameter indices of each bucket.
    buckets: Vec<Vec<usize>>,
}

/// A replica's flattened bucket on its device, and its read-back in flight.
struct Sent {
    flat: Tensor,
    bytes: Readback<u8>,
}

enum Msg {
    Bucket(usize, usize, Sent),
    Done(usize, Result<Tensor>),
}

impl<M: Module> DataParallel<M> {
    /// Gradient bytes per bucket by default (counted in f32). Each bucket costs a read-back
    /// and uploads, so fewer, larger buckets are faster: of 1, 4 and 16 MiB, 16 ran the GPT
    /// step of `train_gpt` (43 MB of f32 gradients) fastest (docs/performance.md, multi-GPU).
    pub const DEFAULT_BUCKET_BYTES: u64 = 16 << 20;

    /// Builds a replica on each device with `build`, then copies the first replica's parameters
    /// into the others, so every replica starts from the same weights.
    pub fn new(devices: Vec<Device>, build: impl Fn(&Device) -> Result<M>) -> Result<Self> {
        if devices.is_empty() {
            return Err(Error::invalid("DataParallel", "no devices"));
        }
        let replicas = devices
            .into_iter()
            .map(|d| build(&d).map(|m| (d, m)))
            .collect::<Result<Vec<_>>>()?;
        let params: Vec<Vec<(String, Tensor)>> = replicas.iter().map(|(_, m)| m.params()).collect();
        for (r, p) in params.iter().enumerate().skip(1) {
            let same = p.len() == params[0].len()
                && p.iter().zip(&params[0]).all(|((na, a), (nb, b))| {
                    na == nb && a.shape() == b.shape() && a.dtype() == b.dtype()
                });
            if !same {
                return Err(Error::invalid(
                    "DataParallel",
                    format!("replica {r} has other parameters than replica 0"),
                ));
            }
        }
        let mut dp = DataParallel {
            replicas,
            params,
            buckets: Vec::new(),
        };
        dp.set_bucket_bytes(Self::DEFAULT_BUCKET_BYTES);
        dp.broadcast_params()?;
        Ok(dp)
    }

    /// Regroups the parameters into buckets of about `bytes` of gradients each (at least one
    /// parameter per bucket): smaller buckets start the exchange earlier, larger ones pay fewer
    /// read-backs.
    pub fn set_bucket_bytes(&mut self, bytes: u64) {
        self.buckets = buckets(&self.params[0], bytes);
    }

    /// The devices and their replicas (build one optimizer per replica from its parameters).
    pub fn replicas(&self) -> &[(Device, M)] {
        &self.replicas
    }

    /// Copies the first replica's parameters into every other replica (through the host).
    pub fn broadcast_params(&self) -> Result<()> {
        for (i, (_, p0)) in self.params[0].iter().enumerate() {
            if self.replicas.len() == 1 {
                break;
            }
            let bytes = p0.read_bytes_async()?.wait()?;
            for p in &self.params[1..] {
                p[i].1.write_bytes(&bytes)?;
            }
        }
        Ok(())
    }

    /// One data-parallel step: replica r runs `loss(r, model, &inputs[r])` (a one-element loss,
    /// each replica on its own thread) and its backward pass (in a scope named "backward" on
    /// its device, for profiles), and every replica's gradients
    /// become the mean over the replicas. With shards of equal size and a mean loss, this is
    /// the gradient of the whole batch. Step each replica's optimizer afterwards, on a thread
    /// per replica when the update waits on its device (a loss scaler's found-inf check): in
    /// turn, each replica waits for the one before, which gives back much of the speed-up
    /// (docs/performance.md, multi-GPU), and [`Device::flush`] each device after
    /// queueing its update, so it
    /// starts while the host queues the next forward pass.
    pub fn step<I: Sync>(
        &self,
        inputs: &[I],
        loss: impl Fn(usize, &M, &I) -> Result<Tensor> + Sync,
    ) -> Result<StepReport> {
        self.run(inputs, loss, true)
    }

    /// [`DataParallel::step`] without the exchange (PyTorch DDP's `no_sync`): each replica's
    /// gradients accumulate its own shard only. For gradient accumulation: some local steps,
    /// then one `step`, which averages what every replica accumulated.
    pub fn step_no_sync<I: Sync>(
        &self,
        inputs: &[I],
        loss: impl Fn(usize, &M, &I) -> Result<Tensor> + Sync,
    ) -> Result<StepReport> {
        self.run(inputs, loss, false)
    }

    fn run<I: Sync>(
        &self,
        inputs: &[I],
        loss: impl Fn(usize, &M, &I) -> Result<Tensor> + Sync,
        sync: bool,
    ) -> Result<StepReport> {
        let n = self.replicas.len();
        if inputs.len() != n {
            return Err(Error::invalid(
                "DataParallel::step",
                format!("{} inputs for {n} replicas", inputs.len()),
            ));
        }
        let t0 = Instant::now();
        if n == 1 || !sync {
            // Nothing to exchange: the plain step, one replica per thread.
            let losses = std::thread::scope(|sc| -> Result<Vec<Tensor>> {
                let hs: Vec<_> = self
                    .replicas
                    .iter()
                    .zip(inputs)
                    .enumerate()
                    .skip(1)
                    .map(|(r, ((dev, m), input))| {
                        let loss = &loss;
                        sc.spawn(move || Self::local_pass(r, dev, m, input, loss))
                    })
                    .collect();
                let (dev, m) = &self.replicas[0];
                let mut out = vec![Self::local_pass(0, dev, m, &inputs[0], &loss)?];
                for h in hs {
                    out.push(h.join().unwrap_or_else(|_| {
                        Err(Error::Internal("a replica thread panicked".into()))
                    })?);
                }
                Ok(out)
            })?;
            let total = t0.elapsed();
            return Ok(StepReport {
                losses,
                total,
                queued: total,
                last_bucket: Duration::ZERO,
                exchange_wait: Duration::ZERO,
                exchange_sum: Duration::ZERO,
                exchange_upload: Duration::ZERO,
                buckets: 0,
                bytes: 0,
            });
        }
        let (tx, rx) = mpsc::channel::<Msg>();
        let loss = &loss;
        let mut losses: Vec<Option<Tensor>> = (0..n).map(|_| None).collect();
        let mut times = [Duration::ZERO; 3];
        let mut queued = Duration::ZERO;
        let mut last_bucket = Duration::ZERO;
        let mut bytes = 0u64;
        let outcome = std::thread::scope(|scope| -> Result<()> {
            for (r, ((_, model), input)) in self.replicas.iter().zip(inputs).enumerate() {
                let tx = tx.clone();
                let params = &self.params[r];
                let buckets = &self.buckets;
                scope.spawn(move || {
                    let res = self.replica_pass(r, model, input, params, buckets, loss, &tx);
                    // The receiver outlives the scope; a send cannot fail while it waits.
                    let _ = tx.send(Msg::Done(r, res));
                });
            }
            drop(tx);
            // Collect the buckets' read-backs as replicas queue them.
            let mut arrived: HashMap<usize, Vec<Option<Sent>>> = HashMap::new();
            let mut first_err: Option<Error> = None;
            let mut done = 0;
            while done < n {
                let Ok(msg) = rx.recv() else {
                    return Err(Error::Internal(
                        "a replica thread ended without reporting".into(),
                    ));
                };
                match msg {
                    Msg::Done(r, res) => {
                        done += 1;
                        match res {
                            Ok(l) => losses[r] = Some(l),
                            Err(e) => {
                                first_err.get_or_insert(e);
                            }
                        }
                    }
                    Msg::Bucket(r, b, rb) => {
                        let slot = arrived
                            .entry(b)
                            .or_insert_with(|| (0..n).map(|_| None).collect());
                        slot[r] = Some(rb);
                    }
                }
            }
            queued = t0.elapsed();
            // Every replica has queued its backward pass: reduce, in bucket order.
            if first_err.is_none() {
                for b in 0..self.buckets.len() {
                    let Some(reads) = arrived.remove(&b) else {
                        return Err(Error::Internal(format!(
                            "gradient bucket {b} never arrived"
                        )));
                    };
                    if reads.iter().any(Option::is_none) {
                        return Err(Error::Internal(format!(
                            "gradient bucket {b} did not arrive from every replica"
                        )));
                    }
                    let (sent, arrived) = self.reduce(b, reads, &mut times)?;
                    bytes += sent;
                    last_bucket = arrived.duration_since(t0);
                }
            }
            match first_err {
                Some(e) => Err(e),
                None => Ok(()),
            }
        });
        outcome?;
        Ok(StepReport {
            losses: losses.into_iter().flatten().collect(),
            total: t0.elapsed(),
            queued,
            last_bucket,
            exchange_wait: times[0],
            exchange_sum: times[1],
            exchange_upload: times[2],
            buckets: self.buckets.len(),
            bytes,
        })
    }

    /// Forward and backward on one replica, no exchange.
    fn local_pass<I>(
        r: usize,
        dev: &Device,
        model: &M,
        input: &I,
        loss: &(impl Fn(usize, &M, &I) -> Result<Tensor> + Sync),
    ) -> Result<Tensor> {
        let l = loss(r, model, input)?;
        dev.begin_scope("backward");
        let done = l.backward();
        dev.end_scope();
        done?;
        Ok(l.detach())
    }

    /// Forward and backward on one replica, sending each bucket as its gradients complete.
    #[allow(clippy::too_many_arguments)]
    fn replica_pass<I>(
        &self,
        r: usize,
        model: &M,
        input: &I,
        params: &[(String, Tensor)],
        buckets: &[Vec<usize>],
        loss: &(impl Fn(usize, &M, &I) -> Result<Tensor> + Sync),
        tx: &mpsc::Sender<Msg>,
    ) -> Result<Tensor> {
        let l = loss(r, model, input)?;
        // The device starts on the forward pass while this thread queues the backward: every
        // step drains it (the update waits for the exchange), and the first batch of
        // dispatches would otherwise go only with the first bucket's read-back (with the flush
        // after the update, this shortens the step: docs/performance.md, multi-GPU).
        self.replicas[r].0.flush()?;
        let mut tracker = Tracker::new(params, buckets);
        let mut sent = vec![false; buckets.len()];
        let send = |b: usize, sent: &mut Vec<bool>| -> Result<()> {
            let flat = flatten(params, &buckets[b])?;
            let bytes = flat.read_bytes_async()?;
            sent[b] = true;
            tx.send(Msg::Bucket(r, b, Sent { flat, bytes }))
                .map_err(|_| Error::Internal("the step's collector has gone".into()))
        };
        let dev = &self.replicas[r].0;
        dev.begin_scope("backward");
        let done = l.backward_hooked(&mut |leaf| match tracker.complete(leaf) {
            Some(b) => send(b, &mut sent),
            None => Ok(()),
        });
        dev.end_scope();
        done?;
        // Parameters the loss did not use have no gradient: zeros, as in every replica.
        for b in 0..buckets.len() {
            if !sent[b] {
                for &i in &buckets[b] {
                    let p = &params[i].1;
                    if p.grad().is_none() {
                        p.set_grad(Some(Tensor::zeros(p.device(), p.shape(), p.dtype())?));
                    }
                }
                send(b, &mut sent)?;
            }
        }
        Ok(l.detach())
    }

    /// Waits for bucket `b` from every replica and makes every replica's gradients the mean.
    /// Each replica's bytes are uploaded to every other device straight from the mapped
    /// read-back memory (no host arithmetic: widening and summing on the host cost more than
    /// the step's computation); each device then sums the
    /// replicas' buckets in replica order, in f32, and scales by 1/n, so replicas on
    /// identical adapters compute identical means. Returns the bytes one replica sent.
    /// Adds the time spent waiting, summing and uploading to `times`.
    /// Also returns when the last replica's bytes were here.
    fn reduce(
        &self,
        b: usize,
        sent: Vec<Option<Sent>>,
        times: &mut [Duration; 3],
    ) -> Result<(u64, Instant)> {
        let n = sent.len();
        let sent: Vec<Sent> = sent.into_iter().flatten().collect();
        if sent.len() != n {
            return Err(Error::Internal(format!(
                "gradient bucket {b} did not arrive from every replica"
            )));
        }
        let (len, dtype) = (sent[0].flat.numel(), sent[0].flat.dtype());
        let devs: Vec<&Device> = self.replicas.iter().map(|(d, _)| d).collect();
        // One thread per source replica: wait for its bytes, upload them to every other
        // device. received[s][d] is replica s's bucket on device d.
        let t = Instant::now();
        let (flats, reads): (Vec<Tensor>, Vec<Readback<u8>>) =
            sent.into_iter().map(|x| (x.flat, x.bytes)).unzip();
        // Each thread returns its copies and when its bytes were here.
        type Moved = Result<(Vec<Option<Tensor>>, Instant)>;
        let moved: Vec<Moved> = std::thread::scope(|sc| {
            let hs: Vec<_> = reads
                .into_iter()
                .enumerate()
                .map(|(s, rb)| {
                    let devs = &devs;
                    sc.spawn(move || -> Moved {
                        let mut here = t;
                        let copies = rb.wait_with(|bytes| {
                            here = Instant::now();
                            devs.iter()
                                .enumerate()
                                .map(|(d, dev)| {
                                    if d == s {
                                        return Ok(None);
                                    }
                                    let t = Tensor::uninit(dev, &[len], dtype)?;
                                    t.write_bytes(bytes)?;
                                    Ok(Some(t))
                                })
                                .collect::<Result<Vec<_>>>()
                        })??;
                        Ok((copies, here))
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::Internal("a read-back thread panicked".into()))
                    })
                })
                .collect()
        });
        let moving = t.elapsed();
        let mut received = Vec::with_capacity(n);
        let mut arrived = t;
        for m in moved {
            let (copies, here) = m?;
            arrived = arrived.max(here);
            received.push(copies);
        }
        let waited = arrived.duration_since(t);
        times[0] += waited;
        times[2] += moving.saturating_sub(waited);
        // On each device: the mean, in replica order, then the parameters' gradients.
        let t = Instant::now();
        let inv = 1.0 / n as f32;
        for d in 0..n {
            let mean = crate::autograd::no_grad(|| -> Result<Tensor> {
                let mut acc: Option<Tensor> = None;
                for (s, copies) in received.iter().enumerate() {
                    let part = match &copies[d] {
                        Some(t) => t,
                        None => &flats[s],
                    };
                    let part = part.to_dtype(DType::F32)?;
                    acc = Some(match acc {
                        None => part,
                        Some(a) => a.add(&part)?,
                    });
                }
                let acc = acc.ok_or_else(|| Error::Internal("no replicas to reduce".into()))?;
                acc.mul_scalar(inv)?.to_dtype(dtype)
            })?;
            set_grads(&self.params[d], &self.buckets[b], &mean)?;
        }
        times[1] += t.elapsed();
        Ok((dtype.bytes(len), arrived))
    }
}
