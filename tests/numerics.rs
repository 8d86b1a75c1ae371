//! Numerics at least as careful as PyTorch's: variance without cancellation, log-softmax
//! without rounding at the size of the max, pow on negative bases, edge cases of reductions.

mod common;

use common::{Rng, assert_close, assert_close_tol, poisoned, tensor};
use wgrad::reference as cpu;
use wgrad::{DType, Tensor};

/// Rows with a large mean next to a unit spread: E[x^2] - E[x]^2 is all noise there, and a
/// mean rounded at the size of 1000 puts its error into every normalised value.
#[test]
fn layer_norm_of_rows_with_a_large_offset() {
    let dev = poisoned();
    let mut rng = Rng::new(1);
    let (rows, len) = (8, 1000);
    for offset in [-1000.0f32, 3.0e4] {
        let x: Vec<f32> = (0..rows * len).map(|_| offset + rng.uniform()).collect();
        let t = tensor(&dev, &x, &[rows, len], DType::F32);
        let gamma = Tensor::ones(&dev, &[len], DType::F32).unwrap();
        let beta = Tensor::zeros(&dev, &[len], DType::F32).unwrap();
        let got = t
            .layer_norm(&gamma, &beta, 1e-5)
            .unwrap()
            .to_f32_vec()
            .unwrap();
        let xd: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let want = cpu::norm(&xd, &vec![1.0; len], Some(&vec![0.0; len]), rows, len, 1e-5);
        // Measured on lavapipe: 3e-7 at most; a plain two-pass mean gave 2e-4 (offset -1000)
        // and 5e-3 (offset 30000).
        assert_close_tol(
            &got,
            &want,
            (1e-5, 1e-5),
            &format!("layer_norm offset {offset}"),
        );
    }
}

/// log-softmax and cross-entropy of logits near -30000: `x - (max + log sum)` rounded at the
/// size of the max (-6.908203 instead of -6.907755 for 1000 equal logits).
#[test]
fn log_softmax_and_cross_entropy_far_from_zero() {
    let dev = poisoned();
    let mut rng = Rng::new(2);
    let (rows, len) = (4, 1000);
    let x: Vec<f32> = (0..rows * len)
        .map(|i| {
            -30000.0
                + if i % len == 0 {
                    0.0
                } else {
                    0.01 * rng.uniform()
                }
        })
        .collect();
    let t = tensor(&dev, &x, &[rows, len], DType::F32);
    let xd: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let want = cpu::softmax(&xd, rows, len, true);
    let got = t.log_softmax().unwrap().to_f32_vec().unwrap();
    // -6.9 to a few ulps.
    assert_close_tol(&got, &want, (4e-6, 1e-6), "log_softmax at -30000");
    let labels: Vec<u32> = (0..rows as u32).map(|r| r * 7).collect();
    let tl = Tensor::from_slice(&dev, &labels, &[rows]).unwrap();
    let loss = t.cross_entropy_rows(&tl).unwrap().to_f32_vec().unwrap();
    let want = cpu::cross_entropy(&xd, &labels, rows, len);
    assert_close_tol(&loss, &want, (4e-6, 1e-6), "cross_entropy at -30000");
    // Its gradient (softmax - onehot) from the saved statistics is as exact.
    let tv = t.variable();
    tv.cross_entropy(&tl).unwrap().backward().unwrap();
    let g = tv.grad().unwrap().to_f32_vec().unwrap();
    let sm = cpu::softmax(&xd, rows, len, false);
    let want: Vec<f64> = (0..rows * len)
        .map(|i| {
            let hot = if labels[i / len] as usize == i % len {
                1.0
            } else {
                0.0
            };
            (sm[i] - hot) / rows as f64
        })
        .collect();
    assert_close_tol(&g, &want, (1e-8, 1e-4), "cross_entropy gradient at -30000");
}

#[test]
fn pow_of_negative_bases_and_zero() {
    let dev = poisoned();
    for dt in [DType::F32, DType::F16] {
        let base = [-2.0f32, -2.0, -2.0, -2.0, 0.0, 0.0, 0.0, 3.0, -0.5, 2.0];
        let expo = [2.0f32, 3.0, 0.5, -1.0, 0.0, 2.0, -1.0, 0.0, -3.0, 0.5];
        let want: Vec<f64> = base
            .iter()
            .zip(&expo)
            .map(|(&b, &e)| (b as f64).powf(e as f64))
            .collect();
        let tb = tensor(&dev, &base, &[10], dt);
        let te = tensor(&dev, &expo, &[10], dt);
        let got = tb.pow(&te).unwrap().to_f32_vec().unwrap();
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            let ok = if w.is_nan() {
                g.is_nan()
            } else if w.is_infinite() {
                g == w as f32
            } else {
                (g as f64 - w).abs() <= 1e-3 * w.abs().max(1.0)
            };
            assert!(ok, "{dt}: {}^{} = {g}, want {w}", base[i], expo[i]);
        }
        // pow_scalar takes the same path.
        let x = tensor(&dev, &[-2.0, -1.5, 0.0, 2.0], &[4], dt);
        assert_eq!(
            x.pow_scalar(3.0).unwrap().to_f32_vec().unwrap(),
            vec![-8.0, -3.375, 0.0, 8.0],
            "{dt}: x^3"
        );
        assert_eq!(
            x.pow_scalar(2.0).unwrap().to_f32_vec().unwrap(),
            vec![4.0, 2.25, 0.0, 4.0],
            "{dt}: x^2"
        );
    }
}

/// d/dx x^n at negative x for integral n, against central differences of the f64 function.
#[test]
fn pow_gradients_at_negative_bases() {
    let dev = poisoned();
    let xs = [-2.0f32, -1.25, -0.5];
    for n in [2.0f32, 3.0] {
        let x = tensor(&dev, &xs, &[3], DType::F32).variable();
        x.pow_scalar(n)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let g = x.grad().unwrap().to_f32_vec().unwrap();
        let h = 1e-5;
        let want: Vec<f64> = xs
            .iter()
            .map(|&v| {
                let v = v as f64;
                ((v + h).powf(n as f64) - (v - h).powf(n as f64)) / (2.0 * h)
            })
            .collect();
        assert_close(&g, &want, DType::F32, &format!("d/dx x^{n}"));
        // Through the tensor-exponent op too.
        let x = tensor(&dev, &xs, &[3], DType::F32).variable();
        let e = tensor(&dev, &[n; 3], &[3], DType::F32);
        x.pow(&e).unwrap().sum_all().unwrap().backward().unwrap();
        assert_close(
            &x.grad().unwrap().to_f32_vec().unwrap(),
            &want,
            DType::F32,
            "pow grad",
        );
    }
}

/// Reductions over an empty axis follow PyTorch: the sum of nothing is 0, its mean NaN; max,
/// min and argmax of nothing are errors.
#[test]
fn reductions_over_an_empty_axis() {
    let dev = poisoned();
    let t = Tensor::zeros(&dev, &[3, 0], DType::F32).unwrap();
    assert_eq!(t.sum(1, false).unwrap().to_f32_vec().unwrap(), vec![0.0; 3]);
    assert!(
        t.mean(1, false)
            .unwrap()
            .to_f32_vec()
            .unwrap()
            .iter()
            .all(|v| v.is_nan())
    );
    assert!(t.max(1, false).is_err());
    assert!(t.min(1, false).is_err());
    assert!(t.argmax(1, false).is_err());
    // Reducing the non-empty axis of an empty tensor gives an empty result.
    assert_eq!(t.sum(0, false).unwrap().shape(), &[0]);
    // A matmul with k = 0 is zeros, consistent with the empty sum.
    let a = Tensor::zeros(&dev, &[2, 0], DType::F32).unwrap();
    let b = Tensor::zeros(&dev, &[0, 3], DType::F32).unwrap();
    assert_eq!(a.matmul(&b).unwrap().to_f32_vec().unwrap(), vec![0.0; 6]);
}

/// NaN in a reduced range: max and min are NaN and argmax points at it, as in PyTorch.
#[test]
fn nan_propagates_through_max_and_argmax() {
    let dev = poisoned();
    let x = tensor(
        &dev,
        &[1.0, f32::NAN, 3.0, 2.0, 0.0, -1.0],
        &[2, 3],
        DType::F32,
    );
    let m = x.max(1, false).unwrap().to_f32_vec().unwrap();
    assert!(m[0].is_nan() && m[1] == 2.0, "{m:?}");
    assert_eq!(
        x.argmax(1, false).unwrap().to_vec::<u32>().unwrap(),
        vec![1, 0]
    );
    let m = x.min(0, false).unwrap().to_f32_vec().unwrap();
    assert!(m[0] == 1.0 && m[1].is_nan() && m[2] == -1.0, "{m:?}");
}
