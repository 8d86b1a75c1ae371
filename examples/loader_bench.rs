//! Data-loader throughput and the overlap of data preparation with training.
//!
//! ```text
//! cargo run --release --example loader_bench -- [--batch 256] [--steps 40] [--work N]
//! ```
//!
//! 1. Samples per second through the loader (collate + upload, synchronised) from memory and
//!    from a memory-mapped record file, without and with worker threads.
//! 2. A training step (the MNIST CNN) fed by a dataset that does real host work per sample:
//!    a random shift of the image plus `--work` units of noise (64 pixels each) (standing in
//!    for decoding and augmentation). Without `--work`, the number of passes is calibrated so
//!    that preparing a batch takes about as long as a training step: the case where overlap
//!    matters most. Four times per step: compute alone (a batch already on
//!    the device), data alone (prepare + upload + wait), and the loop with the loader on the
//!    training thread versus prefetching on workers. Prefetching should bring the step from
//!    about compute + data down to about max(compute, data).

#[path = "common/mnist_cnn.rs"]
mod mnist_cnn;
#[path = "common/repo.rs"]
mod repo;

use std::time::Instant;
use wgrad::data::{DataLoader, Dataset, InMemory, LoaderOptions, MmapDataset, write_records};
use wgrad::nn::Module;
use wgrad::optim::{Adam, Optimizer};
use wgrad::{DType, Device, Result};

/// MNIST with per-sample host work: a random shift and `work` passes of hashed noise.
struct Augmented {
    base: InMemory<f32>,
    work: usize,
}

impl Dataset for Augmented {
    type X = f32;
    fn len(&self) -> usize {
        self.base.len()
    }
    fn x_shape(&self) -> Vec<usize> {
        self.base.x_shape()
    }
    fn y_shape(&self) -> Vec<usize> {
        self.base.y_shape()
    }
    fn get(&self, index: usize, x: &mut [f32], y: &mut [u32]) -> Result<()> {
        let mut img = vec![0f32; x.len()];
        self.base.get(index, &mut img, y)?;
        let mut h = (index as u64).wrapping_mul(0x9E3779B97F4A7C15) | 1;
        let (dx, dy) = ((h % 5) as isize - 2, ((h >> 8) % 5) as isize - 2);
        for r in 0..28isize {
            for c in 0..28isize {
                let (sr, sc) = (r - dy, c - dx);
                x[(r * 28 + c) as usize] = if (0..28).contains(&sr) && (0..28).contains(&sc) {
                    img[(sr * 28 + sc) as usize]
                } else {
                    0.0
                };
            }
        }
        // One unit of work: noise on 64 pixels (fine enough to calibrate against a fast GPU).
        let n = x.len();
        for u in 0..self.work {
            for j in 0..64 {
                h ^= h << 13;
                h ^= h >> 7;
                h ^= h << 17;
                let p = &mut x[(u * 64 + j) % n];
                *p = (*p + ((h >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 1e-3).clamp(0.0, 1.0);
            }
        }
        Ok(())
    }
}

fn throughput<D: Dataset>(dev: &Device, ds: D, batch: usize, workers: usize) -> Result<f64> {
    let loader = DataLoader::new(
        dev,
        ds,
        LoaderOptions {
            batch_size: batch,
            workers,
            prefetch: 4,
            shuffle: true,
            ..Default::default()
        },
    )?;
    let t = Instant::now();
    let mut n = 0;
    for b in loader.epoch(0) {
        n += b?.indices.len();
    }
    dev.sync()?;
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

/// Data loader throughput on MNIST: in memory and memory-mapped, with and without workers.
#[derive(clap::Parser, Debug)]
#[command(name = "loader_bench")]
struct Args {
    /// Samples per batch.
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// Training steps in the overlap measurement.
    #[arg(long, default_value_t = 40)]
    steps: usize,
    /// Units of host work per sample (64 pixels of noise each) [default: calibrated so that
    /// loading takes about as long as the training step].
    #[arg(long)]
    work: Option<usize>,
}

fn main() -> Result<()> {
    let a = <Args as clap::Parser>::parse();
    let (batch, steps, mut work) = (a.batch, a.steps, a.work.unwrap_or(usize::MAX));
    let dev = Device::new()?;
    eprintln!("{}\n", dev.info());
    let root = repo::repo_root().join("data/mnist");
    let mnist = wgrad::data::mnist::load(&root, "t10k")?;

    // A record file of the same images (u8 pixels), to read through a memory map.
    let rec = std::env::temp_dir().join(format!("wgrad-mnist-{}.rec", std::process::id()));
    let (pixels, n, _, _) =
        wgrad::data::mnist::read_images(&root.join("t10k-images-idx3-ubyte.gz"))?;
    let labels: Vec<u32> =
        wgrad::data::mnist::read_labels(&root.join("t10k-labels-idx1-ubyte.gz"))?
            .into_iter()
            .map(u32::from)
            .collect();
    write_records(&rec, 784, &pixels, &labels)?;
    println!("loader throughput, batch {batch}, {n} samples, collate + upload, synchronised:");
    for workers in [0, 2] {
        let mem = throughput(&dev, mnist.subset(0..n)?, batch, workers)?;
        let map = throughput(&dev, MmapDataset::open(&rec, &[1, 28, 28])?, batch, workers)?;
        println!(
            "  workers {workers}: from memory {mem:>10.0} samples/s   from mmap file {map:>10.0} samples/s"
        );
    }
    std::fs::remove_file(&rec).ok();

    let model = mnist_cnn::cnn(&dev, DType::F32)?;
    let mut opt = Adam::new(model.params(), 1e-3)?;
    // The batch for the compute-only timing (its contents do not matter).
    let plain = Augmented {
        base: mnist.subset(0..n)?,
        work: 0,
    };
    let fixed = DataLoader::new(
        &dev,
        plain,
        LoaderOptions {
            batch_size: batch,
            workers: 0,
            ..Default::default()
        },
    )?
    .epoch(0)
    .next();
    let fixed = fixed.unwrap_or_else(|| unreachable!("the dataset is not empty"))?;
    let train_step = |x: &wgrad::Tensor, y: &wgrad::Tensor, opt: &mut Adam| -> Result<()> {
        model.forward(x)?.cross_entropy(y)?.backward()?;
        opt.step()?;
        opt.zero_grad();
        Ok(())
    };
    let compute_ms = |opt: &mut Adam| -> Result<f64> {
        for _ in 0..5 {
            train_step(&fixed.x, &fixed.y, opt)?;
        }
        dev.sync()?;
        let t = Instant::now();
        for _ in 0..steps {
            train_step(&fixed.x, &fixed.y, opt)?;
        }
        dev.sync()?;
        Ok(t.elapsed().as_secs_f64() * 1e3 / steps as f64)
    };
    let compute_before = compute_ms(&mut opt)?;
    let compute = compute_before;

    let data_ms = |work: usize, steps: usize| -> Result<f64> {
        let t = Instant::now();
        let ds = Augmented {
            base: mnist.subset(0..n)?,
            work,
        };
        let loader = DataLoader::new(
            &dev,
            ds,
            LoaderOptions {
                batch_size: batch,
                workers: 0,
                ..Default::default()
            },
        )?;
        for b in loader.epoch(1).take(steps) {
            drop(b?);
        }
        dev.sync()?;
        Ok(t.elapsed().as_secs_f64() * 1e3 / steps as f64)
    };
    if work == usize::MAX {
        // Data time is about linear in the work units: fit two points, aim at the compute time.
        // Enough units that their cost stands well above timing noise.
        let (d0, d1k) = (data_ms(0, 8)?, data_ms(1024, 8)?);
        let per_pass = ((d1k - d0) / 1024.0).max(1e-6);
        work = (((compute - d0) / per_pass).max(0.0) as usize).min(200_000);
    }
    let aug = || Augmented {
        base: mnist.subset(0..n).unwrap_or_else(|_| unreachable!()),
        work,
    };
    let data = data_ms(work, steps)?;

    let mut step_ms = Vec::new();
    for workers in [0, 2] {
        let loader = DataLoader::new(
            &dev,
            aug(),
            LoaderOptions {
                batch_size: batch,
                workers,
                prefetch: 3,
                ..Default::default()
            },
        )?;
        let mut epoch = loader.epoch(2);
        // Let the workers fill their queues, as they would during the previous step.
        if let Some(b) = epoch.next() {
            let b = b?;
            train_step(&b.x, &b.y, &mut opt)?;
        }
        dev.sync()?;
        let t = Instant::now();
        for b in epoch.take(steps) {
            let b = b?;
            train_step(&b.x, &b.y, &mut opt)?;
        }
        dev.sync()?;
        step_ms.push(t.elapsed().as_secs_f64() * 1e3 / steps as f64);
    }
    // Measured again after the loops: the average absorbs clock and cache drift.
    let compute = (compute_before + compute_ms(&mut opt)?) / 2.0;
    println!("\ntraining step, batch {batch}, host work {work} units per sample ({steps} steps):");
    println!("  compute only (batch on device)  {compute:>8.2} ms");
    println!("  data only (prepare + upload)    {data:>8.2} ms");
    println!(
        "  loader on the training thread   {:>8.2} ms   (compute + data = {:.2})",
        step_ms[0],
        compute + data
    );
    println!(
        "  prefetch on 2 workers           {:>8.2} ms   (max(compute, data) = {:.2})",
        step_ms[1],
        compute.max(data)
    );
    println!(
        "overlap_hidden={:.0}% step_no_prefetch_ms={:.2} step_prefetch_ms={:.2}",
        100.0 * (step_ms[0] - step_ms[1]) / data.min(compute).max(1e-9),
        step_ms[0],
        step_ms[1]
    );
    Ok(())
}
