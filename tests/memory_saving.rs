//! fp16 loss scaling, gradient checkpointing, accumulation, guards, batch-size control,
//! scoped tracking.

mod common;

use common::*;
use wgrad::nn::{Activation, Checkpointed, Dropout, Linear, Module, Sequential};
use wgrad::optim::{GradScaler, NonFinite, Optimizer, Sgd, guarded_step};
use wgrad::train::{DynamicBatch, find_batch_size};
use wgrad::{DType, Device, Error, Tensor};

fn block(w: &Tensor, b: &Tensor) -> Sequential {
    Sequential::new()
        .add(
            "fc",
            Linear::from_tensors(w.clone(), Some(b.clone())).unwrap(),
        )
        .add("act", Activation::Gelu)
        .add("drop", Dropout::new(0.2))
}

/// Forward + backward of a 6-block MLP; returns the loss, the gradients and the peak of
/// allocated bytes above the starting point.
fn run(
    dev: &Device,
    weights: &[(Tensor, Tensor)],
    x: &Tensor,
    ckpt: bool,
) -> (f32, Vec<Vec<f32>>, u64) {
    let mut net = Sequential::new();
    for (i, (w, b)) in weights.iter().enumerate() {
        let blk = block(w, b);
        if ckpt {
            net.push(&format!("b{i}"), Box::new(Checkpointed::new(blk)));
        } else {
            net.push(&format!("b{i}"), Box::new(blk));
        }
    }
    // The blocks share the caller's weight tensors (variables are marked in place), so the
    // gradients of an earlier run are cleared first.
    net.params().iter().for_each(|(_, p)| p.zero_grad());
    dev.sync().unwrap();
    let start = dev.memory_stats().allocated;
    dev.reset_peak();
    dev.manual_seed(1234);
    let loss = net
        .forward(x)
        .unwrap()
        .square()
        .unwrap()
        .mean_all()
        .unwrap();
    loss.backward().unwrap();
    let l = loss.to_scalar().unwrap();
    dev.sync().unwrap();
    let peak = dev.memory_stats().peak_allocated - start;
    let grads = net
        .params()
        .iter()
        .map(|(_, p)| p.grad().unwrap().to_vec::<f32>().unwrap())
        .collect();
    (l, grads, peak)
}

#[test]
fn checkpointing_gives_the_same_gradients_with_less_memory() {
    let dev = device_with(|o| o.no_cache = false);
    let (batch, width) = (256, 64);
    let weights: Vec<(Tensor, Tensor)> = (0..6)
        .map(|_| {
            (
                Tensor::randn(&dev, &[width, width], 0.0, 0.2, DType::F32).unwrap(),
                Tensor::randn(&dev, &[width], 0.0, 0.1, DType::F32).unwrap(),
            )
        })
        .collect();
    let x = dev.randn(&[batch, width], DType::F32).unwrap();
    let (l1, g1, peak_plain) = run(&dev, &weights, &x, false);
    let (l2, g2, peak_ckpt) = run(&dev, &weights, &x, true);
    assert_eq!(
        l1.to_bits(),
        l2.to_bits(),
        "same loss (dropout masks replayed)"
    );
    for (a, b) in g1.iter().zip(&g2) {
        assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "gradients differ bitwise"
        );
    }
    assert!(
        peak_ckpt * 10 < peak_plain * 7,
        "checkpointing peak {peak_ckpt} B is not well under the plain peak {peak_plain} B"
    );
}

#[test]
fn loss_scaler_skips_overflow_and_adapts() {
    let dev = device();
    let p = Tensor::from_f32(&dev, &[1.0, 2.0, 3.0], &[3], DType::F16)
        .unwrap()
        .variable();
    let mut opt = Sgd::new(vec![("p".into(), p.clone())], 0.1, 0.0, 0.0, false).unwrap();
    let mut scaler = GradScaler::new();
    scaler.growth_interval = 3;
    assert_eq!(scaler.scale(), 65536.0);
    // A gradient holding inf: the step is skipped, nothing changes, the scale halves.
    p.set_grad(Some(
        Tensor::from_f32(&dev, &[1.0, f32::INFINITY, 1.0], &[3], DType::F16).unwrap(),
    ));
    let r = scaler.step(&mut opt, None).unwrap();
    assert!(!r.stepped && !r.grad_norm.is_finite());
    assert_eq!(p.to_f32_vec().unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(scaler.scale(), 32768.0);
    assert_eq!(scaler.skipped(), 1);
    // NaN too.
    p.set_grad(Some(
        Tensor::from_f32(&dev, &[f32::NAN, 0.0, 0.0], &[3], DType::F16).unwrap(),
    ));
    assert!(!scaler.step(&mut opt, None).unwrap().stepped);
    assert_eq!(scaler.scale(), 16384.0);
    // Scaled clean gradients: the update uses the unscaled value.
    for i in 0..3 {
        let g = scaler.scale(); // gradient of 1.0 after scaling
        p.set_grad(Some(
            Tensor::from_f32(&dev, &[g, g, g], &[3], DType::F16).unwrap(),
        ));
        let r = scaler.step(&mut opt, None).unwrap();
        assert!(r.stepped, "clean step {i}");
        assert!((r.grad_norm - 3f32.sqrt()).abs() < 1e-3);
    }
    assert_eq!(
        scaler.scale(),
        32768.0,
        "doubled after growth_interval clean steps"
    );
    let v = p.to_f32_vec().unwrap();
    assert!(
        (v[0] - 0.7).abs() < 2e-3 && (v[2] - 2.7).abs() < 4e-3,
        "{v:?}"
    );
    // The scaled loss is loss * scale.
    let l = Tensor::from_slice(&dev, &[2.0f32], &[1]).unwrap();
    assert_eq!(scaler.scale_loss(&l).unwrap().to_scalar().unwrap(), 65536.0);
}

/// The deferred step (decided on the device, its report read one step later) takes the same
/// steps as the blocking one through an overflow and a clip: the same parameters, scale and
/// Adam step count; and the skipped step leaves Adam as if it had never come (its bias
/// correction counts only the steps taken).
#[test]
fn deferred_scaler_step_matches_blocking_step() {
    let dev = device();
    let grads: [[f32; 3]; 4] = [
        [1.0, -2.0, 0.5],
        [f32::INFINITY, 0.0, 1.0],
        [0.25, 1.0, -1.0],
        [2.0, 0.5, 0.5],
    ];
    let run = |deferred: bool, leave_out_bad: bool| -> (Vec<f32>, u64, f32, u64) {
        let p = Tensor::from_f32(&dev, &[1.0, 2.0, 3.0], &[3], DType::F16)
            .unwrap()
            .variable();
        let mut opt = wgrad::optim::Adam::new(vec![("p".into(), p.clone())], 0.1).unwrap();
        let mut scaler = GradScaler::with_scale(1024.0);
        for g in &grads {
            if leave_out_bad && !g[0].is_finite() {
                continue;
            }
            // The gradient of a loss scaled on the device (the host's scale lags when deferred).
            let scaled = Tensor::from_f32(&dev, g, &[3], DType::F32)
                .unwrap()
                .mul(&scaler.scale_tensor(&dev).unwrap())
                .unwrap()
                .to_dtype(DType::F16)
                .unwrap();
            p.set_grad(Some(scaled));
            if deferred {
                scaler.step_deferred(&mut opt, Some(1.5)).unwrap();
            } else {
                scaler.step(&mut opt, Some(1.5)).unwrap();
            }
            opt.zero_grad();
        }
        let last = scaler.last_report(&mut opt).unwrap();
        assert!(last.stepped && last.clip < 1.0, "{last:?}");
        (
            p.to_f32_vec().unwrap(),
            opt.steps(),
            scaler.scale(),
            scaler.skipped(),
        )
    };
    let blocking = run(false, false);
    let deferred = run(true, false);
    assert_eq!(blocking, deferred);
    assert_eq!((blocking.1, blocking.2, blocking.3), (3, 512.0, 1));
    let (without, steps, _, skipped) = run(true, true);
    assert_eq!((steps, skipped), (3, 0));
    for (a, b) in blocking.0.iter().zip(&without) {
        assert!((a - b).abs() < 2e-3, "{:?} vs {without:?}", blocking.0);
    }
    // The parameters moved.
    assert!((blocking.0[0] - 1.0).abs() > 0.1, "{:?}", blocking.0);
}

/// An optimizer written outside the crate follows the loss scaler's decision through
/// `Control::stepped` and `Control::multiplier`: plain SGD, updating through the host.
#[test]
fn outside_optimizer_reads_the_control_block() {
    struct Plain {
        p: Tensor,
        lr: f32,
    }
    impl Optimizer for Plain {
        fn step_with(
            &mut self,
            gmul: f32,
            control: Option<&wgrad::optim::Control>,
        ) -> wgrad::Result<()> {
            let Some(g) = self.p.grad() else {
                return Ok(());
            };
            let mut step = g.to_dtype(DType::F32)?.mul_scalar(self.lr * gmul)?;
            if let Some(c) = control {
                let zero = Tensor::zeros(g.device(), g.shape(), DType::F32)?;
                step = Tensor::where_cond(&c.stepped()?, &step.mul(&c.multiplier()?)?, &zero)?;
            }
            let next = self.p.to_dtype(DType::F32)?.sub(&step)?.to_f32_vec()?;
            self.p.copy_from_slice(&next)
        }
        fn zero_grad(&self) {
            self.p.zero_grad();
        }
        fn lr(&self) -> f32 {
            self.lr
        }
        fn set_lr(&mut self, lr: f32) {
            self.lr = lr;
        }
        fn params(&self) -> Vec<(String, Tensor)> {
            vec![("p".into(), self.p.clone())]
        }
        fn state(&self) -> Vec<(String, Tensor)> {
            Vec::new()
        }
    }
    let dev = device();
    let p = Tensor::from_slice(&dev, &[1.0f32, 2.0], &[2])
        .unwrap()
        .variable();
    let mut opt = Plain {
        p: p.clone(),
        lr: 0.5,
    };
    let mut scaler = GradScaler::with_scale(8.0);
    p.set_grad(Some(
        Tensor::from_slice(&dev, &[f32::NAN, 8.0], &[2]).unwrap(),
    ));
    assert!(!scaler.step(&mut opt, None).unwrap().stepped);
    assert_eq!(
        p.to_f32_vec().unwrap(),
        vec![1.0, 2.0],
        "skipped: unchanged"
    );
    // Scale 4 now: a scaled gradient of (4, 8) is (1, 2).
    p.set_grad(Some(
        Tensor::from_slice(&dev, &[4.0f32, 8.0], &[2]).unwrap(),
    ));
    assert!(scaler.step(&mut opt, None).unwrap().stepped);
    assert_eq!(p.to_f32_vec().unwrap(), vec![0.5, 1.0]);
}

#[test]
fn fp16_model_trains_with_scaler() {
    let dev = device();
    dev.manual_seed(5);
    let net = Sequential::new()
        .add("fc1", Linear::new(&dev, 16, 32, true, DType::F16).unwrap())
        .add("act", Activation::Relu)
        .add("fc2", Linear::new(&dev, 32, 4, true, DType::F16).unwrap());
    let mut opt = wgrad::optim::Adam::new(net.params(), 1e-2).unwrap();
    let mut scaler = GradScaler::new();
    let x = Tensor::randn(&dev, &[64, 16], 0.0, 1.0, DType::F16).unwrap();
    let labels: Vec<u32> = (0..64).map(|i| (i % 4) as u32).collect();
    let y = Tensor::from_slice(&dev, &labels, &[64]).unwrap();
    let mut first = 0.0;
    let mut last = 0.0;
    for step in 0..40 {
        let loss = net.forward(&x).unwrap().cross_entropy(&y).unwrap();
        let l = loss.to_scalar().unwrap();
        if step == 0 {
            first = l;
        }
        last = l;
        scaler.scale_loss(&loss).unwrap().backward().unwrap();
        scaler.step(&mut opt, Some(5.0)).unwrap();
        opt.zero_grad();
    }
    assert!(last < first * 0.5, "f16 loss {first} -> {last}");
    assert!(net.params().iter().all(|(_, p)| p.dtype() == DType::F16));
}

#[test]
fn accumulation_matches_one_large_batch() {
    let dev = device();
    dev.manual_seed(9);
    let mut rng = Rng::new(60);
    let make = |dev: &Device| -> (Sequential, Vec<(String, Tensor)>) {
        dev.manual_seed(9);
        let net = Sequential::new()
            .add("fc1", Linear::new(dev, 8, 16, true, DType::F32).unwrap())
            .add("act", Activation::Tanh)
            .add("fc2", Linear::new(dev, 16, 3, true, DType::F32).unwrap());
        let p = net.params();
        (net, p)
    };
    let x = rng.vec(32 * 8);
    let labels: Vec<u32> = (0..32).map(|_| rng.below(3) as u32).collect();
    let xt = Tensor::from_slice(&dev, &x, &[32, 8]).unwrap();
    let yt = Tensor::from_slice(&dev, &labels, &[32]).unwrap();
    // One batch of 32.
    let (net_a, pa) = make(&dev);
    let mut opt_a = Sgd::new(pa.clone(), 0.5, 0.9, 0.0, false).unwrap();
    net_a
        .forward(&xt)
        .unwrap()
        .cross_entropy(&yt)
        .unwrap()
        .backward()
        .unwrap();
    opt_a.step().unwrap();
    // Four micro-batches of 8, gradients accumulated, one step scaled by 1/4.
    let (net_b, pb) = make(&dev);
    let mut opt_b = Sgd::new(pb.clone(), 0.5, 0.9, 0.0, false).unwrap();
    for m in 0..4 {
        let xm = xt.narrow(0, m * 8, 8).unwrap();
        let ym = Tensor::from_slice(&dev, &labels[m * 8..m * 8 + 8], &[8]).unwrap();
        net_b
            .forward(&xm)
            .unwrap()
            .cross_entropy(&ym)
            .unwrap()
            .backward()
            .unwrap();
    }
    opt_b.step_scaled(0.25).unwrap();
    for ((n, a), (_, b)) in pa.iter().zip(&pb) {
        let (va, vb) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
        assert_close(
            &vb,
            &va.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            DType::F32,
            &format!("accumulated update of {n}"),
        );
    }
}

#[test]
fn clipping_and_nonfinite_guards() {
    let dev = device();
    let p = Tensor::from_slice(&dev, &[0.0f32; 4], &[4])
        .unwrap()
        .variable();
    let mut opt = Sgd::new(vec![("p".into(), p.clone())], 1.0, 0.0, 0.0, false).unwrap();
    p.set_grad(Some(
        Tensor::from_slice(&dev, &[3.0f32, 4.0, 0.0, 0.0], &[4]).unwrap(),
    ));
    let r = guarded_step(&mut opt, 1.0, Some(1.0), NonFinite::Error).unwrap();
    assert!((r.grad_norm - 5.0).abs() < 1e-5 && (r.clip - 0.2).abs() < 1e-5);
    let v = p.to_vec::<f32>().unwrap();
    assert!(
        (v[0] + 0.6).abs() < 1e-5 && (v[1] + 0.8).abs() < 1e-5,
        "clipped to norm 1: {v:?}"
    );
    p.set_grad(Some(
        Tensor::from_slice(&dev, &[f32::NAN, 0.0, 0.0, 0.0], &[4]).unwrap(),
    ));
    let e = guarded_step(&mut opt, 1.0, Some(1.0), NonFinite::Error).unwrap_err();
    assert!(e.to_string().contains("inf or NaN"), "{e}");
    assert_eq!(p.to_vec::<f32>().unwrap(), v, "no update on error");
    let r = guarded_step(&mut opt, 1.0, None, NonFinite::Skip).unwrap();
    assert!(!r.stepped);
    assert_eq!(p.to_vec::<f32>().unwrap(), v, "no update when skipping");
    // Parameters on two devices cannot share one optimizer.
    let q = Tensor::zeros(&device(), &[2], DType::F32)
        .unwrap()
        .variable();
    let two = vec![("p".into(), p.clone()), ("q".into(), q)];
    assert!(matches!(
        Sgd::new(two, 1.0, 0.0, 0.0, false),
        Err(Error::Invalid { .. })
    ));
}

/// The global gradient norm over many gradients of awkward sizes and both float dtypes
/// (summed sixteen tensors a dispatch where the adapter binds them, else four: 21 gradients
/// make a full group and a partial one), against an f64 sum; a parameter without a gradient
/// is left out, and an inf in one late gradient makes the norm inf.
#[test]
fn grad_norm_over_many_tensors() {
    let dev = device_with(|o| o.poison = true);
    let mut rng = Rng::new(40);
    let sizes = [
        1usize, 3, 17, 127, 1000, 2049, 5000, 2, 4100, 9, 33, 65, 300, 700, 1, 2, 3, 4097, 5, 6,
        8191,
    ];
    let mut params = Vec::new();
    let mut want = 0.0f64;
    for (i, &n) in sizes.iter().enumerate() {
        let dt = if i % 3 == 1 { DType::F16 } else { DType::F32 };
        let p = Tensor::zeros(&dev, &[n], dt).unwrap().variable();
        let g = rng.vec(n);
        want += rounded(&g, dt).iter().map(|v| v * v).sum::<f64>();
        p.set_grad(Some(tensor(&dev, &g, &[n], dt)));
        params.push((format!("p{i}"), p));
    }
    let idle = Tensor::zeros(&dev, &[7], DType::F32).unwrap().variable();
    params.insert(3, ("idle".into(), idle));
    let got = wgrad::optim::grad_norm(&params).unwrap() as f64;
    assert!(
        (got - want.sqrt()).abs() <= 1e-5 * want.sqrt(),
        "{got} vs {}",
        want.sqrt()
    );
    let mut bad = vec![0.5f32; 2049];
    bad[2000] = f32::INFINITY;
    params[6]
        .1
        .set_grad(Some(tensor(&dev, &bad, &[2049], DType::F32)));
    assert!(wgrad::optim::grad_norm(&params).unwrap().is_infinite());
}

#[test]
fn largest_batch_under_a_budget() {
    let dev = device_with(|o| {
        o.memory_limit = Some(wgrad::MemoryLimit::Bytes(40 << 20));
        o.no_cache = false;
    });
    let w = Tensor::randn(&dev, &[256, 256], 0.0, 0.05, DType::F32)
        .unwrap()
        .variable();
    // A step whose memory grows with the batch: activations of 4 layers of width 256.
    let step = |b: usize| -> wgrad::Result<()> {
        let x = Tensor::randn(&dev, &[b, 256], 0.0, 1.0, DType::F32)?;
        let mut h = x;
        for _ in 0..4 {
            h = h.matmul(&w)?.relu()?;
        }
        h.mean_all()?.backward()?;
        w.zero_grad();
        Ok(())
    };
    let best = find_batch_size(&dev, 1 << 16, step).unwrap();
    assert!(best > 16 && best < 1 << 16, "found {best}");
    dev.empty_cache();
    step(best).expect("the batch found fits");
    dev.sync().unwrap();
    dev.empty_cache();
    assert!(
        step(best + best / 8 + 1).err().is_some_and(|e| e.is_oom()),
        "a batch well above the one found ({best}) should not fit"
    );
    // Other errors pass through.
    let e = find_batch_size(&dev, 8, |_| {
        Err(Error::Invalid {
            op: "trial",
            detail: "broken".into(),
        })
    })
    .unwrap_err();
    assert!(matches!(e, Error::Invalid { .. }));
}

#[test]
fn dynamic_batch_follows_free_memory() {
    let mut d = DynamicBatch::new(64, 8, 256);
    assert_eq!(d.adjust_for(0.1), 48, "under 20% free: shrink by a quarter");
    assert_eq!(d.adjust_for(0.5), 48, "in between: keep");
    assert_eq!(d.adjust_for(0.9), 60, "over 70% free: grow by a quarter");
    for _ in 0..20 {
        d.adjust_for(0.0);
    }
    assert_eq!(d.size, 8, "never below min");
    for _ in 0..40 {
        d.adjust_for(1.0);
    }
    assert_eq!(d.size, 256, "never above max");
    // On a device with a budget, a step that used most of it shrinks the batch.
    let dev = device_with(|o| o.memory_limit = Some(wgrad::MemoryLimit::Bytes(16 << 20)));
    let mut d = DynamicBatch::new(100, 1, 1000);
    let t = Tensor::zeros(&dev, &[(14 << 20) / 4], DType::F32).unwrap();
    drop(t);
    assert!(d.adjust(&dev) < 100);
}

#[test]
fn track_reports_a_scope() {
    let dev = device_with(|o| o.no_cache = false);
    let (sum, r) = dev
        .track("work", || {
            let a = Tensor::ones(&dev, &[1 << 18], DType::F32)?;
            let b = a.mul_scalar(2.0)?;
            b.sum_all()?.to_scalar()
        })
        .unwrap();
    assert_eq!(sum, (1 << 19) as f32);
    assert!(r.peak >= 2 * (1 << 20), "two 1 MiB tensors were alive: {r}");
    assert_eq!(r.allocated_after, r.allocated_before);
    assert!(r.to_string().contains("work"));
}
