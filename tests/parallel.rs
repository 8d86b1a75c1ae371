//! More than one device: tensors moved between devices with gradients, data-parallel training
//! against one device with the whole batch, and a two-stage pipeline against the unsplit
//! model. Two devices on one adapter stand in for two GPUs (the same code path: separate
//! memory, queues and transfers through the host).

mod common;

use common::*;
use wgrad::nn::{Activation, Linear, Module, Sequential};
use wgrad::optim::{Optimizer, Sgd};
use wgrad::parallel::{DataParallel, Pipeline};
use wgrad::{DType, Device, Tensor};

fn two_devices() -> (Device, Device) {
    (device(), device())
}

fn mlp(dev: &Device) -> wgrad::Result<Sequential> {
    Ok(Sequential::new()
        .add("l1", Linear::new(dev, 12, 32, true, DType::F32)?)
        .add("act", Activation::Gelu)
        .add("l2", Linear::new(dev, 32, 32, true, DType::F32)?)
        .add("act2", Activation::Tanh)
        .add("l3", Linear::new(dev, 32, 5, true, DType::F32)?))
}

/// Copies `from`'s parameter values into `to` (same architecture, any devices).
fn copy_params(from: &[(String, Tensor)], to: &[(String, Tensor)]) {
    for ((na, a), (nb, b)) in from.iter().zip(to) {
        assert_eq!(na, nb);
        b.copy_from_slice(&a.to_vec::<f32>().unwrap()).unwrap();
    }
}

#[test]
fn to_device_moves_values_and_gradients() {
    let (a, b) = two_devices();
    let mut rng = Rng::new(1);
    let x = rng.vec(24);
    let xa = Tensor::from_slice(&a, &x, &[4, 6]).unwrap().variable();
    // A strided view, moved, squared on the other device, summed there.
    let t = xa.transpose(0, 1).unwrap();
    let tb = t.to_device(&b).unwrap();
    assert!(tb.device().same(&b) && tb.shape() == [6, 4]);
    let want: Vec<f32> = (0..24).map(|i| x[(i % 4) * 6 + i / 4]).collect();
    assert_eq!(tb.to_vec::<f32>().unwrap(), want);
    tb.square().unwrap().sum_all().unwrap().backward().unwrap();
    let g = xa.grad().unwrap();
    assert!(g.device().same(&a));
    let want: Vec<f64> = x.iter().map(|&v| 2.0 * v as f64).collect();
    assert_close_tol(
        &g.to_f32_vec().unwrap(),
        &want,
        (1e-6, 1e-6),
        "gradient back on device a",
    );
    // Every dtype's bytes move unchanged.
    for dt in [DType::F16, DType::BF16, DType::U32] {
        let t = tensor(&a, &[1.0, 2.0, 3.0], &[3], dt);
        assert_eq!(
            t.to_device(&b).unwrap().to_f32_vec().unwrap(),
            [1.0, 2.0, 3.0]
        );
    }
}

/// Two replicas, each on half of the batch, follow the loss curve of one device on the whole
/// batch (within f32 rounding), and their parameters stay bit-identical.
#[test]
fn data_parallel_matches_one_device_with_the_whole_batch() {
    let (a, b) = two_devices();
    let mut rng = Rng::new(2);
    let (n, steps) = (16usize, 6);
    let xs: Vec<Vec<f32>> = (0..steps).map(|_| rng.vec(n * 12)).collect();
    let ys: Vec<Vec<f32>> = (0..steps).map(|_| rng.vec(n * 5)).collect();

    let mut dp = DataParallel::new(vec![a.clone(), b.clone()], mlp).unwrap();
    // Small buckets: several exchanges per step, started during the backward pass.
    dp.set_bucket_bytes(2048);
    let one_dev = device();
    let single = mlp(&one_dev).unwrap();
    copy_params(&dp.replicas()[0].1.params(), &single.params());

    // SGD, whose step scales with the gradient (Adam's would hide a sum taken for a mean).
    let sgd = |p| Sgd::new(p, 0.2, 0.9, 0.0, false).unwrap();
    let mut opts: Vec<Sgd> = dp.replicas().iter().map(|(_, m)| sgd(m.params())).collect();
    let mut opt1 = sgd(single.params());
    for s in 0..steps {
        // Shard r: rows [r * n/2, (r + 1) * n/2).
        let shards: Vec<(Vec<f32>, Vec<f32>)> = (0..2)
            .map(|r| {
                let h = n / 2;
                (
                    xs[s][r * h * 12..(r + 1) * h * 12].to_vec(),
                    ys[s][r * h * 5..(r + 1) * h * 5].to_vec(),
                )
            })
            .collect();
        let rep = dp
            .step(&shards, |r, m, (x, y)| {
                let dev = &dp.replicas()[r].0;
                let x = Tensor::from_slice(dev, x, &[n / 2, 12])?;
                let y = Tensor::from_slice(dev, y, &[n / 2, 5])?;
                m.forward(&x)?.mse_loss(&y)
            })
            .unwrap();
        assert!(rep.buckets >= 2, "{rep:?}");
        for o in &mut opts {
            o.step().unwrap();
            o.zero_grad();
        }
        let x = Tensor::from_slice(&one_dev, &xs[s], &[n, 12]).unwrap();
        let y = Tensor::from_slice(&one_dev, &ys[s], &[n, 5]).unwrap();
        let l = single.forward(&x).unwrap().mse_loss(&y).unwrap();
        let whole = l.to_scalar().unwrap();
        l.backward().unwrap();
        opt1.step().unwrap();
        opt1.zero_grad();
        let losses: Vec<f32> = rep.losses.iter().map(|l| l.to_scalar().unwrap()).collect();
        let mean = (losses[0] + losses[1]) / 2.0;
        assert!(
            (mean - whole).abs() <= 1e-5 * (1.0 + whole.abs()),
            "step {s}: replicas {losses:?} (mean {mean}) vs one device {whole}"
        );
    }
    let p0 = dp.replicas()[0].1.params();
    let p1 = dp.replicas()[1].1.params();
    for ((name, x), (_, y)) in p0.iter().zip(&p1) {
        assert_eq!(
            x.to_vec::<f32>().unwrap(),
            y.to_vec::<f32>().unwrap(),
            "{name} differs"
        );
    }
    for ((name, x), (_, y)) in p0.iter().zip(single.params()) {
        let want: Vec<f64> = y
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect();
        assert_close_tol(
            &x.to_vec::<f32>().unwrap(),
            &want,
            (1e-5, 1e-4),
            &format!("{name} vs one device"),
        );
    }
    // A wrong number of inputs is an error, not a hang.
    assert!(
        dp.step(
            &[(vec![0.0f32; 12], vec![0.0f32; 5])],
            |_, _, _| unreachable!()
        )
        .is_err()
    );
}

/// A two-stage pipeline in three uneven micro-batches gives the unsplit model's loss and
/// gradients, each stage's on its own device.
#[test]
fn pipeline_gradients_match_the_unsplit_model() {
    let (a, b) = two_devices();
    let mut rng = Rng::new(3);
    let whole = mlp(&device()).unwrap();
    let stage0 = Sequential::new()
        .add("l1", Linear::new(&a, 12, 32, true, DType::F32).unwrap())
        .add("act", Activation::Gelu);
    let stage1 = Sequential::new()
        .add("l2", Linear::new(&b, 32, 32, true, DType::F32).unwrap())
        .add("act2", Activation::Tanh)
        .add("l3", Linear::new(&b, 32, 5, true, DType::F32).unwrap());
    let mut split = stage0.params();
    split.extend(stage1.params());
    copy_params(&whole.params(), &split);
    let pipe = Pipeline::new(vec![
        (a.clone(), Box::new(stage0)),
        (b.clone(), Box::new(stage1)),
    ])
    .unwrap();
    let rows = 10;
    let x = rng.vec(rows * 12);
    let y = rng.vec(rows * 5);
    let yb = Tensor::from_slice(&b, &y, &[rows, 5]).unwrap();
    let rep = pipe
        .train_step(
            &Tensor::from_slice(&a, &x, &[rows, 12]).unwrap(),
            3,
            |out, r| out.mse_loss(&yb.narrow(0, r.start, r.len())?),
        )
        .unwrap();
    let dev = whole.params()[0].1.device().clone();
    let l = whole
        .forward(&Tensor::from_slice(&dev, &x, &[rows, 12]).unwrap())
        .unwrap()
        .mse_loss(&Tensor::from_slice(&dev, &y, &[rows, 5]).unwrap())
        .unwrap();
    let want = l.to_scalar().unwrap();
    l.backward().unwrap();
    assert!(
        (rep.loss - want).abs() <= 1e-5 * (1.0 + want.abs()),
        "{} vs {want}",
        rep.loss
    );
    for ((name, p), (_, q)) in pipe.params().iter().zip(whole.params()) {
        let g = p.grad().unwrap();
        assert!(
            g.device().same(p.device()),
            "{name}'s gradient is on its stage's device"
        );
        let want: Vec<f64> = q
            .grad()
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect();
        assert_close_tol(&g.to_vec::<f32>().unwrap(), &want, (1e-6, 1e-4), name);
    }
    // Forward without micro-batches gives the same output as the unsplit model.
    let out = pipe
        .forward(&Tensor::from_slice(&a, &x, &[rows, 12]).unwrap())
        .unwrap();
    assert!(out.device().same(&b));
    let want = whole
        .forward(&Tensor::from_slice(&dev, &x, &[rows, 12]).unwrap())
        .unwrap();
    let want: Vec<f64> = want
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|&v| v as f64)
        .collect();
    assert_close_tol(
        &out.to_vec::<f32>().unwrap(),
        &want,
        (1e-6, 1e-5),
        "pipeline forward",
    );
    // A stage whose parameters live elsewhere, and too many micro-batches, are errors.
    let wrong = Sequential::new().add("l", Linear::new(&a, 2, 2, true, DType::F32).unwrap());
    assert!(Pipeline::new(vec![(b.clone(), Box::new(wrong))]).is_err());
    assert!(
        pipe.train_step(
            &Tensor::zeros(&a, &[2, 12], DType::F32).unwrap(),
            3,
            |o, _| o.sum_all()
        )
        .is_err()
    );
    assert_eq!(wgrad::parallel::open_devices("0,0").unwrap().len(), 2);
    assert!(wgrad::parallel::open_devices("x").is_err());
}

/// f16 replicas exchange f16 buckets: they stay bit-identical and track one f16 device on the
/// whole batch within f16 rounding.
#[test]
fn data_parallel_in_f16() {
    let (a, b) = two_devices();
    let mut rng = Rng::new(4);
    let n = 8usize;
    let build = |dev: &Device| -> wgrad::Result<Sequential> {
        Ok(Sequential::new()
            .add("l1", Linear::new(dev, 12, 16, true, DType::F16)?)
            .add("act", Activation::Tanh)
            .add("l2", Linear::new(dev, 16, 5, true, DType::F16)?))
    };
    let dp = DataParallel::new(vec![a, b], build).unwrap();
    let one_dev = device();
    let single = build(&one_dev).unwrap();
    for ((_, p), (_, q)) in dp.replicas()[0].1.params().iter().zip(single.params()) {
        q.copy_from_slice(&p.to_vec::<half::f16>().unwrap())
            .unwrap();
    }
    let x = rng.vec(n * 12);
    let y = rng.vec(n * 5);
    let shards: Vec<(Vec<f32>, Vec<f32>)> = (0..2)
        .map(|r| {
            (
                x[r * 48..(r + 1) * 48].to_vec(),
                y[r * 20..(r + 1) * 20].to_vec(),
            )
        })
        .collect();
    let rep = dp
        .step(&shards, |r, m, (xs, ys)| {
            let dev = &dp.replicas()[r].0;
            let xt = tensor(dev, xs, &[n / 2, 12], DType::F16);
            let yt = tensor(dev, ys, &[n / 2, 5], DType::F16);
            m.forward(&xt)?.mse_loss(&yt)
        })
        .unwrap();
    assert_eq!(rep.bytes, 2 * (12 * 16 + 16 + 16 * 5 + 5) as u64, "{rep:?}");
    let xt = tensor(&one_dev, &x, &[n, 12], DType::F16);
    let yt = tensor(&one_dev, &y, &[n, 5], DType::F16);
    single
        .forward(&xt)
        .unwrap()
        .mse_loss(&yt)
        .unwrap()
        .backward()
        .unwrap();
    let g0 = dp.replicas()[0].1.params();
    let g1 = dp.replicas()[1].1.params();
    for (((name, p), (_, q)), (_, s)) in g0.iter().zip(&g1).zip(single.params()) {
        let (gp, gq) = (p.grad().unwrap(), q.grad().unwrap());
        assert_eq!(gp.dtype(), DType::F16);
        assert_eq!(
            gp.to_vec::<half::f16>().unwrap(),
            gq.to_vec::<half::f16>().unwrap(),
            "{name}"
        );
        let want: Vec<f64> = s
            .grad()
            .unwrap()
            .to_f32_vec()
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect();
        assert_close_tol(&gp.to_f32_vec().unwrap(), &want, (2e-3, 1e-2), name);
    }
}

/// `step_no_sync` keeps each replica's gradient to its own shard; a later `step` averages what
/// every replica accumulated: two shards accumulated then synchronised equal one device that
/// accumulates both whole batches.
#[test]
fn no_sync_steps_accumulate_then_one_step_averages() {
    let (a, b) = two_devices();
    let mut rng = Rng::new(5);
    let n = 8usize;
    let dp = DataParallel::new(vec![a, b], mlp).unwrap();
    let single = mlp(&device()).unwrap();
    copy_params(&dp.replicas()[0].1.params(), &single.params());
    let batches: Vec<(Vec<f32>, Vec<f32>)> =
        (0..2).map(|_| (rng.vec(n * 12), rng.vec(n * 5))).collect();
    let shard = |(x, y): &(Vec<f32>, Vec<f32>), r: usize| -> (Vec<f32>, Vec<f32>) {
        let h = n / 2;
        (
            x[r * h * 12..(r + 1) * h * 12].to_vec(),
            y[r * h * 5..(r + 1) * h * 5].to_vec(),
        )
    };
    let run = |r: usize, m: &Sequential, (x, y): &(Vec<f32>, Vec<f32>)| -> wgrad::Result<Tensor> {
        let dev = &dp.replicas()[r].0;
        let xt = Tensor::from_slice(dev, x, &[n / 2, 12])?;
        let yt = Tensor::from_slice(dev, y, &[n / 2, 5])?;
        m.forward(&xt)?.mse_loss(&yt)
    };
    let first: Vec<_> = (0..2).map(|r| shard(&batches[0], r)).collect();
    dp.step_no_sync(&first, run).unwrap();
    // Before the synchronising step the replicas hold different gradients.
    let g0 = dp.replicas()[0].1.params()[0]
        .1
        .grad()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let g1 = dp.replicas()[1].1.params()[0]
        .1
        .grad()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_ne!(g0, g1);
    let second: Vec<_> = (0..2).map(|r| shard(&batches[1], r)).collect();
    dp.step(&second, run).unwrap();
    let dev = single.params()[0].1.device().clone();
    for (x, y) in &batches {
        let xt = Tensor::from_slice(&dev, x, &[n, 12]).unwrap();
        let yt = Tensor::from_slice(&dev, y, &[n, 5]).unwrap();
        single
            .forward(&xt)
            .unwrap()
            .mse_loss(&yt)
            .unwrap()
            .backward()
            .unwrap();
    }
    for r in 0..2 {
        for ((name, p), (_, q)) in dp.replicas()[r].1.params().iter().zip(single.params()) {
            let want: Vec<f64> = q
                .grad()
                .unwrap()
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|&v| v as f64)
                .collect();
            assert_close_tol(
                &p.grad().unwrap().to_vec::<f32>().unwrap(),
                &want,
                (1e-6, 1e-4),
                &format!("replica {r} {name}"),
            );
        }
    }
}
