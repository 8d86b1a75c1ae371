//! Gradient buckets shared by the data-parallel paths: which parameters travel together, in
//! which dtype, flattened on the device and widened on the host.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, TensorId};
use std::collections::HashMap;

/// Which bucket each parameter's gradient completes, during one backward pass.
pub(crate) struct Tracker {
    index: HashMap<TensorId, usize>,
    bucket_of: Vec<usize>,
    left: Vec<usize>,
}

impl Tracker {
    pub(crate) fn new(params: &[(String, Tensor)], buckets: &[Vec<usize>]) -> Tracker {
        let mut bucket_of = vec![0usize; params.len()];
        for (b, ps) in buckets.iter().enumerate() {
            for &i in ps {
                bucket_of[i] = b;
            }
        }
        Tracker {
            index: params
                .iter()
                .enumerate()
                .map(|(i, (_, p))| (p.id(), i))
                .collect(),
            bucket_of,
            left: buckets.iter().map(Vec::len).collect(),
        }
    }

    /// The bucket whose last gradient `leaf`'s is, if it is one of the parameters and
    /// completes its bucket.
    pub(crate) fn complete(&mut self, leaf: &Tensor) -> Option<usize> {
        let b = self.bucket_of[*self.index.get(&leaf.id())?];
        self.left[b] -= 1;
        (self.left[b] == 0).then_some(b)
    }
}

/// Parameter indices grouped into buckets of about `bytes` of gradients each (at least one
/// parameter a bucket), from the last parameter backwards: the order the backward pass
/// finishes them.
pub(crate) fn buckets(params: &[(String, Tensor)], bytes: u64) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut size = 0u64;
    for i in (0..params.len()).rev() {
        cur.push(i);
        size += 4 * params[i].1.numel() as u64;
        if size >= bytes {
            out.push(std::mem::take(&mut cur));
            size = 0;
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The dtype a bucket travels in: its parameters' when they share a 16-bit one (half the
/// bytes of f32), else f32.
pub(crate) fn bucket_dtype(params: &[(String, Tensor)], idx: &[usize]) -> DType {
    let first = idx.first().map(|&i| params[i].1.dtype());
    match first {
        Some(d @ (DType::F16 | DType::BF16)) if idx.iter().all(|&i| params[i].1.dtype() == d) => d,
        _ => DType::F32,
    }
}

#[cfg(feature = "mpi")]
/// Read-back bytes of a bucket in `dtype`, as f32 values in `out` (its memory reused: fresh
/// memory costs page faults on every step).
pub(crate) fn widen_into(bytes: &[u8], dtype: DType, out: &mut Vec<f32>) {
    use half::slice::HalfFloatSliceExt;
    let n = bytes.len() / dtype.size();
    out.clear();
    out.resize(n, 0.0);
    match dtype {
        // Read-back mappings are 8-byte aligned, so the casts succeed; the fallback covers
        // any other slice.
        DType::F16 => match bytemuck::try_cast_slice::<u8, half::f16>(&bytes[..2 * n]) {
            Ok(h) => h.convert_to_f32_slice(out),
            Err(_) => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
        },
        DType::BF16 => match bytemuck::try_cast_slice::<u8, half::bf16>(&bytes[..2 * n]) {
            Ok(h) => h.convert_to_f32_slice(out),
            Err(_) => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
        },
        _ => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
    }
}

/// Sets the gradients of `idx` from `flat` (their gradients end to end, as `flatten` lays
/// them out, in any dtype): each parameter's gradient is its slice, in its dtype, as dense
/// storage (the optimizers need it: a copy for every slice but the first).
pub(crate) fn set_grads(params: &[(String, Tensor)], idx: &[usize], flat: &Tensor) -> Result<()> {
    let mut at = 0;
    for &i in idx {
        let p = &params[i].1;
        let len = p.numel();
        let g = crate::autograd::no_grad(|| {
            flat.narrow(0, at, len)?
                .reshape(p.shape())?
                .to_dtype(p.dtype())?
                .contiguous()
        })?;
        p.set_grad(Some(g));
        at += len;
    }
    Ok(())
}

/// The gradients of `idx` as one vector on their device, in the bucket's dtype.
pub(crate) fn flatten(params: &[(String, Tensor)], idx: &[usize]) -> Result<Tensor> {
    let dtype = bucket_dtype(params, idx);
    crate::autograd::no_grad(|| {
        let mut parts = Vec::with_capacity(idx.len());
        for &i in idx {
            let (name, p) = &params[i];
            let g = p.grad().ok_or_else(|| {
                Error::Internal(format!("parameter {name} has no gradient after backward"))
            })?;
            parts.push(g.reshape(&[g.numel()])?.to_dtype(dtype)?);
        }
        let refs: Vec<&Tensor> = parts.iter().collect();
        Tensor::cat(&refs, 0)
    })
}
