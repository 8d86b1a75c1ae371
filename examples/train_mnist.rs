//! Trains a small CNN (or an MLP) on MNIST and reports held-out accuracy, speed and memory.
//!
//! ```text
//! cargo run --release --example train_mnist -- [--model cnn|mlp] [--epochs 4] [--batch-size 64]
//!     [--lr 0.002] [--seed 0] [--data DIR] [--workers 2] [--devices LIST] [--mpi]
//! ```
//!
//! By default it uses the MNIST test set shipped in `data/mnist` (10,000 images): the first
//! 8,000 for training and the last 2,000 held out (a fixed split, so runs are comparable).
//! With `--data DIR` it reads the full MNIST files from DIR (train-* for training, t10k-* held
//! out). The last line is for scripts: `accuracy=... images_per_s=... peak_mem_mb=...`.
//!
//! `main` is the whole recipe on one device, top to bottom: open a device, load the images,
//! build the model and its optimizer, then for every batch run the forward pass, the loss,
//! `backward`, the optimizer's `step` and `zero_grad`. `train_parallel`, at the end, runs the
//! same recipe on several replicas (`--devices`) or processes (`--mpi`).

#[path = "common/mnist_cnn.rs"]
mod mnist_cnn;
#[path = "common/mpi_group.rs"]
mod mpi_group;
#[path = "common/repo.rs"]
mod repo;

use indicatif::{ProgressBar, ProgressStyle};
use mpi_group::MpiGroup;
use std::path::{Path, PathBuf};
use std::time::Instant;
use wgrad::data::{DataLoader, Dataset, InMemory, LoaderOptions};
use wgrad::nn::{Activation, Flatten, Linear, Module, Sequential};
use wgrad::optim::{Adam, LrSchedule, Optimizer};
use wgrad::parallel::DataParallel;
use wgrad::{DType, Device, Result, Tensor};

/// Trains a small CNN (or an MLP) on MNIST and reports held-out accuracy, speed and memory.
#[derive(clap::Parser, Debug)]
#[command(name = "train_mnist")]
struct Args {
    /// The network.
    #[arg(long, default_value = "cnn", value_parser = ["cnn", "mlp"])]
    model: String,
    /// Passes over the training images.
    #[arg(long, default_value_t = 4)]
    epochs: usize,
    /// Images per step.
    #[arg(long = "batch-size", default_value_t = 64)]
    batch: usize,
    /// Adam's learning rate (cosine-decayed).
    #[arg(long, default_value_t = 2e-3)]
    lr: f32,
    /// Seed of initialisation and shuffling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// A directory with the full MNIST files (train-*, t10k-*) instead of the shipped subset.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Loader threads.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Train data-parallel on these adapters (indices in `Device::all()`'s order, e.g. 0,1;
    /// repeat one for two replicas on one adapter). Each replica takes --batch-size images of
    /// its own share of the training set per step.
    #[arg(long, value_name = "LIST")]
    devices: Option<String>,
    /// One process per GPU under `mpirun -np N` (build with `--features mpi`): each process
    /// trains on its share of the images on its host's adapter number local-rank, and the
    /// gradients are averaged across processes with MPI. Rank 0 reports.
    #[arg(long, conflicts_with = "devices")]
    mpi: bool,
}

fn main() -> Result<()> {
    let a = <Args as clap::Parser>::parse();
    if a.devices.is_some() || a.mpi {
        return train_parallel(&a);
    }

    // A device: the best adapter wgpu finds. Its seed fixes the initial weights.
    let dev = Device::new()?;
    dev.manual_seed(a.seed);
    eprintln!("{}\n", dev.info());

    // The images stay on the host. The loader shuffles them, forms batches on its worker
    // threads and uploads each batch ahead of the step that needs it.
    let (train, held) = load_mnist(a.data.as_deref())?;
    eprintln!(
        "training on {} images, {} held out; model {}",
        train.len(),
        held.len(),
        a.model
    );
    let loader = DataLoader::new(
        &dev,
        train,
        LoaderOptions {
            batch_size: a.batch,
            shuffle: true,
            seed: a.seed,
            drop_last: true,
            workers: a.workers,
            prefetch: 2,
        },
    )?;

    // The model, and Adam over its parameters. The learning rate warms up for a quarter of
    // an epoch, then decays along a cosine to 5% of its peak at the end of training.
    let net = model(&dev, &a.model)?;
    let params = net.params();
    let n_params: usize = params.iter().map(|(_, t)| t.numel()).sum();
    eprintln!("{n_params} parameters in {} tensors", params.len());
    let mut opt = Adam::new(params, a.lr)?;
    let steps = loader.batches_per_epoch() as u64;
    let sched = LrSchedule {
        base: a.lr,
        min: a.lr * 0.05,
        warmup: steps / 4,
        total: steps * a.epochs as u64,
    };

    let mut step = 0u64;
    let mut acc = 0.0;
    let mut train_time = 0.0;
    let mut images = 0usize;
    dev.reset_peak();
    for epoch in 0..a.epochs {
        let bar = epoch_bar(epoch, a.epochs, steps, true);
        let t0 = Instant::now();
        // The losses are summed on the device and read once an epoch: reading one every step
        // would make the host wait for that step to finish before queueing the next.
        let mut loss_sum = Tensor::zeros(&dev, &[], DType::F32)?;
        for b in loader.epoch(epoch as u64) {
            let b = b?;
            opt.set_lr(sched.at(step));
            let loss = net.forward(&b.x)?.cross_entropy(&b.y)?;
            loss.backward()?;
            opt.step()?;
            opt.zero_grad();
            loss_sum = wgrad::no_grad(|| loss_sum.add(&loss))?;
            images += b.indices.len();
            step += 1;
            bar.inc(1);
        }
        let mean_loss = loss_sum.to_scalar()? / steps as f32;
        dev.sync()?;
        let dt = t0.elapsed().as_secs_f64();
        train_time += dt;
        bar.finish_and_clear();
        acc = accuracy(&dev, &net, &held, a.batch)?;
        let per_s = (steps as usize * a.batch) as f64 / dt;
        print_epoch(&dev, epoch, a.epochs, mean_loss, acc, per_s);
    }
    print_summary(&dev, acc, images as f64 / train_time);
    Ok(())
}

/// The training images and the held-out ones: the shipped 10,000 split 8,000 / 2,000, or
/// with `dir` the full MNIST training and test files.
fn load_mnist(dir: Option<&Path>) -> Result<(InMemory<f32>, InMemory<f32>)> {
    Ok(match dir {
        None => {
            let root = repo::repo_root().join("data/mnist");
            let all = wgrad::data::mnist::load(&root, "t10k")?;
            (all.subset(0..8000)?, all.subset(8000..10_000)?)
        }
        Some(dir) => (
            wgrad::data::mnist::load(dir, "train")?,
            wgrad::data::mnist::load(dir, "t10k")?,
        ),
    })
}

/// The network: the shared MNIST CNN, or a one-hidden-layer MLP.
fn model(dev: &Device, kind: &str) -> Result<Sequential> {
    let dt = DType::F32;
    Ok(match kind {
        "mlp" => Sequential::new()
            .add("flatten", Flatten)
            .add("fc1", Linear::new(dev, 784, 256, true, dt)?)
            .add("relu", Activation::Relu)
            .add("fc2", Linear::new(dev, 256, 10, true, dt)?),
        _ => mnist_cnn::cnn(dev, dt)?,
    })
}

/// Fraction of `ds` the model classifies correctly. Evaluation mode and `no_grad` (no graph
/// is recorded); the hits are counted on the device and read once.
fn accuracy(dev: &Device, net: &Sequential, ds: &InMemory<f32>, batch: usize) -> Result<f64> {
    net.train(false);
    let n = ds.len();
    let loader = DataLoader::new(
        dev,
        ds.subset(0..n)?,
        LoaderOptions {
            batch_size: batch * 4,
            shuffle: false,
            workers: 1,
            ..Default::default()
        },
    )?;
    let mut correct = Tensor::zeros(dev, &[], DType::F32)?;
    wgrad::no_grad(|| -> Result<()> {
        for b in loader.epoch(0) {
            let b = b?;
            let pred = net.forward(&b.x)?.argmax(-1, false)?.to_dtype(DType::F32)?;
            let hits = pred.eq(&b.y.to_dtype(DType::F32)?)?.sum_all()?;
            correct = correct.add(&hits)?;
        }
        Ok(())
    })?;
    net.train(true);
    Ok(correct.to_scalar()? as f64 / n as f64)
}

/// A progress bar over one epoch's steps (hidden where another process reports).
fn epoch_bar(epoch: usize, epochs: usize, steps: u64, visible: bool) -> ProgressBar {
    let bar = if visible {
        ProgressBar::new(steps)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("epoch {msg} [{bar:30}] {pos}/{len} {per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(format!("{}/{}", epoch + 1, epochs));
    bar
}

fn print_epoch(dev: &Device, epoch: usize, epochs: usize, loss: f32, acc: f64, per_s: f64) {
    let s = dev.memory_stats();
    println!(
        "epoch {}/{}  loss {loss:.4}  held-out accuracy {acc:.4}  {per_s:.0} images/s  peak {:.1} MiB allocated, {:.1} MiB reserved",
        epoch + 1,
        epochs,
        s.peak_allocated as f64 / 1048576.0,
        s.peak_reserved as f64 / 1048576.0
    );
}

/// The memory report, then the line scripts read.
fn print_summary(dev: &Device, acc: f64, images_per_s: f64) {
    println!("\n{}\n", dev.memory_report());
    let peak = dev.memory_stats().peak_allocated as f64 / 1048576.0;
    println!("accuracy={acc:.4} images_per_s={images_per_s:.0} peak_mem_mb={peak:.1}");
}

/// The recipe of `main` on several replicas: with `--devices`, one replica per listed
/// adapter in this process ([`DataParallel`] averages their gradients after each backward
/// pass); with `--mpi`, one process per GPU (MPI averages the gradients). Every replica
/// starts from the same weights and trains on its own share of the images with its own
/// optimizer; the averaged gradients keep the replicas equal.
fn train_parallel(a: &Args) -> Result<()> {
    let group = if a.mpi { Some(MpiGroup::init()?) } else { None };
    let (rank, ranks) = group.as_ref().map_or((0, 1), |g| (g.rank(), g.size()));
    let root_rank = rank == 0;
    let devices = mpi_group::devices(a.devices.as_deref(), group.as_ref())?;
    let dev = devices[0].clone();
    for d in &devices {
        d.manual_seed(a.seed);
    }
    eprintln!("{}\n", dev.info());

    let (train, held) = load_mnist(a.data.as_deref())?;
    // Under MPI each process trains on its share of the images.
    let train = if ranks > 1 {
        let n = train.len();
        train.subset(rank * n / ranks..(rank + 1) * n / ranks)?
    } else {
        train
    };
    let n_train = train.len();
    eprintln!(
        "training on {n_train} images, {} held out; model {}",
        held.len(),
        a.model
    );

    let replicas = devices.len();
    let dp = DataParallel::new(devices, |d| model(d, &a.model))?;
    let params = dp.replicas()[0].1.params();
    let n_params: usize = params.iter().map(|(_, t)| t.numel()).sum();
    eprintln!(
        "{} parameters in {} tensors{}",
        n_params,
        params.len(),
        if replicas > 1 {
            format!(", {replicas} replicas (data parallel)")
        } else {
            String::new()
        }
    );
    if let Some(g) = &group {
        // Every process starts from rank 0's weights.
        g.broadcast_params(&params)?;
    }
    let mut opts = dp
        .replicas()
        .iter()
        .map(|(_, m)| Adam::new(m.params(), a.lr))
        .collect::<Result<Vec<_>>>()?;
    // Each replica reads its own share of the training set, shuffled with its own seed.
    let loaders = dp
        .replicas()
        .iter()
        .enumerate()
        .map(|(r, (d, _))| {
            DataLoader::new(
                d,
                train.subset(r * n_train / replicas..(r + 1) * n_train / replicas)?,
                LoaderOptions {
                    batch_size: a.batch,
                    shuffle: true,
                    seed: a.seed.wrapping_add(r as u64),
                    drop_last: true,
                    workers: a.workers,
                    prefetch: 2,
                },
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let net = &dp.replicas()[0].1;
    let steps = loaders[0].batches_per_epoch() as u64;
    let sched = LrSchedule {
        base: a.lr,
        min: a.lr * 0.05,
        warmup: steps / 4,
        total: steps * a.epochs as u64,
    };

    let mut step = 0u64;
    let mut acc = 0.0;
    let mut train_time = 0.0;
    let mut images = 0usize;
    dev.reset_peak();
    for epoch in 0..a.epochs {
        let bar = epoch_bar(epoch, a.epochs, steps, root_rank);
        let t0 = Instant::now();
        let mut loss_sum = Tensor::zeros(&dev, &[], DType::F32)?;
        let mut epochs: Vec<_> = loaders.iter().map(|l| l.epoch(epoch as u64)).collect();
        'steps: loop {
            // One batch per replica; the epoch ends when any replica's share runs out.
            let mut batches = Vec::with_capacity(replicas);
            for e in &mut epochs {
                match e.next() {
                    Some(b) => batches.push(b?),
                    None => break 'steps,
                }
            }
            for o in &mut opts {
                o.set_lr(sched.at(step));
            }
            let loss = match &group {
                Some(g) => {
                    // Backward, with the gradients averaged across processes.
                    let b = &batches[0];
                    let l = net.forward(&b.x)?.cross_entropy(&b.y)?;
                    g.backward(&l, &params)?;
                    l.detach()
                }
                None => {
                    // Forward and backward on every replica, each on its own thread, and the
                    // gradients averaged across replicas.
                    let rep =
                        dp.step(&batches, |_, net, b| net.forward(&b.x)?.cross_entropy(&b.y))?;
                    rep.losses[0].clone()
                }
            };
            for o in &mut opts {
                o.step()?;
                o.zero_grad();
            }
            // This process's (first replica's) loss, summed on the device.
            loss_sum = wgrad::no_grad(|| loss_sum.add(&loss))?;
            images += batches.iter().map(|b| b.indices.len()).sum::<usize>();
            step += 1;
            bar.inc(1);
        }
        let mean_loss = loss_sum.to_scalar()? / steps as f32;
        dev.sync()?;
        let dt = t0.elapsed().as_secs_f64();
        train_time += dt;
        bar.finish_and_clear();
        acc = accuracy(&dev, net, &held, a.batch)?;
        if root_rank {
            let per_s = (steps as usize * a.batch * replicas * ranks) as f64 / dt;
            print_epoch(&dev, epoch, a.epochs, mean_loss, acc, per_s);
        }
    }
    if root_rank {
        // Images of every process (each trains the same number of steps).
        print_summary(&dev, acc, (images * ranks) as f64 / train_time);
    }
    Ok(())
}
