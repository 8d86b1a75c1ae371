//! Strided views: permute, transpose, narrow, broadcast and reshape share storage, and every op
//! gives the same result on a view as on a dense copy of it (forward and backward).

mod common;

use common::{Rng, assert_close, assert_close_tol, poisoned, ran_kernels, tensor};
use wgrad::memory::EventKind;
use wgrad::nn::{Module, MultiHeadAttention};
use wgrad::ops::MatmulOpts;
use wgrad::{DType, Tensor};

#[test]
fn layout_ops_are_views() {
    let dev = poisoned();
    let x = dev.randn(&[2, 3, 4], DType::F32).unwrap();
    let views = [
        x.permute(&[2, 0, 1]).unwrap(),
        x.transpose(0, 2).unwrap(),
        x.narrow(1, 1, 2).unwrap(),
        x.reshape(&[6, 4]).unwrap(),
        x.narrow(2, 0, 1)
            .unwrap()
            .broadcast_to(&[5, 2, 3, 4])
            .unwrap(),
        x.unsqueeze(1).unwrap().squeeze(1).unwrap(),
    ];
    for v in &views {
        assert!(v.same_storage(&x), "{v:?} copied");
    }
    // And they read back as the elements they name.
    let xv = x.to_vec::<f32>().unwrap();
    let p = x.permute(&[2, 0, 1]).unwrap().to_vec::<f32>().unwrap();
    for a in 0..4 {
        for b in 0..2 {
            for c in 0..3 {
                assert_eq!(p[(a * 2 + b) * 3 + c], xv[(b * 3 + c) * 4 + a]);
            }
        }
    }
    let n = x.narrow(1, 1, 2).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(n[..4], xv[4..8]);
    // A reshape the strides cannot express is a copy.
    let t = x.transpose(1, 2).unwrap();
    assert!(!t.reshape(&[2, 12]).unwrap().same_storage(&x));
}

/// Each op on a permuted / narrowed / broadcast view equals the op on a dense copy, and so do
/// the gradients that flow back through the view.
#[test]
fn ops_on_views_match_dense_copies() {
    let dev = poisoned();
    let mut rng = Rng::new(1);
    let base = rng.vec(3 * 5 * 8);
    type F = fn(&Tensor) -> wgrad::Result<Tensor>;
    let ops: [(&str, F); 9] = [
        ("exp", |t| t.exp()),
        ("add", |t| t.add(&t.mul_scalar(2.0)?)),
        ("mul broadcast", |t| t.mul(&t.narrow(0, 0, 1)?)),
        ("sum", |t| t.sum(1, false)),
        ("max", |t| t.max(0, false)),
        ("softmax", |t| t.softmax()),
        ("matmul", |t| t.matmul(&t.transpose(1, 2)?)),
        ("matmul^T", |t| {
            t.matmul_with(
                t,
                MatmulOpts {
                    trans_b: true,
                    ..Default::default()
                },
            )
        }),
        ("layer_norm", |t| {
            let d = t.shape()[2];
            let g = Tensor::ones(t.device(), &[d], t.dtype())?;
            let b = Tensor::zeros(t.device(), &[d], t.dtype())?;
            t.layer_norm(&g, &b, 1e-5)
        }),
    ];
    type V = fn(&Tensor) -> wgrad::Result<Tensor>;
    let views: [(&str, V); 3] = [
        ("permute", |t| t.permute(&[1, 0, 2])),
        ("narrow", |t| t.narrow(2, 1, 5)),
        ("transpose", |t| t.transpose(1, 2)),
    ];
    for (vname, view) in views {
        for (oname, op) in ops {
            let x = tensor(&dev, &base, &[3, 5, 8], DType::F32).variable();
            let v = view(&x).unwrap();
            assert!(v.same_storage(&x));
            let y = op(&v).unwrap();
            let xd = tensor(&dev, &base, &[3, 5, 8], DType::F32).variable();
            let vd = view(&xd).unwrap().contiguous().unwrap();
            let yd = op(&vd).unwrap();
            let what = format!("{oname} on a {vname} view");
            let want: Vec<f64> = yd.to_f32_vec().unwrap().iter().map(|&v| v as f64).collect();
            assert_close(&y.to_f32_vec().unwrap(), &want, DType::F32, &what);
            // Gradients back through the view.
            let w = rng.vec(y.numel());
            let gw = tensor(&dev, &w, y.shape(), DType::F32);
            y.backward_with(&gw).unwrap();
            yd.backward_with(&gw).unwrap();
            let want: Vec<f64> = xd
                .grad()
                .unwrap()
                .to_f32_vec()
                .unwrap()
                .iter()
                .map(|&v| v as f64)
                .collect();
            assert_close_tol(
                &x.grad().unwrap().to_f32_vec().unwrap(),
                &want,
                (1e-5, 1e-4),
                &format!("{what}: gradient"),
            );
        }
    }
}

/// Attention reads strided q, k, v (the heads of a fused projection) and matches attention on
/// dense copies, forward and backward, causal or not, at odd lengths.
#[test]
fn attention_on_strided_heads() {
    let dev = poisoned();
    let mut rng = Rng::new(2);
    for (b, s, h, d, causal) in [
        (2, 7, 3, 8, true),
        (1, 17, 2, 16, false),
        (2, 1, 1, 4, true),
    ] {
        let e = h * d;
        let proj = rng.vec(b * s * 3 * e);
        let grad = rng.vec(b * h * s * d);
        let run = |dense: bool| {
            let p = tensor(&dev, &proj, &[b, s, 3 * e], DType::F32).variable();
            let qkv = p
                .reshape(&[b, s, 3, h, d])
                .unwrap()
                .permute(&[2, 0, 3, 1, 4])
                .unwrap();
            let pick = |i: usize| {
                let t = qkv.narrow(0, i, 1).unwrap().squeeze(0).unwrap();
                if dense { t.contiguous().unwrap() } else { t }
            };
            let (q, k, v) = (pick(0), pick(1), pick(2));
            if !dense {
                assert!(q.same_storage(&p) && k.same_storage(&p) && v.same_storage(&p));
            }
            let o = Tensor::attention(&q, &k, &v, causal, None).unwrap();
            o.backward_with(&tensor(&dev, &grad, &[b, h, s, d], DType::F32))
                .unwrap();
            (
                o.to_f32_vec().unwrap(),
                p.grad().unwrap().to_f32_vec().unwrap(),
            )
        };
        let (o1, g1) = run(false);
        let (o2, g2) = run(true);
        let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
        let what = format!("attention b={b} s={s} h={h} d={d} causal={causal}");
        assert_close(&o1, &f(&o2), DType::F32, &what);
        assert_close_tol(&g1, &f(&g2), (1e-5, 1e-4), &format!("{what}: gradient"));
    }
}

/// The attention layer allocates its projections' outputs, the attention output and its
/// statistics, and nothing for q, k and v (the memory trace counts the allocations).
#[test]
fn attention_layer_copies_nothing() {
    let dev = poisoned();
    let (b, s, e, h) = (2, 16, 32, 4);
    let mha = MultiHeadAttention::new(&dev, e, h, true, DType::F32).unwrap();
    let x = dev.randn(&[b, s, e], DType::F32).unwrap();
    // Warm-up (pipelines, pool pages).
    let _ = mha.forward(&x).unwrap();
    dev.sync().unwrap();
    dev.set_memory_trace(true);
    dev.clear_memory_trace();
    let y = wgrad::no_grad(|| mha.forward(&x)).unwrap();
    dev.sync().unwrap();
    let allocs: Vec<u64> = dev
        .memory_events()
        .iter()
        .filter(|ev| ev.kind == EventKind::Alloc)
        .map(|ev| ev.bytes)
        .collect();
    dev.set_memory_trace(false);
    // qkv projection [b, s, 3e], attention output [b, s, e] and its f32 lse [b h, s], output
    // projection [b, s, e].
    let f = 4u64;
    let expect = [b * s * 3 * e, b * s * e, b * h * s, b * s * e].map(|n| n as u64 * f);
    assert_eq!(allocs, expect, "allocations of one forward pass");
    assert_eq!(y.shape(), &[b, s, e]);
}

/// Dense copies of transposed views (a matrix's transpose, NCHW to NHWC and back, a narrowed
/// and so offset view) go through the tiled `transpose` copy, exact in every float dtype, at
/// sizes that leave partial 32 x 32 tiles.
#[test]
fn transposed_views_copy_through_tiles() {
    let dev = poisoned();
    let mut rng = Rng::new(41);
    let cases: [(&[usize], &[usize]); 5] = [
        (&[127, 1000], &[1, 0]),
        (&[2, 3, 17, 5], &[0, 2, 3, 1]),
        (&[3, 33, 7, 9], &[0, 2, 3, 1]),
        (&[3, 7, 9, 33], &[0, 3, 1, 2]),
        (&[1, 1, 1, 1], &[0, 2, 3, 1]),
    ];
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for (shape, perm) in cases {
            let n: usize = shape.iter().product();
            let x = tensor(&dev, &rng.vec(n), shape, dt);
            let xv = x.to_f32_vec().unwrap();
            let (y, ran) = ran_kernels(&dev, || x.permute(perm).unwrap().contiguous().unwrap());
            let got = y.to_f32_vec().unwrap();
            // The reference permutation, element by element.
            let oshape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let mut strides = vec![1usize; shape.len()];
            for k in (0..shape.len() - 1).rev() {
                strides[k] = strides[k + 1] * shape[k + 1];
            }
            for (i, g) in got.iter().enumerate() {
                let mut rem = i;
                let mut src = 0;
                for k in (0..oshape.len()).rev() {
                    src += (rem % oshape[k]) * strides[perm[k]];
                    rem /= oshape[k];
                }
                assert_eq!(
                    g.to_bits(),
                    xv[src].to_bits(),
                    "{dt} {shape:?} {perm:?} at {i}"
                );
            }
            if n > 1 {
                assert!(
                    ran.iter().any(|k| k.contains("transpose")),
                    "{dt} {shape:?} {perm:?}: {:?}",
                    ran
                );
            }
        }
        // An offset view: columns 3.. of a [40, 40] matrix, transposed.
        let x = tensor(&dev, &rng.vec(1600), &[40, 40], dt);
        let xv = x.to_f32_vec().unwrap();
        let got = x
            .narrow(1, 3, 37)
            .unwrap()
            .transpose(0, 1)
            .unwrap()
            .contiguous()
            .unwrap()
            .to_f32_vec()
            .unwrap();
        for j in 0..37 {
            for i in 0..40 {
                assert_eq!(got[j * 40 + i].to_bits(), xv[i * 40 + 3 + j].to_bits());
            }
        }
    }
}

/// Layouts past six dimensions (held on the heap, the rest inline): views, copies, a
/// broadcasting op and the gradient through them address the same elements as the CPU.
#[test]
fn views_past_six_dimensions() {
    let dev = poisoned();
    let shape = [2, 1, 3, 1, 2, 2, 1, 3];
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let x = tensor(&dev, &data, &shape, DType::F32).variable();
    // Row-major strides of `shape`, and the element of `data` at a multi-index.
    let strides: Vec<usize> = (0..shape.len())
        .map(|k| shape[k + 1..].iter().product())
        .collect();
    let perm = [2, 3, 4, 5, 6, 7, 0, 1];
    let p = x.permute(&perm).unwrap();
    assert!(p.same_storage(&x));
    // The permuted view read back, element by element against the CPU's indexing.
    let pshape: Vec<usize> = perm.iter().map(|&a| shape[a]).collect();
    let mut want = Vec::with_capacity(n);
    for i in 0..n {
        let (mut rest, mut at) = (i, 0);
        for k in (0..8).rev() {
            at += (rest % pshape[k]) * strides[perm[k]];
            rest /= pshape[k];
        }
        want.push(data[at] as f64);
    }
    let got = p.to_vec::<f32>().unwrap();
    assert_close(&got, &want, DType::F32, "rank-8 permute");
    // A reshape the strides allow stays a view; one they do not is a copy of the same order.
    let r = p.reshape(&[12, 3, 2]).unwrap();
    assert!(r.same_storage(&x));
    assert_close(
        &r.to_vec::<f32>().unwrap(),
        &want,
        DType::F32,
        "view reshape",
    );
    let rev = x.permute(&[7, 6, 5, 4, 3, 2, 1, 0]).unwrap();
    let c = rev.reshape(&[3, 4, 3, 2]).unwrap();
    assert!(!c.same_storage(&x));
    assert_eq!(c.to_vec::<f32>().unwrap(), rev.to_vec::<f32>().unwrap());
    // A broadcasting product over rank 8, narrowed, and the gradient back to x: d/dx sum(x *
    // x[0:1]) is x[0:1] everywhere plus, on the first slice, the sum over the other.
    let first = x.narrow(0, 0, 1).unwrap();
    let y = x.mul(&first).unwrap().sum_all().unwrap();
    y.backward().unwrap();
    let g = x.grad().unwrap().to_vec::<f32>().unwrap();
    let half = n / 2;
    let want_g: Vec<f64> = (0..n)
        .map(|i| {
            let j = i % half;
            let own = data[j] as f64;
            if i < half {
                own + data[j] as f64 + data[j + half] as f64
            } else {
                own
            }
        })
        .collect();
    assert_close(&g, &want_g, DType::F32, "rank-8 broadcast gradient");
}
