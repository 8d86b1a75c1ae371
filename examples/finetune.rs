//! Fine-tunes a published model with LoRA adapters on a text file, its base weights frozen
//! (and, from a GGUF file, kept quantized), inside a memory budget.
//!
//! ```text
//! cargo run --release --features tokenizers --example finetune -- \
//!     [--model FILE.gguf] [--data data/tinyshakespeare/input.txt] [--steps 100] [--batch 4]
//!     [--context 128] [--rank 8] [--alpha 16] [--dropout 0.05] [--targets q_proj,v_proj]
//!     [--lr 1e-3] [--budget 1GiB] [--dtype f32|f16|bf16] [--checkpointing] [--blocks N]
//!     [--save-every 50] [--resume] [--out finetune-out]
//! ```
//!
//! The text is tokenized with the model's own tokenizer; its last tenth is held out. The
//! example prints the validation loss and a greedy sample before and after training, a
//! progress line every 10 steps, then writes `OUT/adapter/` (peft's `adapter_config.json` and
//! `adapter_model.safetensors`, which `PeftModel.from_pretrained` loads) and `OUT/loss.svg`.
//! Its last line is for scripts: `val_before=... val_after=... step_ms=... peak_mib=...`, the
//! step time over the steps after the first fifth (at most 10), which compile the kernels.
//! A budget too small for one step fails with the out-of-memory error and its numbers.
//!
//! The loss runs through `Llama::loss`, which never holds the whole f32 logits;
//! `--checkpointing` also recomputes each block in the backward pass. Every `--save-every`
//! steps and at the end, `OUT/checkpoint.safetensors` takes the adapters, Adam's state, the
//! loss scaler, the batch sampler's state and the loss curve (`train::save_checkpoint`);
//! `--resume` continues from it, drawing the same batches the uninterrupted run would have.

use std::path::PathBuf;
use std::time::Instant;

use wgrad::gguf::GgufFile;
use wgrad::llm::{Llama, LoraConfig, Tokenizer};
use wgrad::optim::{Adam, GradScaler, Optimizer};
use wgrad::train::{Progress, load_checkpoint, save_checkpoint};
use wgrad::{DType, Device, Result, Tensor, no_grad};

#[path = "common/budget.rs"]
mod budget;
#[path = "common/models.rs"]
mod models;
#[path = "common/plot.rs"]
mod plot;
#[path = "common/repo.rs"]
mod repo;

/// Fine-tunes a published model with LoRA adapters on a text file.
#[derive(clap::Parser, Debug)]
#[command(name = "finetune")]
struct Args {
    /// A GGUF file (default: SmolLM2-135M-Instruct in the model cache, where
    /// scripts/fetch_smollm2.sh puts it).
    #[arg(long, value_name = "FILE.gguf")]
    model: Option<PathBuf>,
    /// The text to train on (default: data/tinyshakespeare/input.txt).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Training steps.
    #[arg(long, default_value_t = 100)]
    steps: usize,
    /// Sequences a step.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Tokens a sequence.
    #[arg(long, default_value_t = 128)]
    context: usize,
    /// The adapters' rank.
    #[arg(long, default_value_t = 8)]
    rank: usize,
    /// The adapters' alpha (their update is scaled by alpha / rank).
    #[arg(long, default_value_t = 16.0)]
    alpha: f32,
    /// Dropout on the adapters' inputs.
    #[arg(long, default_value_t = 0.05)]
    dropout: f32,
    /// The projections adapted, comma-separated (q_proj, k_proj, v_proj, o_proj, gate_proj,
    /// up_proj, down_proj).
    #[arg(long, default_value = "q_proj,v_proj")]
    targets: String,
    /// Learning rate (Adam).
    #[arg(long, default_value_t = 1e-3)]
    lr: f32,
    /// The device memory budget, in bytes like 1GiB (default: none).
    #[arg(long, value_parser = budget::parse_bytes)]
    budget: Option<u64>,
    /// Dtype of the activations and adapters (default: f32 on a CPU adapter, f16 on a GPU).
    #[arg(long, value_parser = ["f32", "f16", "bf16"])]
    dtype: Option<String>,
    /// Recompute each block in the backward pass instead of keeping its activations.
    #[arg(long)]
    checkpointing: bool,
    /// Use only the model's first N blocks (a quick run on a CPU adapter).
    #[arg(long)]
    blocks: Option<usize>,
    /// Write the training checkpoint every N steps (and after the last).
    #[arg(long = "save-every", default_value_t = 50)]
    save_every: usize,
    /// Continue from OUT/checkpoint.safetensors.
    #[arg(long)]
    resume: bool,
    /// Validation batches averaged.
    #[arg(long = "eval-batches", default_value_t = 4)]
    eval_batches: usize,
    /// Where the adapter and the loss curve go.
    #[arg(long, default_value = "finetune-out")]
    out: PathBuf,
    /// Seed of the batches, the adapters' start and dropout.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// A small deterministic generator for batch positions (xorshift*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        (x.wrapping_mul(0x2545F4914F6CDD1D) >> 33) as usize % n.max(1)
    }
}

/// A batch of `batch` windows of `context + 1` tokens from `ids`: (inputs [b, t], targets
/// [b, t]).
fn batch(
    dev: &Device,
    ids: &[u32],
    rng: &mut Rng,
    batch: usize,
    context: usize,
) -> Result<(Tensor, Tensor)> {
    let mut x = Vec::with_capacity(batch * context);
    let mut y = Vec::with_capacity(batch * context);
    for _ in 0..batch {
        let at = rng.below(ids.len() - context - 1);
        x.extend_from_slice(&ids[at..at + context]);
        y.extend_from_slice(&ids[at + 1..at + context + 1]);
    }
    Ok((
        Tensor::from_slice(dev, &x, &[batch, context])?,
        Tensor::from_slice(dev, &y, &[batch, context])?,
    ))
}

/// Mean next-token loss over `n` fixed batches of the held-out ids.
fn val_loss(model: &Llama, ids: &[u32], a: &Args) -> Result<f32> {
    let mut rng = Rng(0x5eed ^ 0x9E37_79B9_7F4A_7C15);
    let mut sum = 0.0;
    for _ in 0..a.eval_batches {
        let (x, y) = batch(model.device(), ids, &mut rng, a.batch, a.context)?;
        sum += no_grad(|| model.loss(&x, &y))?.to_scalar()?;
    }
    Ok(sum / a.eval_batches.max(1) as f32)
}

/// 48 greedy tokens after `prompt`, decoded.
fn sample(model: &Llama, tok: &Tokenizer, prompt: &str) -> Result<String> {
    let ids = tok.encode(prompt, false)?;
    let mut cache = model.new_cache(1, ids.len() + 48)?;
    let x = Tensor::from_slice(model.device(), &ids, &[1, ids.len()])?;
    let mut logits = model.forward(&x, &mut cache, &[0], true)?;
    let mut out = Vec::new();
    for _ in 0..48 {
        let id = wgrad::llm::sample(&logits, &wgrad::llm::Sampling::greedy())?;
        out.push(id.to_vec::<u32>()?[0]);
        logits = model.forward(&id.reshape(&[1, 1])?, &mut cache, &[0], true)?;
    }
    tok.decode(&out, true)
}

/// The loss curve as checkpoint text: `step:loss` pairs, comma-separated.
fn format_curve(curve: &[(u64, f32)]) -> String {
    let pairs: Vec<String> = curve.iter().map(|(s, l)| format!("{s}:{l}")).collect();
    pairs.join(",")
}

/// [`format_curve`]'s text back (pairs that do not parse are skipped).
fn parse_curve(text: &str) -> Vec<(u64, f32)> {
    text.split(',')
        .filter_map(|p| {
            let (s, l) = p.split_once(':')?;
            Some((s.parse().ok()?, l.parse().ok()?))
        })
        .collect()
}

fn invalid(op: &'static str, detail: impl Into<String>) -> wgrad::Error {
    wgrad::Error::Invalid {
        op,
        detail: detail.into(),
    }
}

fn run(a: &Args) -> Result<()> {
    let path = models::model_path(a.model.as_deref()).map_err(|m| invalid("finetune", m))?;
    let dev = Device::new()?;
    dev.manual_seed(a.seed);
    let dtype = match &a.dtype {
        Some(s) => s
            .parse::<DType>()
            .map_err(|e| invalid("--dtype", e.to_string()))?,
        None if dev.info().is_cpu() => DType::F32,
        None => DType::F16,
    };
    dev.set_memory_limit(a.budget);
    let file = GgufFile::open(&path)?;
    let tok = Tokenizer::from_gguf(&file)?;
    drop(file);
    let mut model = Llama::from_gguf(&dev, &path, dtype)?;
    if let Some(n) = a.blocks {
        model.truncate(n)?;
    }
    model.set_checkpointing(a.checkpointing);
    let data = a
        .data
        .clone()
        .unwrap_or_else(|| repo::repo_root().join("data/tinyshakespeare/input.txt"));
    let text = std::fs::read_to_string(&data)?;
    let ids = tok.encode(&text, false)?;
    let split = ids.len() * 9 / 10;
    let (train_ids, val_ids) = (&ids[..split], &ids[split..]);
    if val_ids.len() <= a.context + 1 {
        return Err(invalid(
            "finetune",
            format!(
                "{} tokens of text is too little for windows of {}",
                ids.len(),
                a.context
            ),
        ));
    }
    eprintln!(
        "{}: {} blocks, {dtype}, {:.1} MiB of weights; {}: {} tokens ({} held out)",
        path.display(),
        model.config().layers,
        model.weight_bytes() as f64 / (1 << 20) as f64,
        data.display(),
        ids.len(),
        val_ids.len()
    );
    let prompt = "ROMEO:";
    let val_before = val_loss(&model, val_ids, a)?;
    let sample_before = sample(&model, &tok, prompt)?;
    eprintln!("before: validation loss {val_before:.4}\n{prompt}{sample_before}\n");

    let targets: Vec<&str> = a.targets.split(',').map(str::trim).collect();
    let mut config = LoraConfig::new(a.rank, a.alpha, &targets);
    config.dropout = a.dropout;
    model.add_lora(config)?;
    let params = model.lora_params();
    let count: usize = params.iter().map(|(_, p)| p.numel()).sum();
    let mut opt = Adam::new(params.clone(), a.lr)?;
    let mut scaler = if dtype == DType::F16 {
        GradScaler::new()
    } else {
        GradScaler::unscaled()
    };
    eprintln!("{} adapter parameters on {}", count, a.targets);
    let mut rng = Rng(a.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let (mut curve, mut val_curve) = (Vec::new(), vec![(0u64, val_before)]);
    let ckpt = a.out.join("checkpoint.safetensors");
    let mut first = 1;
    if a.resume {
        let p = load_checkpoint(&ckpt, &params, &mut opt, Some(&mut scaler))?;
        rng = Rng(p.data_position);
        curve = parse_curve(p.notes.get("curve").map_or("", String::as_str));
        first = p.step as usize + 1;
        eprintln!("resumed from {} after step {}", ckpt.display(), p.step);
    }
    std::fs::create_dir_all(&a.out)?;
    dev.sync()?;
    let start = Instant::now();
    // The step time is taken after the first steps, which compile the kernels.
    let warm = first - 1 + ((a.steps + 1).saturating_sub(first) / 5).min(10);
    let mut timed = Instant::now();
    for step in first..=a.steps {
        if step == warm + 1 {
            dev.sync()?;
            timed = Instant::now();
        }
        let (x, y) = batch(&dev, train_ids, &mut rng, a.batch, a.context)?;
        opt.zero_grad();
        let loss = model.loss(&x, &y)?;
        scaler.scale_loss(&loss)?.backward()?;
        scaler.step(&mut opt, Some(1.0))?;
        if step % 10 == 0 || step == a.steps {
            let l = loss.to_scalar()?;
            curve.push((step as u64, l));
            eprintln!(
                "step {step:4}  loss {l:.4}  {:.0} ms/step  peak {:.0} MiB",
                start.elapsed().as_secs_f64() * 1e3 / (step + 1 - first) as f64,
                dev.memory_stats().peak_reserved as f64 / (1 << 20) as f64
            );
        }
        if step % a.save_every.max(1) == 0 || step == a.steps {
            let mut progress = Progress {
                step: step as u64,
                data_position: rng.0,
                ..Default::default()
            };
            progress.notes.insert("curve".into(), format_curve(&curve));
            save_checkpoint(&ckpt, &params, &opt, Some(&scaler), &progress)?;
        }
    }
    dev.sync()?;
    let step_ms = timed.elapsed().as_secs_f64() * 1e3 / a.steps.saturating_sub(warm).max(1) as f64;
    let val_after = val_loss(&model, val_ids, a)?;
    val_curve.push((a.steps as u64, val_after));
    let sample_after = sample(&model, &tok, prompt)?;
    eprintln!("\nafter: validation loss {val_after:.4}\n{prompt}{sample_after}\n");
    model.save_lora(a.out.join("adapter"), &path.display().to_string())?;
    std::fs::write(a.out.join("loss.svg"), plot::loss_svg(&curve, &val_curve))?;
    let peak = dev.memory_stats().peak_reserved as f64 / (1 << 20) as f64;
    eprintln!("adapter and loss.svg in {}", a.out.display());
    println!(
        "val_before={val_before:.4} val_after={val_after:.4} step_ms={step_ms:.1} peak_mib={peak:.0}"
    );
    Ok(())
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    if let Err(e) = run(&args) {
        eprintln!("finetune: {e}");
        std::process::exit(1);
    }
}
