//! Draws where the memory goes in MNIST training: allocated and reserved bytes over a few
//! steps, with the forward, backward and optimizer phases as bands, as an SVG.
//!
//! ```text
//! cargo run --release --example memory_timeline -- [--steps 6] [--batch-size 64] [--out docs/memory_timeline.svg]
//! ```

#[path = "common/mnist_cnn.rs"]
mod mnist_cnn;
#[path = "common/repo.rs"]
mod repo;

use std::path::PathBuf;
use wgrad::data::{DataLoader, LoaderOptions};
use wgrad::nn::Module;
use wgrad::optim::{Adam, Optimizer};
use wgrad::{DType, Device, Result};

/// Draws allocated and reserved memory over a few MNIST training steps as an SVG.
#[derive(clap::Parser, Debug)]
#[command(name = "memory_timeline")]
struct Args {
    /// Training steps to draw.
    #[arg(long, default_value_t = 6)]
    steps: usize,
    /// Images per step.
    #[arg(long = "batch-size", default_value_t = 64)]
    batch: usize,
    /// The SVG to write.
    #[arg(long, default_value = "docs/memory_timeline.svg")]
    out: PathBuf,
}

fn main() -> Result<()> {
    let Args { steps, batch, out } = <Args as clap::Parser>::parse();
    let dev = Device::new()?;
    let root = repo::repo_root().join("data/mnist");
    let train = wgrad::data::mnist::load(&root, "t10k")?.subset(0..8000)?;
    let net = mnist_cnn::cnn(&dev, DType::F32)?;
    let mut opt = Adam::new(net.params(), 1e-3)?;
    let loader = DataLoader::new(
        &dev,
        train,
        LoaderOptions {
            batch_size: batch,
            workers: 1,
            ..Default::default()
        },
    )?;

    dev.sync()?;
    dev.set_memory_trace(true);
    for (i, b) in loader.epoch(0).take(steps).enumerate() {
        let b = b?;
        // Each phase syncs at its end so the bands line up with the device's work.
        dev.track(&format!("forward {i}"), || {
            net.forward(&b.x)?.cross_entropy(&b.y)
        })
        .and_then(|(loss, _)| dev.track(&format!("backward {i}"), || loss.backward()))?;
        dev.track(&format!("step {i}"), || {
            opt.step()?;
            opt.zero_grad();
            Ok(())
        })?;
    }
    dev.set_memory_trace(false);
    let events = dev.memory_events();
    // One colour per phase, not per step: strip the step numbers from scope names.
    let events: Vec<_> = events
        .into_iter()
        .map(|mut e| {
            e.scope = e.scope.map(|s| s.split(' ').next().unwrap_or("").into());
            e
        })
        .collect();
    let svg = wgrad::memory::timeline_svg(
        &events,
        &format!(
            "MNIST CNN, batch {batch}: memory over {steps} training steps on {}",
            dev.info().name
        ),
    );
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, svg)?;
    println!("{} events -> {}", events.len(), out.display());
    println!("{}", dev.memory_report());
    Ok(())
}
