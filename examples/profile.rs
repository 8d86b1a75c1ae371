//! Profiles MNIST training: GPU time per kernel and per scope (forward, backward, optimizer),
//! and a Chrome trace of it with the memory events on the same timeline.
//!
//! ```text
//! cargo run --release --example profile -- [--steps 20] [--batch-size 64] [--trace FILE]
//! ```
//!
//! Open the trace (default `target/profile_trace.json`) in <https://ui.perfetto.dev> or
//! chrome://tracing. Times are GPU timestamps where the adapter has TIMESTAMP_QUERY (the
//! table says so) and host round trips otherwise.

#[path = "common/mnist_cnn.rs"]
mod mnist_cnn;
#[path = "common/repo.rs"]
mod repo;

use std::time::Instant;
use wgrad::data::{DataLoader, LoaderOptions};
use wgrad::nn::Module;
use wgrad::optim::{Adam, Optimizer};
use wgrad::{DType, Device, Result};

/// Profiles MNIST training: GPU time per kernel and per scope, and a Chrome trace with the
/// memory events on the same timeline.
#[derive(clap::Parser, Debug)]
#[command(name = "profile")]
struct Args {
    /// Training steps to profile.
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// Images per step.
    #[arg(long = "batch-size", default_value_t = 64)]
    batch: usize,
    /// Where to write the trace [default: target/profile_trace.json].
    #[arg(long)]
    trace: Option<std::path::PathBuf>,
}

fn main() -> Result<()> {
    let a = <Args as clap::Parser>::parse();
    let (steps, batch) = (a.steps, a.batch);
    let trace = a
        .trace
        .unwrap_or_else(|| repo::repo_root().join("target/profile_trace.json"));
    let dev = Device::new()?;
    eprintln!("{}\n", dev.info());
    let root = repo::repo_root().join("data/mnist");
    let train = wgrad::data::mnist::load(&root, "t10k")?.subset(0..8000)?;
    let net = mnist_cnn::cnn(&dev, DType::F32)?;
    let mut opt = Adam::new(net.params(), 2e-3)?;
    let loader = DataLoader::new(
        &dev,
        train,
        LoaderOptions {
            batch_size: batch,
            shuffle: true,
            drop_last: true,
            workers: 1,
            ..Default::default()
        },
    )?;
    let mut step = |b: &wgrad::data::Batch| -> Result<()> {
        dev.begin_scope("forward");
        let loss = net.forward(&b.x)?.cross_entropy(&b.y)?;
        dev.end_scope();
        dev.begin_scope("backward");
        loss.backward()?;
        dev.end_scope();
        dev.begin_scope("optimizer");
        opt.step()?;
        opt.zero_grad();
        dev.end_scope();
        Ok(())
    };
    let mut batches = loader.epoch(0);
    // Warm-up: pipelines compiled, memory cached.
    for _ in 0..3 {
        if let Some(b) = batches.next() {
            step(&b?)?;
        }
    }
    dev.sync()?;
    let t0 = Instant::now();
    let mut n = 0;
    for _ in 0..steps {
        if let Some(b) = batches.next() {
            step(&b?)?;
            n += 1;
        }
    }
    dev.sync()?;
    let plain = t0.elapsed().as_secs_f64() * 1e3 / n.max(1) as f64;
    dev.set_memory_trace(true);
    dev.clear_memory_trace();
    dev.start_profiling()?;
    let t0 = Instant::now();
    let mut m = 0;
    for _ in 0..steps {
        if let Some(b) = batches.next() {
            step(&b?)?;
            m += 1;
        }
    }
    let profile = dev.stop_profiling()?;
    let profiled = t0.elapsed().as_secs_f64() * 1e3 / m.max(1) as f64;
    println!("{profile}");
    println!("by scope:");
    for s in profile.by_scope() {
        println!(
            "  {:<12} {:>6} calls {:>10.3} ms",
            s.name,
            s.calls,
            s.total.as_secs_f64() * 1e3
        );
    }
    let kernel_ms = profile.total().as_secs_f64() * 1e3 / m.max(1) as f64;
    println!(
        "\nstep: {plain:.2} ms unprofiled; {kernel_ms:.2} ms in kernels per step ({:.0}%), {profiled:.2} ms per profiled step",
        100.0 * kernel_ms / plain
    );
    std::fs::write(&trace, profile.chrome_trace(&dev.memory_events()))?;
    println!("trace: {}", trace.display());
    Ok(())
}
