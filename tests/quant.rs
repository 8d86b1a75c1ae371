//! Quantized matrices (`wgrad::quant`) against f64 references on the CPU: the blocks are made
//! by `quantize_blocks`, decoded on the host by the GGUF reader (itself checked against the
//! `gguf` Python package in tests/gguf.rs), and the products summed in f64.

mod common;

use common::{DTYPES, Rng, poisoned, rounded, tensor};
use wgrad::gguf::dequantize;
use wgrad::quant::{Fusion, QuantFormat, QuantMatrix, quantize_blocks};
use wgrad::{DType, Tensor, no_grad};

const FORMATS: [QuantFormat; 3] = [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0];

/// A random [rows, cols] matrix quantized, and its values as the file's decoder gives them.
fn random_matrix(
    dev: &wgrad::Device,
    f: QuantFormat,
    rows: usize,
    cols: usize,
    seed: u64,
) -> (QuantMatrix, Vec<f32>) {
    let mut rng = Rng::new(seed);
    // Blocks of different magnitudes, so scales differ from block to block.
    let values: Vec<f32> = (0..rows * cols)
        .map(|i| rng.uniform() * (1.0 + ((i / 32) % 5) as f32))
        .collect();
    let bytes = quantize_blocks(f, &values).unwrap();
    let decoded = dequantize(f.ggml_type(), &bytes, rows * cols).unwrap();
    let q = QuantMatrix::from_blocks(dev, f, &bytes, rows, cols).unwrap();
    (q, decoded)
}

/// `res + x W^T` in f64, and the sum of |x w| per output (the scale of f32 accumulation
/// error).
fn reference(
    x: &[f64],
    w: &[f32],
    res: Option<&[f64]>,
    m: usize,
    rows: usize,
    cols: usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0.0; m * rows];
    let mut mag = vec![0.0; m * rows];
    for b in 0..m {
        for r in 0..rows {
            let mut s = res.map_or(0.0, |v| v[b * rows + r]);
            let mut a = s.abs();
            for k in 0..cols {
                let t = x[b * cols + k] * w[r * cols + k] as f64;
                s += t;
                a += t.abs();
            }
            y[b * rows + r] = s;
            mag[b * rows + r] = a;
        }
    }
    (y, mag)
}

/// |got - want| within the dtype's rounding of the result plus f32 accumulation error.
fn check(got: &[f32], want: &[f64], mag: &[f64], dtype: DType, what: &str) {
    let (atol, rtol) = common::tol(dtype);
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((&g, &w), &a)) in got.iter().zip(want).zip(mag).enumerate() {
        let allowed = atol + rtol * w.abs() + 2e-5 * a;
        assert!(
            !g.is_nan() && (g as f64 - w).abs() <= allowed,
            "{what}: element {i}: got {g}, want {w} (allowed {allowed:.3e})"
        );
    }
}

#[test]
fn matvec_matches_f64_reference() {
    let dev = poisoned();
    // Awkward sizes: one block, odd row counts, rows not a multiple of a workgroup's, long
    // rows that take several strides of the workgroup.
    let shapes = [(1, 32), (5, 64), (37, 96), (131, 576), (3, 1536)];
    for (si, &(rows, cols)) in shapes.iter().enumerate() {
        for (fi, &f) in FORMATS.iter().enumerate() {
            let (q, w) = random_matrix(&dev, f, rows, cols, (si * 10 + fi) as u64);
            for &dtype in &DTYPES {
                for m in [1, 3, 8] {
                    let mut rng = Rng::new(si as u64 * 100 + m as u64);
                    let xs = rng.vec(m * cols);
                    let x = tensor(&dev, &xs, &[m, cols], dtype);
                    let y = q.forward(&x).unwrap();
                    assert_eq!(y.shape(), &[m, rows]);
                    assert_eq!(y.dtype(), dtype);
                    let (want, mag) = reference(&rounded(&xs, dtype), &w, None, m, rows, cols);
                    let got = y.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
                    check(
                        &got,
                        &want,
                        &mag,
                        dtype,
                        &format!("{f:?} [{rows}, {cols}] {dtype} m={m}"),
                    );
                }
            }
        }
    }
}

#[test]
fn matvec_adds_the_residual() {
    let dev = poisoned();
    let (rows, cols, m) = (45, 128, 2);
    for &f in &FORMATS {
        let (q, w) = random_matrix(&dev, f, rows, cols, 7);
        for &dtype in &DTYPES {
            let mut rng = Rng::new(3);
            let (xs, rs) = (rng.vec(m * cols), rng.vec(m * rows));
            let x = tensor(&dev, &xs, &[1, m, cols], dtype);
            let res = tensor(&dev, &rs, &[1, m, rows], dtype);
            let y = q.forward_add(&x, &res).unwrap();
            assert_eq!(y.shape(), &[1, m, rows]);
            let rr = rounded(&rs, dtype);
            let (want, mag) = reference(&rounded(&xs, dtype), &w, Some(&rr), m, rows, cols);
            let got = y.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
            check(
                &got,
                &want,
                &mag,
                dtype,
                &format!("{f:?} {dtype} with residual"),
            );
        }
    }
}

#[test]
fn fused_norm_gate_and_residual_match_f64_reference() {
    // RMSNorm before, SwiGLU after, residual added: one kernel for up to 8 rows of x, the
    // composition of basic ops past that; both against the same f64 reference.
    let dev = poisoned();
    let (out, cols, eps) = (37, 96, 1e-5f64);
    for &f in &FORMATS {
        let (q, w) = random_matrix(&dev, f, 2 * out, cols, 19);
        for &dtype in &DTYPES {
            for m in [1, 5, 12] {
                let mut rng = Rng::new(m as u64);
                let (xs, gs, rs) = (rng.vec(m * cols), rng.vec(cols), rng.vec(m * out));
                let (x64, g64, r64) = (
                    rounded(&xs, dtype),
                    rounded(&gs, dtype),
                    rounded(&rs, dtype),
                );
                // n = x / rms(x) * gain, then silu(n W_gate) * (n W_up) + res, in f64.
                let mut want = vec![0.0; m * out];
                let mut mag = vec![0.0; m * out];
                for b in 0..m {
                    let row = &x64[b * cols..(b + 1) * cols];
                    let rms = (row.iter().map(|v| v * v).sum::<f64>() / cols as f64 + eps).sqrt();
                    let n: Vec<f64> = row.iter().zip(&g64).map(|(v, g)| v / rms * g).collect();
                    for r in 0..out {
                        let dot = |wr: usize| -> (f64, f64) {
                            let t = (0..cols).map(|k| n[k] * w[wr * cols + k] as f64);
                            t.fold((0.0, 0.0), |(s, a), v| (s + v, a + v.abs()))
                        };
                        let ((a, ma), (u, mu)) = (dot(r), dot(out + r));
                        let silu = a / (1.0 + (-a).exp());
                        want[b * out + r] = silu * u + r64[b * out + r];
                        mag[b * out + r] = ma * mu.max(1.0) + mu * ma.max(1.0) + 1.0;
                    }
                }
                let x = tensor(&dev, &xs, &[m, 1, cols], dtype);
                let gain = tensor(&dev, &gs, &[cols], dtype);
                let res = tensor(&dev, &rs, &[m, 1, out], dtype);
                let fused = Fusion {
                    norm: Some((&gain, eps as f32)),
                    glu: true,
                    residual: Some(&res),
                };
                let y = q.forward_with(&x, fused).unwrap();
                assert_eq!(y.shape(), &[m, 1, out]);
                let got = y.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
                // The composed path rounds the normalised x to the dtype before the product.
                let scale = if m > 8 { 2.0 } else { 1.0 };
                let (atol, rtol) = common::tol(dtype);
                for (i, ((&g, &w), &a)) in got.iter().zip(&want).zip(&mag).enumerate() {
                    let allowed = scale * (atol + rtol * w.abs() + rtol * 1e-1 * a) + 2e-5 * a;
                    assert!(
                        !g.is_nan() && (g as f64 - w).abs() <= allowed,
                        "{f:?} {dtype} m={m}: element {i}: got {g}, want {w} (allowed {allowed:.3e})"
                    );
                }
            }
        }
    }
}

#[test]
fn many_rows_take_the_decoded_product() {
    // Past the matvec's batch the product decodes the matrix and runs the tiled kernels.
    let dev = poisoned();
    let (rows, cols, m) = (19, 64, 40);
    for &f in &FORMATS {
        let (q, w) = random_matrix(&dev, f, rows, cols, 11);
        let mut rng = Rng::new(5);
        let (xs, rs) = (rng.vec(m * cols), rng.vec(m * rows));
        let x = tensor(&dev, &xs, &[m, cols], DType::F32);
        let res = tensor(&dev, &rs, &[m, rows], DType::F32);
        let y = q.forward_add(&x, &res).unwrap();
        let rr = rounded(&rs, DType::F32);
        let (want, mag) = reference(&rounded(&xs, DType::F32), &w, Some(&rr), m, rows, cols);
        check(
            &y.to_vec::<f32>().unwrap(),
            &want,
            &mag,
            DType::F32,
            &format!("{f:?} m={m}"),
        );
    }
}

#[test]
fn dequantize_and_rows_match_the_file_decoder() {
    let dev = poisoned();
    let (rows, cols) = (23, 96);
    for &f in &FORMATS {
        let (q, w) = random_matrix(&dev, f, rows, cols, 13);
        // Decoded values are exact in f32 (a f16 scale times a small integer, plus the minimum).
        let d = q.dequantize(DType::F32).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(d, w, "{f:?}: decoded matrix");
        for &dtype in &DTYPES {
            let d = q.dequantize(dtype).unwrap().to_dtype(DType::F32).unwrap();
            let want = rounded(&w, dtype);
            let got: Vec<f64> = d
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|&v| v as f64)
                .collect();
            assert_eq!(got, want, "{f:?}: decoded to {dtype}");
        }
        let ids = [22u32, 0, 5, 5, 17];
        let idx = Tensor::from_slice(&dev, &ids, &[5]).unwrap();
        let e = q.embedding(&idx, DType::F32).unwrap();
        assert_eq!(e.shape(), &[5, cols]);
        let got = e.to_vec::<f32>().unwrap();
        for (t, &r) in ids.iter().enumerate() {
            let r = r as usize;
            assert_eq!(
                &got[t * cols..(t + 1) * cols],
                &w[r * cols..(r + 1) * cols],
                "{f:?} row {r}"
            );
        }
        // An index past the rows reads as NaN on an unchecked device.
        let bad = Tensor::from_slice(&dev, &[1u32, 23], &[2]).unwrap();
        let e = q
            .embedding(&bad, DType::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert!(e[..cols].iter().all(|v| !v.is_nan()));
        assert!(
            e[cols..].iter().all(|v| v.is_nan()),
            "{f:?}: out-of-range row"
        );
    }
    let checked = common::device_with(|o| o.checked = true);
    let (q, _) = random_matrix(&checked, QuantFormat::Q8_0, 4, 32, 1);
    let bad = Tensor::from_slice(&checked, &[4u32], &[1]).unwrap();
    let err = q.embedding(&bad, DType::F32).unwrap_err().to_string();
    assert!(err.contains("index 4"), "{err}");
}

#[test]
fn input_gradient_matches_finite_differences() {
    // loss = sum(c * x W^T) is linear in x, so central differences with a large step are exact
    // up to the rounding of the loss.
    let dev = common::device();
    let (rows, cols, m) = (7, 64, 2);
    for &f in &FORMATS {
        let (q, w) = random_matrix(&dev, f, rows, cols, 17);
        let mut rng = Rng::new(9);
        let (xs, cs) = (rng.vec(m * cols), rng.vec(m * rows));
        let c = Tensor::from_slice(&dev, &cs, &[m, rows]).unwrap();
        let loss = |x: &Tensor| q.forward(x).unwrap().mul(&c).unwrap().sum_all().unwrap();
        let x = Tensor::from_slice(&dev, &xs, &[m, cols])
            .unwrap()
            .variable();
        loss(&x).backward().unwrap();
        let g = x.grad().unwrap().to_vec::<f32>().unwrap();
        let h = 0.5f32;
        for i in [0, 1, 31, 63, 64, 100, 127] {
            let at = |d: f32| {
                let mut v = xs.clone();
                v[i] += d;
                no_grad(|| loss(&Tensor::from_slice(&dev, &v, &[m, cols]).unwrap()))
                    .to_scalar()
                    .unwrap() as f64
            };
            let fd = (at(h) - at(-h)) / (2.0 * h as f64);
            let (b, k) = (i / cols, i % cols);
            let exact: f64 = (0..rows)
                .map(|r| cs[b * rows + r] as f64 * w[r * cols + k] as f64)
                .sum();
            assert!(
                (g[i] as f64 - fd).abs() < 1e-3,
                "{f:?} dx[{i}]: {} vs fd {fd}",
                g[i]
            );
            assert!(
                (g[i] as f64 - exact).abs() < 1e-4,
                "{f:?} dx[{i}]: {} vs {exact}",
                g[i]
            );
        }
    }
}

#[test]
fn bad_input_is_an_error() {
    let dev = common::device();
    let bytes = quantize_blocks(QuantFormat::Q4_1, &[0.5; 64]).unwrap();
    // A byte count for another shape, columns not in whole blocks, no rows.
    for (rows, cols) in [(1, 32), (2, 48), (0, 64), (3, 64)] {
        let err = QuantMatrix::from_blocks(&dev, QuantFormat::Q4_1, &bytes, rows, cols);
        assert!(err.is_err(), "[{rows}, {cols}] from 2 blocks");
    }
    assert!(quantize_blocks(QuantFormat::Q8_0, &[1.0; 33]).is_err());
    let q = QuantMatrix::from_blocks(&dev, QuantFormat::Q4_1, &bytes, 1, 64).unwrap();
    let x = Tensor::zeros(&dev, &[2, 32], DType::F32).unwrap();
    let err = q.forward(&x).unwrap_err().to_string();
    assert!(err.contains("quantized linear"), "{err}");
    let x = Tensor::zeros(&dev, &[2, 64], DType::F32).unwrap();
    let res = Tensor::zeros(&dev, &[2, 2], DType::F32).unwrap();
    assert!(q.forward_add(&x, &res).is_err());
    let ids = Tensor::zeros(&dev, &[2], DType::F32).unwrap();
    assert!(q.embedding(&ids, DType::F32).is_err());
    // The matrix still works after the errors.
    let y = q.forward(&x).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(y, vec![0.0; 2]);
}
