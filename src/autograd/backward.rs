//! Gradient rules: one arm per op, no wildcard.

use super::Op;
use crate::error::Result;
use crate::kernels::elementwise::{self as ew, Binary};
use crate::ops::{attention, conv, embedding, loss, matmul, norm, softmax};
use crate::tensor::Tensor;

/// The gradients of `op`'s inputs given the gradient `g` of its output `out`.
pub(super) fn grads(op: &Op, out: &Tensor, g: Tensor) -> Result<Vec<(Tensor, Tensor)>> {
    Ok(match op {
        Op::Reshape { x } => vec![(x.clone(), g.reshape(x.shape())?)],
        Op::Cast { x } => vec![(x.clone(), g.to_dtype(x.dtype())?)],
        Op::Unary { op, x, a, b, saved } => {
            let dx = Tensor::uninit(g.device(), g.shape(), g.dtype())?;
            let saved = saved.to_dtype(g.dtype())?;
            ew::unary_bwd(
                g.device(),
                *op,
                saved.block(),
                g.block(),
                dx.block(),
                g.dtype(),
                g.numel(),
                *a,
                *b,
            )?;
            vec![(x.clone(), dx)]
        }
        Op::Binary { op, x, y } => {
            let (gx, gy) = match op {
                Binary::Add => (g.clone(), g),
                Binary::Sub => (g.clone(), g.neg()?),
                Binary::Mul => (g.mul(y)?, g.mul(x)?),
                Binary::Div => {
                    let gx = g.div(y)?;
                    (gx.clone(), gx.mul(x)?.div(y)?.neg()?)
                }
                Binary::Max | Binary::Min => {
                    // Ties split the gradient evenly, as PyTorch does.
                    let wins = if *op == Binary::Max {
                        x.gt(y)?
                    } else {
                        x.lt(y)?
                    };
                    let ties = x.eq(y)?.mul_scalar(0.5)?;
                    let mx = wins.add(&ties)?;
                    let my = mx.rsub_scalar(1.0)?;
                    (g.mul(&mx)?, g.mul(&my)?)
                }
                Binary::Pow => {
                    // d/dx x^y = y x^(y-1); d/dy x^y = x^y ln x.
                    let gx = g.mul(y)?.mul(&x.pow(&y.add_scalar(-1.0)?)?)?;
                    let gy = g.mul(out)?.mul(&x.log()?)?;
                    (gx, gy)
                }
                Binary::Eq | Binary::Ne | Binary::Lt | Binary::Le | Binary::Gt | Binary::Ge => {
                    unreachable!("comparisons are not recorded")
                }
            };
            vec![
                (x.clone(), gx.sum_to(x.shape())?),
                (y.clone(), gy.sum_to(y.shape())?),
            ]
        }
        Op::Select { c, x, y } => {
            let zero = Tensor::zeros(g.device(), &[1], g.dtype())?;
            let gx = Tensor::where_cond(c, &g, &zero)?;
            let gy = Tensor::where_cond(c, &zero, &g)?;
            vec![
                (x.clone(), gx.sum_to(x.shape())?),
                (y.clone(), gy.sum_to(y.shape())?),
            ]
        }
        Op::Sum {
            x,
            axis,
            keepdim,
            scale,
        } => {
            let mut keep = x.shape().to_vec();
            keep[*axis] = 1;
            let _ = keepdim;
            let gx = g.reshape(&keep)?.broadcast_to(x.shape())?;
            let gx = if *scale == 1.0 {
                gx
            } else {
                gx.mul_scalar(*scale)?
            };
            vec![(x.clone(), gx)]
        }
        Op::Max {
            x,
            axis,
            keepdim,
            out,
        } => {
            let _ = keepdim;
            let mut keep = x.shape().to_vec();
            keep[*axis] = 1;
            let mask = x.eq(&out.reshape(&keep)?)?;
            let count = mask.sum(*axis as isize, true)?;
            let gx = mask.mul(&g.reshape(&keep)?.div(&count)?)?;
            vec![(x.clone(), gx)]
        }
        Op::Permute { x, perm } => {
            let mut inv = vec![0; perm.len()];
            for (k, &p) in perm.iter().enumerate() {
                inv[p] = k;
            }
            vec![(x.clone(), g.permute(&inv)?)]
        }
        Op::Expand { x } => vec![(x.clone(), g.sum_to(x.shape())?)],
        Op::Narrow { x, axis, start } => {
            let gx = Tensor::zeros(g.device(), x.shape(), g.dtype())?;
            gx.write_slice(&g, *axis, *start)?;
            vec![(x.clone(), gx)]
        }
        Op::Cat { xs, axis } => {
            let mut at = 0;
            let mut v = Vec::with_capacity(xs.len());
            for x in xs {
                let len = x.shape()[*axis];
                v.push((x.clone(), g.narrow(*axis as isize, at, len)?));
                at += len;
            }
            v
        }
        Op::Matmul {
            a,
            b,
            bias,
            trans_a,
            trans_b,
            relu_out,
        } => matmul::matmul_grads(
            a,
            b,
            bias.as_ref(),
            *trans_a,
            *trans_b,
            relu_out.as_ref(),
            g,
        )?,
        Op::Conv2d {
            x,
            w,
            bias,
            opts,
            relu_out,
        } => conv::conv_grads(x, w, bias.as_ref(), opts, relu_out.as_ref(), g)?,
        Op::MaxPool { x, geom, idx } => vec![(x.clone(), conv::maxpool_grad(x, geom, idx, &g)?)],
        Op::AvgPool { x, geom } => vec![(x.clone(), conv::avgpool_grad(x, geom, &g)?)],
        Op::Softmax { x, y, log } => vec![(x.clone(), softmax::softmax_grad(y, &g, *log)?)],
        Op::Attention {
            q,
            k,
            v,
            out,
            lse,
            causal,
            scale,
        } => {
            let [dq, dk, dv] = attention::attention_grads(q, k, v, out, lse, *causal, *scale, &g)?;
            vec![(q.clone(), dq), (k.clone(), dk), (v.clone(), dv)]
        }
        Op::Norm {
            x,
            gamma,
            beta,
            stats,
            eps,
        } => {
            let [dx, dgamma, dbeta] = norm::norm_grads(x, gamma, beta.as_ref(), stats, *eps, &g)?;
            let mut v = vec![(x.clone(), dx), (gamma.clone(), dgamma)];
            if let Some(b) = beta {
                v.push((b.clone(), dbeta));
            }
            v
        }
        Op::CrossEntropy { x, labels, stats } => {
            vec![(x.clone(), loss::cross_entropy_grad(x, labels, stats, &g)?)]
        }
        Op::Embedding { w, idx } => vec![(w.clone(), embedding::embedding_grad(w, idx, &g)?)],
        Op::Dropout { x, p, seed } => vec![(x.clone(), embedding::dropout_grad(&g, *p, *seed)?)],
        Op::Checkpoint { x, segment, seed } => vec![(
            x.clone(),
            super::checkpoint::checkpoint_grad(x, segment, *seed, &g)?,
        )],
    })
}
