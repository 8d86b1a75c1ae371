//! Every differentiable op's gradient against central finite differences of an f64 CPU
//! version of the op, on small random shapes; optimizer steps against CPU steps; memory
//! release during backward.

mod common;

use common::ops::{binary_case, sample, unary_case};
use common::*;
use wgrad::Activation;
use wgrad::kernels::elementwise::{Binary, Unary};
use wgrad::ops::{AttentionOpts, Conv2dOpts, MatmulOpts};
use wgrad::optim::{Adam, Optimizer, Sgd};
use wgrad::reference as cpu;
use wgrad::{DType, Device, Tensor};

type Gpu<'a> = &'a dyn Fn(&[Tensor]) -> wgrad::Result<Tensor>;
type Cpu<'a> = &'a dyn Fn(&[Vec<f64>]) -> Vec<f64>;

/// Checks d(sum(w * f(x)))/dx for random upstream weights w against central differences of
/// the f64 CPU version (step 1e-5). Inputs flagged false are constants.
fn check(
    dev: &Device,
    name: &str,
    inputs: &[(Vec<f32>, Vec<usize>, bool)],
    gpu: Gpu<'_>,
    cpu_f: Cpu<'_>,
) {
    let ts: Vec<Tensor> = inputs
        .iter()
        .map(|(v, s, g)| {
            let t = Tensor::from_slice(dev, v, s).unwrap();
            if *g { t.variable() } else { t }
        })
        .collect();
    let y = gpu(&ts).unwrap();
    // Upstream weights from a generator of the check's own, seeded by its name.
    let mut rng = Rng::new(
        name.bytes()
            .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64)),
    );
    let w = rng.vec(y.numel());
    let loss = y
        .mul(&Tensor::from_slice(dev, &w, y.shape()).unwrap())
        .unwrap()
        .sum_all()
        .unwrap();
    loss.backward().unwrap();
    let xs: Vec<Vec<f64>> = inputs
        .iter()
        .map(|(v, _, _)| v.iter().map(|&x| x as f64).collect())
        .collect();
    let objective =
        |xs: &[Vec<f64>]| -> f64 { cpu_f(xs).iter().zip(&w).map(|(a, b)| a * *b as f64).sum() };
    assert!(
        (objective(&xs) - loss.to_scalar().unwrap() as f64).abs()
            < 1e-3 * (1.0 + objective(&xs).abs()),
        "{name}: forward differs from the CPU version"
    );
    for (i, (_, _, needs)) in inputs.iter().enumerate() {
        if !*needs {
            continue;
        }
        let g = ts[i]
            .grad()
            .unwrap_or_else(|| panic!("{name}: input {i} got no gradient"))
            .to_f32_vec()
            .unwrap();
        let h = 1e-5;
        let mut num = Vec::with_capacity(g.len());
        for j in 0..xs[i].len() {
            let mut p = xs.to_vec();
            p[i][j] += h;
            let up = objective(&p);
            p[i][j] -= 2.0 * h;
            let down = objective(&p);
            num.push((up - down) / (2.0 * h));
        }
        assert_close_tol(&g, &num, (2e-3, 1e-2), &format!("{name}: d/d input {i}"));
    }
}

fn v(rng: &mut Rng, n: usize) -> Vec<f32> {
    rng.vec(n)
}

/// Values in [0.2, 1.2) (positive domain for log, sqrt, recip, pow).
fn pos(rng: &mut Rng, n: usize) -> Vec<f32> {
    rng.vec(n).into_iter().map(|x| x.abs() + 0.2).collect()
}

/// Values at least 0.05 away from zero (non-smooth points of relu, abs).
fn away(rng: &mut Rng, n: usize) -> Vec<f32> {
    rng.vec(n)
        .into_iter()
        .map(|x| {
            if x.abs() < 0.05 {
                x + 0.1_f32.copysign(x)
            } else {
                x
            }
        })
        .collect()
}

#[test]
fn unary_gradients() {
    let dev = device();
    let mut rng = Rng::new(30);
    for &op in Unary::ALL {
        let case = unary_case(op);
        if !case.differentiable {
            continue;
        }
        // 17 elements take the one-element-a-thread kernels, 20 the four-a-thread ones.
        for n in [17, 20] {
            let x = sample(&mut rng, case.domain, n);
            check(
                &dev,
                case.name,
                &[(x, vec![n], true)],
                &|t| case.run(&t[0]),
                &|x| x[0].iter().map(|&v| case.cpu(v)).collect(),
            );
        }
    }
}

#[test]
fn binary_gradients_with_broadcast() {
    let dev = device();
    let mut rng = Rng::new(31);
    for &op in Binary::ALL {
        let case = binary_case(op);
        if !case.differentiable {
            continue;
        }
        let (name, g, c) = (case.name, case.run, case.cpu);
        for (sa, sb) in [
            (vec![3, 4], vec![3, 4]),
            (vec![3, 4], vec![4]),
            (vec![2, 1, 3], vec![4, 1]),
        ] {
            let na: usize = sa.iter().product();
            let nb: usize = sb.iter().product();
            let a = pos(&mut rng, na);
            let b = pos(&mut rng, nb);
            let out = wgrad::ops::elementwise::broadcast_shape("t", &sa, &sb).unwrap();
            // Both inputs variables, then each alone (the other side's gradient is skipped).
            for (va, vb) in [(true, true), (true, false), (false, true)] {
                let (sa2, sb2, out2) = (sa.clone(), sb.clone(), out.clone());
                check(
                    &dev,
                    &format!("{name} {sa:?} {sb:?} variables {va} {vb}"),
                    &[(a.clone(), sa.clone(), va), (b.clone(), sb.clone(), vb)],
                    &|t| g(&t[0], &t[1]),
                    &move |x| broadcast_apply(&x[0], &sa2, &x[1], &sb2, &out2, c),
                );
            }
        }
    }
}

/// A binary op computes no gradient for an input that needs none: `x * scale` with a
/// constant scale (a loss scaler's) launches fewer kernels in backward than with a variable
/// one, whose gradient is a product and a sum over the broadcast.
#[test]
fn binary_backward_skips_constant_inputs() {
    let dev = device();
    let launches = |scale_grad: bool| {
        let x = Tensor::ones(&dev, &[64, 8], DType::F32).unwrap().variable();
        let mut s = Tensor::full(&dev, &[1], 2.0, DType::F32).unwrap();
        if scale_grad {
            s = s.variable();
        }
        let y = x.mul(&s).unwrap().sum_all().unwrap();
        dev.sync().unwrap();
        let before = dev.dispatch_stats().dispatches;
        y.backward().unwrap();
        let n = dev.dispatch_stats().dispatches - before;
        assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), vec![2.0; 512]);
        if scale_grad {
            assert_eq!(s.grad().unwrap().to_vec::<f32>().unwrap(), vec![512.0]);
        }
        n
    };
    let (constant, variable) = (launches(false), launches(true));
    assert!(
        constant + 2 <= variable,
        "backward launched {constant} kernels with a constant scale, {variable} with a variable one"
    );
}

#[test]
fn select_reduce_layout_gradients() {
    let dev = device();
    let mut rng = Rng::new(32);
    let c: Vec<f32> = (0..12).map(|i| (i % 3 == 0) as u8 as f32).collect();
    let c2 = c.clone();
    check(
        &dev,
        "where",
        &[
            (c.clone(), vec![3, 4], false),
            (v(&mut rng, 12), vec![3, 4], true),
            (v(&mut rng, 4), vec![4], true),
        ],
        &|t| Tensor::where_cond(&t[0], &t[1], &t[2]),
        &move |x| {
            (0..12)
                .map(|i| if c2[i] != 0.0 { x[1][i] } else { x[2][i % 4] })
                .collect()
        },
    );
    let shape = vec![3, 5, 4];
    for axis in 0..3 {
        let (o, l, inn) = (
            shape[..axis].iter().product::<usize>(),
            shape[axis],
            shape[axis + 1..].iter().product::<usize>(),
        );
        check(
            &dev,
            "sum",
            &[(v(&mut rng, 60), shape.clone(), true)],
            &|t| t[0].sum(axis as isize, false),
            &move |x| cpu::reduce(&x[0], o, l, inn, false),
        );
        check(
            &dev,
            "mean",
            &[(v(&mut rng, 60), shape.clone(), true)],
            &|t| t[0].mean(axis as isize, true),
            &move |x| {
                cpu::reduce(&x[0], o, l, inn, false)
                    .into_iter()
                    .map(|s| s / l as f64)
                    .collect()
            },
        );
        check(
            &dev,
            "max",
            &[(v(&mut rng, 60), shape.clone(), true)],
            &|t| t[0].max(axis as isize, false),
            &move |x| cpu::reduce(&x[0], o, l, inn, true),
        );
    }
    check(
        &dev,
        "reshape+sum_all",
        &[(v(&mut rng, 12), vec![3, 4], true)],
        &|t| t[0].reshape(&[2, 6])?.square()?.sum_all(),
        &|x| vec![x[0].iter().map(|v| v * v).sum()],
    );
    check(
        &dev,
        "permute",
        &[(v(&mut rng, 24), vec![2, 3, 4], true)],
        &|t| t[0].permute(&[2, 0, 1]),
        &|x| {
            let mut out = Vec::new();
            for a in 0..4 {
                for b in 0..2 {
                    for c in 0..3 {
                        out.push(x[0][(b * 3 + c) * 4 + a]);
                    }
                }
            }
            out
        },
    );
    check(
        &dev,
        "broadcast_to",
        &[(v(&mut rng, 3), vec![3, 1], true)],
        &|t| t[0].broadcast_to(&[2, 3, 4]),
        &|x| (0..24).map(|i| x[0][(i / 4) % 3]).collect(),
    );
    check(
        &dev,
        "narrow",
        &[(v(&mut rng, 20), vec![4, 5], true)],
        &|t| t[0].narrow(1, 1, 3),
        &|x| {
            (0..4)
                .flat_map(|r| x[0][r * 5 + 1..r * 5 + 4].to_vec())
                .collect()
        },
    );
    check(
        &dev,
        "cat",
        &[
            (v(&mut rng, 6), vec![2, 3], true),
            (v(&mut rng, 4), vec![2, 2], true),
        ],
        &|t| Tensor::cat(&[&t[0], &t[1]], 1),
        &|x| {
            (0..2)
                .flat_map(|r| {
                    x[0][r * 3..r * 3 + 3]
                        .iter()
                        .chain(&x[1][r * 2..r * 2 + 2])
                        .cloned()
                        .collect::<Vec<_>>()
                })
                .collect()
        },
    );
}

#[test]
fn matmul_gradients() {
    matmul_gradient_cases(&device());
}

/// The same checks with every f32 product split into f16 parts (`MatmulPrecision::High`,
/// forced on every adapter), forward and backward.
#[test]
fn split_f32_matmul_gradients() {
    wgrad::ops::matmul::split_everywhere(|| matmul_gradient_cases(&device()));
}

fn matmul_gradient_cases(dev: &Device) {
    let mut rng = Rng::new(33);
    let (m, n, k) = (5, 7, 3);
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let sa = if ta { vec![k, m] } else { vec![m, k] };
        let sb = if tb { vec![n, k] } else { vec![k, n] };
        check(
            dev,
            &format!("matmul ta={ta} tb={tb} +bias relu"),
            &[
                (away(&mut rng, m * k), sa, true),
                (v(&mut rng, k * n), sb, true),
                (v(&mut rng, n), vec![n], true),
            ],
            &move |t| {
                t[0].matmul_with(
                    &t[1],
                    MatmulOpts {
                        trans_a: ta,
                        trans_b: tb,
                        bias: Some(&t[2]),
                        act: Some(Activation::Relu),
                    },
                )
            },
            &move |x| {
                cpu::matmul(
                    &x[0],
                    &x[1],
                    Some(&x[2]),
                    m,
                    n,
                    k,
                    ta,
                    tb,
                    Some(Activation::Relu),
                )
            },
        );
    }
    check(
        dev,
        "matmul gelu (unfused when recording)",
        &[
            (v(&mut rng, 12), vec![3, 4], true),
            (v(&mut rng, 8), vec![4, 2], true),
        ],
        &|t| {
            t[0].matmul_with(
                &t[1],
                MatmulOpts {
                    act: Some(Activation::Gelu),
                    ..Default::default()
                },
            )
        },
        &|x| {
            cpu::matmul(
                &x[0],
                &x[1],
                None,
                3,
                2,
                4,
                false,
                false,
                Some(Activation::Gelu),
            )
        },
    );
    // Batched with B broadcast over the batch.
    check(
        dev,
        "batched matmul",
        &[
            (v(&mut rng, 2 * 3 * 4), vec![2, 3, 4], true),
            (v(&mut rng, 4 * 5), vec![4, 5], true),
        ],
        &|t| t[0].matmul(&t[1]),
        &|x| {
            (0..2)
                .flat_map(|b| {
                    cpu::matmul(
                        &x[0][b * 12..(b + 1) * 12],
                        &x[1],
                        None,
                        3,
                        5,
                        4,
                        false,
                        false,
                        None,
                    )
                })
                .collect()
        },
    );
    // A linear layer on [batch, seq, in]: the rows fold into one product, forward and
    // backward (the bias's gradient summed inside the weight gradient's product); then the
    // same on a permuted view whose leading axes do not chain, which runs batched instead.
    let (x, w, bias) = (v(&mut rng, 24), v(&mut rng, 20), v(&mut rng, 5));
    let linear_cpu = |x: &[f64], w: &[f64], b: &[f64]| -> Vec<f64> {
        cpu::matmul(x, w, Some(b), 6, 5, 4, false, true, Some(Activation::Relu))
    };
    for permuted in [false, true] {
        let shape = if permuted {
            vec![3, 2, 4]
        } else {
            vec![2, 3, 4]
        };
        check(
            dev,
            &format!("linear on rank 3, permuted={permuted}"),
            &[
                (x.clone(), shape, true),
                (w.clone(), vec![5, 4], true),
                (bias.clone(), vec![5], true),
            ],
            &move |t| {
                let x = if permuted {
                    t[0].permute(&[1, 0, 2])?
                } else {
                    t[0].clone()
                };
                x.matmul_with(
                    &t[1],
                    MatmulOpts {
                        trans_b: true,
                        bias: Some(&t[2]),
                        act: Some(Activation::Relu),
                        ..Default::default()
                    },
                )
            },
            &move |t| {
                // The permuted view's rows, in its own order: (i, j) reads stored row (j, i).
                let rows: Vec<f64> = (0..6)
                    .flat_map(|r| {
                        let s = if permuted { (r % 3) * 2 + r / 3 } else { r };
                        t[0][s * 4..s * 4 + 4].to_vec()
                    })
                    .collect();
                linear_cpu(&rows, &t[1], &t[2])
            },
        );
    }
}

/// Finite-difference check of conv2d with bias (and `opts.act`) on random x, w and bias of
/// the window's shape, against the f64 reference.
fn check_conv2d(
    dev: &Device,
    rng: &mut Rng,
    name: &str,
    win: cpu::Window,
    o: usize,
    opts: Conv2dOpts,
) {
    let (n, c, h, w, k, groups) = (win.n, win.c, win.h, win.w, win.k, opts.groups);
    check(
        dev,
        name,
        &[
            (v(rng, n * c * h * w), vec![n, c, h, w], true),
            (
                v(rng, o * c / groups * k.0 * k.1),
                vec![o, c / groups, k.0, k.1],
                true,
            ),
            (v(rng, o), vec![o], true),
        ],
        &move |t| t[0].conv2d(&t[1], Some(&t[2]), opts),
        &move |x| {
            cpu::conv2d(&x[0], &x[1], Some(&x[2]), &win, o, groups)
                .into_iter()
                .map(|v| opts.act.map_or(v, |a| cpu::activation(a, v)))
                .collect()
        },
    );
}

#[test]
fn conv_and_pool_gradients() {
    let dev = device();
    let mut rng = Rng::new(34);
    for (n, c, h, w, o, k, stride, pad, groups) in [
        (2, 2, 5, 6, 3, (3, 3), (1, 1), (1, 1), 1),
        (1, 4, 7, 5, 2, (3, 2), (2, 1), (0, 1), 2),
    ] {
        let win = cpu::Window {
            n,
            c,
            h,
            w,
            k,
            stride,
            pad,
            dil: (1, 1),
        };
        // Plain, with a ReLU fused into the product (its gradient from the saved output), and
        // with an activation the epilogue does not have (run as its own op).
        for act in [None, Some(Activation::Relu), Some(Activation::Tanh)] {
            let opts = Conv2dOpts {
                stride,
                padding: pad,
                dilation: (1, 1),
                groups,
                act,
            };
            check_conv2d(
                &dev,
                &mut rng,
                &format!("conv2d groups={groups} {act:?}"),
                win,
                o,
                opts,
            );
        }
    }
    let win = cpu::Window {
        n: 2,
        c: 2,
        h: 6,
        w: 5,
        k: (2, 2),
        stride: (2, 1),
        pad: (0, 1),
        dil: (1, 1),
    };
    // Distinct values so each window has one maximum.
    let x: Vec<f32> = (0..120)
        .map(|i| ((i * 37) % 120) as f32 / 120.0 - 0.5)
        .collect();
    // Windows that tile the input exactly take their own backward kernel.
    let tiled = cpu::Window {
        n: 2,
        c: 3,
        h: 4,
        w: 6,
        k: (2, 2),
        stride: (2, 2),
        pad: (0, 0),
        dil: (1, 1),
    };
    let xt: Vec<f32> = (0..144)
        .map(|i| ((i * 53) % 144) as f32 / 144.0 - 0.5)
        .collect();
    check(
        &dev,
        "max_pool2d tiled",
        &[(xt, vec![2, 3, 4, 6], true)],
        &|t| t[0].max_pool2d((2, 2), (2, 2), (0, 0)),
        &move |x| cpu::pool2d(&x[0], &tiled, true),
    );
    check(
        &dev,
        "max_pool2d",
        &[(x, vec![2, 2, 6, 5], true)],
        &|t| t[0].max_pool2d((2, 2), (2, 1), (0, 1)),
        &move |x| cpu::pool2d(&x[0], &win, true),
    );
    check(
        &dev,
        "avg_pool2d",
        &[(v(&mut rng, 120), vec![2, 2, 6, 5], true)],
        &|t| t[0].avg_pool2d((2, 2), (2, 1), (0, 1)),
        &move |x| cpu::pool2d(&x[0], &win, false),
    );
}

/// Convolution gradients through the implicit products (forced `reg`, from channels-last
/// copies with one group and planar images with two): the weight's from a gathered col^T,
/// the input's for stride 1 as a convolution with the flipped weight, and for stride 2
/// through col2im.
#[test]
fn implicit_conv_gradients() {
    use wgrad::kernels::matmul::{Config, forced};
    let dev = device();
    let mut rng = Rng::new(35);
    // (n, c, h, w, o, k, stride, pad, dil, groups)
    for (n, c, h, w, o, k, stride, pad, dil, groups) in [
        (2, 4, 6, 6, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1),
        (1, 8, 7, 8, 8, (3, 3), (1, 1), (2, 2), (2, 2), 2),
        (1, 4, 7, 6, 4, (2, 2), (2, 2), (0, 1), (1, 1), 1),
        (2, 4, 5, 3, 3, (1, 1), (1, 1), (0, 0), (1, 1), 1),
        // Few channels and more output positions than a tile holds: 380 in `reg`'s 64 x 128
        // tiles, 256 in one 64 x 256 tile (kernels/matmul.rs `out_tile`).
        (1, 4, 20, 19, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1),
        (1, 4, 16, 16, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1),
        // Channels last in runs of 4 (not 8) with dilation, forward and both gradients.
        (1, 12, 9, 8, 8, (3, 3), (1, 1), (2, 2), (2, 2), 1),
    ] {
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
        let opts = Conv2dOpts {
            stride,
            padding: pad,
            dilation: dil,
            groups,
            act: Some(Activation::Relu),
        };
        forced(Config::Reg, || {
            check_conv2d(
                &dev,
                &mut rng,
                &format!("implicit conv2d {:?}", (n, c, h, w, o, k, stride, pad, dil)),
                win,
                o,
                opts,
            )
        })
        .unwrap();
    }
    // Chunks of one image (a budget of one byte for transient buffers): channels-last copies
    // (one group), planar images at each chunk's offset (two groups) and column matrices,
    // the weight's gradient summed over three chunks.
    for (groups, im2col) in [(1, false), (2, false), (1, true)] {
        let (n, c, h, w, o, k) = (3, 4, 6, 4, 4, (3, 3));
        let win = cpu::Window {
            n,
            c,
            h,
            w,
            k,
            stride: (1, 1),
            pad: (1, 1),
            dil: (1, 1),
        };
        let opts = Conv2dOpts {
            padding: (1, 1),
            groups,
            act: Some(Activation::Relu),
            ..Default::default()
        };
        let name = format!("conv2d in one-image chunks, groups {groups}, im2col {im2col}");
        let mut run = || {
            forced(Config::Reg, || {
                check_conv2d(&dev, &mut rng, &name, win, o, opts);
            })
            .unwrap()
        };
        wgrad::ops::conv::with_col_budget(1, || {
            if im2col {
                wgrad::ops::conv::with_im2col(run)
            } else {
                run()
            }
        });
    }
}

/// A linear layer's bias gradient (the output gradient's column sums) summed by the weight
/// gradient's product where `wide` runs it (RSUM: no column-sum pass), with 128 x 128,
/// 256 x 128 and 128 x 256 tiles (forced), in one K range (300 rows) and split into partial sums (4160),
/// at sizes off the tiles (264 outputs, 136 inputs); 65 outputs take the padded product and
/// sum apart; f16 and bf16 (where the device has bf16 matrices). Against f64 sums of the
/// seed gradient r: db = r's column sums, dW = r^T x, dx = r W.
#[test]
fn linear_bias_gradient_in_the_weight_product() {
    for dt in [DType::F16, DType::BF16] {
        linear_bias_gradient_case(dt);
    }
}

fn linear_bias_gradient_case(dt: DType) {
    use wgrad::kernels::matmul::{Config, forced};
    let dev = poisoned();
    let wide = runs_wide_for(&dev, dt);
    let mut rng = Rng::new(41);
    for config in [
        None,
        Some(Config::CoopWide),
        Some(Config::CoopWideTall),
        Some(Config::CoopWideFlat),
        Some(Config::CoopWideMid),
    ] {
        for (rows, inp, out) in [(300, 136, 264), (4160, 136, 264), (40, 24, 65)] {
            let name = format!("{config:?} {rows} x {inp} -> {out} {dt}");
            let (xv, wv, bv, rv) = (
                rng.vec(rows * inp),
                rng.vec(out * inp),
                rng.vec(out),
                rng.vec(rows * out),
            );
            let x = tensor(&dev, &xv, &[rows, inp], dt).variable();
            let w = tensor(&dev, &wv, &[out, inp], dt).variable();
            let b = tensor(&dev, &bv, &[out], dt).variable();
            let r = tensor(&dev, &rv, &[rows, out], dt);
            let run = || x.linear(&w, Some(&b)).unwrap().backward_with(&r).unwrap();
            let ((), ran) = ran_kernels(&dev, || match config {
                Some(c) => forced(c, run).unwrap(),
                None => run(),
            });
            if wide && out % 8 == 0 {
                assert!(
                    !ran.iter().any(|k| k.starts_with("Reduce/")),
                    "{name}: kernels {ran:?}"
                );
            }
            let (xr, wr, rr) = (rounded(&xv, dt), rounded(&wv, dt), rounded(&rv, dt));
            let mut dx = vec![0.0f64; rows * inp];
            let mut dw = vec![0.0f64; out * inp];
            let mut db = vec![0.0f64; out];
            for i in 0..rows {
                for o in 0..out {
                    let g = rr[i * out + o];
                    db[o] += g;
                    for c in 0..inp {
                        dx[i * inp + c] += g * wr[o * inp + c];
                        dw[o * inp + c] += g * xr[i * inp + c];
                    }
                }
            }
            let t = tol(dt);
            for (what, got, want) in [("db", &b, &db), ("dW", &w, &dw), ("dx", &x, &dx)] {
                assert_close_tol(
                    &got.grad().unwrap().to_f32_vec().unwrap(),
                    want,
                    (t.0 * 10.0, t.1),
                    &format!("{name}: {what}"),
                );
            }
        }
    }
}

/// f16 convolution gradients on tensor cores, with `wide` gathering channels-last images
/// where the adapter runs it (forced; elsewhere the usual path, still checked): the input's
/// gradient for stride 1 is a mirrored implicit convolution (no col2im), stride 2 and a
/// channel count off 8 fall back; the weight's gathers channels-last columns where the
/// output has a multiple of 8 positions (no im2col). L = sum(conv(x, w) * r) is linear, so its gradients are
/// sums the f64 reference adds up directly: dx from r and w, dw from r and x.
#[test]
fn channels_last_conv_gradients() {
    use wgrad::kernels::matmul::{Config, forced};
    let dev = device();
    let dt = DType::F16;
    let wide = runs_wide(&dev);
    let mut rng = Rng::new(36);
    // (n, c, h, w, o, k, stride, pad, dil)
    for (n, c, h, w, o, k, stride, pad, dil) in [
        (2, 8, 6, 7, 8, (3, 3), (1, 1), (1, 1), (1, 1)),
        (1, 16, 9, 8, 24, (3, 3), (1, 1), (2, 2), (2, 2)),
        (2, 8, 5, 3, 16, (1, 1), (1, 1), (0, 0), (1, 1)),
        (1, 8, 7, 6, 8, (2, 2), (2, 2), (0, 1), (1, 1)),
        (1, 8, 6, 6, 12, (3, 3), (1, 1), (1, 1), (1, 1)),
        (2, 24, 10, 12, 16, (3, 3), (1, 1), (1, 1), (1, 1)),
        (1, 8, 20, 4, 8, (3, 3), (1, 1), (1, 1), (1, 1)),
        (1, 8, 16, 16, 8, (3, 3), (2, 2), (1, 1), (1, 1)),
    ] {
        let name = format!("{:?}", (n, c, h, w, o, k, stride, pad, dil));
        let ho = (h + 2 * pad.0 - dil.0 * (k.0 - 1) - 1) / stride.0 + 1;
        let wo = (w + 2 * pad.1 - dil.1 * (k.1 - 1) - 1) / stride.1 + 1;
        let (xv, wv, rv) = (
            rng.vec(n * c * h * w),
            rng.vec(o * c * k.0 * k.1),
            rng.vec(n * o * ho * wo),
        );
        let x = tensor(&dev, &xv, &[n, c, h, w], dt).variable();
        let wt = tensor(&dev, &wv, &[o, c, k.0, k.1], dt).variable();
        let r = tensor(&dev, &rv, &[n, o, ho, wo], dt);
        let opts = Conv2dOpts {
            stride,
            padding: pad,
            dilation: dil,
            ..Default::default()
        };
        let ((), ran) = ran_kernels(&dev, || {
            forced(Config::CoopWide, || {
                x.conv2d(&wt, None, opts)
                    .unwrap()
                    .mul(&r)
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .backward()
                    .unwrap()
            })
            .unwrap()
        });
        if wide {
            // The weight's gradient gathers where dy's rows are runs of 8 positions.
            let mirrored = stride == (1, 1) && o % 8 == 0;
            let gathered_dw = (ho * wo) % 8 == 0;
            assert_eq!(
                ran.iter().any(|k| k.contains("col2im")),
                !mirrored,
                "{name}: kernels {ran:?}"
            );
            assert_eq!(
                ran.iter().any(|k| k.contains("im2col")),
                !gathered_dw,
                "{name}: kernels {ran:?}"
            );
        }
        let (xr, wr, rr) = (rounded(&xv, dt), rounded(&wv, dt), rounded(&rv, dt));
        let mut dx = vec![0.0f64; xv.len()];
        let mut dw = vec![0.0f64; wv.len()];
        for b in 0..n {
            for oc in 0..o {
                for oh in 0..ho {
                    for ow in 0..wo {
                        let g = rr[((b * o + oc) * ho + oh) * wo + ow];
                        for ci in 0..c {
                            for ki in 0..k.0 {
                                for kj in 0..k.1 {
                                    let ih = (oh * stride.0 + ki * dil.0) as isize - pad.0 as isize;
                                    let iw = (ow * stride.1 + kj * dil.1) as isize - pad.1 as isize;
                                    if ih < 0 || iw < 0 || ih as usize >= h || iw as usize >= w {
                                        continue;
                                    }
                                    let xi = ((b * c + ci) * h + ih as usize) * w + iw as usize;
                                    let wi = ((oc * c + ci) * k.0 + ki) * k.1 + kj;
                                    dx[xi] += g * wr[wi];
                                    dw[wi] += g * xr[xi];
                                }
                            }
                        }
                    }
                }
            }
        }
        let t = tol(dt);
        assert_close_tol(
            &x.grad().unwrap().to_f32_vec().unwrap(),
            &dx,
            (t.0 * 10.0, t.1),
            &format!("f16 conv2d dx {name}"),
        );
        assert_close_tol(
            &wt.grad().unwrap().to_f32_vec().unwrap(),
            &dw,
            (t.0 * 25.0, t.1 * 2.0),
            &format!("f16 conv2d dw {name}"),
        );
    }
}

#[test]
fn softmax_norm_loss_gradients() {
    let dev = device();
    let mut rng = Rng::new(35);
    check(
        &dev,
        "softmax",
        &[(v(&mut rng, 15), vec![3, 5], true)],
        &|t| t[0].softmax(),
        &|x| cpu::softmax(&x[0], 3, 5, false),
    );
    check(
        &dev,
        "log_softmax",
        &[(v(&mut rng, 15), vec![3, 5], true)],
        &|t| t[0].log_softmax(),
        &|x| cpu::softmax(&x[0], 3, 5, true),
    );
    check(
        &dev,
        "layer_norm",
        &[
            (v(&mut rng, 18), vec![3, 6], true),
            (v(&mut rng, 6), vec![6], true),
            (v(&mut rng, 6), vec![6], true),
        ],
        &|t| t[0].layer_norm(&t[1], &t[2], 1e-5),
        &|x| cpu::norm(&x[0], &x[1], Some(&x[2]), 3, 6, 1e-5),
    );
    check(
        &dev,
        "rms_norm",
        &[
            (v(&mut rng, 18), vec![3, 6], true),
            (v(&mut rng, 6), vec![6], true),
        ],
        &|t| t[0].rms_norm(&t[1], 1e-5),
        &|x| cpu::norm(&x[0], &x[1], None, 3, 6, 1e-5),
    );
    // A residual stream: x feeds the norm and the skip connection, and the norm's dx kernel
    // adds the skip's gradient (rows of 6 and of 8 take different dx entries).
    for len in [6usize, 8] {
        for rms in [false, true] {
            let n = 3 * len;
            let mut inputs = vec![
                (v(&mut rng, n), vec![3, len], true),
                (v(&mut rng, len), vec![len], true),
            ];
            if !rms {
                inputs.push((v(&mut rng, len), vec![len], true));
            }
            check(
                &dev,
                &format!("x + norm(x), len {len}, rms {rms}"),
                &inputs,
                &|t| {
                    let y = if t.len() == 3 {
                        t[0].layer_norm(&t[1], &t[2], 1e-5)?
                    } else {
                        t[0].rms_norm(&t[1], 1e-5)?
                    };
                    t[0].add(&y)
                },
                &move |x| {
                    let beta = x.get(2).map(|b| b.as_slice());
                    let y = cpu::norm(&x[0], &x[1], beta, 3, len, 1e-5);
                    x[0].iter().zip(&y).map(|(a, b)| a + b).collect()
                },
            );
        }
    }
    let labels = [2u32, 0, 4, 1];
    let l = Tensor::from_slice(&dev, &labels, &[4]).unwrap();
    check(
        &dev,
        "cross_entropy",
        &[(v(&mut rng, 20), vec![4, 5], true)],
        &|t| t[0].cross_entropy(&l),
        &move |x| vec![cpu::cross_entropy(&x[0], &labels, 4, 5).iter().sum::<f64>() / 4.0],
    );
    let labels = [2u32, 0, 4, 4];
    let l = Tensor::from_slice(&dev, &labels, &[4]).unwrap();
    check(
        &dev,
        "linear_cross_entropy",
        &[
            (v(&mut rng, 24), vec![4, 6], true),
            (v(&mut rng, 30), vec![5, 6], true),
        ],
        &|t| t[0].linear_cross_entropy(&t[1], &l),
        &move |x| {
            let logits = cpu::matmul(&x[0], &x[1], None, 4, 5, 6, false, true, None);
            vec![
                cpu::cross_entropy(&logits, &labels, 4, 5)
                    .iter()
                    .sum::<f64>()
                    / 4.0,
            ]
        },
    );
    check(
        &dev,
        "mse",
        &[
            (v(&mut rng, 6), vec![2, 3], true),
            (v(&mut rng, 6), vec![2, 3], true),
        ],
        &|t| t[0].mse_loss(&t[1]),
        &|x| {
            vec![
                x[0].iter()
                    .zip(&x[1])
                    .map(|(a, b)| (a - b) * (a - b))
                    .sum::<f64>()
                    / 6.0,
            ]
        },
    );
}

/// The residual stream's two gradients meet inside the norm's dx kernel: in the backward of
/// sum(w * (x + layer_norm(x))) the only add is the product's, before the norm's (the
/// values are checked by `softmax_norm_loss_gradients`' x + norm(x) cases).
#[test]
fn norm_backward_adds_the_skip_gradient() {
    let dev = device();
    let x = Tensor::randn(&dev, &[16, 32], 0.0, 1.0, DType::F32)
        .unwrap()
        .variable();
    let g = Tensor::ones(&dev, &[32], DType::F32).unwrap().variable();
    let b = Tensor::zeros(&dev, &[32], DType::F32).unwrap().variable();
    let w = Tensor::randn(&dev, &[16, 32], 0.0, 1.0, DType::F32).unwrap();
    let y = x.add(&x.layer_norm(&g, &b, 1e-5).unwrap()).unwrap();
    let loss = y.mul(&w).unwrap().sum_all().unwrap();
    dev.sync().unwrap();
    dev.start_profiling().unwrap();
    loss.backward().unwrap();
    let ran: Vec<String> = dev
        .stop_profiling()
        .unwrap()
        .events
        .iter()
        .map(|e| e.kernel.to_string())
        .collect();
    let norm = ran.iter().position(|k| k.starts_with("Norm/bwd_x"));
    let adds: Vec<usize> = (0..ran.len())
        .filter(|&i| ran[i].starts_with("Elementwise/binary"))
        .collect();
    assert!(
        norm.is_some() && adds.iter().all(|&i| Some(i) < norm),
        "an add after the norm's dx: {ran:?}"
    );
}

#[test]
fn attention_gradients() {
    let dev = device();
    let mut rng = Rng::new(36);
    for (bh, s, d, causal) in [(2, 3, 4, false), (1, 5, 8, true), (2, 17, 4, true)] {
        let n = bh * s * d;
        check(
            &dev,
            &format!("attention s={s} d={d} causal={causal}"),
            &[
                (v(&mut rng, n), vec![bh, s, d], true),
                (v(&mut rng, n), vec![bh, s, d], true),
                (v(&mut rng, n), vec![bh, s, d], true),
            ],
            &move |t| Tensor::attention(&t[0], &t[1], &t[2], causal, None),
            &move |x| {
                cpu::attention(
                    &x[0],
                    &x[1],
                    &x[2],
                    bh,
                    s,
                    s,
                    d,
                    causal,
                    1.0 / (d as f64).sqrt(),
                )
            },
        );
    }
}

/// Dropout on the attention weights: with a fixed seed the mask is a fixed function of the
/// inputs' positions, so finite differences of the CPU twin check the recomputed mask too.
#[test]
fn attention_dropout_gradients() {
    let dev = device();
    let mut rng = Rng::new(38);
    let seed = 0x9abc_def0_1234_5678u64;
    for (bh, s, d, causal) in [(2, 5, 4, false), (1, 17, 8, true)] {
        let n = bh * s * d;
        check(
            &dev,
            &format!("attention dropout s={s} d={d} causal={causal}"),
            &[
                (v(&mut rng, n), vec![bh, s, d], true),
                (v(&mut rng, n), vec![bh, s, d], true),
                (v(&mut rng, n), vec![bh, s, d], true),
            ],
            &move |t| {
                let opts = AttentionOpts {
                    causal,
                    dropout: 0.3,
                    seed: Some(seed),
                    ..Default::default()
                };
                Tensor::attention_with(&t[0], &t[1], &t[2], opts)
            },
            &move |x| {
                cpu::attention_dropout(
                    &x[0],
                    &x[1],
                    &x[2],
                    bh,
                    s,
                    s,
                    d,
                    causal,
                    1.0 / (d as f64).sqrt(),
                    &|r, j| cpu::attention_keep(0.3, seed, r, j),
                )
            },
        );
    }
}

#[test]
fn embedding_dropout_cast_gradients() {
    let dev = device();
    let mut rng = Rng::new(37);
    let idx = [3u32, 0, 3, 1, 4];
    let it = Tensor::from_slice(&dev, &idx, &[5]).unwrap();
    check(
        &dev,
        "embedding (repeated rows accumulate)",
        &[(v(&mut rng, 15), vec![5, 3], true)],
        &|t| t[0].embedding(&it),
        &move |x| {
            idx.iter()
                .flat_map(|&i| x[0][i as usize * 3..i as usize * 3 + 3].to_vec())
                .collect()
        },
    );
    // Dropout: the gradient is the mask times 1/(1-p), the same mask as the forward pass.
    let x = Tensor::from_slice(&dev, &pos(&mut rng, 1000), &[1000])
        .unwrap()
        .variable();
    let y = x.dropout(0.4).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    let (yv, xv, g) = (
        y.to_vec::<f32>().unwrap(),
        x.to_vec::<f32>().unwrap(),
        x.grad().unwrap().to_vec::<f32>().unwrap(),
    );
    for i in 0..1000 {
        assert!(
            (g[i] - yv[i] / xv[i]).abs() < 1e-4,
            "dropout grad at {i}: {} vs {}",
            g[i],
            yv[i] / xv[i]
        );
    }
    // Cast to f16 and back: the gradient passes through (rounded to f16 on the way).
    let x = Tensor::from_slice(&dev, &v(&mut rng, 17), &[17])
        .unwrap()
        .variable();
    let w = v(&mut rng, 17);
    let y = x
        .to_dtype(DType::F16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    y.mul(&Tensor::from_slice(&dev, &w, &[17]).unwrap())
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_close(
        &x.grad().unwrap().to_vec::<f32>().unwrap(),
        &rounded(&w, DType::F16),
        DType::F16,
        "cast gradient",
    );
}

#[test]
fn gradients_accumulate_and_graph_is_consumed() {
    let dev = device();
    let x = Tensor::from_slice(&dev, &[1.0f32, 2.0, 3.0], &[3])
        .unwrap()
        .variable();
    for _ in 0..2 {
        x.square().unwrap().sum_all().unwrap().backward().unwrap();
    }
    assert_eq!(
        x.grad().unwrap().to_vec::<f32>().unwrap(),
        vec![4.0, 8.0, 12.0]
    );
    let y = x.exp().unwrap().sum_all().unwrap();
    y.backward().unwrap();
    assert!(
        y.backward().is_err(),
        "a second backward through a consumed graph is an error"
    );
    // no_grad records nothing.
    let z = wgrad::no_grad(|| x.square().unwrap());
    assert!(!z.requires_grad());
    assert!(
        x.detach()
            .square()
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .is_err()
    );
}

/// The backward pass releases each activation once its gradient is computed: the peak during
/// backward stays within the activations already held plus the parameter gradients plus one
/// layer's worth of temporaries, instead of doubling.
#[test]
fn backward_frees_activations() {
    let dev = device_with(|o| o.no_cache = false);
    let (batch, width, layers) = (512, 64, 8);
    let ws: Vec<Tensor> = (0..layers)
        .map(|_| {
            Tensor::randn(&dev, &[width, width], 0.0, 0.1, DType::F32)
                .unwrap()
                .variable()
        })
        .collect();
    let x = dev.randn(&[batch, width], DType::F32).unwrap();
    let mut h = x.clone();
    for w in &ws {
        h = h.matmul(w).unwrap().relu().unwrap();
    }
    let loss = h.mean_all().unwrap();
    dev.sync().unwrap();
    let before = dev.memory_stats().allocated;
    dev.reset_peak();
    loss.backward().unwrap();
    drop(loss);
    drop(h);
    dev.sync().unwrap();
    let s = dev.memory_stats();
    let act = (batch * width * 4) as u64;
    let param_grads = (layers * width * width * 4) as u64;
    let rise = s.peak_allocated - before;
    assert!(
        rise <= param_grads + 4 * act,
        "backward peak rose by {rise} B: more than parameter grads ({param_grads}) + 4 activations ({act} each)"
    );
    // Everything but the inputs, weights and their gradients is gone afterwards.
    let kept = (layers * width * width * 4 * 2 + batch * width * 4) as u64;
    assert!(
        s.allocated <= kept + 4096,
        "{} B still allocated after backward (expected about {kept})",
        s.allocated
    );
}

fn sgd_cpu(w: &mut [f64], g: &[f64], buf: &mut [f64], lr: f64, mom: f64, wd: f64, nesterov: bool) {
    for i in 0..w.len() {
        let gi = g[i] + wd * w[i];
        buf[i] = mom * buf[i] + gi;
        let d = if nesterov { gi + mom * buf[i] } else { buf[i] };
        w[i] -= lr * d;
    }
}

#[test]
fn optimizers_match_cpu_steps() {
    let dev = device();
    let mut rng = Rng::new(38);
    let n = 37;
    for (nesterov, wd) in [(false, 0.0), (true, 0.01)] {
        let w0 = v(&mut rng, n);
        let p = Tensor::from_slice(&dev, &w0, &[n]).unwrap().variable();
        let mut opt = Sgd::new(vec![("p".into(), p.clone())], 0.1, 0.9, wd, nesterov).unwrap();
        let (mut w, mut buf): (Vec<f64>, Vec<f64>) =
            (w0.iter().map(|&x| x as f64).collect(), vec![0.0; n]);
        for _ in 0..3 {
            let g = v(&mut rng, n);
            p.set_grad(Some(Tensor::from_slice(&dev, &g, &[n]).unwrap()));
            opt.step().unwrap();
            sgd_cpu(
                &mut w,
                &g.iter().map(|&x| x as f64).collect::<Vec<_>>(),
                &mut buf,
                0.1,
                0.9,
                wd as f64,
                nesterov,
            );
        }
        assert_close(
            &p.to_vec::<f32>().unwrap(),
            &w,
            DType::F32,
            &format!("sgd nesterov={nesterov} wd={wd}"),
        );
    }
    for (decoupled, wd) in [(false, 0.0), (false, 0.05), (true, 0.05)] {
        let w0 = v(&mut rng, n);
        let p = Tensor::from_slice(&dev, &w0, &[n]).unwrap().variable();
        let mut opt = if decoupled {
            Adam::adamw(vec![("p".into(), p.clone())], 0.01, wd).unwrap()
        } else {
            Adam::with(
                vec![("p".into(), p.clone())],
                0.01,
                (0.9, 0.999),
                1e-8,
                wd,
                false,
            )
            .unwrap()
        };
        let mut w: Vec<f64> = w0.iter().map(|&x| x as f64).collect();
        let (mut m, mut vv) = (vec![0.0f64; n], vec![0.0f64; n]);
        for t in 1..=3 {
            let g = v(&mut rng, n);
            p.set_grad(Some(Tensor::from_slice(&dev, &g, &[n]).unwrap()));
            opt.step().unwrap();
            for i in 0..n {
                let mut gi = g[i] as f64;
                if decoupled {
                    w[i] -= 0.01 * wd as f64 * w[i];
                } else {
                    gi += wd as f64 * w[i];
                }
                m[i] = 0.9 * m[i] + 0.1 * gi;
                vv[i] = 0.999 * vv[i] + 0.001 * gi * gi;
                let mh = m[i] / (1.0 - 0.9f64.powi(t));
                let vh = vv[i] / (1.0 - 0.999f64.powi(t));
                w[i] -= 0.01 * mh / (vh.sqrt() + 1e-8);
            }
        }
        assert_close(
            &p.to_vec::<f32>().unwrap(),
            &w,
            DType::F32,
            &format!("adam decoupled={decoupled} wd={wd}"),
        );
    }
}

/// The optimizers' rules in f64: one step of element `i` given its gradient `g`; the state is
/// (momentum buffer) for SGD and (m, v) for Adam; `t` counts from 1.
#[derive(Clone, Copy, Debug)]
enum CpuRule {
    Sgd { mom: f64, wd: f64, nesterov: bool },
    Adam { wd: f64, decoupled: bool },
}

impl CpuRule {
    const LR: f64 = 0.01;

    fn make(self, params: Vec<(String, Tensor)>) -> Box<dyn Optimizer> {
        let lr = Self::LR as f32;
        match self {
            CpuRule::Sgd { mom, wd, nesterov } => {
                Box::new(Sgd::new(params, lr, mom as f32, wd as f32, nesterov).unwrap())
            }
            CpuRule::Adam { wd, decoupled } => {
                Box::new(Adam::with(params, lr, (0.9, 0.999), 1e-8, wd as f32, decoupled).unwrap())
            }
        }
    }

    fn step(self, w: &mut f64, g: f64, s: &mut [f64; 2], t: i32) {
        let lr = Self::LR;
        match self {
            CpuRule::Sgd { mom, wd, nesterov } => {
                let gi = g + wd * *w;
                if mom > 0.0 {
                    s[0] = mom * s[0] + gi;
                    *w -= lr * if nesterov { gi + mom * s[0] } else { s[0] };
                } else {
                    *w -= lr * gi;
                }
            }
            CpuRule::Adam { wd, decoupled } => {
                let mut gi = g;
                if decoupled {
                    *w -= lr * wd * *w;
                } else {
                    gi += wd * *w;
                }
                s[0] = 0.9 * s[0] + 0.1 * gi;
                s[1] = 0.999 * s[1] + 0.001 * gi * gi;
                let mh = s[0] / (1.0 - 0.9f64.powi(t));
                let vh = s[1] / (1.0 - 0.999f64.powi(t));
                *w -= lr * mh / (vh.sqrt() + 1e-8);
            }
        }
    }
}

/// Several parameters of awkward sizes and mixed dtypes (f16 and bf16 ones with f32 master
/// weights),
/// one without a gradient: every optimizer updates each as the f64 rule does, in as few
/// launches as the adapter's grouped updates allow (four parameters a launch where it binds
/// 21 storage buffers).
#[test]
fn optimizers_update_parameter_groups() {
    // f16 in shader f16 and packed into words (adapters without SHADER_F16).
    for dev in [device(), device_with(|o| o.disable_f16 = true)] {
        update_groups(dev);
    }
}

fn update_groups(dev: Device) {
    let sizes = [1usize, 3, 17, 127, 1000, 300, 5, 2];
    let dtypes = [
        DType::F32,
        DType::F16,
        DType::F32,
        DType::F32,
        DType::F16,
        DType::F32,
        DType::BF16,
        DType::F16,
    ];
    // Parameter 2 gets no gradient: it must come out unchanged and take no slot in a group.
    let no_grad = 2;
    let rules = [
        CpuRule::Sgd {
            mom: 0.9,
            wd: 0.01,
            nesterov: true,
        },
        CpuRule::Sgd {
            mom: 0.9,
            wd: 0.0,
            nesterov: false,
        },
        CpuRule::Sgd {
            mom: 0.0,
            wd: 0.01,
            nesterov: false,
        },
        CpuRule::Adam {
            wd: 0.05,
            decoupled: false,
        },
        CpuRule::Adam {
            wd: 0.05,
            decoupled: true,
        },
    ];
    let grouped = dev.caps().max_storage_buffers > 20;
    let mut rng = Rng::new(83);
    for rule in rules {
        let ps: Vec<Tensor> = sizes
            .iter()
            .zip(dtypes)
            .map(|(&n, dt)| {
                Tensor::from_f32(&dev, &v(&mut rng, n), &[n], dt)
                    .unwrap()
                    .variable()
            })
            .collect();
        // f64 copies of what the device holds (the f16 values as rounded, the masters made
        // from them).
        let mut w: Vec<Vec<f64>> = ps
            .iter()
            .map(|p| p.to_f32_vec().unwrap().iter().map(|&x| x as f64).collect())
            .collect();
        let mut state: Vec<Vec<[f64; 2]>> = sizes.iter().map(|&n| vec![[0.0; 2]; n]).collect();
        let named = ps
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("p{i}"), p.clone()))
            .collect();
        let mut opt = rule.make(named);
        for t in 1..=3 {
            for (i, p) in ps.iter().enumerate() {
                if i == no_grad {
                    continue;
                }
                let g =
                    Tensor::from_f32(&dev, &v(&mut rng, sizes[i]), &[sizes[i]], dtypes[i]).unwrap();
                let gv = g.to_f32_vec().unwrap();
                for (j, wj) in w[i].iter_mut().enumerate() {
                    rule.step(wj, gv[j] as f64, &mut state[i][j], t);
                }
                p.set_grad(Some(g));
            }
            dev.sync().unwrap();
            let before = dev.dispatch_stats().dispatches;
            opt.step().unwrap();
            let launches = dev.dispatch_stats().dispatches - before;
            let with_grad = sizes.len() as u64 - 1;
            let want = if grouped {
                with_grad.div_ceil(4)
            } else {
                with_grad
            };
            assert_eq!(launches, want, "{rule:?}: update launches");
        }
        let masters: std::collections::HashMap<String, Tensor> = opt.state().into_iter().collect();
        for (i, p) in ps.iter().enumerate() {
            let what = format!("{rule:?} parameter {i} ({} x {:?})", sizes[i], dtypes[i]);
            assert_close(&p.to_f32_vec().unwrap(), &w[i], dtypes[i], &what);
            if dtypes[i] != DType::F32 {
                let m = masters[&format!("p{i}.master")].to_f32_vec().unwrap();
                assert_close(&m, &w[i], DType::F32, &format!("{what}, master"));
            }
        }
    }
}

#[test]
fn f16_parameters_keep_f32_master_weights() {
    let dev = device();
    let w0 = [1.0f32, -2.0, 0.5];
    let p = Tensor::from_f32(&dev, &w0, &[3], DType::F16)
        .unwrap()
        .variable();
    let mut opt = Sgd::new(vec![("p".into(), p.clone())], 1e-4, 0.0, 0.0, false).unwrap();
    // 1e-4 steps are below f16 resolution at 1.0 (about 1e-3): only an f32 master keeps them.
    for _ in 0..20 {
        p.set_grad(Some(
            Tensor::from_f32(&dev, &[1.0, 1.0, 1.0], &[3], DType::F16).unwrap(),
        ));
        opt.step().unwrap();
    }
    let got = p.to_f32_vec().unwrap();
    assert!((got[0] - (1.0 - 20.0 * 1e-4)).abs() < 1e-3, "{got:?}");
    assert!(got[0] < 1.0, "updates were lost to f16 rounding: {got:?}");
}

/// The chunked output layer and loss against f64 on the CPU: a vocabulary of 70,001 makes 67
/// rows two chunks (59 rows fill one), on a poisoned device so every output is written; the
/// upstream gradient (3) reaches both inputs' gradients. In f16 it agrees with the
/// composition that holds the whole logits.
#[test]
fn linear_cross_entropy_in_chunks_matches_f64() {
    let dev = poisoned();
    let mut rng = Rng::new(57);
    let (rows, dim, classes) = (67usize, 24usize, 70_001usize);
    assert!(rows * classes * 4 > wgrad::ops::loss::LINEAR_CROSS_ENTROPY_CHUNK_BYTES);
    let h = rng.vec(rows * dim);
    let w: Vec<f32> = rng.vec(classes * dim).iter().map(|x| x * 2.0).collect();
    let labels: Vec<u32> = (0..rows)
        .map(|_| rng.below(classes as u64) as u32)
        .collect();
    let ht = Tensor::from_slice(&dev, &h, &[rows, dim])
        .unwrap()
        .variable();
    let wt = Tensor::from_slice(&dev, &w, &[classes, dim])
        .unwrap()
        .variable();
    let lt = Tensor::from_slice(&dev, &labels, &[rows]).unwrap();
    let loss = ht.linear_cross_entropy(&wt, &lt).unwrap();
    loss.mul_scalar(3.0).unwrap().backward().unwrap();

    let (h64, w64): (Vec<f64>, Vec<f64>) = (
        h.iter().map(|&x| x as f64).collect(),
        w.iter().map(|&x| x as f64).collect(),
    );
    let logits = cpu::matmul(&h64, &w64, None, rows, classes, dim, false, true, None);
    let want = cpu::cross_entropy(&logits, &labels, rows, classes)
        .iter()
        .sum::<f64>()
        / rows as f64;
    let got = loss.to_scalar().unwrap() as f64;
    assert!(
        (got - want).abs() < 1e-5 * want.abs().max(1.0),
        "loss {got} against {want}"
    );
    // d loss / d logits = 3 (softmax - one-hot) / rows.
    let mut d = vec![0.0f64; rows * classes];
    for r in 0..rows {
        let row = &logits[r * classes..(r + 1) * classes];
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = row.iter().map(|v| (v - m).exp()).sum();
        for c in 0..classes {
            let p = (row[c] - m).exp() / z - if c == labels[r] as usize { 1.0 } else { 0.0 };
            d[r * classes + c] = 3.0 * p / rows as f64;
        }
    }
    let dh = cpu::matmul(&d, &w64, None, rows, dim, classes, false, false, None);
    let dw = cpu::matmul(&d, &h64, None, classes, dim, rows, true, false, None);
    let gh = ht.grad().unwrap().to_vec::<f32>().unwrap();
    let gw = wt.grad().unwrap().to_vec::<f32>().unwrap();
    assert_close_tol(&gh, &dh, (1e-6, 1e-3), "d loss / d x");
    assert_close_tol(&gw, &dw, (1e-9, 1e-3), "d loss / d weight");

    // f16: against the composition over the whole f16 logits.
    let (hf, wf) = (
        ht.detach().to_dtype(DType::F16).unwrap().variable(),
        wt.detach().to_dtype(DType::F16).unwrap(),
    );
    let fused = hf.linear_cross_entropy(&wf, &lt).unwrap();
    fused.backward().unwrap();
    let g_fused = hf.grad().unwrap().to_f32_vec().unwrap();
    let hp = hf.detach().variable();
    let plain = hp
        .linear(&wf, None)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .cross_entropy(&lt)
        .unwrap();
    plain.backward().unwrap();
    let g_plain: Vec<f64> = hp
        .grad()
        .unwrap()
        .to_f32_vec()
        .unwrap()
        .iter()
        .map(|&x| x as f64)
        .collect();
    let (a, b) = (fused.to_scalar().unwrap(), plain.to_scalar().unwrap());
    assert!((a - b).abs() < 1e-3 * b.abs(), "f16 loss {a} against {b}");
    assert_close_tol(&g_fused, &g_plain, (1e-4, 2e-2), "f16 d loss / d x");

    // A weight that takes no gradient is not held for the backward pass: one decoded for
    // this op alone (a quantized head) is freed with it.
    let before = dev.memory_stats().allocated;
    let w_once = wt.detach().to_dtype(DType::F16).unwrap();
    let kept = hf.linear_cross_entropy(&w_once, &lt).unwrap();
    drop(w_once);
    let held = dev.memory_stats().allocated - before;
    assert!(
        held < (classes * dim * 2) as u64,
        "{held} bytes held after the op, the weight is {}",
        classes * dim * 2
    );
    kept.backward().unwrap();
}
