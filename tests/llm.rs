//! Published-model support against the reference implementation: a tiny random
//! `LlamaForCausalLM` saved by transformers (tests/fixtures/tiny_llama, made by
//! scripts/make_tiny_llama.py) gives transformers' logits at every position and its greedy
//! tokens; decoding over the cache equals running the whole sequence; prompts of different
//! lengths decode together as they do alone; bad input is refused by name.

mod common;

use common::fixture;

use wgrad::llm::{Llama, Sampling, sample};
use wgrad::{DType, Device, Tensor};

struct Prompt {
    ids: Vec<u32>,
    logits: Vec<Vec<f32>>,
    generated: Vec<u32>,
}

fn reference() -> Vec<Prompt> {
    let text = std::fs::read_to_string(fixture("tiny_llama/reference.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ints = |x: &serde_json::Value| -> Vec<u32> {
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
        .map(|p| Prompt {
            ids: ints(&p["ids"]),
            logits: p["logits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|row| {
                    row.as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_f64().unwrap() as f32)
                        .collect()
                })
                .collect(),
            generated: ints(&p["generated"]),
        })
        .collect()
}

/// Greedy generation of `steps` tokens after `prompt`, one prefill then one token a step.
fn greedy(model: &Llama, prompt: &[u32], steps: usize) -> Vec<u32> {
    let dev = model.device();
    let mut cache = model.new_cache(1, prompt.len() + steps).unwrap();
    let x = Tensor::from_slice(dev, prompt, &[1, prompt.len()]).unwrap();
    let mut logits = model.forward(&x, &mut cache, &[0], true).unwrap();
    let mut out = Vec::new();
    for _ in 0..steps {
        let id = sample(&logits, &Sampling::greedy()).unwrap();
        out.push(id.to_vec::<u32>().unwrap()[0]);
        logits = model
            .forward(&id.reshape(&[1, 1]).unwrap(), &mut cache, &[0], true)
            .unwrap();
    }
    out
}

fn max_diff(model: &Llama, p: &Prompt) -> f32 {
    let dev = model.device();
    let mut cache = model.new_cache(1, p.ids.len()).unwrap();
    let x = Tensor::from_slice(dev, &p.ids, &[1, p.ids.len()]).unwrap();
    let got = model.forward(&x, &mut cache, &[0], false).unwrap();
    let vocab = model.config().vocab;
    assert_eq!(got.shape(), &[1, p.ids.len(), vocab]);
    let got = got.to_vec::<f32>().unwrap();
    let want: Vec<f32> = p.logits.iter().flatten().copied().collect();
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

/// f32 weights, one file and sharded: transformers' logits to 1e-4 and its greedy tokens.
#[test]
fn tiny_llama_matches_transformers() {
    let dev = common::device();
    for dir in ["tiny_llama", "tiny_llama_sharded"] {
        let model = Llama::from_hf(&dev, fixture(dir), DType::F32).unwrap();
        for (i, p) in reference().iter().enumerate() {
            let d = max_diff(&model, p);
            assert!(d <= 1e-4, "{dir} prompt {i}: logits differ by {d}");
            let got = greedy(&model, &p.ids, p.generated.len());
            assert_eq!(got, p.generated, "{dir} prompt {i}: greedy tokens");
        }
    }
}

/// bf16 weights (the format most checkpoints are published in) run in f32 and in bf16.
#[test]
fn bf16_checkpoint_loads() {
    let dev = common::device();
    let refs = reference();
    // The bf16 file holds the f32 weights rounded: logits within bf16's rounding of them.
    let model = Llama::from_hf(&dev, fixture("tiny_llama_bf16"), DType::F32).unwrap();
    let d = max_diff(&model, &refs[0]);
    assert!(d <= 0.05, "bf16 weights in f32: logits differ by {d}");
    let model = Llama::from_hf(&dev, fixture("tiny_llama_bf16"), DType::BF16).unwrap();
    let d = max_diff(&model, &refs[0]);
    assert!(d <= 0.25, "bf16 weights in bf16: logits differ by {d}");
}

/// Decoding one token at a time over the cache gives the logits of the whole sequence run
/// at once, in f32 and f16.
#[test]
fn cached_decode_equals_full_forward() {
    let dev = common::device();
    for dt in [DType::F32, DType::F16] {
        let model = Llama::from_hf(&dev, fixture("tiny_llama"), dt).unwrap();
        let ids: Vec<u32> = vec![3, 141, 59, 26, 5, 358, 97, 9, 32, 384];
        let x = Tensor::from_slice(&dev, &ids, &[1, ids.len()]).unwrap();
        let mut cache = model.new_cache(1, ids.len()).unwrap();
        let full = model.forward(&x, &mut cache, &[0], false).unwrap();
        let full = full.to_vec::<f32>().unwrap();
        let vocab = model.config().vocab;
        let mut cache = model.new_cache(1, ids.len()).unwrap();
        let split = 4;
        let head = Tensor::from_slice(&dev, &ids[..split], &[1, split]).unwrap();
        let mut got = model
            .forward(&head, &mut cache, &[0], false)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        for &id in &ids[split..] {
            let x = Tensor::from_slice(&dev, &[id], &[1, 1]).unwrap();
            got.extend(
                model
                    .forward(&x, &mut cache, &[0], false)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap(),
            );
        }
        assert_eq!(cache.len(0), ids.len());
        let tol = if dt == DType::F32 { 1e-4 } else { 3e-2 };
        for (i, (a, b)) in got.iter().zip(&full).enumerate() {
            assert!(
                (a - b).abs() <= tol * (1.0 + b.abs()),
                "{dt} position {} token {}: {a} vs {b}",
                i / vocab,
                i % vocab
            );
        }
    }
}

/// Decode steps over a cache split every 64 positions (the GPUs' flash-decoding path, forced
/// here on any adapter) give the logits of the whole sequence run at once.
#[test]
fn decode_over_a_split_cache_equals_full_forward() {
    let dev = common::device();
    let model = Llama::from_hf(&dev, fixture("tiny_llama"), DType::F32).unwrap();
    let vocab = model.config().vocab as u32;
    let ids: Vec<u32> = (0..128u32).map(|i| (i * 97 + 13) % vocab).collect();
    let x = Tensor::from_slice(&dev, &ids, &[1, ids.len()]).unwrap();
    let mut cache = model.new_cache(1, ids.len()).unwrap();
    let full = model
        .forward(&x, &mut cache, &[0], false)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    wgrad::testing::force_decode_span(Some(64));
    let prompt = 100;
    let mut cache = model.new_cache(1, ids.len()).unwrap();
    let head = Tensor::from_slice(&dev, &ids[..prompt], &[1, prompt]).unwrap();
    model.forward(&head, &mut cache, &[0], true).unwrap();
    let mut got = Vec::new();
    for &id in &ids[prompt..] {
        let x = Tensor::from_slice(&dev, &[id], &[1, 1]).unwrap();
        got.extend(
            model
                .forward(&x, &mut cache, &[0], true)
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
        );
    }
    wgrad::testing::force_decode_span(None);
    let want = &full[prompt * vocab as usize..];
    assert_eq!(got.len(), want.len());
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
            "position {} token {}: {a} vs {b}",
            prompt + i / vocab as usize,
            i % vocab as usize
        );
    }
}

/// Prompts of different lengths prefill into their own rows and decode together, giving the
/// tokens each gives alone.
#[test]
fn a_batch_of_prompts_decodes_as_each_alone() {
    let dev = common::device();
    let model = Llama::from_hf(&dev, fixture("tiny_llama"), DType::F32).unwrap();
    let prompts: [&[u32]; 3] = [&[1, 17, 300], &[5, 42, 99, 7, 250, 11, 8], &[400]];
    let steps = 6;
    let alone: Vec<Vec<u32>> = prompts.iter().map(|p| greedy(&model, p, steps)).collect();
    let mut cache = model.new_cache(prompts.len(), 16).unwrap();
    let mut last = Vec::new();
    for (row, p) in prompts.iter().enumerate() {
        let x = Tensor::from_slice(&dev, p, &[1, p.len()]).unwrap();
        last.push(model.forward(&x, &mut cache, &[row], true).unwrap());
    }
    let refs: Vec<&Tensor> = last.iter().collect();
    let mut logits = Tensor::cat(&refs, 0).unwrap();
    let rows: Vec<usize> = (0..prompts.len()).collect();
    let mut together = vec![Vec::new(); prompts.len()];
    for _ in 0..steps {
        let ids = sample(&logits, &Sampling::greedy()).unwrap();
        for (t, id) in together.iter_mut().zip(ids.to_vec::<u32>().unwrap()) {
            t.push(id);
        }
        let x = ids.reshape(&[prompts.len(), 1]).unwrap();
        logits = model.forward(&x, &mut cache, &rows, true).unwrap();
    }
    assert_eq!(together, alone);
}

/// Sampling with a temperature, top-k and top-p stays inside the allowed tokens, repeats
/// under the same seed, and follows the distribution.
#[test]
fn sampling_keeps_to_top_k_and_top_p() {
    let dev = common::device();
    // Probabilities 0.5, 0.25, 0.125, 0.125 (as logits), then a tail of tiny ones.
    let mut row = vec![-20.0f32; 64];
    row[7] = 0.0;
    row[3] = -(2f32.ln());
    row[40] = -(4f32.ln());
    row[9] = -(4f32.ln());
    let logits = Tensor::from_slice(&dev, &row.repeat(256), &[256, 64]).unwrap();
    let draw = |s: Sampling, seed: u64| {
        dev.manual_seed(seed);
        sample(&logits, &s).unwrap().to_vec::<u32>().unwrap()
    };
    let top2 = Sampling {
        temperature: 1.0,
        top_k: Some(2),
        top_p: None,
    };
    let ids = draw(top2, 1);
    assert!(ids.iter().all(|&i| i == 7 || i == 3), "{ids:?}");
    let sevens = ids.iter().filter(|&&i| i == 7).count();
    // 2/3 of 256 (170.7); five standard deviations is 38.
    assert!((133..=209).contains(&sevens), "{sevens} sevens of 256");
    assert_eq!(draw(top2, 1), ids, "same seed, same draws");
    let nucleus = Sampling {
        temperature: 1.0,
        top_k: None,
        top_p: Some(0.7),
    };
    let ids = draw(nucleus, 2);
    assert!(
        ids.iter().all(|&i| i == 7 || i == 3),
        "top_p 0.7 keeps two: {ids:?}"
    );
    let bad = Sampling {
        temperature: 1.0,
        top_k: None,
        top_p: Some(1.5),
    };
    let e = sample(&logits, &bad).unwrap_err().to_string();
    assert!(e.contains("top_p"), "{e}");
}

/// Bad input: a prompt past the cache, a cache past the context, another architecture, token
/// ids past the vocabulary on a checked device; nothing on the device is lost.
#[test]
fn bad_input_is_refused_by_name() {
    let dev = common::device();
    let model = Llama::from_hf(&dev, fixture("tiny_llama"), DType::F32).unwrap();
    let mut cache = model.new_cache(1, 4).unwrap();
    let x = Tensor::from_slice(&dev, &[1u32, 2, 3, 4, 5], &[1, 5]).unwrap();
    let e = model
        .forward(&x, &mut cache, &[0], true)
        .unwrap_err()
        .to_string();
    assert!(e.contains('5') && e.contains('4'), "{e}");
    assert_eq!(cache.len(0), 0, "a refused step leaves the cache as it was");
    let e = model.new_cache(1, 100_000).err().unwrap().to_string();
    assert!(e.contains("100000") && e.contains("128"), "{e}");
    // Another architecture, named.
    let dir = std::env::temp_dir().join(format!("wgrad-llm-arch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = std::fs::read_to_string(fixture("tiny_llama/config.json")).unwrap();
    std::fs::write(
        dir.join("config.json"),
        config.replace("\"llama\"", "\"gpt_neox\""),
    )
    .unwrap();
    std::fs::copy(
        fixture("tiny_llama/model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    let e = Llama::from_hf(&dev, &dir, DType::F32)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("gpt_neox"), "{e}");
    // Ids past the vocabulary on a checked device: an error naming the index.
    let checked = common::device_with(|o| o.checked = true);
    let model = Llama::from_hf(&checked, fixture("tiny_llama"), DType::F32).unwrap();
    let mut cache = model.new_cache(1, 4).unwrap();
    let x = Tensor::from_slice(&checked, &[1u32, 9999], &[1, 2]).unwrap();
    let e = model
        .forward(&x, &mut cache, &[0], true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("9999"), "{e}");
    // The model still runs.
    let x = Tensor::from_slice(&checked, &[1u32, 2], &[1, 2]).unwrap();
    let mut cache = model.new_cache(1, 4).unwrap();
    assert!(model.forward(&x, &mut cache, &[0], true).is_ok());
    let _ = Device::new();
}
