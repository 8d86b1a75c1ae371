//! LoRA adapters on the tiny Llama against Hugging Face's peft, both ways (fixtures from
//! scripts/make_tiny_llama_lora.py): peft's adapter gives peft's logits in wgrad; wgrad's
//! trained adapter, which the script loads into peft and checks, gives the logits committed
//! beside it. Also: training moves only the adapters and lowers the loss, and a bad adapter
//! is refused without losing the loaded one.
//!
//! `WGRAD_WRITE_LORA=1 cargo test --release --test lora` rewrites wgrad's adapter and logits
//! (then run the script to check them in peft).

mod common;

use common::fixture;

use wgrad::llm::{Llama, LoraConfig};
use wgrad::optim::{Adam, Optimizer};
use wgrad::{DType, Tensor, no_grad};

/// (prompt ids, logits per position) of a fixture's JSON.
fn reference(name: &str) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    let text = std::fs::read_to_string(fixture(name)).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let ids = p["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_u64().unwrap() as u32)
                .collect();
            let rows = p["logits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    r.as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_f64().unwrap() as f32)
                        .collect()
                })
                .collect();
            (ids, rows)
        })
        .collect()
}

/// The largest |wgrad - reference| over every prompt position, through the training pass
/// (no cache) and through the cached forward.
fn worst(model: &Llama, want: &[(Vec<u32>, Vec<Vec<f32>>)]) -> (f32, f32) {
    let dev = model.device();
    let (mut train, mut cached) = (0f32, 0f32);
    for (ids, rows) in want {
        let x = Tensor::from_slice(dev, ids, &[1, ids.len()]).unwrap();
        let a = no_grad(|| model.forward_train(&x))
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let mut cache = model.new_cache(1, ids.len()).unwrap();
        let b = model
            .forward(&x, &mut cache, &[0], false)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let want: Vec<f32> = rows.iter().flatten().copied().collect();
        for ((a, b), w) in a.iter().zip(&b).zip(&want) {
            train = train.max((a - w).abs());
            cached = cached.max((b - w).abs());
        }
        assert_eq!(a.len(), want.len());
    }
    (train, cached)
}

#[test]
fn peft_adapter_gives_peft_logits() {
    let dev = common::device();
    let mut model = Llama::from_hf(&dev, fixture("tiny_llama"), DType::F32).unwrap();
    let base = reference("tiny_llama/reference.json");
    let before = worst(&model, &base[..1]);
    model.load_lora(fixture("tiny_llama_lora/peft")).unwrap();
    assert_eq!(
        model.lora_params().len(),
        2 * 4 * 2,
        "2 blocks x 4 projections x (A, B)"
    );
    let (train, cached) = worst(&model, &reference("tiny_llama_lora/peft.json"));
    assert!(
        train <= 1e-4 && cached <= 1e-4,
        "logits differ from peft's by {train} / {cached}"
    );
    // The adapter does change the model (its B is not zero), and removing it restores the base.
    let changed = worst(&model, &base[..1]);
    assert!(
        changed.0 > 1e-2,
        "the adapter changed the logits by only {}",
        changed.0
    );
    model.remove_lora();
    assert_eq!(worst(&model, &base[..1]), before);
}

/// A few Adam steps of next-token training on a fixed batch: (first loss, last loss).
fn train(model: &Llama, steps: usize) -> (f32, f32) {
    let dev = model.device();
    let ids: Vec<u32> = (0..2 * 24).map(|i| ((i * 37 + 11) % 500) as u32).collect();
    let x = Tensor::from_slice(dev, &ids, &[2, 24]).unwrap();
    let inputs = x.narrow(1, 0, 23).unwrap().contiguous().unwrap();
    let targets = x
        .narrow(1, 1, 23)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape(&[46])
        .unwrap();
    let mut opt = Adam::new(model.lora_params(), 1e-2).unwrap();
    let (mut first, mut last) = (0.0, 0.0);
    for s in 0..steps {
        opt.zero_grad();
        let logits = model
            .forward_train(&inputs)
            .unwrap()
            .reshape(&[46, 512])
            .unwrap();
        let loss = logits.cross_entropy(&targets).unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
        let l = loss.to_scalar().unwrap();
        if s == 0 {
            first = l;
        }
        last = l;
    }
    (first, last)
}

/// `Llama::loss` (chunked output layer and loss) gives the loss and adapter gradients of the
/// whole logits' cross-entropy, and so does it with every block checkpointed; the adapters'
/// dropout draws the same masks each time (the seed is reset before each pass, and a
/// checkpointed block's recomputation rewinds it).
#[test]
fn loss_and_checkpointing_give_the_logits_gradients() {
    let dev = common::device();
    let mut model = Llama::from_hf(&dev, fixture("tiny_llama"), DType::F32).unwrap();
    let mut config = LoraConfig::new(4, 8.0, &["q_proj", "v_proj", "o_proj", "down_proj"]);
    config.dropout = 0.1;
    model.add_lora(config).unwrap();
    // B starts at zero, which would leave A without a gradient: give B values first.
    for (name, p) in model.lora_params() {
        if name.ends_with("lora_B.weight") {
            let v: Vec<f32> = (0..p.numel())
                .map(|i| ((i * 7 % 11) as f32 - 5.0) / 50.0)
                .collect();
            p.copy_from_slice(&v).unwrap();
        }
    }
    let ids: Vec<u32> = (0..2 * 17).map(|i| ((i * 53 + 5) % 500) as u32).collect();
    let x = Tensor::from_slice(&dev, &ids, &[2, 17]).unwrap();
    let inputs = x.narrow(1, 0, 16).unwrap().contiguous().unwrap();
    let targets = x.narrow(1, 1, 16).unwrap().contiguous().unwrap();
    let grads = |model: &Llama| -> Vec<Vec<f32>> {
        model
            .lora_params()
            .iter()
            .map(|(n, p)| {
                let g = p.grad().unwrap_or_else(|| panic!("{n} got no gradient"));
                p.zero_grad();
                g.to_vec::<f32>().unwrap()
            })
            .collect()
    };
    dev.manual_seed(9);
    let plain = model
        .forward_train(&inputs)
        .unwrap()
        .reshape(&[32, 512])
        .unwrap()
        .cross_entropy(&targets.reshape(&[32]).unwrap())
        .unwrap();
    plain.backward().unwrap();
    let (want_loss, want) = (plain.to_scalar().unwrap(), grads(&model));
    for checkpointing in [false, true] {
        model.set_checkpointing(checkpointing);
        dev.manual_seed(9);
        let loss = model.loss(&inputs, &targets).unwrap();
        loss.backward().unwrap();
        let got = grads(&model);
        let l = loss.to_scalar().unwrap();
        assert!(
            (l - want_loss).abs() < 1e-5,
            "checkpointing {checkpointing}: loss {l} against {want_loss}"
        );
        for (g, w) in got.iter().zip(&want) {
            let w: Vec<f64> = w.iter().map(|&v| v as f64).collect();
            common::assert_close_tol(g, &w, (1e-6, 1e-4), "an adapter's gradient");
        }
    }
    let bad = Tensor::from_slice(&dev, &ids[..16], &[1, 16]).unwrap();
    let e = model.loss(&inputs, &bad).unwrap_err().to_string();
    assert!(e.contains("Llama::loss") && e.contains("targets"), "{e}");
}

#[test]
fn training_moves_only_the_adapters_and_round_trips() {
    let dev = common::device();
    let mut model = Llama::from_hf(&dev, fixture("tiny_llama"), DType::F32).unwrap();
    let mut config = LoraConfig::new(4, 8.0, &["q_proj", "v_proj", "o_proj", "down_proj"]);
    config.dropout = 0.05;
    model.add_lora(config).unwrap();
    // New adapters start with B = 0: the model is the base model.
    let base = reference("tiny_llama/reference.json");
    assert!(worst(&model, &base[..1]).0 <= 1e-4);
    let (first, last) = train(&model, 12);
    eprintln!("loss {first:.4} -> {last:.4}");
    assert!(
        last < first - 0.1,
        "training the adapters lowered the loss only from {first} to {last}"
    );
    let dir = std::env::temp_dir().join(format!("wgrad-lora-{}", std::process::id()));
    model.save_lora(&dir, "tiny_llama").unwrap();
    let mut again = Llama::from_hf(&dev, fixture("tiny_llama"), DType::F32).unwrap();
    again.load_lora(&dir).unwrap();
    let ids = [3u32, 141, 59, 26, 5];
    let x = Tensor::from_slice(&dev, &ids, &[1, 5]).unwrap();
    let a = no_grad(|| model.forward_train(&x))
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let b = no_grad(|| again.forward_train(&x))
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(a, b, "saved and loaded adapters give the same logits");
    let _ = std::fs::remove_dir_all(&dir);

    if std::env::var("WGRAD_WRITE_LORA").is_ok_and(|v| v == "1") {
        let out = fixture("tiny_llama_lora/wgrad");
        model.save_lora(&out, "tiny_llama").unwrap();
        let prompts: Vec<serde_json::Value> = [
            vec![3u32, 141, 59, 26, 5, 358, 97, 9, 32, 384],
            vec![7, 7, 300, 12],
        ]
        .iter()
        .map(|ids| {
            let x = Tensor::from_slice(&dev, ids, &[1, ids.len()]).unwrap();
            let l = no_grad(|| model.forward_train(&x))
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            let rows: Vec<Vec<f32>> = l.chunks(512).map(|r| r.to_vec()).collect();
            serde_json::json!({"ids": ids, "logits": rows})
        })
        .collect();
        let text = serde_json::to_string(&serde_json::json!({"prompts": prompts})).unwrap();
        std::fs::write(fixture("tiny_llama_lora/wgrad.json"), text + "\n").unwrap();
    }
}

#[test]
fn wgrad_adapter_gives_its_committed_logits() {
    // The adapter wgrad trained and saved, read back: the logits committed with it, which
    // scripts/make_tiny_llama_lora.py checked in peft.
    let dev = common::device();
    let mut model = Llama::from_hf(&dev, fixture("tiny_llama"), DType::F32).unwrap();
    model.load_lora(fixture("tiny_llama_lora/wgrad")).unwrap();
    let (train, cached) = worst(&model, &reference("tiny_llama_lora/wgrad.json"));
    assert!(train <= 1e-5 && cached <= 1e-4, "{train} / {cached}");
}

#[test]
fn a_bad_adapter_is_refused_and_the_loaded_one_kept() {
    let dev = common::device();
    let mut model = Llama::from_hf(&dev, fixture("tiny_llama"), DType::F32).unwrap();
    model.load_lora(fixture("tiny_llama_lora/peft")).unwrap();
    let want = reference("tiny_llama_lora/peft.json");
    let dir = std::env::temp_dir().join(format!("wgrad-bad-lora-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config =
        std::fs::read_to_string(fixture("tiny_llama_lora/peft/adapter_config.json")).unwrap();
    // Rank 8 in the config against rank-4 tensors: a shape error naming the tensor.
    std::fs::write(
        dir.join("adapter_config.json"),
        config.replace("\"r\": 4", "\"r\": 8"),
    )
    .unwrap();
    std::fs::copy(
        fixture("tiny_llama_lora/peft/adapter_model.safetensors"),
        dir.join("adapter_model.safetensors"),
    )
    .unwrap();
    let err = model.load_lora(&dir).unwrap_err().to_string();
    assert!(
        err.contains("down_proj.lora_A") && err.contains("[4, 160]") && err.contains("[8, 160]"),
        "{err}"
    );
    // A target the model does not have; a DoRA adapter.
    for (from, to, named) in [
        ("\"q_proj\"", "\"qkv\"", "qkv"),
        ("\"use_dora\": false", "\"use_dora\": true", "use_dora"),
    ] {
        std::fs::write(dir.join("adapter_config.json"), config.replace(from, to)).unwrap();
        let err = model.load_lora(&dir).unwrap_err().to_string();
        assert!(err.contains(named), "{err}");
    }
    // Truncated weights.
    std::fs::write(dir.join("adapter_config.json"), &config).unwrap();
    let bytes = std::fs::read(fixture("tiny_llama_lora/peft/adapter_model.safetensors")).unwrap();
    std::fs::write(
        dir.join("adapter_model.safetensors"),
        &bytes[..bytes.len() / 2],
    )
    .unwrap();
    assert!(model.load_lora(&dir).is_err());
    let _ = std::fs::remove_dir_all(&dir);
    // The adapter loaded first is still there and still right.
    let (train, _) = worst(&model, &want);
    assert!(train <= 1e-4, "{train}");
}
