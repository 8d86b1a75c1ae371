//! Memory-saving training, measured: peak memory and step time of two models in f32, with
//! f16 storage, with checkpointing of every block, and with both; then the largest batch that
//! fits a fixed budget for f32 and for f16 + checkpointing.
//!
//! ```text
//! cargo run --release --example memory_bench -- [--quick] [--json]
//!     [--mlp-width 1024] [--mlp-blocks 24] [--mlp-batch 2048]
//!     [--tf-width 512] [--tf-blocks 8] [--tf-ctx 256] [--tf-batch 16] [--budget 2GiB]
//! ```
//!
//! Models: a deep MLP (blocks of Linear + GELU at a fixed width) and a stack of pre-norm
//! transformer blocks (LayerNorm, causal multi-head attention, 4x GELU MLP). A step is
//! forward, MSE loss against a random target, backward and an AdamW update. "peak" is the
//! most memory allocated during the step; "act" is that peak minus what is held between
//! steps (parameters, their optimizer state), i.e. activations plus gradients; "fwd" is what
//! the forward pass leaves allocated for backward: the activations alone. Times are
//! medians of 5 steps after at least 2 warm-up steps and 250 ms of them, synchronised.

use std::time::Instant;
use wgrad::nn::{Activation, Checkpointed, Linear, Module, Sequential, TransformerBlock};
use wgrad::optim::{Adam, Optimizer};
use wgrad::train::find_batch_size;
use wgrad::{DType, Device, MemoryLimit, Result, Tensor};

#[path = "common/budget.rs"]
mod budget;

#[derive(Clone, Copy, PartialEq)]
enum Model {
    Mlp,
    Transformer,
}

struct Cfg {
    mlp: (usize, usize, usize),
    tf: (usize, usize, usize, usize),
    budget: u64,
    json: bool,
}

/// Memory-saving training, measured: peak memory and step time with f16 storage and
/// checkpointing, and the largest batch that fits a budget.
#[derive(clap::Parser, Debug)]
#[command(name = "memory_bench")]
struct Args {
    /// Small models and a 64 MiB budget (CPU adapters); sizes given as options still win.
    #[arg(long)]
    quick: bool,
    /// One JSON object on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// MLP width [default: 1024].
    #[arg(long)]
    mlp_width: Option<usize>,
    /// MLP blocks [default: 24].
    #[arg(long)]
    mlp_blocks: Option<usize>,
    /// MLP batch [default: 2048].
    #[arg(long)]
    mlp_batch: Option<usize>,
    /// Transformer width [default: 512].
    #[arg(long)]
    tf_width: Option<usize>,
    /// Transformer blocks [default: 8].
    #[arg(long)]
    tf_blocks: Option<usize>,
    /// Transformer context [default: 256].
    #[arg(long)]
    tf_ctx: Option<usize>,
    /// Transformer batch [default: 16].
    #[arg(long)]
    tf_batch: Option<usize>,
    /// Budget for the largest-batch search, in bytes like 2GiB [default: 2GiB].
    #[arg(long, value_parser = budget::parse_bytes)]
    budget: Option<u64>,
}

fn parse() -> Cfg {
    let a = <Args as clap::Parser>::parse();
    let (mlp, tf, budget) = if a.quick {
        ((256, 24, 64), (128, 4, 64, 4), 64 << 20)
    } else {
        ((1024, 24, 2048), (512, 8, 256, 16), 2 << 30)
    };
    Cfg {
        mlp: (
            a.mlp_width.unwrap_or(mlp.0),
            a.mlp_blocks.unwrap_or(mlp.1),
            a.mlp_batch.unwrap_or(mlp.2),
        ),
        tf: (
            a.tf_width.unwrap_or(tf.0),
            a.tf_blocks.unwrap_or(tf.1),
            a.tf_ctx.unwrap_or(tf.2),
            a.tf_batch.unwrap_or(tf.3),
        ),
        budget: a.budget.unwrap_or(budget),
        json: a.json,
    }
}

fn build(dev: &Device, m: Model, c: &Cfg, dt: DType, ckpt: bool) -> Result<Sequential> {
    let mut net = Sequential::new();
    let wrap = |net: &mut Sequential, name: String, blk: Box<dyn Module>, ckpt: bool| {
        if ckpt {
            net.push(&name, Box::new(Checkpointed::new(BoxedModule(blk))));
        } else {
            net.push(&name, blk);
        }
    };
    match m {
        Model::Mlp => {
            let (w, blocks, _) = c.mlp;
            for i in 0..blocks {
                let blk = Sequential::new()
                    .add("fc", Linear::new(dev, w, w, true, dt)?)
                    .add("act", Activation::Gelu);
                wrap(&mut net, format!("block{i}"), Box::new(blk), ckpt);
            }
        }
        Model::Transformer => {
            let (w, blocks, _, _) = c.tf;
            for i in 0..blocks {
                wrap(
                    &mut net,
                    format!("block{i}"),
                    Box::new(TransformerBlock::new(dev, w, 8, true, 0.1, dt)?),
                    ckpt,
                );
            }
        }
    }
    Ok(net)
}

/// Lets a boxed module be checkpointed (Checkpointed owns a concrete module).
struct BoxedModule(Box<dyn Module>);

impl Module for BoxedModule {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.0.forward(x)
    }
    fn params(&self) -> Vec<(String, Tensor)> {
        self.0.params()
    }
    fn train(&self, on: bool) {
        self.0.train(on)
    }
}

fn input_shape(m: Model, c: &Cfg, batch: usize) -> Vec<usize> {
    match m {
        Model::Mlp => vec![batch, c.mlp.0],
        Model::Transformer => vec![batch, c.tf.2, c.tf.0],
    }
}

fn step(net: &Sequential, opt: &mut Adam, x: &Tensor, y: &Tensor) -> Result<()> {
    let loss = net.forward(x)?.mse_loss(y)?;
    loss.backward()?;
    opt.step()?;
    opt.zero_grad();
    Ok(())
}

struct Row {
    model: &'static str,
    variant: &'static str,
    batch: usize,
    peak: u64,
    act: u64,
    fwd: u64,
    ms: f64,
}

fn measure(
    dev: &Device,
    m: Model,
    c: &Cfg,
    dt: DType,
    ckpt: bool,
    batch: usize,
) -> Result<(u64, u64, u64, f64)> {
    dev.empty_cache();
    let net = build(dev, m, c, dt, ckpt)?;
    let mut opt = Adam::adamw(net.params(), 1e-4, 0.01)?;
    let shape = input_shape(m, c, batch);
    let x = Tensor::randn(dev, &shape, 0.0, 1.0, dt)?;
    let y = Tensor::randn(dev, &shape, 0.0, 1.0, dt)?;
    // At least 2 warm-up steps and 250 ms of them: a GPU's clocks fall while the host
    // builds pipelines and rise again only under load (as `bench` and `train_gpt` warm up).
    let warm = Instant::now();
    let mut warmed = 0;
    while warmed < 2 || warm.elapsed().as_secs_f64() < 0.25 {
        step(&net, &mut opt, &x, &y)?;
        dev.sync()?;
        warmed += 1;
    }
    let held = dev.memory_stats().allocated;
    dev.reset_peak();
    let mut times = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        step(&net, &mut opt, &x, &y)?;
        dev.sync()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let peak = dev.memory_stats().peak_allocated;
    // Activations alone: what the forward pass leaves allocated for the backward pass.
    let loss = net.forward(&x)?.mse_loss(&y)?;
    dev.sync()?;
    let fwd = dev.memory_stats().allocated.saturating_sub(held);
    loss.backward()?;
    opt.zero_grad();
    Ok((peak, peak.saturating_sub(held), fwd, times[2]))
}

fn largest_batch(c: &Cfg, m: Model, dt: DType, ckpt: bool) -> Result<usize> {
    let dev = Device::with_options(wgrad::DeviceOptions {
        memory_limit: Some(MemoryLimit::Bytes(c.budget)),
        ..wgrad::DeviceOptions::from_env()?
    })?;
    let net = build(&dev, m, c, dt, ckpt)?;
    let mut opt = Adam::adamw(net.params(), 1e-4, 0.01)?;
    find_batch_size(&dev, 1 << 16, |b| {
        let shape = input_shape(m, c, b);
        let x = Tensor::randn(&dev, &shape, 0.0, 1.0, dt)?;
        let y = Tensor::randn(&dev, &shape, 0.0, 1.0, dt)?;
        let r = step(&net, &mut opt, &x, &y);
        opt.zero_grad();
        r
    })
}

fn main() -> Result<()> {
    let c = parse();
    let dev = Device::new()?;
    if !c.json {
        eprintln!("{}\n", dev.info());
    }
    let variants: [(&str, DType, bool); 4] = [
        ("f32", DType::F32, false),
        ("f16", DType::F16, false),
        ("f32+ckpt", DType::F32, true),
        ("f16+ckpt", DType::F16, true),
    ];
    let mut rows = Vec::new();
    for (m, name, batch) in [
        (Model::Mlp, "mlp", c.mlp.2),
        (Model::Transformer, "transformer", c.tf.3),
    ] {
        for (v, dt, ck) in variants {
            let (peak, act, fwd, ms) = measure(&dev, m, &c, dt, ck, batch)?;
            eprintln!(
                "{name:<12} {v:<9} batch {batch:<5} peak {:>9.1} MiB  act {:>9.1} MiB  fwd {:>9.1} MiB  {ms:>8.2} ms",
                peak as f64 / 1048576.0,
                act as f64 / 1048576.0,
                fwd as f64 / 1048576.0
            );
            rows.push(Row {
                model: name,
                variant: v,
                batch,
                peak,
                act,
                fwd,
                ms,
            });
        }
    }
    let mut fits = Vec::new();
    for (m, name) in [(Model::Mlp, "mlp"), (Model::Transformer, "transformer")] {
        let a = largest_batch(&c, m, DType::F32, false)?;
        let b = largest_batch(&c, m, DType::F16, true)?;
        eprintln!(
            "{name:<12} largest batch under {:.0} MiB: f32 {a}, f16+ckpt {b} ({:.2}x)",
            c.budget as f64 / 1048576.0,
            b as f64 / a.max(1) as f64
        );
        fits.push((name, a, b));
    }

    if c.json {
        let r: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "model": r.model, "variant": r.variant, "batch": r.batch, "peak": r.peak,
                    "act": r.act, "fwd": r.fwd, "ms": r.ms,
                })
            })
            .collect();
        let f: Vec<serde_json::Value> = fits
            .iter()
            .map(|(n, a, b)| serde_json::json!({"model": n, "f32": a, "f16_ckpt": b}))
            .collect();
        let out = serde_json::json!({
            "adapter": dev.info().name, "budget": c.budget, "rows": r, "fits": f,
        });
        println!("{out}");
        return Ok(());
    }
    println!(
        "{:<12} {:<9} {:>6} {:>10} {:>7} {:>10} {:>7} {:>10} {:>7} {:>9} {:>7}",
        "model",
        "variant",
        "batch",
        "peak MiB",
        "vs f32",
        "act MiB",
        "vs f32",
        "fwd MiB",
        "vs f32",
        "step ms",
        "vs f32"
    );
    for r in &rows {
        let base = rows
            .iter()
            .find(|b| b.model == r.model && b.variant == "f32")
            .unwrap_or(r);
        println!(
            "{:<12} {:<9} {:>6} {:>10.1} {:>7.2} {:>10.1} {:>7.2} {:>10.1} {:>7.2} {:>9.2} {:>7.2}",
            r.model,
            r.variant,
            r.batch,
            r.peak as f64 / 1048576.0,
            r.peak as f64 / base.peak as f64,
            r.act as f64 / 1048576.0,
            r.act as f64 / base.act as f64,
            r.fwd as f64 / 1048576.0,
            r.fwd as f64 / base.fwd.max(1) as f64,
            r.ms,
            r.ms / base.ms
        );
    }
    println!(
        "\nlargest batch under a {:.0} MiB budget",
        c.budget as f64 / 1048576.0
    );
    for (n, a, b) in fits {
        println!(
            "{n:<12} f32 {a:>6}   f16+ckpt {b:>6}   {:.2}x",
            b as f64 / a.max(1) as f64
        );
    }
    println!("\n{}", dev.memory_report());
    Ok(())
}
