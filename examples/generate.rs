//! Generates text with a published Llama-family model, streamed as it is sampled, and reports
//! the prefill and decode rates; `--bench` measures those rates alone.
//!
//! ```text
//! cargo run --release --features tokenizers --example generate -- \
//!     [--model FILE.gguf|DIR] [--prompt TEXT] [--raw] [--max-tokens 64] [--temperature 0.7]
//!     [--top-k K] [--top-p 0.9] [--seed 0] [--dtype f32|f16|bf16] [--decoded] [--profile]
//! cargo run --release --features tokenizers --example generate -- --bench \
//!     [--bench-prompt 512] [--bench-decode 128] [--bench-batch 8]
//! ```
//!
//! The model is a GGUF file (its tokenizer and chat template come from its metadata) or a
//! Hugging Face checkpoint directory (`config.json`, the safetensors, `tokenizer.json`, and a
//! chat template in `chat_template.jinja` or `tokenizer_config.json`). By default it is
//! SmolLM2-135M-Instruct in the model cache, where `scripts/fetch_smollm2.sh` puts it.
//!
//! A model with a chat template gets the prompt as one user message, followed by the text that
//! opens the assistant's reply; `--raw` sends the prompt as it is. Sampling defaults to
//! temperature 0.7 and top-p 0.9, the common settings for chat; `--temperature 0` is greedy
//! decoding. `--seed` makes a sampled run repeatable.
//!
//! The reply goes to stdout, each piece of text as soon as the token completing it is read
//! back; generation stops at an end-of-sequence token or after `--max-tokens`. The report
//! goes to stderr: the prompt's tokens, the prefill rate (the prompt's tokens through the
//! model and the first token sampled and read back), the decode rate (every later token,
//! each read back before the next step starts), the host's time a decode step spends
//! recording its work and encoding it for the device, and memory. On a CPU adapter
//! (lavapipe) submitting a batch runs it, so "encoding and submitting" includes the device's
//! work there. `--profile` adds the device time of each kernel over the decode steps.
//!
//! `--bench` streams nothing. It repeats the encoded prompt to `--bench-prompt` tokens, then
//! times a prefill and `--bench-decode` greedy decode steps at batch 1, and the same decode
//! steps at batch `--bench-batch` (that many copies of the prompt in as many cache rows,
//! decoding together). Each decode step feeds the ids it sampled to the next without reading
//! them back; one read-back ends each timed phase, so the time is the device's throughput
//! with the host's recording overlapped. An untimed run of the same prefill and two decode
//! steps comes first (pipelines compile on first use), and two untimed decode steps precede
//! the timed batch run. The result is one JSON line on stdout: the rates, the host's time
//! recording a decode step (the timed loop before its final wait), kernel launches a step,
//! and memory.

use std::io::Write;

#[path = "common/models.rs"]
mod models;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use wgrad::error::fmt_bytes;
use wgrad::gguf::GgufFile;
use wgrad::llm::{ChatTemplate, KvCache, Llama, Message, Sampling, Tokenizer, sample};
use wgrad::{DType, Device, Result, Tensor};

/// Generates text with a published model, streamed, and reports prefill and decode rates.
#[derive(clap::Parser, Debug)]
#[command(name = "generate")]
struct Args {
    /// A GGUF file, or a Hugging Face checkpoint directory (config.json, safetensors,
    /// tokenizer.json). Default: SmolLM2-135M-Instruct in the model cache
    /// ($WGRAD_MODEL_DIR, else ~/.cache/wgrad/models; scripts/fetch_smollm2.sh fetches it).
    #[arg(long, value_name = "FILE.gguf|DIR")]
    model: Option<PathBuf>,
    /// The prompt: one user message for a model with a chat template (see --raw).
    #[arg(long, default_value = "What is the capital of France?")]
    prompt: String,
    /// Send the prompt as it is, without the chat template.
    #[arg(long)]
    raw: bool,
    /// Most tokens to generate.
    #[arg(long = "max-tokens", default_value_t = 64)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy decoding.
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    /// Sample among the k most likely tokens only (default: all).
    #[arg(long = "top-k")]
    top_k: Option<usize>,
    /// Sample among the most likely tokens whose probabilities add up to this (1: all).
    #[arg(long = "top-p", default_value_t = 0.9)]
    top_p: f32,
    /// Seed of the device's random stream, which sampling draws from.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Dtype of the weights, activations and cache (default: f32 on a CPU adapter, f16 on
    /// a GPU).
    #[arg(long, value_parser = ["f32", "f16", "bf16"])]
    dtype: Option<String>,
    /// Decode a GGUF file's quantized matrices to --dtype when loading, instead of keeping
    /// them in their block formats on the device.
    #[arg(long)]
    decoded: bool,
    /// Print the device time of each kernel over the decode steps (to stderr); with
    /// --bench, over untimed repeats of its phases.
    #[arg(long)]
    profile: bool,
    /// Measure prefill and decode rates instead of generating; prints one JSON line.
    #[arg(long)]
    bench: bool,
    /// Prompt tokens of the benchmark's prefill (the encoded prompt, repeated).
    #[arg(long = "bench-prompt", default_value_t = 512)]
    bench_prompt: usize,
    /// Decode steps the benchmark times, at batch 1 and at --bench-batch.
    #[arg(long = "bench-decode", default_value_t = 128)]
    bench_decode: usize,
    /// Sequences decoding together in the benchmark's batched run.
    #[arg(long = "bench-batch", default_value_t = 8)]
    bench_batch: usize,
}

/// What the command line asks to run on, found and opened.
struct Loaded {
    dev: Device,
    model: Llama,
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    /// The file or directory's name, for the report.
    name: String,
}

fn main() {
    // Parsed before anything opens, so --help and typos answer at once.
    let args = <Args as clap::Parser>::parse();
    if let Err(e) = check_args(&args) {
        eprintln!("generate: {e}");
        std::process::exit(2);
    }
    let path = match models::model_path(args.model.as_deref()) {
        Ok(p) => p,
        Err(msg) => {
            eprintln!("generate: {msg}");
            std::process::exit(1);
        }
    };
    if let Err(e) = run(&args, &path) {
        eprintln!("generate: {e}");
        std::process::exit(1);
    }
}

/// Values clap's types let through that cannot run.
fn check_args(a: &Args) -> std::result::Result<(), String> {
    if !(a.temperature >= 0.0 && a.temperature.is_finite()) {
        return Err(format!(
            "--temperature {} is not a finite number >= 0",
            a.temperature
        ));
    }
    if !(a.top_p > 0.0 && a.top_p <= 1.0) {
        return Err(format!("--top-p {} is not in (0, 1]", a.top_p));
    }
    if a.top_k == Some(0) {
        return Err("--top-k 0 keeps no token".into());
    }
    if a.bench && (a.bench_prompt == 0 || a.bench_decode == 0 || a.bench_batch == 0) {
        return Err("--bench-prompt, --bench-decode and --bench-batch must be at least 1".into());
    }
    Ok(())
}

/// Whether a checkpoint directory ships a chat template (`ChatTemplate::from_dir` reads it).
fn dir_has_template(dir: &Path) -> bool {
    if dir.join("chat_template.jinja").exists() {
        return true;
    }
    std::fs::read(dir.join("tokenizer_config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .is_some_and(|v| v.get("chat_template").is_some())
}

fn load(a: &Args, path: &Path) -> Result<Loaded> {
    let dev = Device::new()?;
    dev.manual_seed(a.seed);
    let dtype = match &a.dtype {
        Some(s) => s.parse::<DType>().map_err(|e| invalid("--dtype", e))?,
        // A CPU adapter runs f32 at least as fast as f16 (no native half arithmetic there);
        // a GPU halves the bytes every step reads.
        None if dev.info().is_cpu() => DType::F32,
        None => DType::F16,
    };
    let start = Instant::now();
    let (model, tokenizer, template) = if path.is_dir() {
        let model = Llama::from_hf(&dev, path, dtype)?;
        let tokenizer = Tokenizer::from_file(path.join("tokenizer.json"))?;
        let template = if a.raw || !dir_has_template(path) {
            None
        } else {
            Some(ChatTemplate::from_dir(path)?)
        };
        (model, tokenizer, template)
    } else {
        let file = GgufFile::open(path)?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        let template = if a.raw || file.get("tokenizer.chat_template").is_none() {
            None
        } else {
            Some(ChatTemplate::from_gguf(&file)?)
        };
        drop(file);
        let model = if a.decoded {
            Llama::from_gguf_decoded(&dev, path, dtype)?
        } else {
            Llama::from_gguf(&dev, path, dtype)?
        };
        (model, tokenizer, template)
    };
    dev.sync()?;
    let c = model.config();
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    eprintln!(
        "{name}: {} layers, width {}, {} heads ({} kv), vocab {}, context {}; {dtype}, {} of \
         weights, loaded in {:.2} s",
        c.layers,
        c.hidden,
        c.heads,
        c.kv_heads,
        c.vocab,
        c.max_position,
        fmt_bytes(model.weight_bytes()),
        start.elapsed().as_secs_f64()
    );
    eprintln!(
        "device: {} ({}, {}, {})",
        dev.info().name,
        dev.info().backend,
        dev.info().device_type,
        dev.info().driver
    );
    Ok(Loaded {
        dev,
        model,
        tokenizer,
        template,
        name,
    })
}

/// The prompt's token ids: through the chat template when there is one, else as written (with
/// the tokens the tokenizer adds around a sequence, such as Llama's bos).
fn encode_prompt(l: &Loaded, prompt: &str) -> Result<Vec<u32>> {
    match &l.template {
        // The rendered text carries every special token the model expects (bos included
        // where the template writes it), so the tokenizer adds none.
        Some(t) => l
            .tokenizer
            .encode(&t.render(&[Message::user(prompt)], true)?, false),
        None => l.tokenizer.encode(prompt, true),
    }
}

fn run(a: &Args, path: &Path) -> Result<()> {
    let l = load(a, path)?;
    let ids = encode_prompt(&l, &a.prompt)?;
    if ids.is_empty() {
        return Err(invalid("--prompt", "the prompt encodes to no tokens"));
    }
    if a.bench {
        bench(a, &l, &ids)
    } else {
        generate(a, &l, &ids)
    }
}

/// An argument the run cannot use, as the library reports one.
fn invalid(op: &'static str, detail: impl Into<String>) -> wgrad::Error {
    wgrad::Error::Invalid {
        op,
        detail: detail.into(),
    }
}

fn rate(tokens: usize, time: Duration) -> f64 {
    tokens as f64 / time.as_secs_f64().max(1e-9)
}

fn generate(a: &Args, l: &Loaded, prompt: &[u32]) -> Result<()> {
    let (dev, model, tok) = (&l.dev, &l.model, &l.tokenizer);
    let context = model.config().max_position;
    if prompt.len() >= context {
        return Err(invalid(
            "--prompt",
            format!(
                "{} tokens leave no room in the model's context of {context}",
                prompt.len()
            ),
        ));
    }
    // The last token sampled is never fed back, so the cache needs one position less.
    let max_tokens = a.max_tokens.min(context - prompt.len());
    if max_tokens == 0 {
        return Ok(());
    }
    let sampling = Sampling {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: Some(a.top_p),
    };
    let mut cache = model.new_cache(1, prompt.len() + max_tokens)?;

    // Prefill: the whole prompt in one step; its last position's logits give the first token.
    let start = Instant::now();
    let tokens = Tensor::from_slice(dev, prompt, &[1, prompt.len()])?;
    let logits = model.forward(&tokens, &mut cache, &[0], true)?;
    let mut next = sample(&logits, &sampling)?.to_vec::<u32>()?[0];
    let prefill = start.elapsed();

    // Decode: one token a step, read back to be printed and checked for the end.
    let mut stream = tok.stream(true);
    let mut out = std::io::stdout().lock();
    let mut generated = 0;
    let mut stopped_at_eos = false;
    let (mut decode, mut record) = (Duration::ZERO, Duration::ZERO);
    let before = dev.dispatch_stats();
    let built_before = wgrad::kernels::pipeline_count(dev);
    if a.profile {
        dev.start_profiling()?;
    }
    let mut steps = 0;
    loop {
        if tok.is_eos(next) {
            stopped_at_eos = true;
            break;
        }
        let piece = stream.push(tok, next)?;
        out.write_all(piece.as_bytes())?;
        out.flush()?;
        generated += 1;
        if generated == max_tokens {
            break;
        }
        let start = Instant::now();
        let tokens = Tensor::from_slice(dev, &[next], &[1, 1])?;
        let logits = model.forward(&tokens, &mut cache, &[0], true)?;
        let ids = sample(&logits, &sampling)?;
        // Up to here the host only recorded work; the read-back waits for the device.
        record += start.elapsed();
        next = ids.to_vec::<u32>()?[0];
        decode += start.elapsed();
        steps += 1;
    }
    let after = dev.dispatch_stats();
    let built = wgrad::kernels::pipeline_count(dev) - built_before;
    let profile = if a.profile {
        Some(dev.stop_profiling()?)
    } else {
        None
    };
    out.write_all(stream.finish(tok)?.as_bytes())?;
    writeln!(out)?;
    out.flush()?;
    drop(out);

    if let Some(p) = profile {
        eprintln!("\ndecode steps' kernels:\n{p}");
    }
    let stats = dev.memory_stats();
    eprintln!(
        "\nprompt {} tokens, prefill {:.2} tokens/s ({:.1} ms)",
        prompt.len(),
        rate(prompt.len(), prefill),
        prefill.as_secs_f64() * 1e3
    );
    eprintln!(
        "generated {generated} tokens ({}), decode {:.2} tokens/s over {steps} steps",
        if stopped_at_eos {
            "end of sequence"
        } else {
            "--max-tokens reached"
        },
        rate(steps, decode)
    );
    if steps > 0 {
        let per = |d: Duration| d.as_secs_f64() * 1e3 / steps as f64;
        eprintln!(
            "host a decode step: {:.2} ms recording, {:.2} ms encoding and submitting, {} \
             kernel launches ({built} kernels compiled while decoding)",
            per(record),
            per(after.encode_time.saturating_sub(before.encode_time)),
            (after.dispatches - before.dispatches) / steps as u64
        );
    }
    eprintln!(
        "memory: weights {}, cache {}, peak allocated {}, peak reserved {}",
        fmt_bytes(model.weight_bytes()),
        fmt_bytes(cache.nbytes()),
        fmt_bytes(stats.peak_allocated),
        fmt_bytes(stats.peak_reserved)
    );
    Ok(())
}

/// One greedy decode step of every row: the ids sampled last, fed back without a read-back.
fn decode_step(model: &Llama, cache: &mut KvCache, rows: &[usize], ids: &Tensor) -> Result<Tensor> {
    let tokens = ids.reshape(&[rows.len(), 1])?;
    let logits = model.forward(&tokens, cache, rows, true)?;
    sample(&logits, &Sampling::greedy())
}

/// What one benchmark phase measured.
struct Phase {
    prefill: Duration,
    /// The timed decode steps, read back once at the end.
    decode: Duration,
    /// The host's time recording those steps (the decode loop without the final wait).
    record: Duration,
    /// Kernel launches a decode step.
    launches: u64,
}

/// A prefill of `prompt` in each of `batch` cache rows, `warm` untimed decode steps, then
/// `steps` timed ones.
fn bench_phase(
    l: &Loaded,
    prompt: &[u32],
    batch: usize,
    warm: usize,
    steps: usize,
) -> Result<Phase> {
    let (dev, model) = (&l.dev, &l.model);
    let mut cache = model.new_cache(batch, prompt.len() + warm + steps)?;
    let rows: Vec<usize> = (0..batch).collect();
    let all: Vec<u32> = prompt
        .iter()
        .copied()
        .cycle()
        .take(batch * prompt.len())
        .collect();
    dev.sync()?;
    let start = Instant::now();
    let tokens = Tensor::from_slice(dev, &all, &[batch, prompt.len()])?;
    let logits = model.forward(&tokens, &mut cache, &rows, true)?;
    let mut ids = sample(&logits, &Sampling::greedy())?;
    ids.to_vec::<u32>()?;
    let prefill = start.elapsed();
    for _ in 0..warm {
        ids = decode_step(model, &mut cache, &rows, &ids)?;
    }
    ids.to_vec::<u32>()?;
    let before = dev.dispatch_stats();
    let start = Instant::now();
    for _ in 0..steps {
        ids = decode_step(model, &mut cache, &rows, &ids)?;
    }
    let record = start.elapsed();
    ids.to_vec::<u32>()?;
    let decode = start.elapsed();
    let launches = (dev.dispatch_stats().dispatches - before.dispatches) / steps.max(1) as u64;
    Ok(Phase {
        prefill,
        decode,
        record,
        launches,
    })
}

fn bench(a: &Args, l: &Loaded, encoded: &[u32]) -> Result<()> {
    let (p, d, b) = (a.bench_prompt, a.bench_decode, a.bench_batch);
    let prompt: Vec<u32> = encoded.iter().copied().cycle().take(p).collect();
    let warm = 2;
    // Untimed: the same prefill and a few steps, so every pipeline is compiled.
    bench_phase(l, &prompt, 1, 0, warm)?;
    let one = bench_phase(l, &prompt, 1, 0, d)?;
    let many = bench_phase(l, &prompt, b, warm, d)?;
    let (prefill, decode1, decode_b) = (one.prefill, one.decode, many.decode);
    if a.profile {
        // Untimed repeats with the profiler on: where the device time of each goes.
        for batch in [1, b] {
            l.dev.start_profiling()?;
            bench_phase(l, &prompt, batch, 0, d)?;
            eprintln!(
                "prefill and decode at batch {batch}, kernels:\n{}",
                l.dev.stop_profiling()?
            );
        }
    }
    let stats = l.dev.memory_stats();
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    let round = |x: f64| (x * 100.0).round() / 100.0;
    let mut out = serde_json::Map::new();
    out.insert("model".into(), l.name.clone().into());
    out.insert("device".into(), l.dev.info().name.clone().into());
    out.insert("backend".into(), l.dev.info().backend.clone().into());
    out.insert("dtype".into(), l.model.dtype().to_string().into());
    out.insert(
        "weights".into(),
        if a.decoded { "decoded" } else { "as stored" }.into(),
    );
    out.insert("prefill_tokens".into(), p.into());
    out.insert("decode_steps".into(), d.into());
    out.insert(
        "prefill_tokens_per_s".into(),
        round(rate(p, prefill)).into(),
    );
    out.insert(
        "decode_tokens_per_s_batch1".into(),
        round(rate(d, decode1)).into(),
    );
    out.insert(
        format!("decode_tokens_per_s_batch{b}"),
        round(rate(b * d, decode_b)).into(),
    );
    let ms_per_step = |t: Duration| round(t.as_secs_f64() * 1e3 / d as f64);
    out.insert(
        "host_record_ms_per_step_batch1".into(),
        ms_per_step(one.record).into(),
    );
    out.insert(
        format!("host_record_ms_per_step_batch{b}"),
        ms_per_step(many.record).into(),
    );
    out.insert("launches_per_step_batch1".into(), one.launches.into());
    out.insert(format!("launches_per_step_batch{b}"), many.launches.into());
    out.insert(
        "weight_mib".into(),
        round(mib(l.model.weight_bytes())).into(),
    );
    out.insert("peak_mib".into(), round(mib(stats.peak_reserved)).into());
    out.insert(
        "peak_allocated_mib".into(),
        round(mib(stats.peak_allocated)).into(),
    );
    println!("{}", serde_json::Value::Object(out));
    Ok(())
}
