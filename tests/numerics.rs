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

/// f32 -> bf16 on the device rounds to nearest even bit for bit as `half` (and PyTorch) do, on
/// random bit patterns and on the ties, overflow, subnormal and NaN cases; bf16 -> f32 is exact.
#[test]
fn bf16_rounding_is_exact() {
    let dev = poisoned();
    let mut rng = Rng::new(77);
    let mut bits: Vec<u32> = (0..4093).map(|_| rng.next_u64() as u32).collect();
    bits.extend([
        0x3f80_8000, // 1 + 2^-8: a tie, rounds down to even
        0x3f81_8000, // a tie rounding up to even
        0x3f80_8001, // just above a tie
        0x7f7f_ffff, // f32::MAX: rounds to infinity
        0xff7f_8000, // -(largest bf16 + half an ulp): to -infinity
        0x0000_8000, // a subnormal tie
        0x8000_0001, // the smallest negative subnormal: to -0
        0x7fc0_0001, // NaN stays NaN
        0xff80_0001, // a signalling NaN too
        0x7f80_0000, // infinity
    ]);
    let vals: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
    let n = vals.len();
    let x = Tensor::from_slice(&dev, &vals, &[n]).unwrap();
    let got: Vec<half::bf16> = x.to_dtype(DType::BF16).unwrap().to_vec().unwrap();
    for (i, (&g, &v)) in got.iter().zip(&vals).enumerate() {
        let want = half::bf16::from_f32(v);
        let ok = if v.is_nan() {
            g.is_nan()
        } else {
            g.to_bits() == want.to_bits()
        };
        assert!(
            ok,
            "element {i}: {v:e} ({:#010x}) gave {:#06x}, want {:#06x}",
            bits[i],
            g.to_bits(),
            want.to_bits()
        );
    }
    // Back to f32 (odd length: the last word's high half is padding) without change.
    let back = Tensor::from_slice(&dev, &got, &[n])
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    for (i, (&b, &g)) in back.iter().zip(&got).enumerate() {
        assert!(
            b.to_bits() == g.to_f32().to_bits() || (b.is_nan() && g.is_nan()),
            "element {i}"
        );
    }
}

/// var and std: two passes against the f64 reference, with a large offset, corrections 0 and
/// 1, an axis of one element (NaN with correction 1) and an empty axis (NaN), in every float
/// dtype; the gradient by finite differences.
#[test]
fn variance_and_standard_deviation() {
    let dev = poisoned();
    let mut rng = Rng::new(31);
    let reference = |x: &[f64], rows: usize, len: usize, c: usize| -> Vec<f64> {
        (0..rows)
            .map(|r| {
                let row = &x[r * len..(r + 1) * len];
                let m = row.iter().sum::<f64>() / len as f64;
                row.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (len as f64 - c as f64)
            })
            .collect()
    };
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for (rows, len) in [(1, 2), (3, 17), (2, 127), (1, 1000)] {
            let x = rng.vec(rows * len);
            let t = tensor(&dev, &x, &[rows, len], dt);
            let xd: Vec<f64> = t.to_f32_vec().unwrap().iter().map(|&v| v as f64).collect();
            for c in [0, 1] {
                let want = reference(&xd, rows, len, c);
                let tl = if dt == DType::F32 {
                    (1e-6, 1e-5)
                } else {
                    (2e-2, 2e-2)
                };
                let v = t.var(1, c, false).unwrap();
                assert_eq!(v.shape(), &[rows]);
                assert_close_tol(
                    &v.to_f32_vec().unwrap(),
                    &want,
                    tl,
                    &format!("var {dt} {rows}x{len} c={c}"),
                );
                let sd: Vec<f64> = want.iter().map(|v| v.sqrt()).collect();
                let s = t.std(-1, c, true).unwrap();
                assert_eq!(s.shape(), &[rows, 1]);
                assert_close_tol(
                    &s.to_f32_vec().unwrap(),
                    &sd,
                    tl,
                    &format!("std {dt} {rows}x{len} c={c}"),
                );
            }
        }
    }
    // An offset of 10^4 on values of spread 1: a one-pass E[x^2] - E[x]^2 would lose all of it.
    let x: Vec<f32> = rng.vec(1000).into_iter().map(|v| 1e4 + v).collect();
    let xd: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let t = tensor(&dev, &x, &[1, 1000], DType::F32);
    assert_close_tol(
        &t.var(1, 1, false).unwrap().to_f32_vec().unwrap(),
        &reference(&xd, 1, 1000, 1),
        (1e-4, 1e-4),
        "offset",
    );
    // One element with correction 1, and an empty axis: NaN, as PyTorch gives.
    let one = tensor(&dev, &[3.0], &[1, 1], DType::F32);
    assert!(one.var(1, 1, false).unwrap().to_vec::<f32>().unwrap()[0].is_nan());
    assert_eq!(
        one.var(1, 0, false).unwrap().to_vec::<f32>().unwrap(),
        [0.0]
    );
    let empty = Tensor::zeros(&dev, &[2, 0], DType::F32).unwrap();
    let e = empty.var(1, 1, false).unwrap().to_vec::<f32>().unwrap();
    assert!(e.len() == 2 && e.iter().all(|v| v.is_nan()), "{e:?}");
    // Gradient: d var / dx_i = 2 (x_i - mean) / (n - c), checked by finite differences.
    let x = rng.vec(12);
    let xv = tensor(&dev, &x, &[3, 4], DType::F32).variable();
    xv.std(1, 1, false)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let g = xv.grad().unwrap().to_f32_vec().unwrap();
    let loss = |v: &[f32]| -> f64 {
        let t = tensor(&dev, v, &[3, 4], DType::F32);
        t.std(1, 1, false)
            .unwrap()
            .to_f32_vec()
            .unwrap()
            .iter()
            .map(|&s| s as f64)
            .sum()
    };
    for i in 0..12 {
        let (mut up, mut down) = (x.clone(), x.clone());
        up[i] += 1e-2;
        down[i] -= 1e-2;
        let fd = (loss(&up) - loss(&down)) / 2e-2;
        assert!(
            (g[i] as f64 - fd).abs() < 2e-3,
            "d std / dx[{i}]: {} vs {fd}",
            g[i]
        );
    }
}
