//! Every kernel past the sizes where one GPU thread would loop more than lavapipe allows.
//!
//! Mesa's lavapipe stops an invocation's loops after 65,535 iterations in total and carries on
//! with a partial result: a kernel whose loop count grows with the problem gives a silent wrong
//! answer there. wgrad bounds every invocation's loops (kernels::LOOP_BUDGET); each test here
//! runs a kernel well past 65,535 of the loop that used to grow, against an f64 reference.
//! What cannot be split must be an error, never a wrong number.

mod common;

use common::{Rng, assert_close, assert_close_tol, poisoned, tensor, tol};
use wgrad::reference as cpu;
use wgrad::{DType, Error, Tensor};

/// Past the cap: 65,535 plus a margin.
const N: usize = 70_001;

#[test]
fn sum_mean_max_min_over_a_long_axis() {
    let dev = poisoned();
    let mut rng = Rng::new(1);
    for dt in [DType::F32, DType::F16] {
        // [N, 2] reduced over axis 0: one thread per column used to walk all N rows.
        let ones = Tensor::ones(&dev, &[N, 2], dt).unwrap();
        let s = ones.sum(0, false).unwrap().to_f32_vec().unwrap();
        // f16 cannot hold 70001 exactly: compare in its own rounding.
        let want = half::f16::from_f32(N as f32).to_f32();
        let want = if dt == DType::F16 { want } else { N as f32 };
        assert_eq!(s, vec![want, want], "{dt}: ones[{N}, 2].sum(0)");

        let mut x = rng.vec(N * 3);
        // The extremes sit in the last rows, where a truncated loop would never look.
        x[(N - 2) * 3 + 1] = 5.0;
        x[(N - 1) * 3 + 2] = -5.0;
        let t = tensor(&dev, &x, &[N, 3], dt);
        let xd = common::rounded(&x, dt);
        let xr = &xd;
        let col = |c: usize| (0..N).map(move |r| xr[r * 3 + c]);
        let sums: Vec<f64> = (0..3).map(|c| col(c).sum()).collect();
        let got = t.sum(0, false).unwrap().to_f32_vec().unwrap();
        let (atol, rtol) = tol(dt);
        // A sum of N terms of size 1 carries rounding of order sqrt(N) ulps of the partials.
        assert_close_tol(&got, &sums, (atol * 50.0, rtol), &format!("{dt} sum(0)"));
        let means: Vec<f64> = sums.iter().map(|s| s / N as f64).collect();
        let got = t.mean(0, false).unwrap().to_f32_vec().unwrap();
        assert_close_tol(&got, &means, (atol, rtol), &format!("{dt} mean(0)"));
        let maxs: Vec<f64> = (0..3).map(|c| col(c).fold(f64::MIN, f64::max)).collect();
        assert_close(
            &t.max(0, false).unwrap().to_f32_vec().unwrap(),
            &maxs,
            dt,
            &format!("{dt} max(0)"),
        );
        let mins: Vec<f64> = (0..3).map(|c| col(c).fold(f64::MAX, f64::min)).collect();
        assert_close(
            &t.min(0, false).unwrap().to_f32_vec().unwrap(),
            &mins,
            dt,
            &format!("{dt} min(0)"),
        );
        assert_eq!(
            t.argmax(0, false).unwrap().to_vec::<u32>().unwrap()[1],
            (N - 2) as u32,
            "{dt} argmax(0)"
        );
        assert_eq!(
            t.argmin(0, false).unwrap().to_vec::<u32>().unwrap()[2],
            (N - 1) as u32,
            "{dt} argmin(0)"
        );
        // The same along a contiguous axis (rows).
        let row = tensor(&dev, &x, &[1, N * 3], dt);
        assert_eq!(
            row.argmax(1, false).unwrap().to_vec::<u32>().unwrap(),
            vec![((N - 2) * 3 + 1) as u32]
        );
        let total: f64 = xd.iter().sum();
        assert_close_tol(
            &row.sum(1, false).unwrap().to_f32_vec().unwrap(),
            &[total],
            (atol * 100.0, rtol),
            &format!("{dt} row sum"),
        );
    }
}

#[test]
fn linear_bias_and_weight_gradients_over_many_rows() {
    let dev = poisoned();
    let mut rng = Rng::new(2);
    // The bias gradient sums over the rows (a long reduction); the weight gradient is a
    // product whose contraction runs over the rows.
    let (rows, inp, out) = (N, 3, 2);
    let x = rng.vec(rows * inp);
    let w = rng.vec(out * inp);
    let tx = tensor(&dev, &x, &[rows, inp], DType::F32);
    let tw = tensor(&dev, &w, &[out, inp], DType::F32).variable();
    let tb = Tensor::zeros(&dev, &[out], DType::F32).unwrap().variable();
    let y = tx.linear(&tw, Some(&tb)).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    let gb = tb.grad().unwrap().to_f32_vec().unwrap();
    assert_close(
        &gb,
        &[rows as f64, rows as f64],
        DType::F32,
        "bias gradient",
    );
    let gw = tw.grad().unwrap().to_f32_vec().unwrap();
    let want: Vec<f64> = (0..out)
        .flat_map(|_| (0..inp).map(|i| (0..rows).map(|r| x[r * inp + i] as f64).sum::<f64>()))
        .collect();
    assert_close_tol(&gw, &want, (1e-3, 1e-4), "weight gradient");
}

#[test]
fn matmul_with_a_long_contraction() {
    let dev = poisoned();
    let mut rng = Rng::new(3);
    for dt in [DType::F32, DType::F16] {
        let (m, k, n) = (64, 40_000, 64);
        let a = rng.vec(m * k);
        let b = rng.vec(k * n);
        let ta = tensor(&dev, &a, &[m, k], dt);
        let tb = tensor(&dev, &b, &[k, n], dt);
        let got = ta.matmul(&tb).unwrap().to_f32_vec().unwrap();
        let want = cpu::matmul(
            &common::rounded(&a, dt),
            &common::rounded(&b, dt),
            None,
            m,
            n,
            k,
            false,
            false,
            None,
        );
        // Sums of 40,000 products of size 1: absolute error grows like sqrt(k) ulps of ~100.
        let (_, rtol) = tol(dt);
        let atol = if dt == DType::F32 { 2e-3 } else { 0.5 };
        assert_close_tol(
            &got,
            &want,
            (atol, rtol),
            &format!("{dt} [64,40000]x[40000,64]"),
        );
    }
}

/// Attention checked against the f64 forward and backward at one shape.
fn attention_case(sq: usize, skv: usize, d: usize, causal: bool, seed: u64) {
    let dev = poisoned();
    let mut rng = Rng::new(seed);
    let q = rng.vec(sq * d);
    let k = rng.vec(skv * d);
    let v = rng.vec(skv * d);
    let go = rng.vec(sq * d);
    let tq = tensor(&dev, &q, &[1, 1, sq, d], DType::F32).variable();
    let tk = tensor(&dev, &k, &[1, 1, skv, d], DType::F32).variable();
    let tv = tensor(&dev, &v, &[1, 1, skv, d], DType::F32).variable();
    let o = Tensor::attention(&tq, &tk, &tv, causal, None).unwrap();
    let scale = 1.0 / (d as f64).sqrt();
    let f = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<_>>();
    let (qd, kd, vd, gd) = (f(&q), f(&k), f(&v), f(&go));
    let what = format!("attention sq={sq} skv={skv} d={d} causal={causal}");
    let want = cpu::attention(&qd, &kd, &vd, 1, sq, skv, d, causal, scale);
    assert_close(
        &o.to_f32_vec().unwrap(),
        &want,
        DType::F32,
        &format!("{what} forward"),
    );
    o.backward_with(&tensor(&dev, &go, &[1, 1, sq, d], DType::F32))
        .unwrap();
    let (dq, dk, dv) = cpu::attention_backward(&qd, &kd, &vd, &gd, 1, sq, skv, d, causal, scale);
    let t = (1e-4, 1e-3);
    assert_close_tol(
        &tq.grad().unwrap().to_f32_vec().unwrap(),
        &dq,
        t,
        &format!("{what} dq"),
    );
    assert_close_tol(
        &tk.grad().unwrap().to_f32_vec().unwrap(),
        &dk,
        t,
        &format!("{what} dk"),
    );
    assert_close_tol(
        &tv.grad().unwrap().to_f32_vec().unwrap(),
        &dv,
        t,
        &format!("{what} dv"),
    );
}

#[test]
fn attention_over_many_keys() {
    // Forward and dQ walk the keys; 4,100 keys passed the cap at head dims 64 and 128.
    for d in [64, 128] {
        attention_case(16, 4100, d, false, 4);
        attention_case(16, 4100, d, true, 5);
    }
    // dQ's register-tile kernel walks up to 5,728 keys per dispatch at d <= 64, 4,608 at 128.
    attention_case(16, 5800, 48, true, 7);
    attention_case(16, 4700, 100, true, 11);
    // The forward's register-tile kernel (d <= 64, and d <= 128 with 16-wide subgroups) up to
    // 65,248: past it, its running state goes from one dispatch to the next.
    attention_case(16, 66_000, 64, true, 9);
    attention_case(16, 66_000, 128, true, 10);
}

#[test]
fn attention_over_many_queries() {
    // dK and dV walk the queries; the register-tile kernel up to 5,728 of them per dispatch
    // at d <= 64, 4,608 at 128.
    attention_case(4100, 16, 64, false, 6);
    attention_case(4100, 16, 128, false, 7);
    attention_case(5800, 16, 48, false, 8);
    attention_case(4700, 16, 128, false, 12);
}

#[test]
fn embedding_gradient_over_many_positions() {
    let dev = poisoned();
    let mut rng = Rng::new(8);
    // A small vocabulary (row variant) and a large one (column variant).
    for (vocab, dim) in [(10, 4), (5000, 3)] {
        for dt in [DType::F32, DType::F16] {
            let idx: Vec<u32> = (0..N).map(|_| rng.below(vocab as u64) as u32).collect();
            let w = Tensor::randn(&dev, &[vocab, dim], 0.0, 1.0, dt)
                .unwrap()
                .variable();
            let ti = Tensor::from_slice(&dev, &idx, &[N]).unwrap();
            let y = w.embedding(&ti).unwrap();
            y.sum_all().unwrap().backward().unwrap();
            let g = w.grad().unwrap().to_f32_vec().unwrap();
            let mut want = vec![0.0f64; vocab * dim];
            for &i in &idx {
                for c in 0..dim {
                    want[i as usize * dim + c] += 1.0;
                }
            }
            assert_close(
                &g,
                &want,
                dt,
                &format!("embedding gradient vocab={vocab} {dt}"),
            );
        }
    }
}

#[test]
fn layer_norm_parameter_gradients_over_many_rows() {
    let dev = poisoned();
    let mut rng = Rng::new(9);
    let (rows, len) = (N, 3);
    let x = rng.vec(rows * len);
    let tx = tensor(&dev, &x, &[rows, len], DType::F32);
    let gamma = Tensor::ones(&dev, &[len], DType::F32).unwrap().variable();
    let beta = Tensor::zeros(&dev, &[len], DType::F32).unwrap().variable();
    let y = tx.layer_norm(&gamma, &beta, 1e-5).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    assert_close(
        &beta.grad().unwrap().to_f32_vec().unwrap(),
        &[rows as f64; 3],
        DType::F32,
        "dbeta",
    );
    let xhat = cpu::norm(
        &x.iter().map(|&v| v as f64).collect::<Vec<_>>(),
        &[1.0; 3],
        Some(&[0.0; 3]),
        rows,
        len,
        1e-5,
    );
    let want: Vec<f64> = (0..len)
        .map(|c| (0..rows).map(|r| xhat[r * len + c]).sum())
        .collect();
    assert_close_tol(
        &gamma.grad().unwrap().to_f32_vec().unwrap(),
        &want,
        (2e-2, 1e-4),
        "dgamma",
    );
}

#[test]
fn grouped_optimizer_update_past_65535_workgroups() {
    // Two parameters whose workgroups (256 elements each) add up past one grid dimension's
    // 65,535: the grouped update folds its grid into two dimensions and maps every workgroup
    // back to its tensor.
    let dev = poisoned();
    let n = 65_536 * 256 / 2 + 1001;
    let ps: Vec<Tensor> = (0..2)
        .map(|_| {
            Tensor::randn(&dev, &[n], 0.0, 1.0, DType::F32)
                .unwrap()
                .variable()
        })
        .collect();
    let w0: Vec<Vec<f32>> = ps.iter().map(|p| p.to_f32_vec().unwrap()).collect();
    let gs: Vec<Tensor> = (0..2)
        .map(|_| Tensor::randn(&dev, &[n], 0.0, 1.0, DType::F32).unwrap())
        .collect();
    for (p, g) in ps.iter().zip(&gs) {
        p.set_grad(Some(g.clone()));
    }
    let named = ps
        .iter()
        .enumerate()
        .map(|(i, p)| (format!("p{i}"), p.clone()))
        .collect();
    let mut opt = wgrad::optim::Sgd::new(named, 0.5, 0.0, 0.0, false).unwrap();
    use wgrad::optim::Optimizer;
    opt.step().unwrap();
    for (i, (p, g)) in ps.iter().zip(&gs).enumerate() {
        let g = g.to_f32_vec().unwrap();
        let want: Vec<f64> = w0[i]
            .iter()
            .zip(&g)
            .map(|(&w, &g)| w as f64 - 0.5 * g as f64)
            .collect();
        assert_close(
            &p.to_f32_vec().unwrap(),
            &want,
            DType::F32,
            &format!("parameter {i} of {n} after one step"),
        );
    }
}

#[test]
fn what_cannot_be_split_is_an_error() {
    let dev = poisoned();
    // A row longer than the row kernels take.
    let long = Tensor::zeros(&dev, &[1, (1 << 20) + 1], DType::F32).unwrap();
    for r in [
        long.softmax(),
        long.log_softmax(),
        long.layer_norm(
            &Tensor::ones(&dev, &[(1 << 20) + 1], DType::F32).unwrap(),
            &Tensor::zeros(&dev, &[(1 << 20) + 1], DType::F32).unwrap(),
            1e-5,
        ),
    ] {
        match r {
            Err(Error::LimitExceeded { limit_name, .. }) => {
                assert!(limit_name.contains("loop budget"), "{limit_name}")
            }
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("a row past the limit was accepted"),
        }
    }
    // A pooling window past the budget.
    let img = Tensor::zeros(&dev, &[1, 1, 200, 200], DType::F32).unwrap();
    assert!(matches!(
        img.avg_pool2d((200, 200), (1, 1), (0, 0)),
        Err(Error::LimitExceeded { .. })
    ));
    // The device is still usable.
    assert_eq!(
        Tensor::ones(&dev, &[3], DType::F32)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar()
            .unwrap(),
        3.0
    );
}

/// A product split along K (here by the loop budget) sums its partial products and applies
/// bias and activation in a separate pass (`splitk`): against f64, the pass checked to have
/// run, with N a multiple of 4 and not (on lavapipe `simt_n4` and `simt` write the partials).
#[test]
fn split_products_sum_partials_with_bias_and_activation() {
    use wgrad::Activation;
    use wgrad::ops::MatmulOpts;
    let dev = poisoned();
    let mut rng = Rng::new(4);
    for n in [68, 66] {
        let (m, k) = (3, 40_000);
        let (a, b, bias) = (rng.vec(m * k), rng.vec(k * n), rng.vec(n));
        let ta = tensor(&dev, &a, &[m, k], DType::F32);
        let tb = tensor(&dev, &b, &[k, n], DType::F32);
        let tbias = tensor(&dev, &bias, &[n], DType::F32);
        let (got, ran) = common::ran_kernels(&dev, || {
            ta.matmul_with(
                &tb,
                MatmulOpts {
                    bias: Some(&tbias),
                    act: Some(Activation::Relu),
                    ..Default::default()
                },
            )
            .unwrap()
            .to_f32_vec()
            .unwrap()
        });
        assert!(ran.iter().any(|r| r == "Matmul/splitk"), "N = {n}: {ran:?}");
        let f = |v: &[f32]| common::rounded(v, DType::F32);
        let want = cpu::matmul(
            &f(&a),
            &f(&b),
            Some(&f(&bias)),
            m,
            n,
            k,
            false,
            false,
            Some(Activation::Relu),
        );
        assert_close_tol(&got, &want, (2e-3, 1e-4), &format!("N = {n}"));
    }
}
