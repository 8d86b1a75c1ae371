//! Every kernel against the f64 CPU reference, on fresh random inputs, at awkward sizes, in f32,
//! f16 and bf16, with every output poisoned (NaN) before the kernel runs.

mod common;

use common::ops::{binary_case, sample, unary_case};
use common::*;
use wgrad::Activation;
use wgrad::kernels::elementwise::{Binary, Unary};
use wgrad::ops::{AttentionOpts, Conv2dOpts, MatmulOpts};
use wgrad::reference as cpu;
use wgrad::{DType, Error, Tensor};

fn f(v: &[f64]) -> Vec<f64> {
    v.to_vec()
}

/// The devices the elementwise tests run on: the adapter as it is, and (for f16) the same
/// adapter with f16 in packed u32 words, the storage of adapters without SHADER_F16.
fn elementwise_devices() -> [(wgrad::Device, &'static [DType]); 2] {
    let packed = device_with(|o| {
        o.poison = true;
        o.disable_f16 = true;
    });
    [(poisoned(), &DTYPES), (packed, &[DType::F16])]
}

#[test]
fn unary_ops() {
    let mut rng = Rng::new(10);
    for (dev, dtypes) in elementwise_devices() {
        for &dt in dtypes {
            for n in SIZES {
                for &op in Unary::ALL {
                    let case = unary_case(op);
                    let x = sample(&mut rng, case.domain, n);
                    let t = tensor(&dev, &x, &[n], dt);
                    let y = case.run(&t).unwrap().to_f32_vec().unwrap();
                    let want: Vec<f64> = rounded(&x, dt).into_iter().map(|v| case.cpu(v)).collect();
                    assert_close(&y, &want, dt, &format!("{} n={n} {dt}", case.name));
                }
            }
        }
    }
}

#[test]
fn binary_ops_broadcast() {
    let mut rng = Rng::new(11);
    let shapes: [(&[usize], &[usize]); 7] = [
        (&[1], &[1]),
        (&[17], &[17]),
        (&[3, 17], &[17]),
        (&[3, 1, 5], &[4, 1]),
        (&[1], &[127]),
        (&[1000], &[1000]),
        (&[2, 3, 4, 5, 6], &[3, 1, 5, 1]),
    ];
    for (dev, dtypes) in elementwise_devices() {
        for &dt in dtypes {
            for (sa, sb) in shapes {
                let na: usize = sa.iter().product();
                let nb: usize = sb.iter().product();
                let out_shape = wgrad::ops::elementwise::broadcast_shape("t", sa, sb).unwrap();
                for &op in Binary::ALL {
                    let case = binary_case(op);
                    let (a, b): (Vec<f32>, Vec<f32>) = if !case.differentiable {
                        // Comparisons: values on a coarse grid, so that ties occur.
                        let grid = |v: f32| (v * 4.0).round() / 2.0;
                        (
                            rng.vec(na).into_iter().map(grid).collect(),
                            rng.vec(nb).into_iter().map(grid).collect(),
                        )
                    } else {
                        let a = rng.vec(na);
                        // |b| >= 2 keeps division well conditioned.
                        let b = rng
                            .vec(nb)
                            .into_iter()
                            .map(|v| v + 2.0 * v.signum())
                            .collect();
                        if op == Binary::Pow {
                            (a.into_iter().map(|v| v.abs() + 0.5).collect(), b)
                        } else {
                            (a, b)
                        }
                    };
                    let (ta, tb) = (tensor(&dev, &a, sa, dt), tensor(&dev, &b, sb, dt));
                    let y = (case.run)(&ta, &tb).unwrap();
                    assert_eq!(y.shape(), out_shape.as_slice());
                    let (ra, rb) = (rounded(&a, dt), rounded(&b, dt));
                    let want = broadcast_apply(&ra, sa, &rb, sb, &out_shape, case.cpu);
                    assert_close(
                        &y.to_f32_vec().unwrap(),
                        &want,
                        dt,
                        &format!("{} {sa:?} {sb:?} {dt}", case.name),
                    );
                }
            }
        }
    }
}

/// `add_dropout` (a residual add and its branch's dropout in one pass) against the two ops
/// under the same seed: the same mask, values within one rounding, and the gradients (to the
/// residual unchanged, to the branch through the mask), in every dtype and with f16 packed; a
/// size off a multiple of 4 takes the two ops.
#[test]
fn add_dropout_matches_add_and_dropout() {
    let mut rng = Rng::new(28);
    for (dev, dtypes) in elementwise_devices() {
        for &dt in dtypes {
            for n in [4, 1000, 999] {
                let (rv, xv, gv) = (rng.vec(n), rng.vec(n), rng.vec(n));
                let g = tensor(&dev, &gv, &[n], dt);
                let run = |fused: bool| {
                    let r = tensor(&dev, &rv, &[n], dt).variable();
                    let x = tensor(&dev, &xv, &[n], dt).variable();
                    dev.manual_seed(11);
                    let (y, ran) = common::ran_kernels(&dev, || {
                        if fused {
                            r.add_dropout(&x, 0.3).unwrap()
                        } else {
                            r.add(&x.dropout(0.3).unwrap()).unwrap()
                        }
                    });
                    y.backward_with(&g).unwrap();
                    let v = |t: &Tensor| t.to_f32_vec().unwrap();
                    (v(&y), v(&r.grad().unwrap()), v(&x.grad().unwrap()), ran)
                };
                let (y1, gr1, gx1, ran) = run(true);
                let (y2, gr2, gx2, _) = run(false);
                assert_eq!(
                    ran.iter().any(|k| k == "Fill/add_dropout4"),
                    n.is_multiple_of(4),
                    "n = {n}: {ran:?}"
                );
                let what = format!("add_dropout n={n} {dt}");
                let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
                // The unfused sum rounds the dropped-out branch to the dtype first.
                assert_close(&y1, &f(&y2), dt, &what);
                assert_eq!(gr1, gr2, "residual gradient {what}");
                assert_eq!(gx1, gx2, "branch gradient {what}");
                // The mask: the branch's gradient is zero exactly where the branch was dropped.
                let dropped = gx1.iter().filter(|&&v| v == 0.0).count();
                assert!(
                    n < 100 || (n / 5..n / 2).contains(&dropped),
                    "{what}: {dropped} dropped"
                );
            }
        }
    }
}

/// Dropout draws the same mask four elements a thread (n a multiple of 4) as one (n odd), with
/// f16 native or packed: the first 999 of 1000 elements equal 999 elements' dropout under the
/// same seed, each 0 or x / (1 - p).
#[test]
fn dropout_mask_is_the_same_in_every_path() {
    let mut rng = Rng::new(13);
    let x = rng.vec(1000);
    for (dev, dtypes) in elementwise_devices() {
        for &dt in dtypes {
            let run = |n: usize| {
                dev.manual_seed(7);
                tensor(&dev, &x[..n], &[n], dt)
                    .dropout(0.3)
                    .unwrap()
                    .to_f32_vec()
                    .unwrap()
            };
            let (four, one) = (run(1000), run(999));
            assert_eq!(&four[..999], &one[..], "{dt}");
            let want = rounded(&x, dt);
            let mut dropped = 0;
            for (i, &y) in four.iter().enumerate() {
                if y == 0.0 {
                    dropped += 1;
                } else {
                    let w = want[i] / 0.7;
                    assert!(
                        (y as f64 - w).abs() <= 2e-2 * w.abs(),
                        "{dt} {i}: {y} vs {w}"
                    );
                }
            }
            assert!(
                (200..400).contains(&dropped),
                "{dt}: {dropped} of 1000 dropped"
            );
        }
    }
}

#[test]
fn select_where() {
    let dev = poisoned();
    let mut rng = Rng::new(12);
    for dt in DTYPES {
        let c: Vec<f32> = rng
            .vec(3 * 17)
            .into_iter()
            .map(|v| (v > 0.0) as u8 as f32)
            .collect();
        let x = rng.vec(17);
        let y = rng.vec(3 * 17);
        let out = Tensor::where_cond(
            &tensor(&dev, &c, &[3, 17], DType::F32),
            &tensor(&dev, &x, &[17], dt),
            &tensor(&dev, &y, &[3, 17], dt),
        )
        .unwrap();
        let (rx, ry) = (rounded(&x, dt), rounded(&y, dt));
        let want: Vec<f64> = (0..51)
            .map(|i| if c[i] != 0.0 { rx[i % 17] } else { ry[i] })
            .collect();
        assert_close(&out.to_f32_vec().unwrap(), &want, dt, "where");
    }
}

#[test]
fn reductions() {
    reductions_on(false);
}

/// The same cases through the GPUs' kernels (`rows`, `tiles`) on every adapter, so CI's
/// lavapipe tests them too.
#[test]
fn reductions_gpu_paths() {
    wgrad::kernels::reduce::gpu_paths_forced(|| reductions_on(true));
}

fn reductions_on(gpu_paths: bool) {
    let dev = poisoned();
    let mut rng = Rng::new(13 + gpu_paths as u64);
    // The last two take the GPUs' column-tile kernel over several chunks and passes, the
    // last tile of columns partial.
    let cases: [(&[usize], isize); 10] = [
        (&[1], 0),
        (&[3], 0),
        (&[17, 127], 1),
        (&[17, 127], 0),
        (&[5, 1000, 3], 1),
        (&[2, 20000], 1),
        (&[1000, 3], -1),
        (&[3, 4, 5], 0),
        (&[2, 3000, 8], 1),
        (&[1500, 132], 0),
    ];
    for dt in DTYPES {
        for (shape, axis) in cases {
            let n: usize = shape.iter().product();
            let x = rng.vec(n);
            let t = tensor(&dev, &x, shape, dt);
            let a = if axis < 0 {
                (axis + shape.len() as isize) as usize
            } else {
                axis as usize
            };
            let outer: usize = shape[..a].iter().product();
            let inner: usize = shape[a + 1..].iter().product();
            let len = shape[a];
            let rx = rounded(&x, dt);
            let what = format!("{shape:?} axis {axis} {dt}");
            let sum = cpu::reduce(&rx, outer, len, inner, false);
            // Sums of many terms: allow for f32 accumulation error growing with the length.
            let (atol, rtol) = tol(dt);
            let sum_tol = (atol * (len as f64).sqrt() * 4.0, rtol);
            assert_close_tol(
                &t.sum(axis, false).unwrap().to_f32_vec().unwrap(),
                &sum,
                sum_tol,
                &format!("sum {what}"),
            );
            let mean: Vec<f64> = sum.iter().map(|v| v / len as f64).collect();
            assert_close_tol(
                &t.mean(axis, true).unwrap().to_f32_vec().unwrap(),
                &mean,
                sum_tol,
                &format!("mean {what}"),
            );
            let max = cpu::reduce(&rx, outer, len, inner, true);
            assert_close(
                &t.max(axis, false).unwrap().to_f32_vec().unwrap(),
                &max,
                dt,
                &format!("max {what}"),
            );
            let am = t.argmax(axis, false).unwrap().to_vec::<u32>().unwrap();
            for o in 0..outer {
                for i in 0..inner {
                    let first = (0..len)
                        .find(|&l| rx[(o * len + l) * inner + i] == max[o * inner + i])
                        .unwrap();
                    assert_eq!(
                        am[o * inner + i] as usize,
                        first,
                        "argmax {what} at ({o}, {i})"
                    );
                }
            }
        }
    }
    // Everything at once.
    let x = rng.vec(100_003);
    let t = tensor(&dev, &x, &[100_003], DType::F32);
    let want: f64 = x.iter().map(|&v| v as f64).sum();
    let got = t.sum_all().unwrap().to_scalar().unwrap() as f64;
    assert!((got - want).abs() < 1e-3, "sum_all {got} vs {want}");
}

#[test]
fn softmax_rows() {
    let dev = poisoned();
    let mut rng = Rng::new(14);
    for dt in DTYPES {
        // Lengths a multiple of 4 up to 16 runs of 4 a lane take a subgroup per row with the
        // row in registers (`fwd_vec`) where the adapter has one subgroup size: 44, 256 and
        // 512 on lavapipe's 8-wide subgroups, and 1000 as well on 32-wide ones.
        for (rows, len) in [
            (1, 1),
            (3, 3),
            (5, 17),
            (9, 44),
            (2, 127),
            (33, 256),
            (3, 512),
            (7, 1000),
            (1, 100_000),
        ] {
            let x: Vec<f32> = rng.vec(rows * len).into_iter().map(|v| v * 8.0).collect();
            let t = tensor(&dev, &x, &[rows, len], dt);
            let rx = rounded(&x, dt);
            let (y, ran) = common::ran_kernels(&dev, || t.softmax().unwrap().to_f32_vec().unwrap());
            assert_eq!(
                ran.iter().any(|k| k == "Softmax/fwd_vec"),
                in_registers(&dev, len),
                "{rows}x{len}: {ran:?}"
            );
            assert_close(
                &y,
                &cpu::softmax(&rx, rows, len, false),
                dt,
                &format!("softmax {rows}x{len} {dt}"),
            );
            let tl = if dt != DType::F32 {
                (2e-2 * f16_scale(dt), 4e-3 * f16_scale(dt))
            } else {
                (1e-4, 1e-5)
            };
            assert_close_tol(
                &t.log_softmax().unwrap().to_f32_vec().unwrap(),
                &cpu::softmax(&rx, rows, len, true),
                tl,
                &format!("log_softmax {rows}x{len} {dt}"),
            );
        }
    }
    // Large logits do not overflow.
    let t = Tensor::from_slice(&dev, &[1000.0f32, 0.0, -1000.0], &[1, 3]).unwrap();
    assert_close(
        &t.softmax().unwrap().to_f32_vec().unwrap(),
        &[1.0, 0.0, 0.0],
        DType::F32,
        "softmax of large logits",
    );
}

/// Whether rows of `len` take the register entries (kernels/softmax.rs `register_runs` on an
/// adapter with one subgroup size).
fn in_registers(dev: &wgrad::Device, len: usize) -> bool {
    let c = dev.caps();
    let sg = c.subgroup_max as usize;
    c.subgroups
        && c.subgroup_min == c.subgroup_max
        && [32, 64, 128, 256].contains(&(4 * sg))
        && len.is_multiple_of(4)
        && len.div_ceil(4 * sg) <= 16
}

/// Softmax's and log-softmax's gradients against f64 (from the definitions, on the f64
/// softmax) at lengths that take the workgroup and the register entries, in every dtype and
/// with f16 packed.
#[test]
fn softmax_gradients() {
    let mut rng = Rng::new(27);
    for (dev, dtypes) in elementwise_devices() {
        for &dt in dtypes {
            for (rows, len) in [(1, 1), (5, 17), (9, 44), (33, 256), (3, 512), (7, 1000)] {
                let x: Vec<f32> = rng.vec(rows * len).into_iter().map(|v| v * 4.0).collect();
                let dy = rng.vec(rows * len);
                let (rx, rdy) = (rounded(&x, dt), rounded(&dy, dt));
                for log in [false, true] {
                    let t = tensor(&dev, &x, &[rows, len], dt).variable();
                    let y = if log {
                        t.log_softmax().unwrap()
                    } else {
                        t.softmax().unwrap()
                    };
                    y.backward_with(&tensor(&dev, &dy, &[rows, len], dt))
                        .unwrap();
                    let sm = cpu::softmax(&rx, rows, len, false);
                    let mut want = vec![0.0; rows * len];
                    for r in 0..rows {
                        let row = r * len..(r + 1) * len;
                        let (s, g) = (&sm[row.clone()], &rdy[row.clone()]);
                        // log: dx = dy - softmax sum(dy); softmax: dx = y (dy - sum(dy y)).
                        let t: f64 = if log {
                            g.iter().sum()
                        } else {
                            g.iter().zip(s).map(|(a, b)| a * b).sum()
                        };
                        for i in 0..len {
                            want[r * len + i] = if log {
                                g[i] - s[i] * t
                            } else {
                                s[i] * (g[i] - t)
                            };
                        }
                    }
                    let (atol, rtol) = tol(dt);
                    assert_close_tol(
                        &t.grad().unwrap().to_f32_vec().unwrap(),
                        &want,
                        (atol * 10.0, rtol * 4.0),
                        &format!(
                            "{} gradient {rows}x{len} {dt}",
                            if log { "log_softmax" } else { "softmax" }
                        ),
                    );
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn matmul_case(
    dev: &wgrad::Device,
    rng: &mut Rng,
    dt: DType,
    (m, n, k): (usize, usize, usize),
    ta: bool,
    tb: bool,
    bias: bool,
    act: Option<Activation>,
) {
    let a = rng.vec(m * k);
    let b = rng.vec(k * n);
    let bv = rng.vec(n);
    let sa: Vec<usize> = if ta { vec![k, m] } else { vec![m, k] };
    let sb: Vec<usize> = if tb { vec![n, k] } else { vec![k, n] };
    let (tta, ttb, tbias) = (
        tensor(dev, &a, &sa, dt),
        tensor(dev, &b, &sb, dt),
        tensor(dev, &bv, &[n], dt),
    );
    let out = tta
        .matmul_with(
            &ttb,
            MatmulOpts {
                trans_a: ta,
                trans_b: tb,
                bias: bias.then_some(&tbias),
                act,
            },
        )
        .unwrap();
    assert_eq!(out.shape(), &[m, n]);
    let rb = rounded(&bv, dt);
    let want = cpu::matmul(
        &rounded(&a, dt),
        &rounded(&b, dt),
        bias.then_some(rb.as_slice()),
        m,
        n,
        k,
        ta,
        tb,
        act,
    );
    let (atol, rtol) = tol(dt);
    let t = (atol * (k as f64).sqrt(), rtol);
    assert_close_tol(
        &out.to_f32_vec().unwrap(),
        &want,
        t,
        &format!("matmul {m}x{n}x{k} ta={ta} tb={tb} bias={bias} {act:?} {dt}"),
    );
}

/// [2, 3, M, K] x [3, K, N] (B broadcast over the first dimension) against f64 products of
/// each batch's matrices.
fn broadcast_batch_case(
    dev: &wgrad::Device,
    rng: &mut Rng,
    dt: DType,
    (m, n, k): (usize, usize, usize),
    what: &str,
) {
    let (a, b) = (rng.vec(2 * 3 * m * k), rng.vec(3 * k * n));
    let ta = tensor(dev, &a, &[2, 3, m, k], dt);
    let tb = tensor(dev, &b, &[3, k, n], dt);
    let got = ta.matmul(&tb).unwrap().to_f32_vec().unwrap();
    let mut want = Vec::new();
    for i in 0..6 {
        let am = &a[i * m * k..(i + 1) * m * k];
        let bm = &b[(i % 3) * k * n..(i % 3 + 1) * k * n];
        want.extend(cpu::matmul(
            &rounded(am, dt),
            &rounded(bm, dt),
            None,
            m,
            n,
            k,
            false,
            false,
            None,
        ));
    }
    assert_close(&got, &want, dt, what);
}

#[test]
fn matmul_shapes() {
    let dev = poisoned();
    let mut rng = Rng::new(15);
    let sizes = [
        (1, 1, 1),
        (3, 17, 5),
        (17, 127, 33),
        (127, 3, 1000),
        (130, 129, 65),
        (1000, 17, 3),
        (64, 64, 64),
        (129, 257, 17),
        (256, 128, 1024),
        // Multiples of 16 but not of the 128-wide tile: clamped edge tiles on tensor cores.
        (80, 208, 32),
    ];
    for dt in DTYPES {
        for s in sizes {
            matmul_case(&dev, &mut rng, dt, s, false, false, false, None);
        }
        for (ta, tb) in [(true, false), (false, true), (true, true)] {
            // (128, 256, 48) takes the aligned tensor-core path where the adapter has one.
            for s in [(3, 17, 5), (130, 129, 65), (17, 1000, 3), (128, 256, 48)] {
                matmul_case(&dev, &mut rng, dt, s, ta, tb, false, None);
            }
        }
        let acts = [
            None,
            Some(Activation::Relu),
            Some(Activation::Gelu),
            Some(Activation::Tanh),
        ];
        for act in acts {
            matmul_case(&dev, &mut rng, dt, (33, 65, 17), false, true, true, act);
            matmul_case(&dev, &mut rng, dt, (200, 150, 40), false, true, true, act);
        }
    }
}

/// Shapes the tiled tensor-core kernel takes on adapters that have one (f16, operands' fast
/// extents multiples of 4, M and N at least 64): partial tiles on every edge, every
/// transpose, K not a multiple of the 32-wide step, fused epilogues. Elsewhere the same cases
/// test the other kernels.
#[test]
fn matmul_tensor_core_tiles() {
    let dev = poisoned();
    let mut rng = Rng::new(17);
    for dt in DTYPES {
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            for s in [
                (68, 132, 36),
                (200, 72, 1000),
                (128, 128, 32),
                (260, 100, 52),
            ] {
                matmul_case(&dev, &mut rng, dt, s, ta, tb, false, None);
            }
        }
        for act in [None, Some(Activation::Relu), Some(Activation::Gelu)] {
            matmul_case(&dev, &mut rng, dt, (196, 68, 44), false, true, true, act);
            // x W^T with N not a multiple of 4 (a GPT's 65 logits): the tiled kernel's
            // epilogue stores those outputs one by one.
            matmul_case(&dev, &mut rng, dt, (196, 65, 96), false, true, true, act);
        }
        matmul_case(&dev, &mut rng, dt, (130, 127, 64), false, true, false, None);
        // Few output tiles and a long K: split into partial products on a GPU (to occupy
        // it), summed with the bias and activation in the splitk pass. The second pair is
        // large enough for the tensor-core kernels (`wide` for both layouts where the adapter
        // takes wgrad's SPIR-V; else `main` for x W^T's, `direct` for g^T x's), whose split-K
        // partials are f32 runs of 4.
        for (ta, tb) in [(false, true), (true, false)] {
            let act = Some(Activation::Relu);
            matmul_case(&dev, &mut rng, dt, (48, 40, 4160), ta, tb, true, act);
            matmul_case(&dev, &mut rng, dt, (128, 192, 4096), ta, tb, true, act);
        }
    }
}

/// The workgroup-tile kernels for GPUs (`reg`, 128 x 128 with 8 x 8 outputs per thread, and
/// the 64 x 64 `main`), forced on every adapter so CPU adapters test them too: partial tiles,
/// every transpose, fused epilogues, a batch broadcasting B, and (`reg`) K split into
/// partial products. `reg` takes the shapes whose extents are multiples of 4 (16-byte
/// loads), the others go to `main`.
/// Products whose extents or pitches keep them off `reg` and `wide` (a vocabulary of 65) run
/// on zero-padded copies: forced to `reg` and padded whatever their size, so that lavapipe
/// runs the padded path too, against f64 references in every transpose, with bias and
/// activation, cut back to M x N; on a GPU with tensor cores, f16 products of these sizes
/// reach `wide` the same way unforced.
#[test]
fn matmul_pads_odd_extents() {
    use wgrad::kernels::matmul::{Config, Operands, forced, plan};
    use wgrad::ops::matmul::pad_everywhere;
    let dev = poisoned();
    let mut rng = Rng::new(19);
    let shapes = [(257, 131, 127), (130, 257, 65), (65, 384, 1031)];
    pad_everywhere(|| {
        forced(Config::Reg, || {
            for dt in [DType::F32, DType::F16] {
                for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                    for s in shapes {
                        let ((), ran) = ran_kernels(&dev, || {
                            matmul_case(&dev, &mut rng, dt, s, ta, tb, false, None)
                        });
                        let reg = ran.iter().any(|k| k == "Matmul/reg");
                        assert!(
                            reg && !ran.iter().any(|k| k == "Matmul/main"),
                            "{s:?} {ran:?}"
                        );
                    }
                }
                // N padded too (B contiguous along N): the bias with it.
                for act in [None, Some(Activation::Relu), Some(Activation::Gelu)] {
                    matmul_case(&dev, &mut rng, dt, (257, 131, 127), false, false, true, act);
                }
            }
        })
    })
    .unwrap();
    // Without the override a small product is not worth its copies.
    let ((), ran) = ran_kernels(&dev, || {
        forced(Config::Reg, || {
            matmul_case(
                &dev,
                &mut rng,
                DType::F32,
                (257, 131, 127),
                false,
                false,
                false,
                None,
            )
        })
        .unwrap()
    });
    assert!(ran.iter().any(|k| k == "Matmul/main"), "{ran:?}");
    let dense = Operands::dense(264, 136, 128, false, false);
    if plan(&dev, DType::F16, (264, 136, 128), &dense) != Config::CoopWide {
        return;
    }
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        for s in shapes {
            let ((), ran) = ran_kernels(&dev, || {
                matmul_case(&dev, &mut rng, DType::F16, s, ta, tb, false, None)
            });
            assert!(
                ran.iter().any(|k| k == "MatmulWide/main"),
                "f16 {s:?} {ran:?}"
            );
        }
    }
}

#[test]
fn matmul_register_tiles() {
    use wgrad::kernels::matmul::{Config, forced};
    let dev = poisoned();
    let mut rng = Rng::new(18);
    for config in [Config::Reg, Config::Tiled(64, 64, 16, 4, 4)] {
        forced(config, || {
            // (bf16 differs from f16 only in its loads, which every kernel shares.)
            for dt in [DType::F32, DType::F16] {
                for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                    for s in [
                        (1, 1, 1),
                        (3, 17, 5),
                        (130, 129, 65),
                        (4, 8, 12),
                        (132, 200, 36),
                        (260, 132, 20),
                        (64, 132, 40),
                        // M <= 64 and several tiles along N: 64 x 128 tiles (N = 520,
                        // which 256-wide tiles would pad by half), 64 x 256 (N = 1000).
                        (36, 520, 28),
                        (60, 1000, 44),
                    ] {
                        matmul_case(&dev, &mut rng, dt, s, ta, tb, false, None);
                    }
                }
                for act in [None, Some(Activation::Relu), Some(Activation::Gelu)] {
                    matmul_case(&dev, &mut rng, dt, (140, 200, 12), false, true, true, act);
                }
            }
            broadcast_batch_case(
                &dev,
                &mut rng,
                DType::F32,
                (36, 140, 20),
                &format!("batched {config:?}"),
            );
        })
        .unwrap();
    }
    // K past one invocation's loop budget: partial products over splits of K.
    forced(Config::Reg, || {
        matmul_case(
            &dev,
            &mut rng,
            DType::F32,
            (132, 4, 10100),
            false,
            true,
            true,
            None,
        );
    })
    .unwrap();
    // The any-shape tensor-core kernel cannot be forced; the tiled ones apply only where the
    // adapter has tensor cores, and products stay correct either way (their own layout rules
    // still apply: 130 x 129 is no whole number of 16 x 16 tiles for `direct`).
    assert!(forced(Config::Coop, || ()).is_err());
    // (136 x 72 x 88 suits all three: runs of 8 for `wide`, whole 16 x 16 tiles for `direct`,
    // partial 128 x 128 tiles, and a partial last K step: 32-wide steps in `main`, 64-wide in
    // `wide`.)
    // bf16 too: `wide` where the device has bf16 matrices, the general kernels elsewhere.
    for config in [Config::CoopTiled, Config::CoopWide, Config::CoopDirect] {
        forced(config, || {
            for dt in [DType::F16, DType::BF16] {
                for s in [(130, 129, 65), (64, 128, 48), (136, 72, 88)] {
                    matmul_case(&dev, &mut rng, dt, s, false, false, false, None);
                    matmul_case(&dev, &mut rng, dt, s, true, true, true, None);
                }
            }
        })
        .unwrap();
    }
}

/// `wide` with 256 x 128, 128 x 256 and 128 x 192 tiles (8 subgroups; K steps of 32, 48 or 64
/// by layout and tile), f16 and bf16, forced where the adapter runs `wide` for the dtype
/// (elsewhere the usual path, still checked): every transpose; M and N past one tile, both partial, either way round (300 x 136,
/// 136 x 300); K of one partial step, of several with a partial last one (88 = 32 + 32 + 24
/// where B is k-fast, 48 + 40 for A B and A^T B, whose 48 split a k-fast A's runs 4 + 2), and
/// long enough to split into partial products (4160, with the bias and activation then in the
/// `splitk` pass); the fused epilogues; a batch broadcasting B; and M below 64.
#[test]
fn matmul_tall_tiles() {
    use wgrad::kernels::matmul::{Config, forced};
    let dev = poisoned();
    let mut rng = Rng::new(29);
    for config in [
        Config::CoopWideTall,
        Config::CoopWideFlat,
        Config::CoopWideMid,
    ] {
        for dt in [DType::F16, DType::BF16] {
            let wide = runs_wide_for(&dev, dt);
            forced(config, || {
                for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                    for s in [
                        (300, 136, 88),
                        (264, 8, 24),
                        (40, 264, 72),
                        (256, 128, 64),
                        (136, 300, 88),
                    ] {
                        let ((), ran) = ran_kernels(&dev, || {
                            matmul_case(&dev, &mut rng, dt, s, ta, tb, false, None)
                        });
                        assert!(
                            !wide || ran.iter().any(|k| k == "MatmulWide/main"),
                            "{s:?} {ran:?}"
                        );
                    }
                    for act in [None, Some(Activation::Relu), Some(Activation::Gelu)] {
                        matmul_case(&dev, &mut rng, dt, (300, 136, 88), ta, tb, true, act);
                    }
                }
                // N not a multiple of 4 (B contiguous along K): outputs stored one by one, bf16
                // ones as 16-bit values like f16, in the product itself (no `splitk` pass).
                let ((), ran) = ran_kernels(&dev, || {
                    matmul_case(&dev, &mut rng, dt, (136, 66, 88), false, true, true, None)
                });
                assert!(
                    !wide
                        || (ran.iter().any(|k| k == "MatmulWide/main")
                            && !ran.iter().any(|k| k == "Matmul/splitk")),
                    "{ran:?}"
                );
                let act = Some(Activation::Relu);
                for (ta, tb) in [(false, true), (false, false)] {
                    matmul_case(&dev, &mut rng, dt, (300, 136, 4160), ta, tb, true, act);
                }
                matmul_case(&dev, &mut rng, dt, (300, 136, 4160), true, false, true, act);
                broadcast_batch_case(
                    &dev,
                    &mut rng,
                    dt,
                    (264, 136, 40),
                    &format!("batched, {config:?} {dt}"),
                );
            })
            .unwrap();
        }
    }
}

/// A product with enough 128 x 128 tiles to fill a large GPU 1.45 times (16384 x 384), which
/// `reg` splits along K on GPUs to even out the waves: sampled entries against f64 dot
/// products. (CPU adapters never split this way, and the product is large for them: GPUs
/// only.)
#[test]
fn matmul_split_for_even_waves() {
    let dev = poisoned();
    if dev.info().is_cpu() {
        return;
    }
    let mut rng = Rng::new(19);
    let (m, n, k) = (16384, 384, 1152);
    let (a, b) = (rng.vec(m * k), rng.vec(n * k));
    let c = tensor(&dev, &a, &[m, k], DType::F32)
        .matmul_with(
            &tensor(&dev, &b, &[n, k], DType::F32),
            MatmulOpts {
                trans_b: true,
                ..Default::default()
            },
        )
        .unwrap()
        .to_f32_vec()
        .unwrap();
    for t in 0..256 {
        let (i, j) = ((t * 7919 + 13) % m, (t * 104_729 + 7) % n);
        let want: f64 = (0..k)
            .map(|p| a[i * k + p] as f64 * b[j * k + p] as f64)
            .sum();
        let got = c[i * n + j] as f64;
        assert!(
            (got - want).abs() <= 1e-4 * (k as f64).sqrt(),
            "({i}, {j}): {got} vs {want}"
        );
    }
}

/// The f32 product of `MatmulPrecision::High` (three f16 products of split operands), forced
/// on every adapter: against an f64 reference of the f32 inputs, within 2^-18 of each
/// output's sum |a||b| (f16 operands would miss by 2^-11, exact f32 products meet 2^-22):
/// every transpose, awkward sizes, the fused epilogues, batches that broadcast an operand,
/// lines of magnitudes 1e30 and 1e-30 side by side, and non-finite inputs.
#[test]
fn matmul_split_f32() {
    use wgrad::ops::matmul::split_everywhere;
    let dev = poisoned();
    let mut rng = Rng::new(23);
    let bound = 2f64.powi(-18);
    #[allow(clippy::too_many_arguments)]
    fn check(
        dev: &wgrad::Device,
        a: &[f32],
        b: &[f32],
        bias: Option<&[f32]>,
        (m, n, k): (usize, usize, usize),
        (ta, tb): (bool, bool),
        act: Option<Activation>,
        bound: f64,
    ) -> Vec<f32> {
        let sa: Vec<usize> = if ta { vec![k, m] } else { vec![m, k] };
        let sb: Vec<usize> = if tb { vec![n, k] } else { vec![k, n] };
        let tbias = bias.map(|v| tensor(dev, v, &[n], DType::F32));
        let got = split_everywhere(|| {
            tensor(dev, a, &sa, DType::F32).matmul_with(
                &tensor(dev, b, &sb, DType::F32),
                MatmulOpts {
                    trans_a: ta,
                    trans_b: tb,
                    bias: tbias.as_ref(),
                    act,
                },
            )
        })
        .unwrap()
        .to_f32_vec()
        .unwrap();
        let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
        let abs = |v: &[f32]| v.iter().map(|&x| x.abs() as f64).collect::<Vec<_>>();
        let rb = bias.map(f);
        let want = cpu::matmul(&f(a), &f(b), rb.as_deref(), m, n, k, ta, tb, act);
        let mag = cpu::matmul(&abs(a), &abs(b), None, m, n, k, ta, tb, None);
        let mut worst = 0f64;
        for i in 0..m * n {
            let (g, w) = (got[i] as f64, want[i]);
            // Outside f32's normal range the f32 result itself is inf or rounded to 0.
            if !w.is_finite() || !(1e-35..=1e35).contains(&mag[i]) {
                continue;
            }
            worst = worst.max((g - w).abs() / mag[i].max(1e-300));
            // GELU and ReLU change values by at most their input's error.
            assert!(
                (g - w).abs() <= bound * mag[i] + 1e-300,
                "split f32 {m}x{n}x{k} ta={ta} tb={tb} {act:?} at {i}: {g} vs {w} (sum |a||b| {})",
                mag[i]
            );
        }
        eprintln!("split f32 {m}x{n}x{k} ta={ta} tb={tb}: worst error / sum |a||b| {worst:.2e}");
        got
    }
    for (m, n, k) in [
        (1, 1, 1),
        (3, 17, 5),
        (17, 127, 33),
        (127, 3, 1000),
        (130, 129, 65),
        (1000, 17, 3),
        (64, 72, 200),
        // 3 K = 210,000 past lavapipe's loop cap: the product's K splits, and so does the
        // reduction that finds each line's scale.
        (2, 3, 70_000),
    ] {
        for t in [(false, false), (false, true), (true, false), (true, true)] {
            let (a, b) = (rng.vec(m * k), rng.vec(k * n));
            check(&dev, &a, &b, None, (m, n, k), t, None, bound);
        }
    }
    for act in [None, Some(Activation::Relu), Some(Activation::Gelu)] {
        let (m, n, k) = (33, 65, 17);
        let (a, b, c) = (rng.vec(m * k), rng.vec(k * n), rng.vec(n));
        check(&dev, &a, &b, Some(&c), (m, n, k), (false, true), act, bound);
    }
    // Lines far outside f16's range, and far apart: each keeps its own relative precision
    // (with the outputs past f32's range skipped).
    let (m, n, k) = (4, 3, 129);
    let mut a = rng.vec(m * k);
    let mut b = rng.vec(k * n);
    for j in 0..k {
        a[j] *= 1e30;
        a[k + j] *= 1e-30;
        a[2 * k + j] *= 1e-20;
        b[j * n] *= 1e-30;
        b[j * n + 1] *= 1e30;
    }
    check(&dev, &a, &b, None, (m, n, k), (false, false), None, bound);
    // An inf in row 1 of A and a NaN in column 2 of B: NaN there (the f32 product gives inf
    // or NaN), every other output accurate.
    let (m, n, k) = (3, 4, 20);
    let mut a = rng.vec(m * k);
    let mut b = rng.vec(k * n);
    a[k + 5] = f32::INFINITY;
    b[7 * n + 2] = f32::NAN;
    let got = check(&dev, &a, &b, None, (m, n, k), (false, false), None, bound);
    for i in 0..m {
        for j in 0..n {
            let bad = i == 1 || j == 2;
            assert_eq!(
                got[i * n + j].is_finite(),
                !bad,
                "non-finite input at ({i}, {j})"
            );
        }
    }
    // Batches: [2, 3, M, K] x [3, K, N] (B shared over the first axis) and [4, M, K] x [K, N].
    for (sa, sb) in [
        (vec![2usize, 3, 9, 21], vec![3usize, 21, 10]),
        (vec![4, 17, 12], vec![12, 33]),
    ] {
        let (na, nb): (usize, usize) = (sa.iter().product(), sb.iter().product());
        let (a, b) = (rng.vec(na), rng.vec(nb));
        let got = split_everywhere(|| {
            tensor(&dev, &a, &sa, DType::F32).matmul(&tensor(&dev, &b, &sb, DType::F32))
        })
        .unwrap()
        .to_f32_vec()
        .unwrap();
        let want = tensor(&dev, &a, &sa, DType::F32)
            .matmul(&tensor(&dev, &b, &sb, DType::F32))
            .unwrap()
            .to_f32_vec()
            .unwrap();
        let k = sa[sa.len() - 1];
        assert_close_tol(
            &got,
            &want.iter().map(|&x| x as f64).collect::<Vec<_>>(),
            (1e-5 * (k as f64).sqrt(), 1e-5),
            &format!("split f32 batched {sa:?} x {sb:?}"),
        );
    }
}

/// `MatmulPrecision::High` as a device setting: small products (and every product on a
/// device without f16 tensor cores) stay exactly the f32 product; on a GPU with them, a
/// product past the size threshold takes the split path, within its error.
#[test]
fn matmul_precision_setting() {
    use wgrad::MatmulPrecision;
    let dev = poisoned();
    assert_eq!(dev.matmul_precision(), MatmulPrecision::Highest);
    let mut rng = Rng::new(29);
    let product = |(m, n, k): (usize, usize, usize), a: &[f32], b: &[f32]| {
        tensor(&dev, a, &[m, k], DType::F32)
            .matmul(&tensor(&dev, b, &[k, n], DType::F32))
            .unwrap()
            .to_f32_vec()
            .unwrap()
    };
    let small = (128, 96, 256);
    let (a, b) = (rng.vec(small.0 * small.2), rng.vec(small.2 * small.1));
    let exact = product(small, &a, &b);
    dev.set_matmul_precision(MatmulPrecision::High);
    assert_eq!(dev.matmul_precision(), MatmulPrecision::High);
    let (high, ran) = ran_kernels(&dev, || product(small, &a, &b));
    assert!(!ran.iter().any(|k| k.contains("Split")), "{ran:?}");
    assert_eq!(high, exact, "a small product under High is the f32 product");
    // 2^32 multiply-adds: too slow for a CPU adapter, which never splits anyway.
    if !dev.info().is_cpu() {
        let (m, n, k) = (2048, 2048, 1024);
        let (a, b) = (rng.vec(m * k), rng.vec(k * n));
        let (high, ran) = ran_kernels(&dev, || product((m, n, k), &a, &b));
        let split = ran.iter().any(|k| k.contains("Split"));
        eprintln!("matmul_precision_setting: split path {split} ({ran:?})");
        let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
        // Sampled rows against f64 (the whole reference is 4e9 multiply-adds).
        for i in (0..m).step_by(97) {
            let want = cpu::matmul(
                &f(&a[i * k..(i + 1) * k]),
                &f(&b),
                None,
                1,
                n,
                k,
                false,
                false,
                None,
            );
            let tol = if split {
                2f64.powi(-18) * k as f64
            } else {
                1e-4 * (k as f64).sqrt()
            };
            assert_close_tol(&high[i * n..(i + 1) * n], &want, (tol, 0.0), "High, large");
        }
    }
    dev.set_matmul_precision(MatmulPrecision::Highest);
    assert!(MatmulPrecision::parse("high").is_ok() && MatmulPrecision::parse("fast").is_err());
}

#[test]
fn matmul_batched_broadcast() {
    let dev = poisoned();
    let mut rng = Rng::new(16);
    for dt in DTYPES {
        // [2,3,M,K] x [3,K,N] (B broadcast over the first dim) and [2,1,M,K] x [2,3,K,N].
        for (sa, sb) in [
            (vec![2usize, 3, 5, 7], vec![3usize, 7, 4]),
            (vec![2, 1, 5, 7], vec![2, 3, 7, 4]),
            (vec![4, 9, 6], vec![6, 10]),
        ] {
            let na: usize = sa.iter().product();
            let nb: usize = sb.iter().product();
            let a = rng.vec(na);
            let b = rng.vec(nb);
            let out = tensor(&dev, &a, &sa, dt)
                .matmul(&tensor(&dev, &b, &sb, dt))
                .unwrap();
            let (m, k, n) = (sa[sa.len() - 2], sa[sa.len() - 1], sb[sb.len() - 1]);
            let batch_a = &sa[..sa.len() - 2];
            let batch_b = &sb[..sb.len() - 2];
            let batch = wgrad::ops::elementwise::broadcast_shape("t", batch_a, batch_b).unwrap();
            let nbt: usize = batch.iter().product();
            let (ra, rb) = (rounded(&a, dt), rounded(&b, dt));
            let mut want = Vec::new();
            for bi in 0..nbt {
                let pick = |shape: &[usize]| -> usize {
                    // Index of the broadcast operand matrix for output batch bi.
                    let mut rem = bi;
                    let mut coords = vec![0; batch.len()];
                    for d in (0..batch.len()).rev() {
                        coords[d] = rem % batch[d];
                        rem /= batch[d];
                    }
                    let off = batch.len() - shape.len();
                    shape.iter().enumerate().fold(0, |acc, (d, &s)| {
                        acc * s + if s == 1 { 0 } else { coords[off + d] }
                    })
                };
                let ia = pick(batch_a);
                let ib = pick(batch_b);
                want.extend(cpu::matmul(
                    &ra[ia * m * k..(ia + 1) * m * k],
                    &rb[ib * k * n..(ib + 1) * k * n],
                    None,
                    m,
                    n,
                    k,
                    false,
                    false,
                    None,
                ));
            }
            let mut want_shape = batch.clone();
            want_shape.extend([m, n]);
            assert_eq!(out.shape(), want_shape.as_slice());
            assert_close(
                &out.to_f32_vec().unwrap(),
                &want,
                dt,
                &format!("batched {sa:?} x {sb:?} {dt}"),
            );
        }
    }
}

#[test]
fn conv2d_geometries() {
    let dev = poisoned();
    let mut rng = Rng::new(17);
    // (n, c, h, w, o, k, stride, pad, dil, groups)
    let cases = [
        (1, 1, 5, 5, 1, (3, 3), (1, 1), (0, 0), (1, 1), 1),
        (2, 3, 17, 13, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1),
        (3, 4, 12, 9, 6, (3, 2), (2, 1), (1, 0), (1, 1), 2),
        (2, 2, 11, 11, 3, (3, 3), (2, 2), (2, 2), (2, 2), 1),
        (1, 6, 7, 7, 6, (5, 5), (1, 1), (2, 2), (1, 1), 6),
        (4, 1, 28, 28, 8, (5, 5), (1, 1), (2, 2), (1, 1), 1),
    ];
    for dt in DTYPES {
        for (n, c, h, w, o, k, stride, pad, dil, groups) in cases {
            let x = rng.vec(n * c * h * w);
            let wt = rng.vec(o * (c / groups) * k.0 * k.1);
            let b = rng.vec(o);
            // A fused ReLU on the grouped cases (and checked against the reference's).
            let act = (groups > 1).then_some(Activation::Relu);
            let opts = Conv2dOpts {
                stride,
                padding: pad,
                dilation: dil,
                groups,
                act,
            };
            let tb = tensor(&dev, &b, &[o], dt);
            let y = tensor(&dev, &x, &[n, c, h, w], dt)
                .conv2d(
                    &tensor(&dev, &wt, &[o, c / groups, k.0, k.1], dt),
                    Some(&tb),
                    opts,
                )
                .unwrap();
            let win = cpu::Window {
                n,
                c,
                h,
                w,
                k,
                stride,
                pad,
                dil,
            };
            let (ho, wo) = win.out();
            assert_eq!(y.shape(), &[n, o, ho, wo]);
            let rbias = rounded(&b, dt);
            let want = cpu::conv2d(
                &rounded(&x, dt),
                &rounded(&wt, dt),
                Some(&rbias),
                &win,
                o,
                groups,
            );
            let want: Vec<f64> = want
                .into_iter()
                .map(|v| act.map_or(v, |a| cpu::activation(a, v)))
                .collect();
            assert_close_tol(
                &y.to_f32_vec().unwrap(),
                &want,
                (tol(dt).0 * 10.0, tol(dt).1),
                &format!(
                    "conv2d {:?} {dt}",
                    (n, c, h, w, o, k, stride, pad, dil, groups)
                ),
            );
        }
    }
}

/// (n, c, h, w, o, k, stride, pad, dil, groups) of a convolution case.
type ConvCase = (
    usize,
    usize,
    usize,
    usize,
    usize,
    (usize, usize),
    (usize, usize),
    (usize, usize),
    (usize, usize),
    usize,
);

/// One conv2d forward with bias and ReLU, its products forced to `config`, against the f64
/// reference; returns the kernels it ran.
fn conv_case(
    dev: &wgrad::Device,
    rng: &mut Rng,
    dt: DType,
    case: ConvCase,
    config: wgrad::kernels::matmul::Config,
) -> Vec<String> {
    let (n, c, h, w, o, k, stride, pad, dil, groups) = case;
    let x = rng.vec(n * c * h * w);
    let wt = rng.vec(o * (c / groups) * k.0 * k.1);
    let b = rng.vec(o);
    let opts = Conv2dOpts {
        stride,
        padding: pad,
        dilation: dil,
        groups,
        act: Some(Activation::Relu),
    };
    let (tx, tw, tb) = (
        tensor(dev, &x, &[n, c, h, w], dt),
        tensor(dev, &wt, &[o, c / groups, k.0, k.1], dt),
        tensor(dev, &b, &[o], dt),
    );
    let (y, ran) = ran_kernels(dev, || {
        wgrad::kernels::matmul::forced(config, || tx.conv2d(&tw, Some(&tb), opts))
            .unwrap()
            .unwrap()
    });
    let win = cpu::Window {
        n,
        c,
        h,
        w,
        k,
        stride,
        pad,
        dil,
    };
    let want: Vec<f64> = cpu::conv2d(
        &rounded(&x, dt),
        &rounded(&wt, dt),
        Some(&rounded(&b, dt)),
        &win,
        o,
        groups,
    )
    .into_iter()
    .map(|v| cpu::activation(Activation::Relu, v))
    .collect();
    assert_close_tol(
        &y.to_f32_vec().unwrap(),
        &want,
        (tol(dt).0 * 10.0, tol(dt).1),
        &format!("conv2d {case:?} {dt} forced {config:?}"),
    );
    ran
}

/// Convolutions as implicit products (`reg` gathering its B operand from the image, forced
/// here since lavapipe runs the CPU kernels): forward with bias and ReLU against the f64
/// reference, and no column matrix written where the weight's layout allows the gather.
#[test]
fn conv2d_implicit() {
    use wgrad::kernels::matmul::Config;
    let dev = poisoned();
    let mut rng = Rng::new(19);
    // C/G x KH x KW a multiple of 4 except the last (which must fall back to im2col and still
    // be right). One group, channels in runs of 4 and more than one tap gather from a
    // channels-last copy of the image (12 channels: runs of 4 that are not runs of 8); the
    // rest from the planar image.
    let cases: [ConvCase; 8] = [
        (1, 4, 1, 1, 1, (1, 1), (1, 1), (0, 0), (1, 1), 1),
        (2, 4, 17, 13, 5, (3, 3), (1, 1), (1, 1), (1, 1), 1),
        (3, 4, 12, 9, 6, (3, 2), (2, 1), (1, 0), (1, 1), 2),
        (2, 8, 11, 10, 8, (3, 3), (1, 1), (2, 2), (2, 2), 2),
        (1, 12, 11, 10, 7, (3, 3), (1, 1), (2, 2), (2, 2), 1),
        (1, 16, 33, 35, 3, (3, 3), (2, 2), (1, 1), (1, 1), 1),
        (1, 8, 17, 3, 127, (1, 3), (1, 1), (0, 1), (1, 1), 1),
        (2, 3, 9, 9, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    ];
    for dt in DTYPES {
        for case in cases {
            let ran = conv_case(&dev, &mut rng, dt, case, Config::Reg);
            let (c, k, groups) = (case.1, case.5, case.9);
            let implicit = (c / groups * k.0 * k.1) % 4 == 0;
            let channels_last = groups == 1 && c % 4 == 0 && k.0 * k.1 > 1;
            assert_eq!(
                ran.iter().any(|k| k.contains("im2col")),
                !implicit,
                "{case:?} {dt}: kernels {ran:?}"
            );
            // The image's channels-last copy.
            assert_eq!(
                ran.iter().any(|k| k.starts_with("Copy/")),
                channels_last,
                "{case:?} {dt}: kernels {ran:?}"
            );
        }
    }
}

/// Convolutions as implicit products on tensor cores (`wide` gathering 16-byte runs of
/// channels from the image copied channels last): f16, forced where the adapter runs `wide`
/// (elsewhere the usual path, still checked). Channels that are a multiple of 8 and one group
/// gather; the others (C = 12, two groups) must fall back to im2col and still be right.
#[test]
fn conv2d_channels_last() {
    use wgrad::kernels::matmul::Config;
    let dev = poisoned();
    let dt = DType::F16;
    let wide = runs_wide(&dev);
    let mut rng = Rng::new(23);
    // 1x1, 3x3 padded, K past one 64-wide step with a partial last one (C = 24: K = 216),
    // stride 2 with dilation, more than 128 positions and output channels (partial tiles both
    // ways), and the two fallbacks.
    let cases: [ConvCase; 7] = [
        (1, 8, 1, 1, 1, (1, 1), (1, 1), (0, 0), (1, 1), 1),
        (2, 8, 17, 13, 5, (3, 3), (1, 1), (1, 1), (1, 1), 1),
        (3, 24, 12, 9, 6, (3, 3), (2, 1), (1, 0), (2, 1), 1),
        (2, 16, 13, 11, 130, (3, 2), (1, 1), (2, 1), (2, 2), 1),
        (1, 8, 33, 35, 3, (5, 5), (1, 1), (2, 2), (1, 1), 1),
        (2, 12, 9, 9, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1),
        (2, 16, 9, 9, 4, (3, 3), (1, 1), (1, 1), (1, 1), 2),
    ];
    for case in cases {
        let ran = conv_case(&dev, &mut rng, dt, case, Config::CoopWide);
        if wide {
            let gathers = case.1 % 8 == 0 && case.9 == 1;
            assert_eq!(
                ran.iter().any(|k| k.contains("im2col")),
                !gathers,
                "{case:?}: kernels {ran:?}"
            );
        }
    }
}

/// Convolutions whose products run `wide` with 256 x 128 tiles (forced; those tiles do not
/// gather, so the columns go through im2col): the forward's bias lies along M (output
/// channels), here past one 256-row tile.
#[test]
fn conv2d_tall_tiles() {
    use wgrad::kernels::matmul::Config;
    let dev = poisoned();
    let mut rng = Rng::new(31);
    let wide = runs_wide(&dev);
    let case: ConvCase = (2, 8, 8, 8, 260, (3, 3), (1, 1), (1, 1), (1, 1), 1);
    let ran = conv_case(&dev, &mut rng, DType::F16, case, Config::CoopWideTall);
    assert!(
        !wide || ran.iter().any(|k| k == "MatmulWide/main"),
        "kernels {ran:?}"
    );
}

#[test]
fn pooling() {
    let dev = poisoned();
    let mut rng = Rng::new(18);
    for dt in DTYPES {
        for (n, c, h, w, k, s, p) in [
            (1, 1, 1, 1, (1, 1), (1, 1), (0, 0)),
            (2, 3, 17, 13, (2, 2), (2, 2), (0, 0)),
            (1, 2, 9, 10, (3, 3), (2, 2), (1, 1)),
            (2, 1, 28, 28, (3, 2), (1, 2), (1, 1)),
        ] {
            let x = rng.vec(n * c * h * w);
            let t = tensor(&dev, &x, &[n, c, h, w], dt);
            let win = cpu::Window {
                n,
                c,
                h,
                w,
                k,
                stride: s,
                pad: p,
                dil: (1, 1),
            };
            let rx = rounded(&x, dt);
            assert_close(
                &t.max_pool2d(k, s, p).unwrap().to_f32_vec().unwrap(),
                &cpu::pool2d(&rx, &win, true),
                dt,
                "max_pool2d",
            );
            assert_close(
                &t.avg_pool2d(k, s, p).unwrap().to_f32_vec().unwrap(),
                &cpu::pool2d(&rx, &win, false),
                dt,
                "avg_pool2d",
            );
        }
    }
}

#[test]
fn attention_vs_reference_and_composition() {
    let dev = poisoned();
    let mut rng = Rng::new(19);
    for dt in DTYPES {
        for (b, h, s, d) in [
            (1, 1, 1, 8),
            (2, 3, 3, 16),
            (1, 2, 17, 33),
            (1, 1, 127, 64),
            (1, 2, 40, 128),
            (1, 1, 9, 200),
            // Multiples of 16 with d 64 or 128: the tensor-core path where the adapter has one.
            (1, 2, 64, 64),
            (1, 1, 48, 128),
            (2, 2, 80, 64),
            // Four query and key blocks of 64 (the last one 16 wide): causal blocks skipped.
            (1, 2, 208, 64),
            // The same at head dimension 128, whose forward loads a block's V and the next
            // block's K while it multiplies.
            (1, 1, 208, 128),
        ] {
            for causal in [false, true] {
                let n = b * h * s * d;
                let (q, k, v) = (rng.vec(n), rng.vec(n), rng.vec(n));
                let shape = [b, h, s, d];
                let (tq, tk, tv) = (
                    tensor(&dev, &q, &shape, dt),
                    tensor(&dev, &k, &shape, dt),
                    tensor(&dev, &v, &shape, dt),
                );
                let out = Tensor::attention(&tq, &tk, &tv, causal, None).unwrap();
                let scale = 1.0 / (d as f64).sqrt();
                let want = cpu::attention(
                    &rounded(&q, dt),
                    &rounded(&k, dt),
                    &rounded(&v, dt),
                    b * h,
                    s,
                    s,
                    d,
                    causal,
                    scale,
                );
                let what = format!("attention {:?} causal={causal} {dt}", shape);
                let got = out.to_f32_vec().unwrap();
                assert_close(&got, &want, dt, &what);
                // The same from the basic kernels: softmax(q k^T * scale + mask) v.
                let scores = tq
                    .matmul_with(
                        &tk,
                        MatmulOpts {
                            trans_b: true,
                            ..Default::default()
                        },
                    )
                    .unwrap()
                    .mul_scalar(scale as f32)
                    .unwrap();
                let scores = if causal {
                    let mask: Vec<f32> = (0..s * s)
                        .map(|i| if i % s > i / s { -1e4 } else { 0.0 })
                        .collect();
                    scores.add(&tensor(&dev, &mask, &[s, s], dt)).unwrap()
                } else {
                    scores
                };
                let composed = scores
                    .softmax()
                    .unwrap()
                    .matmul(&tv)
                    .unwrap()
                    .to_f32_vec()
                    .unwrap();
                let (atol, rtol) = tol(dt);
                assert_close_tol(
                    &got,
                    &f(&composed.iter().map(|&v| v as f64).collect::<Vec<_>>()),
                    (atol * 4.0, rtol * 4.0),
                    &format!("{what} vs composition"),
                );
            }
        }
    }
}

/// Scores that climb along the keys, by about 2 per key for some rows and fall for others,
/// so a row's maximum grows past the running one by far more than the tensor-core forward's
/// lazy threshold from one block of 64 keys to the next (that kernel then scales the output
/// accumulated so far) while other rows of the same workgroup do not move: forward and
/// gradients against the f64 reference.
#[test]
fn attention_with_growing_scores() {
    let dev = poisoned();
    let mut rng = Rng::new(29);
    for dt in DTYPES {
        for (b, h, s, d) in [(1, 2, 208, 64), (1, 1, 144, 128), (1, 1, 65, 64)] {
            for causal in [false, true] {
                let n = b * h * s * d;
                let (mut q, mut k, v, g) = (rng.vec(n), rng.vec(n), rng.vec(n), rng.vec(n));
                // Every coordinate of q near +-1 (the sign per row), of key j near j / 16: the
                // score of key j is about +-j d / (16 sqrt d) = +-j / 2 at d = 64.
                for r in 0..b * h * s {
                    let sign = if r % 3 == 0 { -1.0 } else { 1.0 };
                    for c in 0..d {
                        q[r * d + c] = sign * (1.0 + 0.1 * q[r * d + c]);
                        let j = (r % s) as f32;
                        k[r * d + c] = j / 16.0 * (1.0 + 0.1 * k[r * d + c]) * 64.0 / d as f32;
                    }
                }
                let shape = [b, h, s, d];
                let what = format!("attention growing {:?} causal={causal} {dt}", shape);
                check_attention(&dev, dt, &shape, &shape, causal, [&q, &k, &v, &g], &what);
            }
        }
    }
}

/// Attention over q of `q_shape` and k, v of `kv_shape` ([..., length, d]; the leading
/// dimensions are the batch of heads), forward and gradients (upstream gradient g) against the
/// f64 reference; failures name `what`.
fn check_attention(
    dev: &wgrad::Device,
    dt: DType,
    q_shape: &[usize],
    kv_shape: &[usize],
    causal: bool,
    [q, k, v, g]: [&[f32]; 4],
    what: &str,
) {
    let r = q_shape.len();
    let (sq, skv, d) = (q_shape[r - 2], kv_shape[r - 2], q_shape[r - 1]);
    let bh: usize = q_shape[..r - 2].iter().product();
    let tq = tensor(dev, q, q_shape, dt).variable();
    let tk = tensor(dev, k, kv_shape, dt).variable();
    let tv = tensor(dev, v, kv_shape, dt).variable();
    let out = Tensor::attention(&tq, &tk, &tv, causal, None).unwrap();
    let scale = 1.0 / (d as f64).sqrt();
    let (rq, rk, rv) = (rounded(q, dt), rounded(k, dt), rounded(v, dt));
    let want = cpu::attention(&rq, &rk, &rv, bh, sq, skv, d, causal, scale);
    assert_close(&out.to_f32_vec().unwrap(), &want, dt, what);
    out.backward_with(&tensor(dev, g, q_shape, dt)).unwrap();
    let rg = rounded(g, dt);
    let (dq, dk, dv) = cpu::attention_backward(&rq, &rk, &rv, &rg, bh, sq, skv, d, causal, scale);
    for (name, t, want) in [("dq", &tq, dq), ("dk", &tk, dk), ("dv", &tv, dv)] {
        let got = t.grad().unwrap().to_f32_vec().unwrap();
        let tol = grad_tol(&want, dt);
        assert_close_tol(&got, &want, tol, &format!("{name} of {what}"));
    }
}

/// Tolerance of an attention gradient against its f64 reference: f16 and bf16 storage of
/// inputs and gradients gives errors of a few parts in a thousand of the largest gradient.
fn grad_tol(want: &[f64], dt: DType) -> (f64, f64) {
    let big = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    if dt != DType::F32 {
        (1e-2 * big * f16_scale(dt), 1e-2 * f16_scale(dt))
    } else {
        (1e-5 * big.max(1.0), 1e-4)
    }
}

/// Gradients at the shapes the tensor-core forward takes where the adapter has one (f16, head
/// dims 64 and 128, lengths multiples of 16, more keys than queries too, batch and heads
/// above 1), against the f64 reference.
#[test]
fn attention_gradients_at_tensor_core_shapes() {
    let dev = poisoned();
    let mut rng = Rng::new(23);
    for dt in DTYPES {
        for (b, h, sq, skv, d) in [
            (1, 2, 64, 64, 64),
            (2, 1, 80, 80, 64),
            (1, 1, 48, 48, 128),
            (1, 1, 32, 96, 64),
            (1, 1, 144, 144, 64),
            // Several blocks each way, causal ones skipped; fewer queries than keys.
            (1, 1, 208, 208, 64),
            (1, 2, 80, 208, 128),
        ] {
            for causal in [false, true] {
                let (nq, nk) = (b * h * sq * d, b * h * skv * d);
                let (q, k, v, g) = (rng.vec(nq), rng.vec(nk), rng.vec(nk), rng.vec(nq));
                let (sq_shape, sk_shape) = ([b, h, sq, d], [b, h, skv, d]);
                let tq = tensor(&dev, &q, &sq_shape, dt).variable();
                let tk = tensor(&dev, &k, &sk_shape, dt).variable();
                let tv = tensor(&dev, &v, &sk_shape, dt).variable();
                let out = Tensor::attention(&tq, &tk, &tv, causal, None).unwrap();
                out.backward_with(&tensor(&dev, &g, &sq_shape, dt)).unwrap();
                let (dq, dk, dv) = cpu::attention_backward(
                    &rounded(&q, dt),
                    &rounded(&k, dt),
                    &rounded(&v, dt),
                    &rounded(&g, dt),
                    b * h,
                    sq,
                    skv,
                    d,
                    causal,
                    1.0 / (d as f64).sqrt(),
                );
                for (name, t, want) in [("dq", &tq, dq), ("dk", &tk, dk), ("dv", &tv, dv)] {
                    let got = t.grad().unwrap().to_f32_vec().unwrap();
                    let t = grad_tol(&want, dt);
                    let what =
                        format!("{name} b={b} h={h} sq={sq} skv={skv} d={d} causal={causal} {dt}");
                    assert_close_tol(&got, &want, t, &what);
                }
            }
        }
    }
}

/// bf16 attention runs on the tensor-core `_reg` kernels exactly where the device has bf16
/// cooperative matrices and the fragment layout they assume (else on the f32 tile kernels),
/// and its forward and gradients match the f64 reference either way.
#[test]
fn bf16_attention_takes_tensor_cores_where_the_device_has_them() {
    let dev = poisoned();
    let mut rng = Rng::new(31);
    let dt = DType::BF16;
    let coop = dev.hardware().tensor_cores(dt)
        && wgrad::kernels::coop_layout::quad_rows_for(&dev, dt).unwrap();
    let (b, h, s, d) = (1, 2, 96, 128);
    let n = b * h * s * d;
    let (q, k, v, g) = (rng.vec(n), rng.vec(n), rng.vec(n), rng.vec(n));
    let shape = [b, h, s, d];
    let tq = tensor(&dev, &q, &shape, dt).variable();
    let tk = tensor(&dev, &k, &shape, dt).variable();
    let tv = tensor(&dev, &v, &shape, dt).variable();
    let (out, ran) = ran_kernels(&dev, || {
        let out = Tensor::attention(&tq, &tk, &tv, true, None).unwrap();
        out.backward_with(&tensor(&dev, &g, &shape, dt)).unwrap();
        out.to_f32_vec().unwrap()
    });
    for entry in ["fwd_reg", "bwd_q_reg", "bwd_kv_reg"] {
        let name = format!("AttentionCoop/{entry}");
        assert_eq!(ran.contains(&name), coop, "{name}: {ran:?}");
    }
    let scale = 1.0 / (d as f64).sqrt();
    let (rq, rk, rv) = (rounded(&q, dt), rounded(&k, dt), rounded(&v, dt));
    let want = cpu::attention(&rq, &rk, &rv, b * h, s, s, d, true, scale);
    assert_close(&out, &want, dt, "bf16 attention forward");
    let (dq, dk, dv) =
        cpu::attention_backward(&rq, &rk, &rv, &rounded(&g, dt), b * h, s, s, d, true, scale);
    for (name, t, want) in [("dq", &tq, dq), ("dk", &tk, dk), ("dv", &tv, dv)] {
        let got = t.grad().unwrap().to_f32_vec().unwrap();
        assert_close_tol(&got, &want, grad_tol(&want, dt), name);
    }
}

/// Forward and gradients against the f64 reference at the odd lengths where tiles and chunks
/// end mid-way (1, 7, 65, 129 queries and keys; more keys than queries too), every dtype.
#[test]
fn attention_at_odd_lengths() {
    let dev = poisoned();
    let mut rng = Rng::new(26);
    for dt in DTYPES {
        for (bh, sq, skv, d) in [
            (1, 1, 1, 8),
            (2, 7, 7, 16),
            (1, 65, 65, 64),
            (1, 129, 129, 32),
            (1, 7, 65, 64),
            // Head dimensions past 64: the f32 forward's 128-wide tiles (100 zero-padded).
            (1, 65, 65, 100),
            (1, 7, 129, 128),
        ] {
            for causal in [false, true] {
                let (nq, nk) = (bh * sq * d, bh * skv * d);
                let (q, k, v, g) = (rng.vec(nq), rng.vec(nk), rng.vec(nk), rng.vec(nq));
                let what =
                    format!("attention bh={bh} sq={sq} skv={skv} d={d} causal={causal} {dt}");
                let (q_shape, kv_shape) = ([bh, sq, d], [bh, skv, d]);
                check_attention(
                    &dev,
                    dt,
                    &q_shape,
                    &kv_shape,
                    causal,
                    [&q, &k, &v, &g],
                    &what,
                );
            }
        }
    }
}

/// The f32 backward at head dimensions 65 to 128 runs the register-tile kernels (`bwd_kv_tile`,
/// `bwd_q_split`, built for 128: zero past d) on every device with 32 KiB of workgroup memory,
/// and its gradients match the f64 reference at lengths that end blocks mid-way, with more
/// keys than queries, and causal or not.
#[test]
fn f32_attention_backward_at_128_takes_register_tiles() {
    let dev = poisoned();
    if dev.caps().workgroup_storage < 32_768 {
        return;
    }
    let mut rng = Rng::new(31);
    for (bh, sq, skv, d) in [(2, 47, 47, 128), (1, 33, 70, 100), (3, 17, 17, 65)] {
        for causal in [false, true] {
            let (nq, nk) = (bh * sq * d, bh * skv * d);
            let (q, k, v, g) = (rng.vec(nq), rng.vec(nk), rng.vec(nk), rng.vec(nq));
            let what = format!("attention bh={bh} sq={sq} skv={skv} d={d} causal={causal}");
            let ((), ran) = ran_kernels(&dev, || {
                check_attention(
                    &dev,
                    DType::F32,
                    &[bh, sq, d],
                    &[bh, skv, d],
                    causal,
                    [&q, &k, &v, &g],
                    &what,
                )
            });
            for entry in ["Attention/bwd_kv_tile", "Attention/bwd_q_split"] {
                assert!(
                    ran.iter().any(|k| k == entry),
                    "{what}: {entry} not in {ran:?}"
                );
            }
        }
    }
}

/// Dropout on the attention weights inside the fused kernels (tensor-core shapes and others),
/// forward and gradients, against the f64 reference with the same mask.
#[test]
fn attention_dropout_vs_reference() {
    let dev = poisoned();
    let mut rng = Rng::new(24);
    let (p, seed) = (0.3f32, 0xfeed_0001_2345_6789u64);
    // The mask itself: about p of the weights dropped.
    let dropped = (0..200)
        .flat_map(|r| (0..200).map(move |j| (r, j)))
        .filter(|&(r, j)| cpu::attention_keep(p, seed, r, j) == 0.0)
        .count();
    assert!(
        (0.28..0.32).contains(&(dropped as f64 / 40000.0)),
        "{dropped} of 40000 dropped"
    );
    for dt in DTYPES {
        for (b, h, sq, skv, d) in [
            (1, 2, 17, 17, 33),
            (1, 1, 40, 72, 16),
            (1, 2, 64, 64, 64),
            (1, 1, 208, 208, 64),
            (1, 1, 48, 96, 128),
        ] {
            for causal in [false, true] {
                let (nq, nk) = (b * h * sq * d, b * h * skv * d);
                let (q, k, v, g) = (rng.vec(nq), rng.vec(nk), rng.vec(nk), rng.vec(nq));
                let (sq_shape, sk_shape) = ([b, h, sq, d], [b, h, skv, d]);
                let tq = tensor(&dev, &q, &sq_shape, dt).variable();
                let tk = tensor(&dev, &k, &sk_shape, dt).variable();
                let tv = tensor(&dev, &v, &sk_shape, dt).variable();
                let opts = AttentionOpts {
                    causal,
                    dropout: p,
                    seed: Some(seed),
                    ..Default::default()
                };
                let out = Tensor::attention_with(&tq, &tk, &tv, opts).unwrap();
                let scale = 1.0 / (d as f64).sqrt();
                let keep = |r: usize, j: usize| cpu::attention_keep(p, seed, r, j);
                let (rq, rk, rv) = (rounded(&q, dt), rounded(&k, dt), rounded(&v, dt));
                let want =
                    cpu::attention_dropout(&rq, &rk, &rv, b * h, sq, skv, d, causal, scale, &keep);
                let what = format!("attention dropout {sq_shape:?} skv={skv} causal={causal} {dt}");
                assert_close(&out.to_f32_vec().unwrap(), &want, dt, &what);
                out.backward_with(&tensor(&dev, &g, &sq_shape, dt)).unwrap();
                let (dq, dk, dv) = cpu::attention_backward_dropout(
                    &rq,
                    &rk,
                    &rv,
                    &rounded(&g, dt),
                    b * h,
                    sq,
                    skv,
                    d,
                    causal,
                    scale,
                    &keep,
                );
                for (name, t, want) in [("dq", &tq, dq), ("dk", &tk, dk), ("dv", &tv, dv)] {
                    let got = t.grad().unwrap().to_f32_vec().unwrap();
                    let t = grad_tol(&want, dt);
                    assert_close_tol(&got, &want, t, &format!("{name} of {what}"));
                }
            }
        }
    }
    // Out-of-range probabilities are errors.
    let t = tensor(&dev, &[0.0; 8], &[2, 4], DType::F32);
    for bad in [1.0, -0.1, f32::NAN] {
        let opts = AttentionOpts {
            dropout: bad,
            ..Default::default()
        };
        assert!(
            Tensor::attention_with(&t, &t, &t, opts).is_err(),
            "dropout {bad}"
        );
    }
}

/// q, k and v as views of one fused QKV projection ([batch, seq, 3, heads, dim], the layout
/// MultiHeadAttention reads in place; the tensor-core kernels take the row pitch 3 heads dim),
/// forward and gradients against the f64 reference on the de-interleaved heads.
#[test]
fn attention_reads_fused_qkv_views() {
    let dev = poisoned();
    let mut rng = Rng::new(25);
    for dt in DTYPES {
        for (b, s, h, d, causal, dropout) in [
            (2, 80, 2, 64, true, 0.0),
            (1, 48, 1, 128, false, 0.2),
            (1, 33, 2, 16, true, 0.0),
        ] {
            let n = b * s * 3 * h * d;
            let (x, g) = (rng.vec(n), rng.vec(b * h * s * d));
            let fused = tensor(&dev, &x, &[b, s, 3, h, d], dt).variable();
            let heads = fused.permute(&[2, 0, 3, 1, 4]).unwrap();
            let pick = |i: usize| heads.narrow(0, i, 1).unwrap().squeeze(0).unwrap();
            let (q, k, v) = (pick(0), pick(1), pick(2));
            let seed = 77;
            let opts = AttentionOpts {
                causal,
                dropout,
                seed: Some(seed),
                ..Default::default()
            };
            let out = Tensor::attention_with(&q, &k, &v, opts).unwrap();
            // The same heads, de-interleaved on the host: part i of head (bb, hh) at row t.
            let xr = rounded(&x, dt);
            let part = |i: usize| -> Vec<f64> {
                let mut o = Vec::with_capacity(b * h * s * d);
                for bb in 0..b {
                    for hh in 0..h {
                        for t in 0..s {
                            let at = (((bb * s + t) * 3 + i) * h + hh) * d;
                            o.extend_from_slice(&xr[at..at + d]);
                        }
                    }
                }
                o
            };
            let (rq, rk, rv) = (part(0), part(1), part(2));
            let scale = 1.0 / (d as f64).sqrt();
            let keep = |r: usize, j: usize| cpu::attention_keep(dropout, seed, r, j);
            let want = cpu::attention_dropout(&rq, &rk, &rv, b * h, s, s, d, causal, scale, &keep);
            let what =
                format!("fused qkv b={b} s={s} h={h} d={d} causal={causal} p={dropout} {dt}");
            assert_close(&out.to_f32_vec().unwrap(), &want, dt, &what);
            out.backward_with(&tensor(&dev, &g, &[b, h, s, d], dt))
                .unwrap();
            let (dq, dk, dv) = cpu::attention_backward_dropout(
                &rq,
                &rk,
                &rv,
                &rounded(&g, dt),
                b * h,
                s,
                s,
                d,
                causal,
                scale,
                &keep,
            );
            // Interleave the reference gradients back into the fused layout.
            let mut want = vec![0.0; n];
            for (i, part) in [dq, dk, dv].iter().enumerate() {
                for bb in 0..b {
                    for hh in 0..h {
                        for t in 0..s {
                            let at = (((bb * s + t) * 3 + i) * h + hh) * d;
                            let from = ((bb * h + hh) * s + t) * d;
                            want[at..at + d].copy_from_slice(&part[from..from + d]);
                        }
                    }
                }
            }
            let got = fused.grad().unwrap().to_f32_vec().unwrap();
            let t = grad_tol(&want, dt);
            assert_close_tol(&got, &want, t, &format!("gradient of {what}"));

            // The same through attention_qkv: [b, s, 3 h d] in, [b, s, h d] out, one gradient.
            let flat = tensor(&dev, &x, &[b, s, 3 * h * d], dt).variable();
            let o2 = Tensor::attention_qkv(&flat, h, opts).unwrap();
            assert_eq!(o2.shape(), &[b, s, h * d]);
            let mut want_o = vec![0.0; b * s * h * d];
            let want_bhsd =
                cpu::attention_dropout(&rq, &rk, &rv, b * h, s, s, d, causal, scale, &keep);
            let mut g2 = vec![0.0f32; b * s * h * d];
            for bb in 0..b {
                for hh in 0..h {
                    for t in 0..s {
                        let (to, from) = (((bb * s + t) * h + hh) * d, ((bb * h + hh) * s + t) * d);
                        want_o[to..to + d].copy_from_slice(&want_bhsd[from..from + d]);
                        g2[to..to + d].copy_from_slice(&g[from..from + d]);
                    }
                }
            }
            assert_close(
                &o2.to_f32_vec().unwrap(),
                &want_o,
                dt,
                &format!("attention_qkv {what}"),
            );
            o2.backward_with(&tensor(&dev, &g2, &[b, s, h * d], dt))
                .unwrap();
            let got = flat.grad().unwrap().to_f32_vec().unwrap();
            assert_close_tol(&got, &want, t, &format!("attention_qkv gradient of {what}"));
        }
    }
    // Widths that do not split into 3 x heads are errors.
    let t = tensor(&dev, &[0.0; 40], &[1, 4, 10], DType::F32);
    assert!(Tensor::attention_qkv(&t, 2, AttentionOpts::default()).is_err());
}

#[test]
fn attention_cross_lengths() {
    // Fewer queries than keys (a decoding step): causal mask aligned bottom-right.
    let dev = poisoned();
    let mut rng = Rng::new(20);
    let (bh, sq, skv, d) = (2, 5, 23, 32);
    let (q, k, v) = (
        rng.vec(bh * sq * d),
        rng.vec(bh * skv * d),
        rng.vec(bh * skv * d),
    );
    for causal in [false, true] {
        let out = Tensor::attention(
            &tensor(&dev, &q, &[bh, sq, d], DType::F32),
            &tensor(&dev, &k, &[bh, skv, d], DType::F32),
            &tensor(&dev, &v, &[bh, skv, d], DType::F32),
            causal,
            Some(0.3),
        )
        .unwrap();
        let want = cpu::attention(
            &rounded(&q, DType::F32),
            &rounded(&k, DType::F32),
            &rounded(&v, DType::F32),
            bh,
            sq,
            skv,
            d,
            causal,
            0.3,
        );
        assert_close(
            &out.to_f32_vec().unwrap(),
            &want,
            DType::F32,
            &format!("cross attention causal={causal}"),
        );
    }
}

#[test]
fn norms() {
    let dev = poisoned();
    let mut rng = Rng::new(21);
    for dt in DTYPES {
        // Rows up to 1024 long take one subgroup each on adapters with subgroups; longer ones a
        // workgroup each. Lengths a multiple of 4 hold the row in registers where it is short
        // enough (up to 16 runs of 4 a lane: 512 on 8-wide subgroups, 2048 on 32-wide).
        for (rows, len) in [
            (1, 1),
            (3, 17),
            (127, 3),
            (7, 44),
            (33, 256),
            (9, 512),
            (130, 384),
            (5, 1000),
            (6, 1025),
            (3, 1152),
        ] {
            let x: Vec<f32> = rng
                .vec(rows * len)
                .into_iter()
                .map(|v| v * 2.0 + 0.5)
                .collect();
            let g = rng.vec(len);
            let b = rng.vec(len);
            let t = tensor(&dev, &x, &[rows, len], dt);
            let (tg, tb) = (tensor(&dev, &g, &[len], dt), tensor(&dev, &b, &[len], dt));
            let (rx, rg, rb) = (rounded(&x, dt), rounded(&g, dt), rounded(&b, dt));
            let tl = (tol(dt).0 * 10.0, tol(dt).1 * 2.0);
            let (y, ran) = common::ran_kernels(&dev, || {
                t.layer_norm(&tg, &tb, 1e-5).unwrap().to_f32_vec().unwrap()
            });
            // Where the register entry applies (norm.rs `row_launch`), it ran.
            assert_eq!(
                ran.iter().any(|k| k == "Norm/fwd_vec"),
                in_registers(&dev, len),
                "{rows}x{len}: {ran:?}"
            );
            assert_close_tol(
                &y,
                &cpu::norm(&rx, &rg, Some(&rb), rows, len, 1e-5),
                tl,
                &format!("layer_norm {rows}x{len} {dt}"),
            );
            assert_close_tol(
                &t.rms_norm(&tg, 1e-5).unwrap().to_f32_vec().unwrap(),
                &cpu::norm(&rx, &rg, None, rows, len, 1e-5),
                tl,
                &format!("rms_norm {rows}x{len} {dt}"),
            );
        }
    }
}

/// LayerNorm's and RMSNorm's gradients (dx, dgamma, dbeta) against f64 at the lengths of
/// `norms` (every entry: workgroup, subgroup and register rows), in every dtype and with f16
/// packed.
#[test]
fn norm_gradients() {
    let mut rng = Rng::new(26);
    for (dev, dtypes) in elementwise_devices() {
        for &dt in dtypes {
            for (rows, len) in [
                (1, 1),
                (3, 17),
                (7, 44),
                (33, 256),
                (9, 512),
                (130, 384),
                (5, 1000),
                (6, 1025),
                (3, 1152),
                // Enough row chunks (32 or 64 rows each) for every group of the chunk sums.
                (600, 20),
                (600, 17),
            ] {
                let x: Vec<f32> = rng.vec(rows * len).iter().map(|v| v * 2.0 + 0.5).collect();
                let (g, b, dy) = (rng.vec(len), rng.vec(len), rng.vec(rows * len));
                let (rx, rg, rdy) = (rounded(&x, dt), rounded(&g, dt), rounded(&dy, dt));
                for rms in [false, true] {
                    let t = tensor(&dev, &x, &[rows, len], dt).variable();
                    let tg = tensor(&dev, &g, &[len], dt).variable();
                    let tb = tensor(&dev, &b, &[len], dt).variable();
                    let y = if rms {
                        t.rms_norm(&tg, 1e-5).unwrap()
                    } else {
                        t.layer_norm(&tg, &tb, 1e-5).unwrap()
                    };
                    y.backward_with(&tensor(&dev, &dy, &[rows, len], dt))
                        .unwrap();
                    let (dx, dgamma, dbeta) =
                        cpu::norm_backward(&rx, &rg, &rdy, rms, rows, len, 1e-5);
                    let what = format!(
                        "{} {rows}x{len} {dt}",
                        if rms { "rms_norm" } else { "layer_norm" }
                    );
                    let (atol, rtol) = tol(dt);
                    let tl = (atol * 20.0, rtol * 4.0);
                    let grad = |t: &Tensor| t.grad().unwrap().to_f32_vec().unwrap();
                    assert_close_tol(&grad(&t), &dx, tl, &format!("dx {what}"));
                    // Sums over the rows: error grows with their count.
                    let sum_tol = (tl.0 * (rows as f64).sqrt(), tl.1);
                    assert_close_tol(&grad(&tg), &dgamma, sum_tol, &format!("dgamma {what}"));
                    if !rms {
                        assert_close_tol(&grad(&tb), &dbeta, sum_tol, &format!("dbeta {what}"));
                    }
                }
            }
        }
    }
}

#[test]
fn cross_entropy_rows() {
    let dev = poisoned();
    let mut rng = Rng::new(22);
    for dt in DTYPES {
        for (rows, classes) in [(1, 1), (3, 10), (17, 3), (127, 1000)] {
            let x: Vec<f32> = rng
                .vec(rows * classes)
                .into_iter()
                .map(|v| v * 4.0)
                .collect();
            let labels: Vec<u32> = (0..rows)
                .map(|_| rng.below(classes as u64) as u32)
                .collect();
            let t = tensor(&dev, &x, &[rows, classes], dt);
            let l = Tensor::from_slice(&dev, &labels, &[rows]).unwrap();
            let want = cpu::cross_entropy(&rounded(&x, dt), &labels, rows, classes);
            assert_close_tol(
                &t.cross_entropy_rows(&l).unwrap().to_f32_vec().unwrap(),
                &want,
                (tol(dt).0 * 5.0, tol(dt).1),
                &format!("cross_entropy {rows}x{classes} {dt}"),
            );
        }
    }
    // A label out of range poisons its row's loss with NaN instead of reading out of bounds.
    let t = Tensor::from_slice(&dev, &[0.0f32, 1.0, 2.0, 3.0], &[2, 2]).unwrap();
    let l = Tensor::from_slice(&dev, &[1u32, 7], &[2]).unwrap();
    let loss = t.cross_entropy_rows(&l).unwrap().to_vec::<f32>().unwrap();
    assert!(loss[0].is_finite() && loss[1].is_nan(), "{loss:?}");
}

#[test]
fn embedding_gather() {
    let dev = poisoned();
    let mut rng = Rng::new(23);
    for dt in DTYPES {
        for (vocab, dim, n) in [(1, 1, 1), (3, 17, 5), (65, 127, 33), (1000, 3, 1000)] {
            let w = rng.vec(vocab * dim);
            let idx: Vec<u32> = (0..n).map(|_| rng.below(vocab as u64) as u32).collect();
            let y = tensor(&dev, &w, &[vocab, dim], dt)
                .embedding(&Tensor::from_slice(&dev, &idx, &[n]).unwrap())
                .unwrap();
            assert_eq!(y.shape(), &[n, dim]);
            let rw = rounded(&w, dt);
            let want: Vec<f64> = idx
                .iter()
                .flat_map(|&i| rw[i as usize * dim..(i as usize + 1) * dim].to_vec())
                .collect();
            assert_close(&y.to_f32_vec().unwrap(), &want, dt, "embedding");
        }
    }
}

#[test]
fn layout_cast_fill() {
    let dev = poisoned();
    let mut rng = Rng::new(24);
    let x = rng.vec(2 * 3 * 4);
    let t = tensor(&dev, &x, &[2, 3, 4], DType::F32);
    // permute [2,3,4] -> [4,2,3]
    let p = t.permute(&[2, 0, 1]).unwrap();
    assert_eq!(p.shape(), &[4, 2, 3]);
    let got = p.to_vec::<f32>().unwrap();
    for a in 0..4 {
        for b in 0..2 {
            for c in 0..3 {
                assert_eq!(got[(a * 2 + b) * 3 + c], x[(b * 3 + c) * 4 + a]);
            }
        }
    }
    let n = t.narrow(1, 1, 2).unwrap();
    assert_eq!(
        n.to_vec::<f32>().unwrap(),
        (0..2)
            .flat_map(|i| x[i * 12 + 4..i * 12 + 12].to_vec())
            .collect::<Vec<_>>()
    );
    let c = Tensor::cat(&[&t, &n], 1).unwrap();
    assert_eq!(c.shape(), &[2, 5, 4]);
    let cv = c.to_vec::<f32>().unwrap();
    assert_eq!(&cv[..12], &x[..12]);
    assert_eq!(&cv[12..20], &x[4..12]);
    let bc = Tensor::from_slice(&dev, &[1.0f32, 2.0, 3.0], &[3, 1])
        .unwrap()
        .broadcast_to(&[2, 3, 2])
        .unwrap();
    assert_eq!(
        bc.to_vec::<f32>().unwrap(),
        vec![1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    );
    // Casts both ways, u32 included; copies are exact.
    for n in SIZES {
        let v: Vec<f32> = rng.vec(n).into_iter().map(|x| x * 1000.0).collect();
        let t = tensor(&dev, &v, &[n], DType::F32);
        let h = t.to_dtype(DType::F16).unwrap();
        assert_close(
            &h.to_f32_vec().unwrap(),
            &rounded(&v, DType::F16),
            DType::F16,
            "cast to f16",
        );
        let back = h.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        assert_close(&back, &rounded(&v, DType::F16), DType::F32, "cast back");
        assert_eq!(t.copy().unwrap().to_vec::<f32>().unwrap(), v);
        let u: Vec<u32> = (0..n as u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        let tu = Tensor::from_slice(&dev, &u, &[n]).unwrap();
        assert_eq!(
            tu.copy().unwrap().to_vec::<u32>().unwrap(),
            u,
            "u32 copies are bit-exact"
        );
        assert_eq!(
            tu.reshape(&[n, 1])
                .unwrap()
                .transpose(0, 1)
                .unwrap()
                .to_vec::<u32>()
                .unwrap(),
            u
        );
    }
    for dt in [DType::F32, DType::F16, DType::U32] {
        let z = Tensor::full(&dev, &[1000], 3.0, dt).unwrap();
        assert!(
            z.to_f32_vec().unwrap().iter().all(|&v| v == 3.0),
            "fill {dt}"
        );
    }
}

#[test]
fn random_and_dropout() {
    let dev = poisoned();
    dev.manual_seed(7);
    let n = 200_000;
    for dt in DTYPES {
        let u = Tensor::rand(&dev, &[n], -1.0, 3.0, dt)
            .unwrap()
            .to_f32_vec()
            .unwrap();
        assert!(u.iter().all(|&v| (-1.0..=3.0).contains(&v)));
        let mean = u.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
        assert!((mean - 1.0).abs() < 0.02, "uniform mean {mean}");
        let z = Tensor::randn(&dev, &[n], 0.5, 2.0, dt)
            .unwrap()
            .to_f32_vec()
            .unwrap();
        let m = z.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
        let var = z.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / n as f64;
        assert!(
            (m - 0.5).abs() < 0.02 && (var.sqrt() - 2.0).abs() < 0.02,
            "normal mean {m} std {}",
            var.sqrt()
        );
    }
    // Same seed, same numbers; next draw, different numbers.
    dev.manual_seed(99);
    let a = dev
        .randn(&[1000], DType::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let b = dev
        .randn(&[1000], DType::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    dev.manual_seed(99);
    let c = dev
        .randn(&[1000], DType::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(a, c);
    assert_ne!(a, b);
    for dt in DTYPES {
        let x = Tensor::ones(&dev, &[n], dt).unwrap();
        let y = x.dropout(0.3).unwrap().to_f32_vec().unwrap();
        let zeros = y.iter().filter(|&&v| v == 0.0).count() as f64 / n as f64;
        assert!((zeros - 0.3).abs() < 0.01, "dropped fraction {zeros}");
        let kept_scale = 1.0 / 0.7;
        assert!(
            y.iter().all(|&v| v == 0.0 || (v - kept_scale).abs() < 2e-3),
            "kept values are scaled by 1/(1-p)"
        );
    }
}

#[test]
fn bad_input_gives_clear_errors() {
    let dev = device();
    let a = Tensor::zeros(&dev, &[2, 3], DType::F32).unwrap();
    let b = Tensor::zeros(&dev, &[4, 5], DType::F32).unwrap();
    let e = a.matmul(&b).unwrap_err();
    assert!(
        matches!(e, Error::Shape { op: "matmul", .. })
            && e.to_string().contains("[2, 3]")
            && e.to_string().contains("[4, 5]"),
        "{e}"
    );
    let e = a.add(&b).unwrap_err();
    assert!(e.to_string().contains("do not broadcast"), "{e}");
    let h = Tensor::zeros(&dev, &[2, 3], DType::F16).unwrap();
    assert!(matches!(a.add(&h), Err(Error::DType { .. })));
    let u = Tensor::zeros(&dev, &[2], DType::U32).unwrap();
    assert!(matches!(u.exp(), Err(Error::DType { .. })));
    assert!(matches!(a.sum(2, false), Err(Error::Invalid { .. })));
    assert!(matches!(a.reshape(&[7]), Err(Error::Shape { .. })));
    assert!(matches!(
        a.softmax().unwrap().cross_entropy(&a),
        Err(Error::DType { .. })
    ));
    let q = Tensor::zeros(&dev, &[1, 4, 300], DType::F32).unwrap();
    let e = Tensor::attention(&q, &q, &q, false, None).unwrap_err();
    assert!(matches!(e, Error::LimitExceeded { .. }), "{e}");
    let x = Tensor::zeros(&dev, &[1, 3, 4, 4], DType::F32).unwrap();
    let w = Tensor::zeros(&dev, &[2, 3, 5, 5], DType::F32).unwrap();
    assert!(matches!(
        x.conv2d(&w, None, Conv2dOpts::default()),
        Err(Error::Shape { .. })
    ));
    assert!(x.dropout(1.5).is_err());
    // Nothing above damaged the device: work still runs.
    assert_eq!(
        a.add_scalar(1.0)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar()
            .unwrap(),
        6.0
    );
}

/// Index arithmetic (a flat index split into coordinates) divides through f32 on the device,
/// where GPUs may round 33 / 33 below 1. A transpose copies every element through that split,
/// so any off-by-one quotient moves a value: checked exactly for every divisor 3..=130, and up
/// to indices near 2^24 for small divisors, where the rounding error is largest.
#[test]
fn strided_copy_index_math_exact() {
    let dev = poisoned();
    let mut cases: Vec<(usize, usize)> = (3..=130).map(|d| (4099 / d + 3, d)).collect();
    cases.extend([(5_592_000, 3), (3_355_000, 5), (2_396_000, 7)]);
    for (rows, d) in cases {
        let n = rows * d;
        let v: Vec<u32> = (0..n as u32).collect();
        let t = Tensor::from_slice(&dev, &v, &[rows, d]).unwrap();
        let got = t
            .transpose(0, 1)
            .unwrap()
            .contiguous()
            .unwrap()
            .to_vec::<u32>()
            .unwrap();
        for (j, &g) in got.iter().enumerate() {
            let (c, r) = (j / rows, j % rows);
            assert_eq!(
                g as usize,
                r * d + c,
                "[{rows}, {d}] transposed: element {j}"
            );
        }
    }
}

/// Dense copies of contiguous runs at every offset and length parity: f16 runs move as whole
/// 32-bit words when both ends sit on 4-byte boundaries, element by element otherwise.
#[test]
fn contiguous_run_copies() {
    let dev = poisoned();
    let mut rng = Rng::new(18);
    for dt in DTYPES {
        let x = rng.vec(1000);
        let t = tensor(&dev, &x, &[1000], dt);
        let want = rounded(&x, dt);
        for start in [0, 1, 2, 3, 17] {
            for len in [1, 2, 3, 4, 127, 982] {
                let got = t.narrow(0, start, len).unwrap().copy().unwrap();
                assert_close(
                    &got.to_f32_vec().unwrap(),
                    &want[start..start + len],
                    dt,
                    &format!("copy of [{start}, {}) {dt}", start + len),
                );
            }
        }
    }
}

/// The cooperative-matrix layout probe (kernels/coop_layout.rs): on a device with
/// cooperative matrices and wgrad's own SPIR-V it finds a layout (every position held once,
/// every element read back as written), for f16 and, where the device has them, bf16
/// operands; elsewhere it finds none. Prints what it found.
#[test]
fn coop_layout_probe() {
    use wgrad::kernels::coop_layout::{CoopLayout, layout, layout_for};
    let dev = device();
    let c = dev.caps();
    let found = layout(&dev).expect("probe");
    let able =
        c.coop_elements && c.f16 && c.subgroups && c.subgroup_min == 32 && c.subgroup_max == 32;
    match &found {
        Some(l) => eprintln!(
            "cooperative-matrix layout: quad rows {}; C lane 0 {:?}, lane 5 {:?}; A lane 0 {:?}, lane 5 {:?}",
            *l == CoopLayout::quad_rows(),
            l.c[0],
            l.c[5],
            l.a[0],
            l.a[5]
        ),
        None => eprintln!("cooperative-matrix layout: none (able: {able})"),
    }
    assert_eq!(found.is_some(), able);
    // Measured once: the second call returns the kept result.
    assert_eq!(layout(&dev).expect("again"), found);
    // With bf16 operands: measured where the device has bf16 matrices (the probe's values
    // then bf16), none elsewhere.
    let bf16 = layout_for(&dev, DType::BF16).expect("bf16 probe");
    eprintln!(
        "bf16 operands: {}",
        match &bf16 {
            Some(l) => format!("quad rows {}", *l == CoopLayout::quad_rows()),
            None => "none".into(),
        }
    );
    assert_eq!(bf16.is_some(), able && c.coop_bf16_16);
    assert_eq!(layout_for(&dev, DType::BF16).expect("again"), bf16);
}

/// The embedding's gradient (a scatter-add of dy's rows) against f64 with random dy, in each
/// of its kernels: `scatter_tab` for small vocabularies (several column groups and chunks,
/// a 256-row table), `scatter_rows` up to 4096, `scatter_cols` past it; awkward sizes, every
/// dtype and f16 packed.
#[test]
fn embedding_scatter_add() {
    let mut rng = Rng::new(25);
    let tab = |dev: &wgrad::Device, vocab: usize| {
        vocab <= 256
            && vocab.next_power_of_two().max(32) * 128 <= dev.caps().workgroup_storage as usize
    };
    for (dev, dtypes) in elementwise_devices() {
        for &dt in dtypes {
            for (vocab, dim, n) in [
                (1, 1, 1),
                (3, 17, 5),
                (65, 40, 1000),
                (256, 33, 700),
                (300, 5, 400),
                (5000, 3, 2000),
            ] {
                let idx: Vec<u32> = (0..n).map(|_| rng.below(vocab as u64) as u32).collect();
                let dy = rng.vec(n * dim);
                let w = Tensor::zeros(&dev, &[vocab, dim], dt).unwrap().variable();
                let ti = Tensor::from_slice(&dev, &idx, &[n]).unwrap();
                let tdy = tensor(&dev, &dy, &[n, dim], dt);
                let (g, ran) = common::ran_kernels(&dev, || {
                    w.embedding(&ti).unwrap().backward_with(&tdy).unwrap();
                    w.grad().unwrap().to_f32_vec().unwrap()
                });
                let entry = if tab(&dev, vocab) {
                    "Embedding/scatter_tab"
                } else if vocab <= 4096 {
                    "Embedding/scatter_rows"
                } else {
                    "Embedding/scatter_cols"
                };
                assert!(ran.iter().any(|k| k == entry), "vocab {vocab}: {ran:?}");
                let rdy = rounded(&dy, dt);
                let mut want = vec![0.0f64; vocab * dim];
                let mut count = vec![0usize; vocab];
                for (t, &i) in idx.iter().enumerate() {
                    count[i as usize] += 1;
                    for c in 0..dim {
                        want[i as usize * dim + c] += rdy[t * dim + c];
                    }
                }
                let most = count.iter().max().copied().unwrap_or(1) as f64;
                let (atol, rtol) = tol(dt);
                assert_close_tol(
                    &g,
                    &want,
                    (atol * most.sqrt() * 4.0, rtol),
                    &format!("embedding gradient vocab={vocab} dim={dim} n={n} {dt}"),
                );
            }
        }
    }
}

/// u32 comparisons are exact for every value (ids past 2^24, which f32 would merge), with
/// broadcasting and a strided operand, against the host's comparison; outputs are poisoned.
#[test]
fn u32_comparisons_are_exact() {
    let dev = poisoned();
    let mut rng = Rng::new(13);
    // Neighbours past 2^24 and at the top of the range, then random ids.
    let mut xs: Vec<u32> = vec![1 << 24, (1 << 24) + 1, u32::MAX, u32::MAX - 1, 0, 7];
    xs.extend((0..5 * 7 - xs.len()).map(|_| rng.below(40) as u32));
    let ys: Vec<u32> = vec![(1 << 24) + 1, 1 << 24, u32::MAX - 1, u32::MAX, 0, 3, 9];
    let x = Tensor::from_slice(&dev, &xs, &[5, 7]).unwrap();
    let y = Tensor::from_slice(&dev, &ys, &[7]).unwrap();
    type Op = fn(&Tensor, &Tensor) -> wgrad::Result<Tensor>;
    type Host = fn(u32, u32) -> bool;
    let ops: [(&str, Op, Host); 6] = [
        ("eq", Tensor::eq, |a, b| a == b),
        ("ne", Tensor::ne, |a, b| a != b),
        ("lt", Tensor::lt, |a, b| a < b),
        ("le", Tensor::le, |a, b| a <= b),
        ("gt", Tensor::gt, |a, b| a > b),
        ("ge", Tensor::ge, |a, b| a >= b),
    ];
    for (name, op, host) in ops {
        let got = op(&x, &y).unwrap();
        assert_eq!(got.dtype(), DType::F32, "{name}");
        let want: Vec<f32> = (0..35)
            .map(|i| host(xs[i], ys[i % 7]) as u32 as f32)
            .collect();
        assert_eq!(got.to_vec::<f32>().unwrap(), want, "{name}");
        // The transposed (strided) operand against its own values.
        let xt = x.transpose(0, 1).unwrap();
        let got = op(&xt, &xt.contiguous().unwrap()).unwrap();
        let same = (0..35)
            .map(|_| host(1, 1) as u32 as f32)
            .collect::<Vec<_>>();
        assert_eq!(got.to_vec::<f32>().unwrap(), same, "{name} strided");
    }
    // Arithmetic on u32 is refused with the op's name.
    let e = x.add(&x).unwrap_err().to_string();
    assert!(e.starts_with("add:"), "{e}");
}

/// K and V of `kv` heads repeated to `heads` (head h of the result is head h / group), the
/// slow composition grouped-query attention must match.
fn repeat_heads(t: &Tensor, heads: usize) -> Tensor {
    let kv = t.shape()[1];
    let idx: Vec<u32> = (0..heads).map(|h| (h / (heads / kv)) as u32).collect();
    let idx = Tensor::from_slice(t.device(), &idx, &[heads]).unwrap();
    t.index_select(1, &idx).unwrap()
}

/// Grouped-query attention (k and v with fewer heads than q) against attention over K and V
/// repeated to every query head, forward and backward, causal (with a cache's extra keys)
/// and not, at head dimensions on the register-tile and tensor-core paths.
#[test]
fn grouped_query_attention_matches_repeated_heads() {
    let dev = poisoned();
    let mut rng = Rng::new(14);
    for dt in DTYPES {
        for &(heads, kv, sq, skv, d, causal) in &[
            (6usize, 2usize, 5usize, 7usize, 16usize, true),
            (4, 1, 9, 9, 64, true),
            (9, 3, 1, 13, 64, true),
            (4, 2, 17, 17, 32, false),
        ] {
            let b = 2;
            let mk = |h: usize, s: usize, rng: &mut Rng| {
                Tensor::from_f32(&dev, &rng.vec(b * h * s * d), &[b, h, s, d], dt)
                    .unwrap()
                    .variable()
            };
            let q = mk(heads, sq, &mut rng);
            let k = mk(kv, skv, &mut rng);
            let v = mk(kv, skv, &mut rng);
            let g = Tensor::from_f32(&dev, &rng.vec(b * heads * sq * d), &[b, heads, sq, d], dt)
                .unwrap();
            let out = Tensor::attention(&q, &k, &v, causal, None).unwrap();
            out.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
            let (kr, vr) = (
                repeat_heads(&k.detach(), heads).variable(),
                repeat_heads(&v.detach(), heads).variable(),
            );
            let q2 = q.detach().variable();
            let want = Tensor::attention(&q2, &kr, &vr, causal, None).unwrap();
            want.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
            let what = format!("{dt} heads {heads}/{kv} sq {sq} skv {skv} d {d} causal {causal}");
            let (atol, rtol) = tol(dt);
            let close = |a: &Tensor, b: &Tensor, name: &str| {
                let (a, b) = (a.to_f32_vec().unwrap(), b.to_f32_vec().unwrap());
                assert_eq!(a.len(), b.len(), "{what} {name}");
                for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                    assert!(
                        (x - y).abs() as f64 <= 2.0 * (atol + rtol * y.abs() as f64),
                        "{what} {name}[{i}]: {x} vs {y}"
                    );
                }
            };
            close(&out, &want, "out");
            close(&q.grad().unwrap(), &q2.grad().unwrap(), "dq");
            // Each kv head's gradient sums its group's query heads.
            let sum_groups = |t: Tensor| {
                t.reshape(&[b, kv, heads / kv, skv, d])
                    .unwrap()
                    .sum(2, false)
                    .unwrap()
            };
            close(&k.grad().unwrap(), &sum_groups(kr.grad().unwrap()), "dk");
            close(&v.grad().unwrap(), &sum_groups(vr.grad().unwrap()), "dv");
        }
    }
    // Heads that do not divide are refused, naming the shapes.
    let q = dev.zeros(&[1, 4, 3, 8], DType::F32).unwrap();
    let k = dev.zeros(&[1, 3, 3, 8], DType::F32).unwrap();
    let e = Tensor::attention(&q, &k, &k, false, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("[1, 4, 3, 8]") && e.contains("[1, 3, 3, 8]"),
        "{e}"
    );
}

/// The device's profile is its capabilities in use, and an NVIDIA GPU through Vulkan reports
/// its SM count (`VK_NV_shader_sm_builtins`), which the matmul plan counts waves on.
#[test]
fn hardware_profile_follows_the_capabilities() {
    let dev = device();
    let (hw, caps, info) = (dev.hardware(), dev.caps(), dev.info());
    assert_eq!(hw.cpu, info.is_cpu());
    assert_eq!(
        (hw.f16, hw.coop_f16_16, hw.coop_bf16_16, hw.spirv),
        (caps.f16, caps.coop_matrix_16, caps.coop_bf16_16, caps.spirv)
    );
    // bf16 matrices only in wgrad's own SPIR-V, beside f16 ones.
    assert!(!caps.coop_bf16_16 || (caps.spirv && caps.coop_matrix_16));
    assert_eq!(hw.workgroup_storage, caps.workgroup_storage);
    assert_eq!(hw.subgroups.is_some(), caps.subgroups);
    eprintln!("{}: {hw:?}", info.name);
    if info.name.contains("NVIDIA")
        && info.backend == "Vulkan"
        && std::env::var("WGRAD_CORES").is_err()
    {
        assert!(hw.cores.is_some_and(|c| c > 0), "{hw:?}");
    }
}
