//! What adapting a trained model needs: frozen parameters and optimizer groups.

mod common;

use wgrad::nn::{self, LayerNorm, Linear, Module, Sequential};
use wgrad::optim::{Adam, Group, Optimizer, Sgd};
use wgrad::{DType, Tensor};

fn mlp(dev: &wgrad::Device, width: usize) -> Sequential {
    Sequential::new()
        .add(
            "fc1",
            Linear::new(dev, width, width, true, DType::F32).unwrap(),
        )
        .add("norm", LayerNorm::new(dev, width, DType::F32).unwrap())
        .add(
            "fc2",
            Linear::new(dev, width, width, true, DType::F32).unwrap(),
        )
        .add(
            "head",
            Linear::new(dev, width, 3, true, DType::F32).unwrap(),
        )
}

fn values(model: &dyn Module) -> Vec<(String, Vec<f32>)> {
    model
        .params()
        .into_iter()
        .map(|(n, p)| (n, p.to_vec::<f32>().unwrap()))
        .collect()
}

#[test]
fn frozen_parameters_get_no_gradient_state_or_update() {
    let dev = common::device();
    let model = mlp(&dev, 16);
    assert_eq!(nn::freeze(&model, "fc*"), 4);
    assert_eq!(nn::freeze(&model, "norm.*"), 2);
    let mut opt = Adam::adamw(model.params(), 1e-2, 0.1).unwrap();
    // State for the head's two parameters only: m and v each.
    let state = opt.state();
    assert_eq!(
        state.len(),
        4,
        "{:?}",
        state.iter().map(|s| &s.0).collect::<Vec<_>>()
    );
    assert!(state.iter().all(|(n, _)| n.starts_with("head.")));
    let before = values(&model);
    let x = dev.randn(&[8, 16], DType::F32).unwrap();
    let labels = Tensor::from_slice(&dev, &[0u32, 1, 2, 0, 1, 2, 0, 1], &[8]).unwrap();
    model
        .forward(&x)
        .unwrap()
        .cross_entropy(&labels)
        .unwrap()
        .backward()
        .unwrap();
    for (name, p) in model.params() {
        assert_eq!(
            p.grad().is_some(),
            name.starts_with("head."),
            "{name}: gradient"
        );
    }
    opt.step().unwrap();
    for ((name, a), (_, b)) in before.iter().zip(values(&model)) {
        assert_eq!(a == &b, !name.starts_with("head."), "{name}: updated");
    }
    // Unfrozen, they train again.
    assert_eq!(nn::unfreeze(&model, "*"), 6);
    model
        .forward(&x)
        .unwrap()
        .cross_entropy(&labels)
        .unwrap()
        .backward()
        .unwrap();
    assert!(model.params().iter().all(|(_, p)| p.grad().is_some()));
}

#[test]
fn a_frozen_norm_passes_the_same_input_gradient() {
    // The norm's input gradient is computed without its parameters' sums, and equals the one
    // computed with them.
    let dev = common::device();
    for width in [24, 384, 2048] {
        let norm = LayerNorm::new(&dev, width, DType::F32).unwrap();
        let xs = common::Rng::new(width as u64).vec(5 * width);
        let dx = |frozen: bool| {
            if frozen {
                nn::freeze(&norm, "*");
            } else {
                nn::unfreeze(&norm, "*");
            }
            let x = Tensor::from_slice(&dev, &xs, &[5, width])
                .unwrap()
                .variable();
            let w =
                Tensor::from_slice(&dev, &common::Rng::new(1).vec(5 * width), &[5, width]).unwrap();
            norm.forward(&x)
                .unwrap()
                .mul(&w)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let g = x.grad().unwrap().to_vec::<f32>().unwrap();
            (
                g,
                norm.params()
                    .iter()
                    .map(|(_, p)| p.grad().is_some())
                    .collect::<Vec<_>>(),
            )
        };
        let (trained, had) = dx(false);
        let (frozen, has) = dx(true);
        assert_eq!(had, vec![true, true]);
        assert_eq!(
            has,
            vec![false, false],
            "width {width}: frozen parameters' gradients"
        );
        for (i, (a, b)) in trained.iter().zip(&frozen).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6 * (1.0 + a.abs()),
                "width {width} dx[{i}]: {a} vs {b}"
            );
        }
    }
}

#[test]
fn freezing_saves_the_gradients_and_optimizer_state() {
    // A wide body frozen under a small head: the peak memory of making the optimizer and
    // taking steps drops by the body's gradients and Adam's two f32 states of it
    // (3 x 2 x 1024 x 1024 x 4 bytes = 24 MiB).
    let dev = common::device();
    let peak = |freeze: bool| {
        let model = Sequential::new()
            .add(
                "body1",
                Linear::new(&dev, 1024, 1024, false, DType::F32).unwrap(),
            )
            .add(
                "body2",
                Linear::new(&dev, 1024, 1024, false, DType::F32).unwrap(),
            )
            .add(
                "head",
                Linear::new(&dev, 1024, 4, false, DType::F32).unwrap(),
            );
        if freeze {
            nn::freeze(&model, "body*");
        }
        let x = dev.randn(&[16, 1024], DType::F32).unwrap();
        dev.sync().unwrap();
        dev.reset_peak();
        let base = dev.memory_stats().allocated;
        let mut opt = Adam::new(model.params(), 1e-3).unwrap();
        for _ in 0..2 {
            opt.zero_grad();
            model
                .forward(&x)
                .unwrap()
                .square()
                .unwrap()
                .mean_all()
                .unwrap()
                .backward()
                .unwrap();
            opt.step().unwrap();
        }
        dev.sync().unwrap();
        dev.memory_stats().peak_allocated - base
    };
    let (all, frozen) = (peak(false), peak(true));
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    eprintln!(
        "step peak above the model: trained {:.1} MiB, body frozen {:.1} MiB",
        mib(all),
        mib(frozen)
    );
    assert!(
        mib(all) - mib(frozen) >= 22.0,
        "{} vs {} MiB",
        mib(all),
        mib(frozen)
    );
}

#[test]
fn groups_scale_learning_rates_and_choose_weight_decay() {
    let dev = common::device();
    for adam in [true, false] {
        let params: Vec<(String, Tensor)> = ["emb.weight", "fc.weight", "fc.bias", "ln.weight"]
            .iter()
            .map(|n| {
                (
                    n.to_string(),
                    Tensor::from_slice(&dev, &[1.0f32, -1.0], &[2])
                        .unwrap()
                        .variable(),
                )
            })
            .collect();
        let mut opt: Box<dyn Optimizer> = if adam {
            Box::new(Adam::adamw(params.clone(), 0.1, 0.5).unwrap())
        } else {
            Box::new(Sgd::new(params.clone(), 0.1, 0.0, 0.5, false).unwrap())
        };
        let mut groups = vec![Group {
            pattern: "emb.*".into(),
            lr_scale: 0.0,
            weight_decay: None,
        }];
        groups.extend(Group::no_decay(&["*.bias", "ln.*"]));
        opt.set_groups(&groups).unwrap();
        for (_, p) in &params {
            p.mul_scalar(0.0)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap(); // zero gradient
        }
        opt.step().unwrap();
        let v = |i: usize| params[i].1.to_vec::<f32>().unwrap();
        assert_eq!(
            v(0),
            [1.0, -1.0],
            "adam={adam}: a group with no learning rate stays"
        );
        assert!(
            v(1)[0] < 1.0 && v(1)[1] > -1.0,
            "adam={adam}: the weight decays: {:?}",
            v(1)
        );
        assert_eq!(v(2), [1.0, -1.0], "adam={adam}: no decay on the bias");
        assert_eq!(v(3), [1.0, -1.0], "adam={adam}: no decay on the norm");
    }
}
