//! Fused scaled dot-product attention.
//!
//! q, k and v may be views (any layout whose head dimension is contiguous), so the heads of
//! a fused QKV projection are read in place. The output is stored sequence-major
//! ([batch, seq, heads, dim]) and returned as a [batch, heads, seq, dim] view of it, so
//! merging the heads back (`permute(0, 2, 1, 3)` then `reshape`) costs no copy either.

use super::elementwise::{float_only, same_device, same_dtype};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::attention::{self as ka, Dims, Grads, HeadLayout};
use crate::layout::Dims as Axes;
use crate::tensor::graph::{Backward, record};
use crate::tensor::{Layout, Tensor};

/// (batch dims, heads, layout) of a [..., heads, seq, dim] (or [seq, dim]) operand, or `None`
/// when its layout needs a copy (head dimension not contiguous, batch dimensions that do not
/// collapse to one stride).
fn heads_of(t: &Tensor) -> Option<(usize, HeadLayout)> {
    let (shape, st) = (t.shape(), t.strides());
    let r = shape.len();
    if shape[r - 1] > 1 && st[r - 1] != 1 {
        return None;
    }
    let ss = st[r - 2];
    let (heads, sh) = if r >= 3 {
        (shape[r - 3], st[r - 3])
    } else {
        (1, 0)
    };
    let lead = r.saturating_sub(3);
    let sb = crate::layout::run_stride(&shape[..lead], &st[..lead])?;
    Some((
        heads,
        HeadLayout {
            off: t.layout().offset(),
            sb,
            sh,
            ss,
        },
    ))
}

/// `t` and its head layout, made dense first when the kernels cannot read it as it is.
fn readable(t: &Tensor) -> Result<(Tensor, HeadLayout)> {
    if let Some((_, l)) = heads_of(t) {
        return Ok((t.clone(), l));
    }
    let d = t.contiguous()?;
    let (_, l) = heads_of(&d).ok_or_else(|| Error::Internal("dense attention operand".into()))?;
    Ok((d, l))
}

/// Options of [`Tensor::attention_with`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttentionOpts {
    /// Mask future keys (see [`Tensor::attention`] for the alignment).
    pub causal: bool,
    /// Score scale; 1/sqrt(head_dim) when `None`.
    pub scale: Option<f32>,
    /// Probability of dropping each attention weight (PyTorch's `dropout_p`), in [0, 1): the
    /// kept weights are scaled by 1 / (1 - p) after the softmax. The mask is recomputed from
    /// a seed in the backward pass, never stored.
    pub dropout: f32,
    /// The mask's seed; `None` draws one from the device's seed stream (as
    /// [`Tensor::dropout`] does, so [`crate::Device::manual_seed`] makes it reproducible).
    pub seed: Option<u64>,
}

fn dims(q: &Tensor, k: &Tensor, v: &Tensor, o: &AttentionOpts, seed: u64) -> Result<Dims> {
    let (causal, scale) = (o.causal, o.scale);
    let op = "attention";
    if !(0.0..1.0).contains(&o.dropout) {
        return Err(Error::invalid(
            op,
            format!("dropout probability {} is not in [0, 1)", o.dropout),
        ));
    }
    same_dtype(op, q, k)?;
    same_dtype(op, q, v)?;
    same_device(op, q, k)?;
    same_device(op, q, v)?;
    float_only(op, q)?;
    if q.rank() < 2 || k.rank() != q.rank() || v.shape() != k.shape() {
        return Err(Error::shape(
            op,
            format!(
                "q {:?}, k {:?}, v {:?}: want [..., seq, dim] with k and v alike",
                q.shape(),
                k.shape(),
                v.shape()
            ),
        ));
    }
    let r = q.rank();
    let (sq, d) = (q.shape()[r - 2], q.shape()[r - 1]);
    let skv = k.shape()[r - 2];
    // Grouped-query attention: k and v may have fewer heads than q, a divisor of them;
    // query head h reads key/value head h / (q heads / kv heads).
    let (qh, kh) = if r >= 3 {
        (q.shape()[r - 3], k.shape()[r - 3])
    } else {
        (1, 1)
    };
    let lead = r.saturating_sub(3);
    let grouped = kh > 0 && qh.is_multiple_of(kh);
    if k.shape()[r - 1] != d || q.shape()[..lead] != k.shape()[..lead] || !grouped {
        return Err(Error::shape(
            op,
            format!(
                "q {:?} and k {:?} differ outside the sequence axis (k may have fewer heads \
                 than q only where they divide q's)",
                q.shape(),
                k.shape()
            ),
        ));
    }
    if causal && skv < sq {
        return Err(Error::shape(
            op,
            format!("causal attention needs at least as many keys ({skv}) as queries ({sq})"),
        ));
    }
    if sq == 0 || skv == 0 || d == 0 {
        return Err(Error::shape(
            op,
            format!("empty q {:?} or k {:?}", q.shape(), k.shape()),
        ));
    }
    let heads = qh;
    let dense = HeadLayout::dense(heads, sq, d);
    Ok(Dims {
        bh: q.numel() / (sq * d),
        heads,
        group: qh / kh,
        sq,
        skv,
        d,
        scale: scale.unwrap_or(1.0 / (d as f32).sqrt()),
        causal,
        dropout: o.dropout,
        seed,
        q: dense,
        k: HeadLayout::dense(kh, skv, d),
        v: HeadLayout::dense(kh, skv, d),
        o: dense,
        g: dense,
    })
}

/// What the forward pass keeps for the backward pass.
struct Saved {
    out: Tensor,
    lse: Tensor,
    /// The forward's options, with the scale and the dropout seed resolved.
    opts: AttentionOpts,
    seed: u64,
}

struct AttentionBack(Saved);

/// Gradients of attention (dq, dk, dv, shaped as q, k and v) from the saved output and
/// log-sum-exp: new dense tensors, or written into the views `into` (of q's dtype, head
/// dimension contiguous).
fn attention_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    saved: &Saved,
    dout: Tensor,
    into: Option<[Tensor; 3]>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let mut a = dims(q, k, v, &saved.opts, saved.seed)?;
    // The tensor-core kernels read operands in place when their rows are 16-byte aligned,
    // else dense copies of them.
    let coop = ka::backward_uses_tensor_cores(q.device(), q.dtype(), a.sq, a.skv, a.d);
    let pick = |t: &Tensor| -> Result<(Tensor, HeadLayout)> {
        let (r, l) = readable(t)?;
        if coop && !l.coop_aligned() {
            readable(&t.contiguous()?)
        } else {
            Ok((r, l))
        }
    };
    let (q, lq) = pick(q)?;
    let (k, lk) = pick(k)?;
    let (v, lv) = pick(v)?;
    let (o, lo) = pick(&saved.out)?;
    let dout = dout.to_dtype(q.dtype())?;
    let (g, lg) = pick(&dout)?;
    (a.q, a.k, a.v, a.o, a.g) = (lq, lk, lv, lo, lg);
    let dev = q.device();
    let delta = Tensor::uninit(dev, &[a.bh, a.sq], DType::F32)?;
    // With grouped-query attention the kernels write each query head's share of dk and dv
    // (shaped as q's heads), summed over each group below.
    let per_head = |t: &Tensor| -> Vec<usize> {
        let mut s = t.shape().to_vec();
        let r = s.len();
        if a.group > 1 {
            s[r - 3] *= a.group;
        }
        s
    };
    let [dq, dk, dv] = match into {
        Some(views) => views,
        None => [
            Tensor::uninit(dev, q.shape(), q.dtype())?,
            Tensor::uninit(dev, &per_head(&k), q.dtype())?,
            Tensor::uninit(dev, &per_head(&v), q.dtype())?,
        ],
    };
    let at = |t: &Tensor| -> Result<HeadLayout> {
        match heads_of(t) {
            Some((_, l)) if t.dtype() == q.dtype() => Ok(l),
            _ => Err(Error::Internal(format!(
                "attention gradient layout {:?}",
                t.layout()
            ))),
        }
    };
    let (dq_at, dk_at, dv_at) = (at(&dq)?, at(&dk)?, at(&dv)?);
    let op = "attention backward";
    ka::backward(
        dev,
        &a,
        &Grads {
            q: q.block(),
            k: k.block(),
            v: v.block(),
            o: o.block(),
            lse: saved.lse.dense_block(op)?,
            dout: g.block(),
            delta: delta.dense_block(op)?,
            dq: dq.block(),
            dk: dk.block(),
            dv: dv.block(),
            dq_at,
            dk_at,
            dv_at,
        },
        q.dtype(),
    )?;
    if a.group > 1 {
        let sum_groups = |t: Tensor, like: &Tensor| -> Result<Tensor> {
            let r = like.rank();
            let mut grouped = like.shape().to_vec();
            grouped.insert(r - 2, a.group);
            t.reshape(&grouped)?.sum(r as isize - 2, false)
        };
        return Ok((dq, sum_groups(dk, &k)?, sum_groups(dv, &v)?));
    }
    Ok((dq, dk, dv))
}

impl Backward for AttentionBack {
    fn backward(
        &self,
        inputs: &[Tensor],
        _out: &Tensor,
        dout: Tensor,
    ) -> Result<Vec<Option<Tensor>>> {
        let (dq, dk, dv) =
            attention_backward(&inputs[0], &inputs[1], &inputs[2], &self.0, dout, None)?;
        Ok(vec![Some(dq), Some(dk), Some(dv)])
    }
}

/// The heads of a fused QKV projection ([..., seq, 3, heads, dim] storage) as q, k and v
/// views [..., heads, seq, dim] (no autograd: the caller records one node for the whole).
fn split_qkv(qkv: &Tensor, heads: usize) -> Result<(Tensor, Tensor, Tensor)> {
    let op = "attention_qkv";
    let r = qkv.rank();
    let width = qkv.shape().last().copied().unwrap_or(0);
    if r < 2 || heads == 0 || !width.is_multiple_of(3 * heads) || width == 0 {
        return Err(Error::shape(
            op,
            format!(
                "{:?} is not [..., seq, 3 heads dim] with {heads} heads",
                qkv.shape()
            ),
        ));
    }
    let pick = |i| heads_part(qkv, 3, heads, i);
    Ok((pick(0)?, pick(1)?, pick(2)?))
}

/// Part `part` of `parts` along the last axis of a [..., seq, parts heads dim] tensor, as its
/// [..., heads, seq, dim] view, without autograd. Cutting one axis into three is always a
/// view, so the layout is written down directly: through reshape, permute, narrow and
/// squeeze it took five tensors a part, three times a layer a step.
fn heads_part(t: &Tensor, parts: usize, heads: usize, part: usize) -> Result<Tensor> {
    let l = t.layout();
    let (shape, strides) = (l.shape(), l.strides());
    let r = shape.len();
    let width = shape.last().copied().unwrap_or(0);
    if r < 2 || heads == 0 || !width.is_multiple_of(parts * heads) || part >= parts {
        return Err(Error::Internal(format!(
            "part {part} of {parts} of {shape:?} in {heads} heads"
        )));
    }
    let d = width / (parts * heads);
    let (ss, ls) = (strides[r - 2], strides[r - 1]);
    let lead = r - 2;
    let shape: Axes = (shape[..lead].iter().copied())
        .chain([heads, shape[lead], d])
        .collect();
    let strides: Axes = (strides[..lead].iter().copied())
        .chain([d * ls, ss, ls])
        .collect();
    let offset = l.offset() + part * heads * d * ls;
    Ok(t.view(Layout::from_parts(&shape, &strides, offset), None))
}

/// [`Tensor::attention_qkv`]'s gradient: the three head gradients written straight into one
/// tensor shaped as the fused projection (no zero-filled slices summed).
struct FusedQkvBack {
    saved: Saved,
    heads: usize,
}

impl Backward for FusedQkvBack {
    fn backward(
        &self,
        inputs: &[Tensor],
        _out: &Tensor,
        dout: Tensor,
    ) -> Result<Vec<Option<Tensor>>> {
        let qkv = &inputs[0];
        let (q, k, v) = split_qkv(qkv, self.heads)?;
        // dout is [..., seq, heads dim]; the kernels take its [..., heads, seq, dim] view.
        let dout = heads_view(&dout, self.heads)?;
        // The three gradients are written straight into their places in the projection's
        // gradient, which they cover.
        let g = Tensor::uninit(qkv.device(), qkv.shape(), qkv.dtype())?;
        let (gq, gk, gv) = split_qkv(&g, self.heads)?;
        attention_backward(&q, &k, &v, &self.saved, dout, Some([gq, gk, gv]))?;
        Ok(vec![Some(g)])
    }
}

/// A [..., seq, heads dim] tensor as its [..., heads, seq, dim] view.
fn heads_view(t: &Tensor, heads: usize) -> Result<Tensor> {
    heads_part(t, 1, heads, 0)
}

impl Tensor {
    /// softmax(scale * q k^T [+ causal mask]) v over [..., seq, head_dim] tensors (typically
    /// [batch, heads, seq, head_dim]); scale defaults to 1/sqrt(head_dim). The score matrix is
    /// never stored: memory is O(seq) per head.
    ///
    /// The causal mask is aligned to the bottom right: query i (of `sq`) sees key j (of
    /// `skv`) when `j <= i + (skv - sq)`. With as many keys as queries that is the usual
    /// lower triangle; with more keys (decoding with a cache) the queries are the last `sq`
    /// positions of the sequence. Causal attention needs `skv >= sq`.
    ///
    /// q, k and v may be views whose head dimension is contiguous (no copy is made); the
    /// result is a [..., heads, seq, dim] view of sequence-major storage.
    pub fn attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        causal: bool,
        scale: Option<f32>,
    ) -> Result<Tensor> {
        Tensor::attention_with(
            q,
            k,
            v,
            AttentionOpts {
                causal,
                scale,
                ..Default::default()
            },
        )
    }

    /// [`Tensor::attention`] with dropout on the attention weights (nanoGPT's `attn_dropout`,
    /// PyTorch's `scaled_dot_product_attention(dropout_p=...)`), inside the fused kernels.
    pub fn attention_with(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        opts: AttentionOpts,
    ) -> Result<Tensor> {
        let saved = attention_forward(q, k, v, &opts, resolve_seed(q, &opts))?;
        let out = saved.out.clone();
        let rec = record("attention", &[q, k, v], || AttentionBack(saved));
        Ok(out.with_node(rec))
    }

    /// Attention over the heads of a fused QKV projection: `qkv` is [..., seq, 3 heads dim]
    /// (q, k and v one after the other along the last axis, heads inside each), the result
    /// [..., seq, heads dim], heads merged. Nothing is copied either way: the kernels read
    /// the heads in place, write the output in its final layout, and the backward pass writes
    /// the three gradients into one tensor shaped as `qkv`.
    pub fn attention_qkv(qkv: &Tensor, heads: usize, opts: AttentionOpts) -> Result<Tensor> {
        let (q, k, v) = split_qkv(qkv, heads)?;
        let saved = attention_forward(&q, &k, &v, &opts, resolve_seed(qkv, &opts))?;
        // The output is a [..., heads, seq, dim] view of [..., seq, heads, dim] storage.
        // Merged by layout alone: one tensor, where a permute and a reshape made two.
        let out = &saved.out;
        let r = out.rank();
        let mut perm: Axes = (0..r).collect();
        perm.swap(r - 3, r - 2);
        let mut merged = Axes::from_slice(qkv.shape());
        let last = merged.len() - 1;
        merged[last] /= 3;
        let layout = (out.layout().permute(&perm).reshape(&merged)).ok_or_else(|| {
            Error::Internal(format!("attention output {:?} as {merged:?}", out.shape()))
        })?;
        let flat = out.view(layout, None);
        let rec = record("attention_qkv", &[qkv], || FusedQkvBack { saved, heads });
        Ok(flat.with_node(rec))
    }
}

/// The dropout seed: the caller's, or the device's next one when dropping.
fn resolve_seed(t: &Tensor, opts: &AttentionOpts) -> u64 {
    match opts.seed {
        Some(s) => s,
        None if opts.dropout > 0.0 => t.device().next_seed(),
        None => 0,
    }
}

/// The forward pass without recording: the output (a [..., heads, seq, dim] view of
/// [..., seq, heads, dim] storage, with no autograd node), the log-sum-exp per query row, and
/// the options with the scale and seed resolved: what the backward pass needs.
fn attention_forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &AttentionOpts,
    seed: u64,
) -> Result<Saved> {
    let mut a = dims(q, k, v, opts, seed)?;
    let (qr, lq) = readable(q)?;
    let (kr, lk) = readable(k)?;
    let (vr, lv) = readable(v)?;
    (a.q, a.k, a.v) = (lq, lk, lv);
    let dev = q.device();
    let r = q.rank();
    // Storage [..., seq, heads, dim]; the result is its [..., heads, seq, dim] view.
    let (storage, layout) = if r >= 3 {
        let mut phys = q.shape().to_vec();
        phys.swap(r - 3, r - 2);
        let t = Tensor::uninit(dev, &phys, q.dtype())?;
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 3, r - 2);
        let l = t.layout().permute(&perm);
        (t, l)
    } else {
        let t = Tensor::uninit(dev, q.shape(), q.dtype())?;
        let l = Layout::contiguous(q.shape());
        (t, l)
    };
    a.o = HeadLayout {
        off: 0,
        sb: a.sq * a.heads * a.d,
        sh: a.d,
        ss: a.heads * a.d,
    };
    if r < 3 {
        a.o = HeadLayout::dense(1, a.sq, a.d);
    }
    // The tensor-core forward reads q, k and v in place when their rows are 16-byte
    // aligned (the heads of a fused QKV projection are), else dense copies of them.
    let (qr, kr, vr) =
        if ka::uses_tensor_cores(dev, q.dtype(), a.sq, a.skv, a.d) && !a.coop_readable(false) {
            // Dense copies for the kernel only: the caller's node records q, k and v.
            let (qc, lq) = readable(&qr.contiguous()?)?;
            let (kc, lk) = readable(&kr.contiguous()?)?;
            let (vc, lv) = readable(&vr.contiguous()?)?;
            (a.q, a.k, a.v) = (lq, lk, lv);
            (qc, kc, vc)
        } else {
            (qr, kr, vr)
        };
    let lse = Tensor::uninit(dev, &[a.bh, a.sq], DType::F32)?;
    let op = "attention";
    ka::forward(
        dev,
        &a,
        qr.block(),
        kr.block(),
        vr.block(),
        storage.dense_block(op)?,
        lse.dense_block(op)?,
        q.dtype(),
    )?;
    let out = storage.view(layout, None);
    Ok(Saved {
        out,
        lse,
        opts: AttentionOpts {
            scale: Some(a.scale),
            ..*opts
        },
        seed,
    })
}
