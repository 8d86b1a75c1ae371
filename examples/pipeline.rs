//! A transformer too big for one device's budget, trained as a two-stage pipeline.
//!
//! ```text
//! cargo run --release --example pipeline -- [--devices 0,1] [--blocks 8] [--width 512]
//!     [--context 128] [--batch 16] [--micro 4] [--steps 5] [--limit 512MiB] [--dtype f32]
//! ```
//!
//! First the whole model is tried on the first device under `--limit` (it should fail with
//! `OutOfMemory`, which is the point); then the first half of the blocks goes to the first
//! device and the second half to the second, each under the same limit, and trains in
//! `--micro` micro-batches. The report gives the step time, the peak memory of each stage, and
//! the share of the step the host spent waiting for activations to arrive from the previous
//! stage (the transfer time the computation did not hide). On a CPU-only machine two devices
//! on one adapter stand in: `--devices 0,0`.

use std::time::Instant;
use wgrad::nn::{Module, Sequential, TransformerBlock};
use wgrad::optim::{Adam, Optimizer};
use wgrad::parallel::{Pipeline, open_devices};
use wgrad::{DType, Device, Error, Result};

/// A transformer stack split into two pipeline stages.
#[derive(clap::Parser, Debug)]
#[command(name = "pipeline")]
struct Args {
    /// Adapters of the two stages (indices in `Device::all()`'s order).
    #[arg(long, default_value = "0,1")]
    devices: String,
    /// Transformer blocks in all (half per stage).
    #[arg(long, default_value_t = 8)]
    blocks: usize,
    /// Model width (heads of 64).
    #[arg(long, default_value_t = 512)]
    width: usize,
    /// Sequence length.
    #[arg(long, default_value_t = 128)]
    context: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Micro-batches per step.
    #[arg(long, default_value_t = 4)]
    micro: usize,
    /// Steps to time (after one warm-up step).
    #[arg(long, default_value_t = 5)]
    steps: usize,
    /// Memory budget of each device, like 512MiB.
    #[arg(long, default_value = "512MiB")]
    limit: String,
    /// Storage dtype: f32 or f16.
    #[arg(long, default_value = "f32")]
    dtype: String,
}

fn blocks(dev: &Device, a: &Args, range: std::ops::Range<usize>, dt: DType) -> Result<Sequential> {
    let mut s = Sequential::new();
    for i in range {
        s = s.add(
            &format!("block{i}"),
            TransformerBlock::new(dev, a.width, (a.width / 64).max(1), true, 0.0, dt)?,
        );
    }
    Ok(s)
}

fn bytes(limit: &str) -> Result<u64> {
    match wgrad::MemoryLimit::parse(limit)? {
        wgrad::MemoryLimit::Bytes(b) => Ok(b),
        wgrad::MemoryLimit::Fraction(_) => Err(Error::Invalid {
            op: "--limit",
            detail: "give bytes, like 512MiB".into(),
        }),
    }
}

fn main() -> Result<()> {
    let a = <Args as clap::Parser>::parse();
    let dt = match a.dtype.as_str() {
        "f16" => DType::F16,
        _ => DType::F32,
    };
    let devs = open_devices(&a.devices)?;
    if devs.len() != 2 {
        return Err(Error::Invalid {
            op: "--devices",
            detail: "two devices, one per stage".into(),
        });
    }
    let limit = bytes(&a.limit)?;
    for d in &devs {
        d.set_memory_limit(Some(limit));
    }
    println!(
        "stage 0: {}\nstage 1: {}",
        devs[0].info().name,
        devs[1].info().name
    );
    let (b, s, w) = (a.batch, a.context, a.width);
    let mb = (limit as f64) / 1048576.0;

    // 1. The whole model on one device, under the same budget.
    let whole = (|| -> Result<()> {
        let m = blocks(&devs[0], &a, 0..a.blocks, dt)?;
        let mut opt = Adam::new(m.params(), 1e-4)?;
        let x = devs[0].randn(&[b, s, w], dt)?;
        let loss = m.forward(&x)?.square()?.mean_all()?;
        loss.backward()?;
        opt.step()?;
        devs[0].sync()
    })();
    match &whole {
        Ok(()) => println!("one device: the whole model trains within {mb:.0} MiB"),
        Err(e) => println!("one device: {e}"),
    }
    devs[0].empty_cache();

    // 2. Two stages.
    let s0 = blocks(&devs[0], &a, 0..a.blocks / 2, dt)?;
    let s1 = blocks(&devs[1], &a, a.blocks / 2..a.blocks, dt)?;
    let pipe = Pipeline::new(vec![
        (devs[0].clone(), Box::new(s0)),
        (devs[1].clone(), Box::new(s1)),
    ])?;
    let mut opts: Vec<Adam> = pipe
        .stages()
        .iter()
        .map(|(_, m)| Adam::new(m.params(), 1e-4))
        .collect::<Result<_>>()?;
    let x = devs[0].randn(&[b, s, w], dt)?;
    let step = |opts: &mut Vec<Adam>| -> Result<wgrad::parallel::PipelineReport> {
        let r = pipe.train_step(&x, a.micro, |y, _| y.square()?.mean_all())?;
        for o in opts.iter_mut() {
            o.step()?;
            o.zero_grad();
        }
        Ok(r)
    };
    step(&mut opts)?;
    devs.iter().try_for_each(|d| d.sync())?;
    devs.iter().for_each(|d| d.reset_peak());
    let t0 = Instant::now();
    let mut wait = 0.0;
    let mut loss = 0.0;
    for _ in 0..a.steps {
        let r = step(&mut opts)?;
        wait += r.transfer_wait.as_secs_f64();
        loss = r.loss;
    }
    devs.iter().try_for_each(|d| d.sync())?;
    let total = t0.elapsed().as_secs_f64();
    let ms = total * 1e3 / a.steps as f64;
    let peaks: Vec<f64> = devs
        .iter()
        .map(|d| d.memory_stats().peak_allocated as f64 / 1048576.0)
        .collect();
    println!(
        "pipeline: {} blocks of width {w}, batch {b} x {s} in {} micro-batches, {dt}: {ms:.1} ms a step, loss {loss:.4}",
        a.blocks, a.micro
    );
    println!(
        "peak {:.0} MiB on stage 0, {:.0} MiB on stage 1 (budget {mb:.0} MiB each); host waited on transfers {:.1}% of the time",
        peaks[0],
        peaks[1],
        100.0 * wait / total
    );
    println!(
        "pipeline_ms_per_step={ms:.2} transfer_wait_share={:.3} whole_model_fits={}",
        wait / total,
        whole.is_ok()
    );
    Ok(())
}
