//! Trains a small CNN (or an MLP) on MNIST and reports held-out accuracy, speed and memory.
//!
//! ```text
//! cargo run --release --example train_mnist -- [--model cnn|mlp] [--epochs 4] [--batch-size 64]
//!     [--lr 0.002] [--seed 0] [--data DIR] [--workers 2]
//! ```
//!
//! By default it uses the MNIST test set shipped in `data/mnist` (10,000 images): the first
//! 8,000 for training and the last 2,000 held out (a fixed split, so runs are comparable).
//! With `--data DIR` it reads the full MNIST files from DIR (train-* for training, t10k-* held
//! out). The last line is for scripts: `accuracy=... images_per_s=... peak_mem_mb=...`.

#[path = "common/mnist_cnn.rs"]
mod mnist_cnn;

use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
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

#[path = "common/mpi_group.rs"]
mod mpi_group;
use mpi_group::MpiGroup;

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

/// Fraction of `ds` the model classifies correctly (counted on the device, read once).
fn accuracy(dev: &Device, net: &Sequential, ds: InMemory<f32>, batch: usize) -> Result<f64> {
    net.train(false);
    let n = ds.len();
    let loader = DataLoader::new(
        dev,
        ds,
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

fn main() -> Result<()> {
    let a = <Args as clap::Parser>::parse();
    let group = if a.mpi { Some(MpiGroup::init()?) } else { None };
    let (rank, ranks) = group.as_ref().map_or((0, 1), |g| (g.rank(), g.size()));
    let root_rank = rank == 0;
    let devices = mpi_group::devices(a.devices.as_deref(), group.as_ref())?;
    let dev = devices[0].clone();
    for d in &devices {
        d.manual_seed(a.seed);
    }
    eprintln!("{}\n", dev.info());

    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/mnist");
    let (train, held) = match &a.data {
        None => {
            let all = wgrad::data::mnist::load(&root, "t10k")?;
            (all.subset(0..8000)?, all.subset(8000..10_000)?)
        }
        Some(dir) => (
            wgrad::data::mnist::load(dir, "train")?,
            wgrad::data::mnist::load(dir, "t10k")?,
        ),
    };
    // Under MPI each process trains on its share of the images.
    let train = if ranks > 1 {
        let n = train.len();
        train.subset(rank * n / ranks..(rank + 1) * n / ranks)?
    } else {
        train
    };
    let (n_train, n_held) = (train.len(), held.len());
    eprintln!(
        "training on {n_train} images, {n_held} held out; model {}",
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
    // Each replica reads its own share of the training set.
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
    let loader = &loaders[0];
    let net = &dp.replicas()[0].1;
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
        let bar = if root_rank {
            ProgressBar::new(steps)
        } else {
            ProgressBar::hidden()
        };
        bar.set_style(
            ProgressStyle::with_template("epoch {msg} [{bar:30}] {pos}/{len} {per_sec} eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_message(format!("{}/{}", epoch + 1, a.epochs));
        let t0 = Instant::now();
        let mut loss_sum = Tensor::zeros(&dev, &[], DType::F32)?;
        let mut epochs: Vec<_> = loaders.iter().map(|l| l.epoch(epoch as u64)).collect();
        'steps: loop {
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
                    let b = &batches[0];
                    let l = net.forward(&b.x)?.cross_entropy(&b.y)?;
                    g.backward(&l, &params)?;
                    l.detach()
                }
                None => {
                    let rep =
                        dp.step(&batches, |_, net, b| net.forward(&b.x)?.cross_entropy(&b.y))?;
                    rep.losses[0].clone()
                }
            };
            for o in &mut opts {
                o.step()?;
                o.zero_grad();
            }
            // This process's (first replica's) loss, summed on the device: reading it every
            // step would stall the pipeline.
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
        acc = accuracy(&dev, net, held.subset(0..n_held)?, a.batch)?;
        let s = dev.memory_stats();
        if !root_rank {
            continue;
        }
        println!(
            "epoch {}/{}  loss {mean_loss:.4}  held-out accuracy {acc:.4}  {:.0} images/s  peak {:.1} MiB allocated, {:.1} MiB reserved",
            epoch + 1,
            a.epochs,
            (steps as usize * a.batch * replicas * ranks) as f64 / dt,
            s.peak_allocated as f64 / 1048576.0,
            s.peak_reserved as f64 / 1048576.0
        );
    }
    if !root_rank {
        return Ok(());
    }
    println!("\n{}\n", dev.memory_report());
    let peak = dev.memory_stats().peak_allocated as f64 / 1048576.0;
    // Images of every process (each trains the same number of steps).
    println!(
        "accuracy={acc:.4} images_per_s={:.0} peak_mem_mb={peak:.1}",
        (images * ranks) as f64 / train_time
    );
    Ok(())
}
