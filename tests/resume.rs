//! Resumable training: 20 steps straight and 10 steps, a checkpoint, a rebuilt model and 10
//! more give the same losses, bit for bit (f16 storage, loss scaling, dropout, AdamW); a
//! checkpoint that was truncated or edited is refused with an error naming the file.

mod common;

use wgrad::nn::{Embedding, Linear, Module, TransformerBlock};
use wgrad::optim::{Adam, GradScaler, Optimizer};
use wgrad::train::{Progress, load_checkpoint, load_weights, save_checkpoint};
use wgrad::{DType, Device, Error, Tensor};

const VOCAB: usize = 11;
const B: usize = 4;
const T: usize = 8;
const E: usize = 16;

struct TinyGpt {
    tok: Embedding,
    block: TransformerBlock,
    head: Linear,
}

impl TinyGpt {
    fn new(dev: &Device) -> TinyGpt {
        TinyGpt {
            tok: Embedding::new(dev, VOCAB, E, DType::F16).unwrap(),
            block: TransformerBlock::new(dev, E, 2, true, 0.2, DType::F16).unwrap(),
            head: Linear::new(dev, E, VOCAB, true, DType::F16).unwrap(),
        }
    }
    fn params(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![("tok".to_string(), self.tok.weight.clone())];
        v.extend(self.block.params());
        v.extend(self.head.params());
        v
    }
    fn loss(&self, x: &Tensor, y: &Tensor) -> Tensor {
        let h = self.block.forward(&self.tok.lookup(x).unwrap()).unwrap();
        let logits = self
            .head
            .forward(&h)
            .unwrap()
            .reshape(&[B * T, VOCAB])
            .unwrap();
        logits
            .to_dtype(DType::F32)
            .unwrap()
            .cross_entropy(&y.reshape(&[B * T]).unwrap())
            .unwrap()
    }
}

/// A sampler whose whole state is one u64 (what a checkpoint's data position holds).
fn batch(dev: &Device, state: &mut u64) -> (Tensor, Tensor) {
    // Windows of a sequence that counts up (mod VOCAB) from a random start: learnable.
    let mut ids = Vec::with_capacity(B * (T + 1));
    for _ in 0..B {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        let start = *state % VOCAB as u64;
        ids.extend((0..=T as u64).map(|t| ((start + t) % VOCAB as u64) as u32));
    }
    let x: Vec<u32> = (0..B)
        .flat_map(|b| ids[b * (T + 1)..b * (T + 1) + T].to_vec())
        .collect();
    let y: Vec<u32> = (0..B)
        .flat_map(|b| ids[b * (T + 1) + 1..(b + 1) * (T + 1)].to_vec())
        .collect();
    (
        Tensor::from_slice(dev, &x, &[B, T]).unwrap(),
        Tensor::from_slice(dev, &y, &[B, T]).unwrap(),
    )
}

struct Run {
    model: TinyGpt,
    opt: Adam,
    scaler: GradScaler,
    data: u64,
}

impl Run {
    fn new(dev: &Device, seed: u64) -> Run {
        dev.manual_seed(seed);
        let model = TinyGpt::new(dev);
        let opt = Adam::with(model.params(), 3e-3, (0.9, 0.99), 1e-8, 0.1, true).unwrap();
        Run {
            model,
            opt,
            scaler: GradScaler::new(),
            data: 0x2545_f491_4f6c_dd1d,
        }
    }
    fn step(&mut self, dev: &Device) -> f32 {
        let (x, y) = batch(dev, &mut self.data);
        let loss = self.model.loss(&x, &y);
        self.scaler.scale_loss(&loss).unwrap().backward().unwrap();
        self.scaler.step(&mut self.opt, Some(1.0)).unwrap();
        self.opt.zero_grad();
        loss.to_scalar().unwrap()
    }
}

fn tmp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("wgrad-resume-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn resumed_run_matches_the_straight_run() {
    let dev = common::device();
    let mut straight = Run::new(&dev, 7);
    let want: Vec<f32> = (0..20).map(|_| straight.step(&dev)).collect();

    let mut first = Run::new(&dev, 7);
    let mut got: Vec<f32> = (0..10).map(|_| first.step(&dev)).collect();
    let path = tmp("run.safetensors");
    let mut notes = std::collections::BTreeMap::new();
    notes.insert("config".to_string(), "tiny".to_string());
    let progress = Progress {
        step: 10,
        data_position: first.data,
        notes,
    };
    save_checkpoint(
        &path,
        &first.model.params(),
        &first.opt,
        Some(&first.scaler),
        &progress,
    )
    .unwrap();
    // Keep using the device in between, as a restarted process would have drawn its own
    // random numbers for initialisation.
    let _ = dev.randn(&[100], DType::F32).unwrap();
    drop(first);

    // A rebuilt run with another initialisation: everything must come from the file.
    let mut second = Run::new(&dev, 99);
    let back = load_checkpoint(
        &path,
        &second.model.params(),
        &mut second.opt,
        Some(&mut second.scaler),
    )
    .unwrap();
    assert_eq!(back, progress);
    assert_eq!(second.opt.steps(), 10);
    second.data = back.data_position;
    got.extend((0..10).map(|_| second.step(&dev)));
    assert_eq!(
        got, want,
        "losses of 10 + resume + 10 steps against 20 straight"
    );
    assert!(want[19] < want[0], "the tiny model learns: {want:?}");

    // Weights alone, for inference: same logits as the trained model.
    let infer = TinyGpt::new(&dev);
    load_weights(&path, &infer.params()).unwrap();
    // The inference model holds the weights saved at step 10 (the resumed run has moved on).
    let (x, y) = batch(&dev, &mut 1);
    let mut check = Run::new(&dev, 5);
    load_checkpoint(&path, &check.model.params(), &mut check.opt, None).unwrap();
    for ((n, a), (_, b)) in infer.params().iter().zip(check.model.params().iter()) {
        assert_eq!(a.to_f32_vec().unwrap(), b.to_f32_vec().unwrap(), "{n}");
    }
    wgrad::no_grad(|| {
        infer.block.train(false);
        check.model.block.train(false);
        assert_eq!(
            infer.loss(&x, &y).to_scalar().unwrap(),
            check.model.loss(&x, &y).to_scalar().unwrap()
        );
    });
    let _ = std::fs::remove_file(&path);
}

#[test]
fn damaged_checkpoints_are_refused_by_name() {
    let dev = common::device();
    let mut run = Run::new(&dev, 3);
    run.step(&dev);
    let path = tmp("damaged.safetensors");
    let params = run.model.params();
    save_checkpoint(
        &path,
        &params,
        &run.opt,
        Some(&run.scaler),
        &Progress::default(),
    )
    .unwrap();
    let good = std::fs::read(&path).unwrap();
    let before: Vec<Vec<f32>> = params
        .iter()
        .map(|(_, t)| t.to_f32_vec().unwrap())
        .collect();

    let refuse = |bytes: &[u8], what: &str, expect: &str| {
        let p = tmp(&format!("{what}.safetensors"));
        std::fs::write(&p, bytes).unwrap();
        let mut fresh = Run::new(&dev, 4);
        let e = load_checkpoint(
            &p,
            &fresh.model.params(),
            &mut fresh.opt,
            Some(&mut fresh.scaler),
        )
        .expect_err(what);
        let msg = e.to_string();
        assert!(matches!(e, Error::Format { .. }), "{what}: {msg}");
        assert!(
            msg.contains(&p.display().to_string()),
            "{what}: names the file: {msg}"
        );
        assert!(msg.contains(expect), "{what}: says {expect:?}: {msg}");
        let _ = std::fs::remove_file(&p);
    };
    refuse(&good[..good.len() / 2], "truncated", "");
    let mut edited = good.clone();
    let last = edited.len() - 3;
    edited[last] ^= 0x40;
    refuse(&edited, "edited", "checksum");
    // A plain weights file is not a training checkpoint.
    let plain = tmp("plain.safetensors");
    wgrad::nn::save(&plain, &params).unwrap();
    refuse(
        &std::fs::read(&plain).unwrap(),
        "plain",
        "not a wgrad training checkpoint",
    );
    let _ = std::fs::remove_file(&plain);

    // A model of another shape: refused before anything is written.
    let other = Linear::new(&dev, 3, 5, true, DType::F16).unwrap();
    let mut opt = Adam::new(other.params(), 1e-3).unwrap();
    let e = load_checkpoint(&path, &other.params(), &mut opt, None).expect_err("shape");
    assert!(
        e.to_string().contains("missing") || e.to_string().contains("shape"),
        "{e}"
    );
    let after: Vec<Vec<f32>> = params
        .iter()
        .map(|(_, t)| t.to_f32_vec().unwrap())
        .collect();
    assert_eq!(before, after);
    let _ = std::fs::remove_file(&path);
}
