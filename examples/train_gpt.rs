//! A character-level GPT on tinyshakespeare (nanoGPT's shakespeare-char run), resumable.
//!
//! cargo run --release --example train_gpt -- --help
//!
//! The model is in `examples/common/gpt.rs`: token and position embeddings, pre-norm blocks
//! (causal fused attention, GELU MLP 4x; dropout on the embeddings, on the attention weights
//! inside the fused kernel and on both residual branches, as nanoGPT), a final LayerNorm and
//! a head that shares the token embedding's weights. This file reads the text, trains the
//! model, benchmarks a step and samples. Training: AdamW (betas 0.9, 0.99), warm-up then
//! cosine decay, gradient clipping at 1, decided on the device with the loss scaler's
//! overflow check, so the host queues step after step without waiting (the progress line
//! shows the previous step's loss, read back while the next one runs). The first 90% of the
//! text trains, the last 10% validates.
//!
//! Defaults fit the adapter: nanoGPT's configuration (6 layers, 6 heads, width 384, context
//! 256, batch 64, 5000 steps, f16 storage) on a GPU; a small one on a CPU adapter (lavapipe)
//! that finishes in a few minutes. Every `--eval-every` steps the run prints train and
//! validation loss (means over a fixed set of batches) and writes `DIR/checkpoint.safetensors`
//! (weights, optimizer state, loss scaler, random state, data position: `--resume` continues
//! exactly) and `DIR/loss.svg`. At the end it prints a sample and a line for scripts:
//! `val_loss=... tokens_per_s=... peak_mem_mb=...`.
//!
//! `--generate` samples from a saved checkpoint without training (no optimizer is built).
//! `--bench N` times N training steps (after at least 3 warm-up steps and 250 ms of them: the
//! GPU's clock falls while the first steps compile their kernels) and, with `--profile`,
//! breaks one step down by kernel and by scope.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use wgrad::nn::Module;
use wgrad::optim::{Adam, GradScaler, Group, LrSchedule, Optimizer};
use wgrad::parallel::DataParallel;
use wgrad::train::{Progress, load_checkpoint, load_weights, save_checkpoint};
use wgrad::{DType, Device, Error, Readback, Result, Tensor};

#[path = "common/gpt.rs"]
mod gpt;
#[path = "common/mpi_group.rs"]
mod mpi_group;
#[path = "common/plot.rs"]
mod plot;
#[path = "common/repo.rs"]
mod repo;
use gpt::{Gpt, GptConfig};
use mpi_group::MpiGroup;

/// Set on the ranks other than 0 under mpirun: only rank 0 reports.
static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

macro_rules! say {
    ($($t:tt)*) => {
        if !QUIET.load(std::sync::atomic::Ordering::Relaxed) {
            println!($($t)*)
        }
    };
}

macro_rules! say_err {
    ($($t:tt)*) => {
        if !QUIET.load(std::sync::atomic::Ordering::Relaxed) {
            eprint!($($t)*)
        }
    };
}

/// A character-level GPT on tinyshakespeare, resumable. Options left out take the
/// adapter's defaults: nanoGPT's shakespeare-char configuration on a GPU, a small model that
/// trains in a few minutes on a CPU adapter.
#[derive(clap::Parser, Debug)]
#[command(name = "train_gpt")]
struct Args {
    /// Transformer blocks.
    #[arg(long)]
    layers: Option<usize>,
    /// Attention heads per block (must divide --width).
    #[arg(long)]
    heads: Option<usize>,
    /// Model width.
    #[arg(long)]
    width: Option<usize>,
    /// Context length in characters.
    #[arg(long)]
    context: Option<usize>,
    /// Sequences per step.
    #[arg(long)]
    batch: Option<usize>,
    /// Training steps.
    #[arg(long)]
    steps: Option<u64>,
    /// Peak learning rate.
    #[arg(long)]
    lr: Option<f32>,
    /// Learning rate at the end of the cosine decay.
    #[arg(long)]
    min_lr: Option<f32>,
    /// Warm-up steps.
    #[arg(long)]
    warmup: Option<u64>,
    /// AdamW's decoupled weight decay.
    #[arg(long)]
    weight_decay: Option<f32>,
    /// Dropout probability (embeddings, attention weights and residual branches).
    #[arg(long)]
    dropout: Option<f32>,
    /// Storage dtype: f32, f16 (with a loss scaler) or bf16 (without one). Default: f16 on a
    /// GPU, f32 on a CPU.
    #[arg(long)]
    dtype: Option<DType>,
    /// Same as --dtype f16.
    #[arg(long, conflicts_with_all = ["dtype", "fp32"])]
    fp16: bool,
    /// Same as --dtype f32.
    #[arg(long, conflicts_with = "dtype")]
    fp32: bool,
    /// Recompute each block in the backward pass (less memory).
    #[arg(long)]
    checkpoint: bool,
    /// Seed of initialisation, dropout and data order.
    #[arg(long, default_value_t = 1337)]
    seed: u64,
    /// Text file to train on [default: data/tinyshakespeare/input.txt].
    #[arg(long)]
    data: Option<PathBuf>,
    /// Directory for the checkpoint and the loss curve [default: target/train_gpt].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue from OUT/checkpoint.safetensors.
    #[arg(long)]
    resume: bool,
    /// Steps between evaluations (and checkpoints).
    #[arg(long)]
    eval_every: Option<u64>,
    /// Batches averaged per evaluation.
    #[arg(long)]
    eval_batches: Option<usize>,
    /// Sample from OUT/checkpoint.safetensors without training.
    #[arg(long)]
    generate: bool,
    /// Characters to sample.
    #[arg(long)]
    sample_len: Option<usize>,
    /// Sampling temperature.
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// Sample among the k most likely characters.
    #[arg(long, default_value_t = 20)]
    top_k: usize,
    /// Time N training steps (after 3 warm-up steps and at least 250 ms of them), no
    /// evaluation.
    #[arg(long, default_value_t = 0, value_name = "N")]
    bench: u64,
    /// With --bench: break one step down by kernel and scope.
    #[arg(long)]
    profile: bool,
    /// With --bench: steps queued one at a time onto an idle device to time the host's own
    /// work (their median is reported; the host's time moves run to run).
    #[arg(long, default_value_t = 5, value_name = "N")]
    host_steps: usize,
    /// Train data-parallel on these adapters (indices in `Device::all()`'s order, e.g. 0,1;
    /// repeat one to put two replicas on one adapter). --batch is per device.
    #[arg(long, value_name = "LIST")]
    devices: Option<String>,
    /// One process per GPU under `mpirun -np N` (build with `--features mpi`): each process
    /// trains on its own batches on its host's adapter number local-rank, gradients are
    /// averaged with MPI, rank 0 reports and saves. --batch is per process.
    #[arg(long, conflicts_with = "devices")]
    mpi: bool,
    /// With --devices: skip the gradient exchange (replicas then train apart), to measure
    /// what the exchange costs in --bench.
    #[arg(long)]
    no_sync: bool,
    /// Gradient bucket size of the data-parallel exchange, in MiB (of f32 gradients).
    #[arg(long, default_value_t = 16)]
    bucket_mib: u64,
    /// List the adapters --devices can name, and exit.
    #[arg(long)]
    list_devices: bool,
}

#[derive(Clone, Debug)]
struct Cfg {
    layers: usize,
    heads: usize,
    width: usize,
    context: usize,
    batch: usize,
    steps: u64,
    lr: f32,
    min_lr: f32,
    warmup: u64,
    weight_decay: f32,
    dropout: f32,
    dtype: DType,
    checkpoint: bool,
    seed: u64,
    data: PathBuf,
    out: PathBuf,
    resume: bool,
    eval_every: u64,
    eval_batches: usize,
    generate: bool,
    sample_len: usize,
    temperature: f32,
    top_k: usize,
    bench: u64,
    profile: bool,
    host_steps: usize,
}

impl Cfg {
    /// nanoGPT's shakespeare-char configuration on a GPU; a small one on a CPU adapter.
    fn defaults(cpu: bool) -> Cfg {
        let root = repo::repo_root();
        let base = Cfg {
            layers: 6,
            heads: 6,
            width: 384,
            context: 256,
            batch: 64,
            steps: 5000,
            lr: 1e-3,
            min_lr: 1e-4,
            warmup: 100,
            weight_decay: 0.1,
            dropout: 0.2,
            dtype: DType::F16,
            checkpoint: false,
            seed: 1337,
            data: root.join("data/tinyshakespeare/input.txt"),
            out: root.join("target/train_gpt"),
            resume: false,
            eval_every: 250,
            eval_batches: 20,
            generate: false,
            sample_len: 500,
            temperature: 0.8,
            top_k: 20,
            bench: 0,
            profile: false,
            host_steps: 5,
        };
        if !cpu {
            return base;
        }
        Cfg {
            layers: 2,
            heads: 2,
            width: 64,
            context: 64,
            batch: 16,
            steps: 400,
            lr: 3e-3,
            min_lr: 3e-4,
            warmup: 20,
            dropout: 0.0,
            dtype: DType::F32,
            eval_every: 100,
            eval_batches: 8,
            sample_len: 200,
            ..base
        }
    }

    /// The model's configuration for a vocabulary of `vocab` characters.
    fn model(&self, vocab: usize) -> GptConfig {
        GptConfig {
            vocab,
            layers: self.layers,
            heads: self.heads,
            width: self.width,
            context: self.context,
            dropout: self.dropout,
            dtype: self.dtype,
            checkpoint: self.checkpoint,
        }
    }

    /// The parts that must match for a checkpoint to fit.
    fn model_key(&self) -> String {
        format!(
            "layers={} heads={} width={} context={} dtype={}",
            self.layers, self.heads, self.width, self.context, self.dtype
        )
    }
}

impl Cfg {
    /// The adapter's defaults with the command line's choices on top.
    fn from_args(a: Args, cpu: bool) -> std::result::Result<Cfg, String> {
        let d = Cfg::defaults(cpu);
        let dtype = match (a.dtype, a.fp16, a.fp32) {
            (Some(t), _, _) => t,
            (None, true, _) => DType::F16,
            (None, _, true) => DType::F32,
            _ => d.dtype,
        };
        let c = Cfg {
            layers: a.layers.unwrap_or(d.layers),
            heads: a.heads.unwrap_or(d.heads),
            width: a.width.unwrap_or(d.width),
            context: a.context.unwrap_or(d.context),
            batch: a.batch.unwrap_or(d.batch),
            steps: a.steps.unwrap_or(d.steps),
            lr: a.lr.unwrap_or(d.lr),
            min_lr: a.min_lr.unwrap_or(d.min_lr),
            warmup: a.warmup.unwrap_or(d.warmup),
            weight_decay: a.weight_decay.unwrap_or(d.weight_decay),
            dropout: a.dropout.unwrap_or(d.dropout),
            dtype,
            checkpoint: a.checkpoint,
            seed: a.seed,
            data: a.data.unwrap_or(d.data),
            out: a.out.unwrap_or(d.out),
            resume: a.resume,
            eval_every: a.eval_every.unwrap_or(d.eval_every),
            eval_batches: a.eval_batches.unwrap_or(d.eval_batches),
            generate: a.generate,
            sample_len: a.sample_len.unwrap_or(d.sample_len),
            temperature: a.temperature,
            top_k: a.top_k,
            bench: a.bench,
            profile: a.profile,
            host_steps: a.host_steps.max(1),
        };
        if !c.dtype.is_float() {
            return Err(format!("--dtype {} is not a float dtype", c.dtype));
        }
        if c.heads == 0 || !c.width.is_multiple_of(c.heads) || c.context == 0 || c.batch == 0 {
            return Err(format!(
                "width {} must split into {} heads; context and batch must be positive",
                c.width, c.heads
            ));
        }
        Ok(c)
    }
}

// ----- data -----

/// The text as character ids, its vocabulary, and the 90/10 split point.
struct Text {
    ids: Vec<u32>,
    vocab: Vec<char>,
    split: usize,
}

impl Text {
    fn read(path: &PathBuf, context: usize) -> Result<Text> {
        let text = std::fs::read_to_string(path)?;
        let mut vocab: Vec<char> = text.chars().collect();
        vocab.sort_unstable();
        vocab.dedup();
        let ids: Vec<u32> = text
            .chars()
            .map(|ch| vocab.binary_search(&ch).unwrap_or(0) as u32)
            .collect();
        let split = ids.len() * 9 / 10;
        if split < context + 2 || ids.len() - split < context + 2 {
            return Err(Error::Format {
                path: path.display().to_string(),
                detail: format!(
                    "{} characters are too few for a context of {context}",
                    ids.len()
                ),
            });
        }
        Ok(Text { ids, vocab, split })
    }

    fn decode(&self, ids: &[u32]) -> String {
        ids.iter().map(|&i| self.vocab[i as usize]).collect()
    }
}

/// xorshift64: the sampler's whole state is one number, which checkpoints keep.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// A batch of windows from [lo, hi) of the text: inputs [batch, context] and next characters.
fn batch(
    dev: &Device,
    t: &Text,
    (lo, hi): (usize, usize),
    c: &Cfg,
    state: &mut u64,
) -> Result<(Tensor, Tensor)> {
    let mut x = Vec::with_capacity(c.batch * c.context);
    let mut y = Vec::with_capacity(c.batch * c.context);
    for _ in 0..c.batch {
        let start = lo + (next(state) % (hi - lo - c.context - 1) as u64) as usize;
        x.extend_from_slice(&t.ids[start..start + c.context]);
        y.extend_from_slice(&t.ids[start + 1..start + c.context + 1]);
    }
    Ok((
        Tensor::from_slice(dev, &x, &[c.batch, c.context])?,
        Tensor::from_slice(dev, &y, &[c.batch * c.context])?,
    ))
}

// ----- training -----

/// One model per device (a plain model on one device), each with its AdamW and, for f16, its
/// loss scaler. Replicas see the same averaged gradients, so they make the same decisions.
struct Trainer {
    dp: DataParallel<Gpt>,
    opts: Vec<Adam>,
    /// The loss scalers (f16), or scale-1 guards that clip and catch inf and NaN (f32).
    scalers: Vec<GradScaler>,
    /// Under mpirun: the other processes (this one has one replica).
    mpi: Option<MpiGroup>,
    /// Skip the exchange between replicas (a diagnostic).
    no_sync: bool,
}

impl Trainer {
    /// The first replica: evaluation, sampling and checkpoints use it.
    fn model(&self) -> (&Device, &Gpt) {
        let (d, g) = &self.dp.replicas()[0];
        (d, g)
    }
}

/// One step queued on every replica: forward, cross-entropy, backward (scaled with f16),
/// gradients averaged across replicas, clipped AdamW update. The clipping, the overflow check
/// and the loss scale are decided on the device, so nothing waits for the GPU here (except
/// the exchange between replicas). Returns each replica's loss (on its device, not read back:
/// see `mean_of`) and how long the host waited for gradient read-backs.
fn train_step(
    t: &mut Trainer,
    text: &Text,
    c: &Cfg,
    range: (usize, usize),
    lr: f32,
    data: &mut u64,
) -> Result<(Vec<Tensor>, HostTimes)> {
    // Each replica's loss scale, as a view of its scaler's state on the device.
    let scales = t
        .scalers
        .iter_mut()
        .zip(t.dp.replicas())
        .map(|(s, (dev, _))| s.scale_tensor(dev))
        .collect::<Result<Vec<_>>>()?;
    let unscaled: Vec<Mutex<Option<Tensor>>> = scales.iter().map(|_| Mutex::new(None)).collect();
    let forward = |r: usize, g: &Gpt, x: &Tensor, y: &Tensor| -> Result<Tensor> {
        let dev = x.device();
        dev.begin_scope("forward");
        let loss = g.loss(x, y)?;
        dev.end_scope();
        if let Ok(mut u) = unscaled[r].lock() {
            *u = Some(loss.detach());
        }
        loss.mul(&scales[r])
    };
    let mut host = match &t.mpi {
        Some(group) => {
            // Every process draws the same batches from the one data stream (so resuming is
            // exact) and trains on the one of its rank.
            let (dev, g) = &t.dp.replicas()[0];
            let mut mine = None;
            for k in 0..group.size() {
                if k == group.rank() {
                    mine = Some(batch(dev, text, range, c, data)?);
                } else {
                    (0..c.batch).for_each(|_| {
                        next(data);
                    });
                }
            }
            let (x, y) = mine.ok_or_else(|| Error::Internal("no batch for this rank".into()))?;
            let loss = forward(0, g, &x, &y)?;
            dev.begin_scope("backward");
            let wait = group.backward(&loss, &g.params());
            dev.end_scope();
            let w = wait?;
            HostTimes {
                wait: w,
                exchange_end: w,
                ..Default::default()
            }
        }
        None => {
            // One batch per replica, drawn in order from the one data stream.
            let batches =
                t.dp.replicas()
                    .iter()
                    .map(|(dev, _)| batch(dev, text, range, c, data))
                    .collect::<Result<Vec<_>>>()?;
            let f = |r: usize, g: &Gpt, (x, y): &(Tensor, Tensor)| forward(r, g, x, y);
            let report = if t.no_sync {
                t.dp.step_no_sync(&batches, f)?
            } else {
                t.dp.step(&batches, f)?
            };
            HostTimes {
                wait: report.exchange_wait,
                sum: report.exchange_sum,
                upload: report.exchange_upload,
                queued: report.queued,
                exchange_end: report.total,
                last_bucket: report.last_bucket,
                update: Default::default(),
            }
        }
    };
    // Each replica's update on its own thread, the first one's on this thread (collecting the
    // last step's decision may wait on that device, and one replica's wait should not hold up
    // the other's update).
    let f32_run = c.dtype != DType::F16;
    let update = |opt: &mut Adam, scaler: &mut GradScaler, dev: &Device| -> Result<()> {
        dev.begin_scope("optimizer");
        opt.set_lr(lr);
        let r = scaler.step_deferred(opt, Some(1.0));
        opt.zero_grad();
        dev.end_scope();
        r?;
        // Submitted now, the update runs while the next forward pass is queued (the exchange
        // left the device idle; see DataParallel::step).
        dev.flush()?;
        // Without loss scaling a non-finite gradient is an error (found one step late; the
        // device skipped that update).
        if f32_run && scaler.skipped() > 0 {
            return Err(Error::Invalid {
                op: "train_gpt",
                detail: "a gradient held inf or NaN (the update was skipped)".into(),
            });
        }
        Ok(())
    };
    let mut jobs = t.opts.iter_mut().zip(&mut t.scalers).zip(t.dp.replicas());
    let t_update = Instant::now();
    std::thread::scope(|sc| -> Result<()> {
        let first = jobs.next();
        // (One replica, as most runs have, spawns nothing.)
        let hs: Vec<_> = jobs
            .map(|((opt, scaler), (dev, _))| sc.spawn(move || update(opt, scaler, dev)))
            .collect();
        if let Some(((opt, scaler), (dev, _))) = first {
            update(opt, scaler, dev)?;
        }
        for h in hs {
            h.join()
                .unwrap_or_else(|_| Err(Error::Internal("an optimizer thread panicked".into())))?;
        }
        Ok(())
    })?;
    let losses = unscaled
        .into_iter()
        .map(|u| {
            u.into_inner()
                .ok()
                .flatten()
                .ok_or_else(|| Error::Internal("a replica computed no loss".into()))
        })
        .collect::<Result<Vec<_>>>()?;
    host.update = t_update.elapsed();
    Ok((losses, host))
}

/// Where the host's time went in a training step (summed over the steps of --bench).
#[derive(Clone, Copy, Default)]
struct HostTimes {
    /// Blocked on gradient read-backs (under mpirun: the whole exchange).
    wait: std::time::Duration,
    /// Queueing the devices' sums of the buckets.
    sum: std::time::Duration,
    /// Copying the buckets to the other devices.
    upload: std::time::Duration,
    /// Until every replica had queued its forward and backward passes.
    queued: std::time::Duration,
    /// Until the last bucket's read-back was complete.
    last_bucket: std::time::Duration,
    /// Until the exchange ended.
    exchange_end: std::time::Duration,
    /// Queueing the updates.
    update: std::time::Duration,
}

impl std::ops::AddAssign for HostTimes {
    fn add_assign(&mut self, o: HostTimes) {
        self.wait += o.wait;
        self.sum += o.sum;
        self.upload += o.upload;
        self.queued += o.queued;
        self.last_bucket += o.last_bucket;
        self.exchange_end += o.exchange_end;
        self.update += o.update;
    }
}

/// The mean of the replicas' losses (of every process under mpirun).
fn mean_of(t: &Trainer, losses: &[f32]) -> f32 {
    let mean = losses.iter().sum::<f32>() / losses.len().max(1) as f32;
    match &t.mpi {
        Some(group) => group.mean(mean),
        None => mean,
    }
}

fn mean_loss(
    dev: &Device,
    g: &Gpt,
    t: &Text,
    range: (usize, usize),
    c: &Cfg,
    seed: u64,
) -> Result<f32> {
    g.train(false);
    let mut state = seed;
    let mut sum = 0.0;
    for _ in 0..c.eval_batches {
        let (x, y) = batch(dev, t, range, c, &mut state)?;
        sum += wgrad::no_grad(|| g.loss(&x, &y))?.to_scalar()?;
    }
    g.train(true);
    Ok(sum / c.eval_batches.max(1) as f32)
}

/// Samples `len` characters after `prompt`, feeding the last `context` characters each step.
fn generate(dev: &Device, g: &Gpt, t: &Text, c: &Cfg, prompt: &[u32], seed: u64) -> Result<String> {
    g.train(false);
    let mut ids = prompt.to_vec();
    let mut state = seed | 1;
    for _ in 0..c.sample_len {
        let window = &ids[ids.len().saturating_sub(g.context)..];
        let x = Tensor::from_slice(dev, window, &[1, window.len()])?;
        let logits = wgrad::no_grad(|| g.logits(&x))?;
        let v = t.vocab.len();
        let all = logits.to_f32_vec()?;
        let last = &all[all.len() - v..];
        // Top-k, then softmax at the temperature, then one draw.
        let mut order: Vec<usize> = (0..v).collect();
        order.sort_by(|&a, &b| last[b].total_cmp(&last[a]));
        order.truncate(c.top_k.clamp(1, v));
        let top = last[order[0]];
        let w: Vec<f64> = order
            .iter()
            .map(|&i| (((last[i] - top) / c.temperature.max(1e-3)) as f64).exp())
            .collect();
        let mut r = (next(&mut state) >> 11) as f64 / (1u64 << 53) as f64 * w.iter().sum::<f64>();
        let mut pick = order[order.len() - 1];
        for (k, &wk) in w.iter().enumerate() {
            if r < wk {
                pick = order[k];
                break;
            }
            r -= wk;
        }
        ids.push(pick as u32);
    }
    Ok(t.decode(&ids[prompt.len()..]))
}

fn curve_text(v: &[(u64, f32)]) -> String {
    v.iter()
        .map(|(s, l)| format!("{s}:{l}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn curve_parse(s: Option<&String>) -> Vec<(u64, f32)> {
    s.map(|s| {
        s.split(',')
            .filter_map(|p| {
                let (a, b) = p.split_once(':')?;
                Some((a.parse().ok()?, b.parse().ok()?))
            })
            .collect()
    })
    .unwrap_or_default()
}

fn main() {
    if let Err(e) = run() {
        eprintln!("train_gpt: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    // Parsed before the device opens, so --help and typos answer at once.
    let args = <Args as clap::Parser>::parse();
    if args.list_devices {
        for a in Device::all() {
            println!(
                "#{} {} ({}, {}, {})",
                a.index, a.name, a.backend, a.device_type, a.driver
            );
        }
        return Ok(());
    }
    let group = if args.mpi {
        Some(MpiGroup::init()?)
    } else {
        None
    };
    let root = group.as_ref().is_none_or(|g| g.rank() == 0);
    QUIET.store(!root, std::sync::atomic::Ordering::Relaxed);
    let devices = mpi_group::devices(args.devices.as_deref(), group.as_ref())?;
    let dev = devices[0].clone();
    let args_bucket_mib = args.bucket_mib;
    let no_sync = args.no_sync;
    let c = match Cfg::from_args(args, dev.info().is_cpu()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("train_gpt: {e}");
            std::process::exit(2);
        }
    };
    let text = Text::read(&c.data, c.context)?;
    let vocab = text.vocab.len();
    let (train_range, val_range) = ((0, text.split), (text.split, text.ids.len()));
    std::fs::create_dir_all(&c.out)?;
    let ckpt = c.out.join("checkpoint.safetensors");
    let names: Vec<String> = devices
        .iter()
        .map(|d| {
            format!(
                "{} [{}, {}]",
                d.info().name,
                d.info().backend,
                d.info().driver
            )
        })
        .collect();
    say!(
        "adapter   {} ({:?})\nmodel     {}, vocabulary {vocab}, {} training and {} validation characters",
        names.join(" + "),
        dev.info().backend,
        c.model_key(),
        text.split,
        text.ids.len() - text.split
    );
    let replicas = devices.len();
    // Each replica's dropout draws from its own device's generator: seeded apart.
    for (r, d) in devices.iter().enumerate() {
        d.manual_seed(c.seed.wrapping_add(r as u64));
    }
    let bucket = args_bucket_mib << 20;
    let model = c.model(vocab);
    let mut dp = DataParallel::new(devices, |d| Gpt::new(d, &model))?;
    dp.set_bucket_bytes(bucket);
    let n_params: usize = dp.replicas()[0]
        .1
        .params()
        .iter()
        .map(|(_, t)| t.numel())
        .sum();
    say!(
        "          {:.2}M parameters, batch {} x {}{}",
        n_params as f64 / 1e6,
        c.batch,
        c.context,
        if replicas > 1 {
            format!(" on each of {replicas} devices (data parallel)")
        } else {
            String::new()
        }
    );

    if c.generate {
        let g = &dp.replicas()[0].1;
        load_weights(&ckpt, &g.params())?;
        say!("{}", generate(&dev, g, &text, &c, &[text.ids[0]], c.seed)?);
        return Ok(());
    }

    let opts = dp
        .replicas()
        .iter()
        .map(|(_, g)| {
            let mut opt = Adam::with(g.params(), c.lr, (0.9, 0.99), 1e-8, c.weight_decay, true)?;
            // nanoGPT's rule: weight decay on the matrices only, not on biases and norm gains.
            opt.set_groups(&Group::no_decay(&["*.bias", "*ln*.weight"]))?;
            Ok(opt)
        })
        .collect::<Result<Vec<_>>>()?;
    // f16's range needs a loss scaler; bf16 has f32's and trains without one (a scale-1
    // guard still clips on the device and catches inf and NaN).
    let scaled = c.dtype == DType::F16;
    let scalers = (0..replicas)
        .map(|_| {
            if scaled {
                GradScaler::new()
            } else {
                GradScaler::unscaled()
            }
        })
        .collect();
    if let Some(g) = &group {
        // Every process starts from rank 0's weights.
        g.broadcast_params(&dp.replicas()[0].1.params())?;
    }
    let ranks = group.as_ref().map_or(1, |g| g.size());
    let mut tr = Trainer {
        dp,
        opts,
        scalers,
        mpi: group,
        no_sync,
    };
    let sched = LrSchedule {
        base: c.lr,
        min: c.min_lr,
        warmup: c.warmup,
        total: c.steps,
    };
    let mut step = 0u64;
    let mut data = c.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let (mut train_curve, mut val_curve) = (Vec::new(), Vec::new());
    if c.resume {
        // Every replica loads the same state.
        let mut last = None;
        for ((opt, scaler), (_, g)) in tr
            .opts
            .iter_mut()
            .zip(&mut tr.scalers)
            .zip(tr.dp.replicas())
        {
            last = Some(load_checkpoint(
                &ckpt,
                &g.params(),
                opt,
                scaled.then_some(scaler),
            )?);
        }
        let p = last.ok_or_else(|| Error::Invalid {
            op: "resume",
            detail: "no replicas".into(),
        })?;
        if p.notes.get("model").map(String::as_str) != Some(c.model_key().as_str()) {
            return Err(Error::Format {
                path: ckpt.display().to_string(),
                detail: format!(
                    "saved for {:?}, this run is {}",
                    p.notes.get("model"),
                    c.model_key()
                ),
            });
        }
        (step, data) = (p.step, p.data_position);
        train_curve = curve_parse(p.notes.get("train_curve"));
        val_curve = curve_parse(p.notes.get("val_curve"));
        say!("resumed   at step {step} from {}", ckpt.display());
    }

    let one_step = |tr: &mut Trainer, step: u64, data: &mut u64| {
        train_step(tr, &text, &c, train_range, sched.at(step), data).map(|r| r.0)
    };
    let sync_all =
        |tr: &Trainer| -> Result<()> { tr.dp.replicas().iter().try_for_each(|(d, _)| d.sync()) };

    if c.bench > 0 {
        // At least 3 steps and 250 ms of them: compiling the first steps' kernels leaves the
        // GPU idle long enough for its clock to fall, and a few steps do not raise it again,
        // so steps timed straight after compiling would run slow.
        let warm = Instant::now();
        let mut warmed = 0;
        while warmed < 3 || warm.elapsed() < Duration::from_millis(250) {
            one_step(&mut tr, step, &mut data)?;
            sync_all(&tr)?;
            warmed += 1;
        }
        dev.reset_peak();
        let t0 = Instant::now();
        let mut host = HostTimes::default();
        for _ in 0..c.bench {
            host += train_step(&mut tr, &text, &c, train_range, sched.at(step), &mut data)?.1;
        }
        sync_all(&tr)?;
        let ms = t0.elapsed().as_secs_f64() * 1e3 / c.bench as f64;
        let peak = dev.memory_stats().peak_allocated as f64 / (1 << 20) as f64;
        let tps = (ranks * replicas * c.batch * c.context) as f64 / ms * 1e3;
        say!("step      {ms:.2} ms, {tps:.0} tokens/s, peak {peak:.0} MiB allocated");
        for (d, _) in tr.dp.replicas() {
            let m = d.memory_stats();
            say!(
                "staging   {} upload buffers ({} MiB), {} read-back buffers ({} MiB)",
                m.upload_buffers,
                m.upload_bytes >> 20,
                m.download_buffers,
                m.download_bytes >> 20
            );
        }
        say!("autotune  {}", wgrad::kernels::autotune_stats(&dev)?);
        if replicas * ranks == 1 {
            // The host's own time a step: steps queued one at a time onto an idle device, so that
            // nothing inside waits for it (in the loop above the update waits for the last step's
            // decision). The median of --host-steps (5). The device runs while the host
            // queues, so the step waits on the host only where this passes 100%.
            let enc0 = dev.dispatch_stats().encode_time;
            let mut alone = (0..c.host_steps)
                .map(|_| -> Result<(f64, HostTimes)> {
                    let t = Instant::now();
                    let h =
                        train_step(&mut tr, &text, &c, train_range, sched.at(step), &mut data)?.1;
                    let ms = t.elapsed().as_secs_f64() * 1e3;
                    sync_all(&tr)?;
                    Ok((ms, h))
                })
                .collect::<Result<Vec<_>>>()?;
            alone.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (host_ms, parts) = alone[alone.len() / 2];
            let d = dev.dispatch_stats();
            let enc_ms = (d.encode_time - enc0).as_secs_f64() * 1e3 / alone.len() as f64;
            say!(
                "dispatch  {} kernel launches, {} submits since the start; {:.1}% of launches reused a bind group ({} kept)",
                d.dispatches,
                d.submits,
                100.0 * d.bind_groups_reused as f64 / d.dispatches.max(1) as f64,
                d.bind_groups_kept
            );
            say!(
                "host      records and queues a step in {host_ms:.2} ms ({:.0}% of the step, overlapping the device's work)",
                100.0 * host_ms / ms
            );
            let ms_of = |d: Duration| d.as_secs_f64() * 1e3;
            say!(
                "host      of which forward and backward {:.2} ms, the update {:.2} ms",
                ms_of(parts.queued),
                ms_of(parts.update)
            );
            let (who, share) = if d.submit_thread {
                ("the submit thread encodes and submits it in", " beside it")
            } else {
                ("of which encoding and submitting take", "")
            };
            say!(
                "host      {who} {enc_ms:.2} ms ({:.0}% of the step{share})",
                100.0 * enc_ms / ms
            );
        } else {
            let per = |x: std::time::Duration| x.as_secs_f64() * 1e3 / c.bench as f64;
            say!(
                "exchange  the host waited {:.2} ms a step for gradient read-backs, queued the sums for {:.2} ms, uploaded for {:.2} ms",
                per(host.wait),
                per(host.sum),
                per(host.upload)
            );
            say!(
                "host      replicas queued forward and backward in {:.2} ms, the last bucket was back at {:.2} ms, the exchange ended at {:.2} ms, updates queued in {:.2} ms",
                per(host.queued),
                per(host.last_bucket),
                per(host.exchange_end),
                per(host.update)
            );
        }
        if c.profile {
            dev.start_profiling()?;
            let t1 = Instant::now();
            one_step(&mut tr, step, &mut data)?;
            dev.sync()?;
            let wall = t1.elapsed().as_secs_f64() * 1e3;
            let prof = dev.stop_profiling()?;
            say!("{prof}");
            for s in prof.by_scope() {
                say!(
                    "scope {:<10} {:>5} dispatches {:>9.3} ms",
                    s.name,
                    s.calls,
                    s.total.as_secs_f64() * 1e3
                );
            }
            say!(
                "profiled step: {wall:.2} ms wall, {:.2} ms in kernels",
                prof.total().as_secs_f64() * 1e3
            );
        }
        say!("bench_ms_per_step={ms:.3} tokens_per_s={tps:.0} peak_mem_mb={peak:.1}");
        return Ok(());
    }

    let val_seed = 0x0005_eed0_f7a1;
    let train_seed = 0x0007_a10f_5eed;
    let tokens = (ranks * replicas * c.batch * c.context) as f64;
    // Train and validation loss of the first replica, each over a fixed set of batches.
    let evaluate = |tr: &Trainer| -> Result<(f32, f32)> {
        let (dev, g) = tr.model();
        Ok((
            mean_loss(dev, g, &text, train_range, &c, train_seed)?,
            mean_loss(dev, g, &text, val_range, &c, val_seed)?,
        ))
    };
    let start = Instant::now();
    let first_step = step;
    let mut last_val = f32::NAN;
    if val_curve.is_empty() {
        let (tl, vl) = evaluate(&tr)?;
        say!("step {step:>5}  train {tl:.4}  val {vl:.4}");
        train_curve.push((step, tl));
        val_curve.push((step, vl));
    }
    // The loss shown is the last step's: its read-back starts when the step is queued and is
    // collected after the next one is, by when it has arrived, so the host never waits.
    let mut reading: Option<Vec<Readback<f32>>> = None;
    while step < c.steps {
        let losses = one_step(&mut tr, step, &mut data)?;
        let started = losses
            .iter()
            .map(|l| l.to_vec_async::<f32>())
            .collect::<Result<Vec<_>>>()?;
        let values = match reading.replace(started) {
            Some(last) => last
                .into_iter()
                .map(|r| Ok(r.wait()?.first().copied().unwrap_or(f32::NAN)))
                .collect::<Result<Vec<f32>>>()?,
            // The first step has no last one: its own loss, waited for this once.
            None => losses
                .iter()
                .map(|l| l.to_scalar())
                .collect::<Result<Vec<f32>>>()?,
        };
        let loss = mean_of(&tr, &values);
        step += 1;
        let done = step - first_step;
        let tps = tokens * done as f64 / start.elapsed().as_secs_f64();
        let mem = dev.memory_stats().peak_allocated as f64 / (1 << 20) as f64;
        let w = 30;
        let filled = (w as u64 * step / c.steps.max(1)) as usize;
        say_err!(
            "\r[{}{}] {step}/{}  loss {loss:.4}  {tps:.0} tokens/s  peak {mem:.0} MiB ",
            "#".repeat(filled),
            ".".repeat(w - filled),
            c.steps
        );
        if step.is_multiple_of(c.eval_every) || step == c.steps {
            let (tl, vl) = evaluate(&tr)?;
            last_val = vl;
            say_err!("\n");
            say!(
                "step {step:>5}  train {tl:.4}  val {vl:.4}  lr {:.2e}  {:.0} s",
                sched.at(step - 1),
                start.elapsed().as_secs_f64()
            );
            train_curve.push((step, tl));
            val_curve.push((step, vl));
            let mut notes = BTreeMap::new();
            notes.insert("model".to_string(), c.model_key());
            notes.insert("train_curve".to_string(), curve_text(&train_curve));
            notes.insert("val_curve".to_string(), curve_text(&val_curve));
            let progress = Progress {
                step,
                data_position: data,
                notes,
            };
            // Rank 0 saves (every process holds the same state).
            if root {
                save_checkpoint(
                    &ckpt,
                    &tr.model().1.params(),
                    &tr.opts[0],
                    scaled.then_some(&tr.scalers[0]),
                    &progress,
                )?;
                std::fs::write(
                    c.out.join("loss.svg"),
                    plot::loss_svg(&train_curve, &val_curve),
                )?;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let done = step - first_step;
    let tps = tokens * done as f64 / secs.max(1e-9);
    let peak = dev.memory_stats().peak_allocated as f64 / (1 << 20) as f64;
    if last_val.is_nan() {
        last_val = val_curve.last().map(|p| p.1).unwrap_or(f32::NAN);
    }
    let first_val = val_curve.first().map(|p| p.1).unwrap_or(f32::NAN);
    let best_val = val_curve.iter().map(|p| p.1).fold(f32::INFINITY, f32::min);
    say!(
        "\n{done} steps in {secs:.1} s; validation loss {first_val:.4} -> {last_val:.4} (best {best_val:.4}); checkpoint and loss.svg in {}",
        c.out.display()
    );
    say!(
        "sample:\n{}",
        generate(
            &dev,
            tr.model().1,
            &text,
            &c,
            &text.ids[text.split..text.split + 1],
            c.seed
        )?
    );
    std::io::stdout().flush()?;
    say!(
        "val_loss={last_val:.4} best_val_loss={best_val:.4} tokens_per_s={tps:.0} peak_mem_mb={peak:.1}"
    );
    Ok(())
}
