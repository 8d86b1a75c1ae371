//! Cumulative sums. Forward and backward are the same kernel, the backward summing from the
//! end: d/dx_q of sum_p g_p y_p, with y_p = x_0 + ... + x_p, is g_q + g_{q+1} + ... .

use super::elementwise::float_only;
use crate::error::Result;
use crate::kernels::scan::{self as ks, Lines};
use crate::ops::reduce::split3;
use crate::tensor::Tensor;
use crate::tensor::graph::record_fn;

impl Tensor {
    /// Cumulative sum along `axis` (negative counts from the end): element q of the result
    /// is the sum of elements 0..=q. Sums run in f32 for every dtype.
    pub fn cumsum(&self, axis: isize) -> Result<Tensor> {
        let a = self.axis(axis, "cumsum")?;
        self.scan(a, false)
    }

    fn scan(&self, a: usize, reverse: bool) -> Result<Tensor> {
        float_only("cumsum", self)?;
        let x = self.contiguous()?;
        let out = Tensor::uninit(self.device(), self.shape(), self.dtype())?;
        let (outer, len, inner) = split3(self.shape(), a);
        if out.numel() > 0 {
            ks::cumsum(
                self.device(),
                x.dense_block("cumsum")?,
                out.dense_block("cumsum")?,
                self.dtype(),
                Lines {
                    outer,
                    len,
                    inner,
                    reverse,
                },
            )?;
        }
        let rec = record_fn("cumsum", self, move |_, g| g.scan(a, !reverse));
        Ok(out.with_node(rec))
    }
}

/// The f64 reference, checked against the kernel on random inputs at awkward sizes, past the
/// loop cap of lavapipe (one line of 70,001), on a poisoned device, in f32 and f16, and by
/// finite differences.
#[cfg(test)]
mod tests {
    use crate::{DType, Device, DeviceOptions, Tensor};

    /// Cumulative sums of `x` as [outer, len, inner] along the middle axis.
    fn reference(x: &[f64], (outer, len, inner): (usize, usize, usize), reverse: bool) -> Vec<f64> {
        let mut y = vec![0.0; x.len()];
        for o in 0..outer {
            for j in 0..inner {
                let mut acc = 0.0;
                for t in 0..len {
                    let q = if reverse { len - 1 - t } else { t };
                    let e = (o * len + q) * inner + j;
                    acc += x[e];
                    y[e] = acc;
                }
            }
        }
        y
    }

    /// The adapter the environment picks (`WGRAD_*`, `WGPU_BACKEND`), with poisoned outputs.
    fn device() -> Device {
        let mut o = DeviceOptions::from_env().expect("WGRAD_* variables");
        o.poison = true;
        Device::with_options(o).expect("a wgpu adapter")
    }

    /// Uniform in [-1, 1), deterministic.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    fn check(got: &[f32], want: &[f64], len: usize, dt: DType, what: &str) {
        // A sequential f32 sum of `len` terms: its rounding walks like sqrt(len) ulps of the
        // largest running sum; f16 adds the rounding of each stored result.
        let scale = want.iter().fold(1.0f64, |m, w| m.max(w.abs()));
        let walk = 1.2e-7 * (len as f64).sqrt() * scale;
        let eps = if dt == DType::F16 { 1e-3 } else { 1.2e-7 };
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let tol = eps * (1.0 + w.abs()) * 2.0 + walk;
            assert!(
                (g as f64 - w).abs() <= tol,
                "{what}: element {i}: got {g}, want {w} (tol {tol:e})"
            );
        }
    }

    #[test]
    fn matches_reference() {
        let dev = device();
        let shapes: [&[usize]; 7] = [
            &[1],
            &[3],
            &[17, 3],
            &[2, 127, 5],
            &[1000],
            &[3, 1000],
            &[70_001],
        ];
        for dt in [DType::F32, DType::F16] {
            for (si, shape) in shapes.iter().enumerate() {
                for axis in 0..shape.len() {
                    let n: usize = shape.iter().product();
                    let x = values(n, si as u64 + 1);
                    let t = Tensor::from_f32(&dev, &x, shape, dt).expect("upload");
                    // What the kernel saw: the inputs rounded to the dtype.
                    let xd: Vec<f64> = t
                        .to_f32_vec()
                        .expect("read")
                        .iter()
                        .map(|&v| v as f64)
                        .collect();
                    let dims = crate::ops::reduce::split3(shape, axis);
                    let got = t
                        .cumsum(axis as isize)
                        .expect("cumsum")
                        .to_f32_vec()
                        .expect("read");
                    let what = format!("{dt} {shape:?} axis {axis}");
                    check(&got, &reference(&xd, dims, false), dims.1, dt, &what);
                }
            }
        }
    }

    #[test]
    fn strided_input_and_negative_axis() {
        let dev = device();
        let x = values(4 * 6, 9);
        let t = Tensor::from_f32(&dev, &x, &[4, 6], DType::F32).expect("upload");
        // A transposed view: [6, 4], summed along its last axis = the original's first.
        let got = t.transpose(0, 1).expect("view").cumsum(-1).expect("cumsum");
        assert_eq!(got.shape(), &[6, 4]);
        let xt: Vec<f64> = (0..24).map(|i| x[(i % 4) * 6 + i / 4] as f64).collect();
        check(
            &got.to_f32_vec().expect("read"),
            &reference(&xt, (6, 4, 1), false),
            4,
            DType::F32,
            "transposed",
        );
        assert!(
            t.cumsum(2).is_err() && t.cumsum(-3).is_err(),
            "axis out of range is an error"
        );
    }

    /// The gradient by finite differences of the GPU forward pass, and the reversed sum
    /// over a long axis against the reference.
    #[test]
    fn gradient() {
        let dev = device();
        let (shape, n) = ([2usize, 5, 3], 30);
        let x = values(n, 3);
        let w: Vec<f32> = values(n, 4);
        let wt = Tensor::from_f32(&dev, &w, &shape, DType::F32).expect("upload");
        let loss = |x: &[f32]| -> f64 {
            let t = Tensor::from_f32(&dev, x, &shape, DType::F32).expect("upload");
            let y = t.cumsum(1).expect("cumsum").to_f32_vec().expect("read");
            y.iter().zip(&w).map(|(a, b)| *a as f64 * *b as f64).sum()
        };
        let xv = Tensor::from_f32(&dev, &x, &shape, DType::F32)
            .expect("upload")
            .variable();
        let l = xv
            .cumsum(1)
            .expect("cumsum")
            .mul(&wt)
            .expect("mul")
            .sum_all()
            .expect("sum");
        l.backward().expect("backward");
        let g = xv.grad().expect("gradient").to_f32_vec().expect("read");
        let h = 1e-2;
        for i in 0..n {
            let (mut up, mut down) = (x.clone(), x.clone());
            up[i] += h;
            down[i] -= h;
            let fd = (loss(&up) - loss(&down)) / (2.0 * h as f64);
            assert!(
                (g[i] as f64 - fd).abs() < 2e-3,
                "d/dx[{i}]: got {}, fd {fd}",
                g[i]
            );
        }
        // Reversed, past lavapipe's loop cap.
        let long = values(70_001, 5);
        let t = Tensor::from_f32(&dev, &long, &[70_001], DType::F32).expect("upload");
        let got = t.scan(0, true).expect("scan").to_f32_vec().expect("read");
        let xd: Vec<f64> = long.iter().map(|&v| v as f64).collect();
        check(
            &got,
            &reference(&xd, (1, 70_001, 1), true),
            70_001,
            DType::F32,
            "reversed",
        );
    }

    /// An axis longer than the loop budget allows is an error, not a truncated sum.
    #[test]
    fn too_long_is_an_error() {
        let dev = device();
        let b = dev.alloc(4).expect("block");
        let lines = crate::kernels::scan::Lines {
            outer: 1,
            len: crate::kernels::LOOP_BUDGET * 4096,
            inner: 1,
            reverse: false,
        };
        let e = crate::kernels::scan::cumsum(&dev, &b, &b, DType::F32, lines);
        assert!(
            matches!(e, Err(crate::Error::LimitExceeded { .. })),
            "got {e:?}"
        );
    }
}
