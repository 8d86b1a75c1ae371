//! Plain CPU references for the kernels, accumulating in f64.
//!
//! Deliberately naive (loops in the order of the definition) and independent of everything on
//! the GPU side, so a bug cannot be shared between a kernel and its reference. Tests and the
//! bench program compare against these.

/// `C = act(op(A) op(B) + bias)` for one matrix; A is M x K (or K x M when `trans_a`), B is
/// K x N (or N x K), row-major.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    a: &[f64],
    b: &[f64],
    bias: Option<&[f64]>,
    m: usize,
    n: usize,
    k: usize,
    trans_a: bool,
    trans_b: bool,
    act: Option<crate::ops::Activation>,
) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0;
            for p in 0..k {
                let av = if trans_a { a[p * m + i] } else { a[i * k + p] };
                let bv = if trans_b { b[j * k + p] } else { b[p * n + j] };
                s += av * bv;
            }
            if let Some(bias) = bias {
                s += bias[j];
            }
            c[i * n + j] = act.map_or(s, |a| activation(a, s));
        }
    }
    c
}

/// The value of activation `a` at `x`.
pub fn activation(a: crate::ops::Activation, x: f64) -> f64 {
    use crate::ops::Activation;
    match a {
        Activation::Relu => x.max(0.0),
        Activation::Gelu => gelu(x),
        Activation::Tanh => x.tanh(),
        Activation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Activation::Silu => x / (1.0 + (-x).exp()),
    }
}

/// GELU, erf form.
pub fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))
}

/// erf to ~1e-15 (series for small |x|, continued fraction tail otherwise).
pub fn erf(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 3.0 {
        // Maclaurin series: erf(x) = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1)).
        let mut term = a;
        let mut sum = a;
        let x2 = a * a;
        let mut n = 0.0;
        loop {
            n += 1.0;
            term *= -x2 / n;
            let add = term / (2.0 * n + 1.0);
            sum += add;
            // `<=` so that x = 0 (every term 0) ends at once; 200 terms bound the loop.
            if add.abs() <= 1e-17 * sum.abs() || n > 200.0 {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc continued fraction (Lentz), accurate for a >= 3.
        let mut f = a;
        let mut c = a;
        let mut d = 0.0;
        for i in 1..200 {
            let an = i as f64 / 2.0;
            d = a + an * d;
            d = 1.0 / d;
            c = a + an / c;
            let delta = c * d;
            f *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        1.0 - (-a * a).exp() / (f * std::f64::consts::PI.sqrt())
    };
    if x < 0.0 { -r } else { r }
}

/// Softmax (or log-softmax) of each row.
pub fn softmax(x: &[f64], rows: usize, len: usize, log: bool) -> Vec<f64> {
    let mut y = vec![0.0; rows * len];
    for r in 0..rows {
        let row = &x[r * len..(r + 1) * len];
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
        for i in 0..len {
            y[r * len + i] = if log {
                row[i] - m - s.ln()
            } else {
                (row[i] - m).exp() / s
            };
        }
    }
    y
}

/// Attention over [bh, sq, d] / [bh, skv, d] with the bottom-right aligned causal mask.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    bh: usize,
    sq: usize,
    skv: usize,
    d: usize,
    causal: bool,
    scale: f64,
) -> Vec<f64> {
    attention_dropout(q, k, v, bh, sq, skv, d, causal, scale, &|_, _| 1.0)
}

/// The device's integer hash (common.wgsl's `mix32`).
pub fn mix32(x: u32) -> u32 {
    let mut h = x;
    h = (h ^ (h >> 16)).wrapping_mul(0x7feb352d);
    h = (h ^ (h >> 15)).wrapping_mul(0x846ca68b);
    h ^ (h >> 16)
}

/// The factor the attention kernels give the weight of `key` in query row `row` (counted
/// across heads) under dropout `p` with `seed`: 0 or 1 / (1 - p) (common.wgsl's
/// `attn_keep`, the same bits).
pub fn attention_keep(p: f32, seed: u64, row: usize, key: usize) -> f64 {
    let thr = crate::kernels::attention::drop_threshold(p);
    if thr == 0 {
        return 1.0;
    }
    let h = mix32(
        mix32(row as u32 ^ seed as u32)
            ^ (key as u32).wrapping_mul(0x9e3779b9)
            ^ (seed >> 32) as u32,
    );
    if h < thr {
        0.0
    } else {
        (1.0 / (1.0 - p)) as f64
    }
}

/// [`attention`] with each weight (row `h sq + i`, key `j`) multiplied by `keep(row, j)` after
/// the softmax: dropout on the attention weights.
#[allow(clippy::too_many_arguments)]
pub fn attention_dropout(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    bh: usize,
    sq: usize,
    skv: usize,
    d: usize,
    causal: bool,
    scale: f64,
    keep: &dyn Fn(usize, usize) -> f64,
) -> Vec<f64> {
    let mut o = vec![0.0; bh * sq * d];
    for h in 0..bh {
        for i in 0..sq {
            let mut s: Vec<f64> = (0..skv)
                .map(|j| {
                    if causal && j + sq > i + skv {
                        return f64::NEG_INFINITY;
                    }
                    (0..d)
                        .map(|t| q[(h * sq + i) * d + t] * k[(h * skv + j) * d + t])
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let mut z = 0.0;
            for x in s.iter_mut() {
                *x = (*x - m).exp();
                z += *x;
            }
            let row = h * sq + i;
            for t in 0..d {
                o[row * d + t] = (0..skv)
                    .map(|j| s[j] / z * keep(row, j) * v[(h * skv + j) * d + t])
                    .sum();
            }
        }
    }
    o
}

/// Gradients (dq, dk, dv) of [`attention`] for the output gradient `dout`.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    dout: &[f64],
    bh: usize,
    sq: usize,
    skv: usize,
    d: usize,
    causal: bool,
    scale: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    attention_backward_dropout(q, k, v, dout, bh, sq, skv, d, causal, scale, &|_, _| 1.0)
}

/// Gradients of [`attention_dropout`].
#[allow(clippy::too_many_arguments)]
pub fn attention_backward_dropout(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    dout: &[f64],
    bh: usize,
    sq: usize,
    skv: usize,
    d: usize,
    causal: bool,
    scale: f64,
    keep: &dyn Fn(usize, usize) -> f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut dq = vec![0.0; bh * sq * d];
    let mut dk = vec![0.0; bh * skv * d];
    let mut dv = vec![0.0; bh * skv * d];
    for h in 0..bh {
        for i in 0..sq {
            let row = h * sq + i;
            let qi = |t: usize| q[row * d + t];
            let s: Vec<f64> = (0..skv)
                .map(|j| {
                    if causal && j + sq > i + skv {
                        return f64::NEG_INFINITY;
                    }
                    (0..d)
                        .map(|t| qi(t) * k[(h * skv + j) * d + t])
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|&x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            let pr: Vec<f64> = e.iter().map(|x| x / z).collect();
            let go = |t: usize| dout[row * d + t];
            // O = (P z) V: dV += (P z)^T dO; dP = z (dO V^T); dS = P (dP - sum(P dP)).
            let dp: Vec<f64> = (0..skv)
                .map(|j| {
                    keep(row, j)
                        * (0..d)
                            .map(|t| go(t) * v[(h * skv + j) * d + t])
                            .sum::<f64>()
                })
                .collect();
            let dot: f64 = (0..skv).map(|j| pr[j] * dp[j]).sum();
            for j in 0..skv {
                let ds = pr[j] * (dp[j] - dot);
                let pd = pr[j] * keep(row, j);
                for t in 0..d {
                    dv[(h * skv + j) * d + t] += pd * go(t);
                    dk[(h * skv + j) * d + t] += ds * qi(t) * scale;
                    dq[row * d + t] += ds * k[(h * skv + j) * d + t] * scale;
                }
            }
        }
    }
    (dq, dk, dv)
}

/// LayerNorm (with beta) or RMSNorm (without) of each row.
pub fn norm(
    x: &[f64],
    gamma: &[f64],
    beta: Option<&[f64]>,
    rows: usize,
    len: usize,
    eps: f64,
) -> Vec<f64> {
    let mut y = vec![0.0; rows * len];
    for r in 0..rows {
        let row = &x[r * len..(r + 1) * len];
        let mean = if beta.is_some() {
            row.iter().sum::<f64>() / len as f64
        } else {
            0.0
        };
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / len as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for i in 0..len {
            y[r * len + i] = (row[i] - mean) * rstd * gamma[i] + beta.map_or(0.0, |b| b[i]);
        }
    }
    y
}

/// Gradients of [`norm`] for output gradient `dy`: (dx, dgamma, dbeta), dbeta zero for
/// RMSNorm. From the definitions: with xhat = (x - mean) / std and g = dy gamma,
/// dx = (g - mean(g) - xhat mean(g xhat)) / std (mean(g) left out for RMSNorm, whose mean
/// is 0), dgamma = sum over rows of dy xhat, dbeta = sum of dy.
#[allow(clippy::too_many_arguments)]
pub fn norm_backward(
    x: &[f64],
    gamma: &[f64],
    dy: &[f64],
    rms: bool,
    rows: usize,
    len: usize,
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut dx, mut dg, mut db) = (vec![0.0; rows * len], vec![0.0; len], vec![0.0; len]);
    for r in 0..rows {
        let row = &x[r * len..(r + 1) * len];
        let d = &dy[r * len..(r + 1) * len];
        let mean = if rms {
            0.0
        } else {
            row.iter().sum::<f64>() / len as f64
        };
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / len as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        let xh: Vec<f64> = row.iter().map(|v| (v - mean) * rstd).collect();
        let g: Vec<f64> = (0..len).map(|i| d[i] * gamma[i]).collect();
        let mg = if rms {
            0.0
        } else {
            g.iter().sum::<f64>() / len as f64
        };
        let mgx = (0..len).map(|i| g[i] * xh[i]).sum::<f64>() / len as f64;
        for i in 0..len {
            dx[r * len + i] = rstd * (g[i] - mg - xh[i] * mgx);
            dg[i] += d[i] * xh[i];
            db[i] += d[i];
        }
    }
    (dx, dg, db)
}

/// Per-row cross-entropy of logits against labels.
pub fn cross_entropy(x: &[f64], labels: &[u32], rows: usize, classes: usize) -> Vec<f64> {
    (0..rows)
        .map(|r| {
            let row = &x[r * classes..(r + 1) * classes];
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            lse - row[labels[r] as usize]
        })
        .collect()
}

/// Geometry of a 2-D convolution or pooling window (NCHW).
#[derive(Clone, Copy, Debug)]
pub struct Window {
    /// Batch, channels, height, width of the input.
    pub n: usize,
    /// Channels.
    pub c: usize,
    /// Height.
    pub h: usize,
    /// Width.
    pub w: usize,
    /// Kernel size.
    pub k: (usize, usize),
    /// Stride.
    pub stride: (usize, usize),
    /// Padding.
    pub pad: (usize, usize),
    /// Dilation.
    pub dil: (usize, usize),
}

impl Window {
    /// Output height and width.
    pub fn out(&self) -> (usize, usize) {
        let eh = self.dil.0 * (self.k.0 - 1) + 1;
        let ew = self.dil.1 * (self.k.1 - 1) + 1;
        (
            (self.h + 2 * self.pad.0 - eh) / self.stride.0 + 1,
            (self.w + 2 * self.pad.1 - ew) / self.stride.1 + 1,
        )
    }

    /// Input coordinates of tap (ki, kj) of output (oh, ow), if inside the input.
    fn tap(&self, oh: usize, ow: usize, ki: usize, kj: usize) -> Option<(usize, usize)> {
        let ih = (oh * self.stride.0 + ki * self.dil.0) as isize - self.pad.0 as isize;
        let iw = (ow * self.stride.1 + kj * self.dil.1) as isize - self.pad.1 as isize;
        (ih >= 0 && iw >= 0 && (ih as usize) < self.h && (iw as usize) < self.w)
            .then_some((ih as usize, iw as usize))
    }
}

/// Grouped 2-D convolution, NCHW input, OIHW weight.
pub fn conv2d(
    x: &[f64],
    wt: &[f64],
    bias: Option<&[f64]>,
    g: &Window,
    o: usize,
    groups: usize,
) -> Vec<f64> {
    let (ho, wo) = g.out();
    let cg = g.c / groups;
    let og = o / groups;
    let mut y = vec![0.0; g.n * o * ho * wo];
    for n in 0..g.n {
        for oc in 0..o {
            let grp = oc / og;
            for oh in 0..ho {
                for ow in 0..wo {
                    let mut s = bias.map_or(0.0, |b| b[oc]);
                    for ci in 0..cg {
                        let c = grp * cg + ci;
                        for ki in 0..g.k.0 {
                            for kj in 0..g.k.1 {
                                if let Some((ih, iw)) = g.tap(oh, ow, ki, kj) {
                                    s += x[((n * g.c + c) * g.h + ih) * g.w + iw]
                                        * wt[((oc * cg + ci) * g.k.0 + ki) * g.k.1 + kj];
                                }
                            }
                        }
                    }
                    y[((n * o + oc) * ho + oh) * wo + ow] = s;
                }
            }
        }
    }
    y
}

/// Max (`max = true`) or average pooling; the average divides by the full window size.
pub fn pool2d(x: &[f64], g: &Window, max: bool) -> Vec<f64> {
    let (ho, wo) = g.out();
    let mut y = vec![0.0; g.n * g.c * ho * wo];
    for plane in 0..g.n * g.c {
        for oh in 0..ho {
            for ow in 0..wo {
                let mut acc = if max { f64::NEG_INFINITY } else { 0.0 };
                for ki in 0..g.k.0 {
                    for kj in 0..g.k.1 {
                        if let Some((ih, iw)) = g.tap(oh, ow, ki, kj) {
                            let v = x[(plane * g.h + ih) * g.w + iw];
                            acc = if max { acc.max(v) } else { acc + v };
                        }
                    }
                }
                y[(plane * ho + oh) * wo + ow] = if max {
                    acc
                } else {
                    acc / (g.k.0 * g.k.1) as f64
                };
            }
        }
    }
    y
}

/// Sum (or max) of x viewed as [outer, len, inner] over the middle axis.
pub fn reduce(x: &[f64], outer: usize, len: usize, inner: usize, max: bool) -> Vec<f64> {
    let mut y = vec![if max { f64::NEG_INFINITY } else { 0.0 }; outer * inner];
    for o in 0..outer {
        for l in 0..len {
            for i in 0..inner {
                let v = x[(o * len + l) * inner + i];
                let t = &mut y[o * inner + i];
                *t = if max { t.max(v) } else { *t + v };
            }
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_known_values() {
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (2.5, 0.999593047982555),
            (3.5, 0.9999992569016276),
            (-1.0, -0.8427007929497149),
        ] {
            assert!(
                (erf(x) - want).abs() < 1e-13,
                "erf({x}) = {} want {want}",
                erf(x)
            );
        }
    }

    #[test]
    fn matmul_small() {
        let c = matmul(
            &[1.0, 2.0, 3.0, 4.0],
            &[5.0, 6.0, 7.0, 8.0],
            None,
            2,
            2,
            2,
            false,
            false,
            None,
        );
        assert_eq!(c, vec![19.0, 22.0, 43.0, 50.0]);
        let ct = matmul(
            &[1.0, 3.0, 2.0, 4.0],
            &[5.0, 7.0, 6.0, 8.0],
            None,
            2,
            2,
            2,
            true,
            true,
            None,
        );
        assert_eq!(ct, c);
    }
}
