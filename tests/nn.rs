//! Layers, composition and weight files.

mod common;

use common::*;
use wgrad::nn::{Linear, Module, MultiHeadAttention, Sequential, TransformerBlock};
use wgrad::{DType, Error, Tensor};

#[test]
fn linear_matches_reference_over_leading_dims() {
    let dev = device();
    let mut rng = Rng::new(50);
    let lin = Linear::new(&dev, 5, 3, true, DType::F32).unwrap();
    let x = rng.vec(2 * 4 * 5);
    let y = lin
        .forward(&Tensor::from_slice(&dev, &x, &[2, 4, 5]).unwrap())
        .unwrap();
    assert_eq!(y.shape(), &[2, 4, 3]);
    let w: Vec<f64> = lin
        .weight
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|&v| v as f64)
        .collect();
    let b: Vec<f64> = lin
        .bias
        .as_ref()
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|&v| v as f64)
        .collect();
    let want = wgrad::reference::matmul(
        &rounded(&x, DType::F32),
        &w,
        Some(&b),
        8,
        3,
        5,
        false,
        true,
        None,
    );
    assert_close(&y.to_vec::<f32>().unwrap(), &want, DType::F32, "linear");
    let names: Vec<String> = Sequential::new()
        .add("a", lin)
        .params()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, vec!["a.weight", "a.bias"]);
}

#[test]
fn attention_layer_equals_its_composition() {
    let dev = device();
    let mut rng = Rng::new(51);
    let (b, s, e, h) = (2, 7, 16, 4);
    let mha = MultiHeadAttention::new(&dev, e, h, true, DType::F32).unwrap();
    let x = Tensor::from_slice(&dev, &rng.vec(b * s * e), &[b, s, e]).unwrap();
    let got = mha.forward(&x).unwrap().to_vec::<f32>().unwrap();
    // The same with explicit per-head scores and a causal mask.
    let qkv = mha.qkv.forward(&x).unwrap();
    let d = e / h;
    let head = |which: usize| {
        qkv.narrow(2, which * e, e)
            .unwrap()
            .reshape(&[b, s, h, d])
            .unwrap()
            .permute(&[0, 2, 1, 3])
            .unwrap()
    };
    let (q, k, v) = (head(0), head(1), head(2));
    let scores = q
        .matmul(&k.transpose(-1, -2).unwrap())
        .unwrap()
        .mul_scalar(1.0 / (d as f32).sqrt())
        .unwrap();
    let mask: Vec<f32> = (0..s * s)
        .map(|i| if i % s > i / s { -1e9 } else { 0.0 })
        .collect();
    let p = scores
        .add(&Tensor::from_slice(&dev, &mask, &[s, s]).unwrap())
        .unwrap()
        .softmax()
        .unwrap();
    let o = p
        .matmul(&v)
        .unwrap()
        .permute(&[0, 2, 1, 3])
        .unwrap()
        .reshape(&[b, s, e])
        .unwrap();
    let want: Vec<f64> = mha
        .out
        .forward(&o)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|&v| v as f64)
        .collect();
    assert_close_tol(&got, &want, (1e-5, 1e-4), "MultiHeadAttention");
}

#[test]
fn transformer_block_trains() {
    let dev = device();
    dev.manual_seed(3);
    let block = TransformerBlock::new(&dev, 32, 4, true, 0.0, DType::F32).unwrap();
    let x = dev.randn(&[2, 9, 32], DType::F32).unwrap();
    let target = dev.randn(&[2, 9, 32], DType::F32).unwrap();
    let mut opt = wgrad::optim::Adam::new(block.params(), 1e-2).unwrap();
    let mut losses = Vec::new();
    for _ in 0..30 {
        use wgrad::optim::Optimizer;
        let loss = block.forward(&x).unwrap().mse_loss(&target).unwrap();
        losses.push(loss.to_scalar().unwrap());
        loss.backward().unwrap();
        opt.step().unwrap();
        opt.zero_grad();
    }
    assert!(
        losses[29] < 0.5 * losses[0],
        "loss did not fall: {losses:?}"
    );
}

#[test]
fn safetensors_round_trip_and_errors() {
    let dev = device();
    let dir = std::env::temp_dir().join(format!("wgrad-st-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("w.safetensors");
    let net = Sequential::new()
        .add("l1", Linear::new(&dev, 4, 3, true, DType::F32).unwrap())
        .add("l2", Linear::new(&dev, 3, 2, false, DType::F16).unwrap());
    wgrad::nn::save(&path, &net.params()).unwrap();
    let loaded: std::collections::HashMap<String, Tensor> =
        wgrad::nn::load(&dev, &path).unwrap().into_iter().collect();
    assert_eq!(loaded.len(), 3);
    for (name, a) in net.params() {
        let b = &loaded[&name];
        assert_eq!((a.shape(), a.dtype()), (b.shape(), b.dtype()));
        assert_eq!(a.to_f32_vec().unwrap(), b.to_f32_vec().unwrap());
    }
    // Into a fresh network of the same shape: identical weights afterwards.
    let fresh = Sequential::new()
        .add("l1", Linear::new(&dev, 4, 3, true, DType::F32).unwrap())
        .add("l2", Linear::new(&dev, 3, 2, false, DType::F16).unwrap());
    wgrad::nn::load_into(&fresh, &path).unwrap();
    for ((_, a), (_, b)) in net.params().iter().zip(fresh.params()) {
        assert_eq!(a.to_f32_vec().unwrap(), b.to_f32_vec().unwrap());
    }
    // Missing tensor, wrong shape, wrong dtype: errors that name the tensor.
    let bigger = Sequential::new()
        .add("l1", Linear::new(&dev, 4, 3, true, DType::F32).unwrap())
        .add("l3", Linear::new(&dev, 3, 2, false, DType::F16).unwrap());
    let e = wgrad::nn::load_into(&bigger, &path).unwrap_err();
    assert!(
        matches!(e, Error::Format { .. })
            && e.to_string().contains("l3.weight")
            && e.to_string().contains("missing"),
        "{e}"
    );
    let wide = Sequential::new().add("l1", Linear::new(&dev, 5, 3, true, DType::F32).unwrap());
    let e = wgrad::nn::load_into(&wide, &path).unwrap_err();
    assert!(
        e.to_string().contains("l1.weight") && e.to_string().contains("[3, 4]"),
        "{e}"
    );
    let half = Sequential::new().add("l1", Linear::new(&dev, 4, 3, true, DType::F16).unwrap());
    let e = wgrad::nn::load_into(&half, &path).unwrap_err();
    assert!(
        e.to_string().contains("l1.weight") && e.to_string().contains("f32"),
        "{e}"
    );
    std::fs::write(dir.join("junk.safetensors"), b"not a safetensors file").unwrap();
    assert!(wgrad::nn::load(&dev, dir.join("junk.safetensors")).is_err());
    std::fs::remove_dir_all(&dir).ok();
}

/// A bf16 checkpoint written by Python's `safetensors` (tests/fixtures/make_bf16.py) loads as
/// bf16 with every value the rounding of its f32 source, converts to f16 and f32 on load, and
/// loads into f32 and bf16 models; the strict loader refuses the dtype change.
#[test]
fn bf16_safetensors_from_python_load() {
    let dev = poisoned();
    let path = common::repo_root().join("tests/fixtures/bf16.safetensors");
    let loaded: std::collections::HashMap<String, Tensor> =
        wgrad::nn::load(&dev, &path).unwrap().into_iter().collect();
    for name in ["weight", "bias"] {
        let t = &loaded[&format!("layer.{name}")];
        let src = loaded[&format!("source.{name}")].to_vec::<f32>().unwrap();
        assert_eq!(t.dtype(), DType::BF16);
        let got = t.to_vec::<half::bf16>().unwrap();
        for (i, (&g, &s)) in got.iter().zip(&src).enumerate() {
            assert_eq!(
                g.to_bits(),
                half::bf16::from_f32(s).to_bits(),
                "{name}[{i}] from {s:e}"
            );
        }
        // Sanity on values a reader can check by eye: 1/3 is 0.333984375 in bf16.
        if name == "weight" {
            assert_eq!(got[2].to_f32(), 0.333_984_38);
            assert_eq!(got[4].to_f32(), 3.140625);
        }
    }
    let as_f32: std::collections::HashMap<String, Tensor> =
        wgrad::nn::load_as(&dev, &path, DType::F32)
            .unwrap()
            .into_iter()
            .collect();
    let as_f16: std::collections::HashMap<String, Tensor> =
        wgrad::nn::load_as(&dev, &path, DType::F16)
            .unwrap()
            .into_iter()
            .collect();
    let w = loaded["layer.weight"].to_vec::<half::bf16>().unwrap();
    let w32 = as_f32["layer.weight"].to_vec::<f32>().unwrap();
    let w16 = as_f16["layer.weight"].to_vec::<half::f16>().unwrap();
    for i in 0..w.len() {
        assert_eq!(w32[i].to_bits(), w[i].to_f32().to_bits(), "f32[{i}]");
        // 3e38 is past f16's range: infinity, as PyTorch's .half() gives.
        assert_eq!(
            w16[i].to_bits(),
            half::f16::from_f32(w[i].to_f32()).to_bits(),
            "f16[{i}]"
        );
    }
    for dt in [DType::F32, DType::BF16] {
        let net = Sequential::new().add("layer", Linear::new(&dev, 4, 4, true, dt).unwrap());
        wgrad::nn::load_into_converting(&net, &path).unwrap();
        let got = net.params()[0].1.to_f32_vec().unwrap();
        let want: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
        assert_eq!(got, want, "{dt}");
        if dt == DType::F32 {
            let e = wgrad::nn::load_into(&net, &path).unwrap_err();
            assert!(e.to_string().contains("bf16"), "{e}");
        } else {
            wgrad::nn::load_into(&net, &path).unwrap();
        }
    }
}

/// bf16 parameters train without a loss scaler: f32 master weights in the optimizer, bf16
/// storage everywhere else, and the loss falls like the f32 model's.
#[test]
fn bf16_trains_without_a_loss_scaler() {
    use wgrad::optim::Optimizer;
    let dev = device();
    let mut finals = Vec::new();
    for dt in [DType::F32, DType::BF16] {
        dev.manual_seed(5);
        let net = Sequential::new()
            .add("l1", Linear::new(&dev, 16, 32, true, dt).unwrap())
            .add("act", wgrad::Activation::Gelu)
            .add("l2", Linear::new(&dev, 32, 4, true, dt).unwrap());
        assert!(net.params().iter().all(|(_, p)| p.dtype() == dt));
        let x = dev.randn(&[64, 16], dt).unwrap();
        let y = x
            .narrow(1, 0, 4)
            .unwrap()
            .mul_scalar(0.5)
            .unwrap()
            .tanh()
            .unwrap();
        let mut opt = wgrad::optim::Adam::new(net.params(), 1e-2).unwrap();
        let mut losses = Vec::new();
        for _ in 0..60 {
            let loss = net.forward(&x).unwrap().mse_loss(&y).unwrap();
            losses.push(loss.to_scalar().unwrap());
            loss.backward().unwrap();
            opt.step().unwrap();
            opt.zero_grad();
        }
        assert!(
            losses[59] < 0.1 * losses[0],
            "{dt}: loss did not fall: {:?}",
            &losses[..]
        );
        finals.push(losses[59]);
    }
    // bf16 ends near f32 (within its rounding, not orders of magnitude away).
    assert!(finals[1] < 3.0 * finals[0] + 1e-3, "{finals:?}");
}

/// Finite-difference check of d(sum(w * f(x)))/dx for a layer, on the device's forward pass.
fn fd_check(dev: &wgrad::Device, layer: &dyn Module, x: &[f32], shape: &[usize], what: &str) {
    let xt = Tensor::from_slice(dev, x, shape).unwrap().variable();
    let y = layer.forward(&xt).unwrap();
    let mut rng = Rng::new(99);
    let w = rng.vec(y.numel());
    let wt = Tensor::from_slice(dev, &w, y.shape()).unwrap();
    y.mul(&wt).unwrap().sum_all().unwrap().backward().unwrap();
    let g = xt.grad().unwrap().to_f32_vec().unwrap();
    let loss = |v: &[f32]| -> f64 {
        let t = Tensor::from_slice(dev, v, shape).unwrap();
        let y = layer.forward(&t).unwrap().to_f32_vec().unwrap();
        y.iter().zip(&w).map(|(a, b)| *a as f64 * *b as f64).sum()
    };
    for i in 0..x.len() {
        let (mut up, mut down) = (x.to_vec(), x.to_vec());
        up[i] += 1e-2;
        down[i] -= 1e-2;
        let fd = (loss(&up) - loss(&down)) / 2e-2;
        assert!(
            (g[i] as f64 - fd).abs() < 5e-3 * (1.0 + fd.abs()),
            "{what}: d/dx[{i}]: got {}, fd {fd}",
            g[i]
        );
    }
}

/// BatchNorm2d against an f64 reference: batch statistics while training, running estimates
/// (momentum 0.1, unbiased variance) after two steps, those estimates in evaluation, the
/// gradient by finite differences, and the running estimates through a weight file.
#[test]
fn batch_norm_2d() {
    use wgrad::nn::BatchNorm2d;
    let dev = poisoned();
    let mut rng = Rng::new(61);
    let (n, c, h, w) = (3, 4, 5, 2);
    let bn = BatchNorm2d::new(&dev, c, DType::F32).unwrap();
    let gamma: Vec<f32> = (0..c).map(|i| 0.5 + i as f32).collect();
    bn.gamma.copy_from_slice(&gamma).unwrap();
    let stats = |x: &[f64]| -> Vec<(f64, f64)> {
        (0..c)
            .map(|ch| {
                let v: Vec<f64> = (0..n)
                    .flat_map(|b| (0..h * w).map(move |p| (b * c + ch) * h * w + p))
                    .map(|i| x[i])
                    .collect();
                let m = v.iter().sum::<f64>() / v.len() as f64;
                (
                    m,
                    v.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / v.len() as f64,
                )
            })
            .collect()
    };
    let (mut rm, mut rv) = (vec![0.0f64; c], vec![1.0f64; c]);
    let count = (n * h * w) as f64;
    for step in 0..2 {
        let x: Vec<f32> = rng
            .vec(n * c * h * w)
            .iter()
            .map(|v| 3.0 * v + step as f32)
            .collect();
        let xd: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let y = bn
            .forward(&Tensor::from_slice(&dev, &x, &[n, c, h, w]).unwrap())
            .unwrap()
            .to_f32_vec()
            .unwrap();
        let st = stats(&xd);
        let want: Vec<f64> = (0..xd.len())
            .map(|i| {
                let ch = (i / (h * w)) % c;
                (xd[i] - st[ch].0) / (st[ch].1 + 1e-5).sqrt() * gamma[ch] as f64
            })
            .collect();
        assert_close_tol(&y, &want, (1e-5, 1e-4), &format!("train step {step}"));
        for ch in 0..c {
            rm[ch] = 0.9 * rm[ch] + 0.1 * st[ch].0;
            rv[ch] = 0.9 * rv[ch] + 0.1 * st[ch].1 * count / (count - 1.0);
        }
    }
    assert_close_tol(
        &bn.running_mean().to_f32_vec().unwrap(),
        &rm,
        (1e-6, 1e-5),
        "running mean",
    );
    assert_close_tol(
        &bn.running_var().to_f32_vec().unwrap(),
        &rv,
        (1e-6, 1e-5),
        "running var",
    );
    // Evaluation: the running estimates, whatever the batch.
    bn.train(false);
    let x = rng.vec(c * 2);
    let y = bn
        .forward(&Tensor::from_slice(&dev, &x, &[1, c, 1, 2]).unwrap())
        .unwrap();
    let want: Vec<f64> = (0..x.len())
        .map(|i| {
            let ch = i / 2;
            (x[i] as f64 - rm[ch]) / (rv[ch] + 1e-5).sqrt() * gamma[ch] as f64
        })
        .collect();
    assert_close_tol(&y.to_f32_vec().unwrap(), &want, (1e-5, 1e-4), "eval");
    // Gradients in both modes; one value per channel is refused while training.
    fd_check(
        &dev,
        &bn,
        &rng.vec(2 * c * 3),
        &[2, c, 3, 1],
        "BatchNorm2d eval",
    );
    bn.train(true);
    fd_check(
        &dev,
        &bn,
        &rng.vec(2 * c * 3),
        &[2, c, 3, 1],
        "BatchNorm2d train",
    );
    assert!(
        bn.forward(&Tensor::zeros(&dev, &[1, c, 1, 1], DType::F32).unwrap())
            .is_err()
    );
    // Weight files carry the running estimates.
    let net = Sequential::new().add("bn", bn);
    let path = std::env::temp_dir().join(format!("wgrad-bn-{}.safetensors", std::process::id()));
    wgrad::nn::save(&path, &net.state_dict()).unwrap();
    let fresh = Sequential::new().add("bn", BatchNorm2d::new(&dev, c, DType::F32).unwrap());
    wgrad::nn::load_into(&fresh, &path).unwrap();
    let names: Vec<String> = fresh.state_dict().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        ["bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"]
    );
    // (The finite differences above ran training steps: the saved estimates are the latest.)
    for ((name, a), (_, b)) in net.buffers().iter().zip(fresh.buffers()) {
        assert_eq!(
            a.to_vec::<f32>().unwrap(),
            b.to_vec::<f32>().unwrap(),
            "{name}"
        );
    }
    std::fs::remove_file(&path).ok();
}

/// GroupNorm against an f64 reference (groups of two channels, and one group: LayerNorm
/// over everything) and by finite differences.
#[test]
fn group_norm() {
    use wgrad::nn::GroupNorm;
    let dev = poisoned();
    let mut rng = Rng::new(62);
    let (n, c, l) = (2, 6, 7);
    for groups in [3, 1] {
        let gn = GroupNorm::new(&dev, groups, c, DType::F32).unwrap();
        let beta: Vec<f32> = (0..c).map(|i| i as f32 * 0.1).collect();
        gn.beta.copy_from_slice(&beta).unwrap();
        let x: Vec<f32> = rng.vec(n * c * l).iter().map(|v| 5.0 * v + 2.0).collect();
        let y = gn
            .forward(&Tensor::from_slice(&dev, &x, &[n, c, l]).unwrap())
            .unwrap();
        let per = c / groups * l;
        let mut want = vec![0.0f64; x.len()];
        for blk in 0..n * groups {
            let v: Vec<f64> = x[blk * per..(blk + 1) * per]
                .iter()
                .map(|&a| a as f64)
                .collect();
            let m = v.iter().sum::<f64>() / per as f64;
            let var = v.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / per as f64;
            for (j, a) in v.iter().enumerate() {
                let ch = (blk * per + j) / l % c;
                want[blk * per + j] = (a - m) / (var + 1e-5).sqrt() + beta[ch] as f64;
            }
        }
        assert_close_tol(
            &y.to_f32_vec().unwrap(),
            &want,
            (1e-5, 1e-4),
            &format!("groups {groups}"),
        );
        fd_check(&dev, &gn, &rng.vec(n * c * 2), &[n, c, 2], "GroupNorm");
    }
    assert!(GroupNorm::new(&dev, 4, 6, DType::F32).is_err());
}

/// Conv1d (stride 2, padding 1, dilation 2) against a direct f64 convolution, and its input
/// gradient by finite differences.
#[test]
fn conv1d() {
    use wgrad::nn::Conv1d;
    let dev = poisoned();
    let mut rng = Rng::new(63);
    let (n, ci, co, k, len) = (2, 3, 4, 3, 17);
    let mut conv = Conv1d::new(&dev, ci, co, k, DType::F32).unwrap();
    conv.stride = 2;
    conv.padding = 1;
    conv.dilation = 2;
    let x = rng.vec(n * ci * len);
    let y = conv
        .forward(&Tensor::from_slice(&dev, &x, &[n, ci, len]).unwrap())
        .unwrap();
    let lo = (len + 2 - 2 * (k - 1) - 1) / 2 + 1;
    assert_eq!(y.shape(), &[n, co, lo]);
    let wv = conv.weight.to_vec::<f32>().unwrap();
    let bv = conv.bias.as_ref().unwrap().to_vec::<f32>().unwrap();
    let mut want = vec![0.0f64; n * co * lo];
    for b in 0..n {
        for o in 0..co {
            for t in 0..lo {
                let mut acc = bv[o] as f64;
                for i in 0..ci {
                    for j in 0..k {
                        let p = (t * 2 + j * 2) as isize - 1;
                        if p >= 0 && (p as usize) < len {
                            acc += wv[(o * ci + i) * k + j] as f64
                                * x[(b * ci + i) * len + p as usize] as f64;
                        }
                    }
                }
                want[(b * co + o) * lo + t] = acc;
            }
        }
    }
    assert_close_tol(&y.to_f32_vec().unwrap(), &want, (1e-5, 1e-4), "conv1d");
    fd_check(&dev, &conv, &rng.vec(n * ci * 9), &[n, ci, 9], "Conv1d");
    assert!(
        conv.forward(&Tensor::zeros(&dev, &[2, 3], DType::F32).unwrap())
            .is_err()
    );
}
