//! Host side of `shaders/decode.wgsl`: rotary embedding with the cache write, and attention
//! of one new token a sequence over the cache (flash-decoding).

use super::{Kernel, LOOP_BUDGET, Launch, arg, grid_1d, launch, over_budget, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::Block;
use std::sync::atomic::{AtomicUsize, Ordering};

crate::params! {
    /// `struct Params` of decode.wgsl.
    pub struct DecodeParams {
        n: u32,
        heads: u32,
        kv_heads: u32,
        hd: u32,
        cap: u32,
        span: u32,
        nsplit: u32,
        scale: f32,
    }
}

/// A span every adapter uses, set by `testing::force_decode_span` (0: none).
static FORCED_SPAN: AtomicUsize = AtomicUsize::new(0);

#[cfg(feature = "testing")]
pub(crate) fn force_span(span: Option<usize>) {
    FORCED_SPAN.store(span.unwrap_or(0), Ordering::Relaxed);
}

/// Threads of an `attend` workgroup: the positions a chunk scores.
const ATTEND_WG: u32 = 64;

/// The sizes of one decode step's attention.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Step {
    /// Sequences stepping together.
    pub n: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Positions the cache holds a sequence.
    pub cap: usize,
}

impl Step {
    fn params(&self) -> Result<DecodeParams> {
        u32_len(
            "decode attention",
            self.n.max(1) * (self.heads + 2 * self.kv_heads) * self.head_dim * self.cap.max(1),
        )?;
        Ok(DecodeParams {
            n: self.n as u32,
            heads: self.heads as u32,
            kv_heads: self.kv_heads as u32,
            hd: self.head_dim as u32,
            cap: self.cap as u32,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
            ..Default::default()
        })
    }
}

/// Positions one `attend` workgroup covers, and how many splits a cache of `len` positions
/// takes: CPU adapters take the whole length in one (their few cores gain nothing from more
/// workgroups, and the merge costs a pass); GPUs give each workgroup one chunk of 64
/// positions, since a workgroup's chunks run one after another (latency-bound at a decode
/// step's size) while splits run side by side. Spans lengthen where the merge's loop budget
/// needs it.
pub(crate) fn attend_split(len: usize, cpu: bool, head_dim: usize) -> (usize, usize) {
    let wg = ATTEND_WG as usize;
    // Loop iterations a chunk of WG positions costs one invocation.
    let per_chunk = head_dim / 4 + head_dim.div_ceil(wg) * wg + 8;
    let max_span = (LOOP_BUDGET - 2 * head_dim) / per_chunk * wg;
    // The merge reads every split's maximum twice.
    let min_span = len.div_ceil((LOOP_BUDGET - 16) / 2).max(wg);
    let forced = FORCED_SPAN.load(Ordering::Relaxed);
    let span = if forced > 0 {
        forced
    } else if cpu {
        len.max(1)
    } else {
        wg
    };
    let span = span.max(min_span).min(max_span).max(wg);
    (span, len.div_ceil(span).max(1))
}

/// Whether `attend` takes these heads: a head dimension of a multiple of 4 up to 256, and
/// query heads in whole groups per key/value head.
pub(crate) fn supports(heads: usize, kv_heads: usize, head_dim: usize) -> bool {
    head_dim.is_multiple_of(4)
        && (4..=256).contains(&head_dim)
        && kv_heads > 0
        && heads.is_multiple_of(kv_heads)
}

/// Rotates the new q and k of `qkv` by their positions, writes q, and stores k and v in
/// the cache (`ps`: u32 [2 n], positions then cache rows).
#[allow(clippy::too_many_arguments)]
pub(crate) fn rope_write(
    dev: &Device,
    st: Step,
    qkv: &Block,
    cos: &Block,
    sin: &Block,
    ps: &Block,
    q: &Block,
    kc: &Block,
    vc: &Block,
    dtype: DType,
) -> Result<()> {
    let threads = st.n * (st.heads + 2 * st.kv_heads) * st.head_dim / 2;
    launch(
        dev,
        &Launch {
            kernel: Kernel::Decode,
            entry: "rope_write",
            wg: 64,
            consts: &[],
            params: st.params()?,
            args: &[
                arg(qkv, dtype),
                arg(cos, DType::F32),
                arg(sin, DType::F32),
                arg(ps, DType::U32),
                arg(q, dtype),
                arg(kc, dtype),
                arg(vc, dtype),
            ],
            groups: grid_1d(threads, 64),
        },
    )
}

/// o [n, heads * head_dim] = attention of q [n, heads, head_dim] over positions
/// 0 ..= ps[i] of each row's cache; `max_len` is the longest row's length after the step.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    dev: &Device,
    st: Step,
    q: &Block,
    kc: &Block,
    vc: &Block,
    ps: &Block,
    o: &Block,
    dtype: DType,
    max_len: usize,
) -> Result<()> {
    if !supports(st.heads, st.kv_heads, st.head_dim) {
        return Err(Error::invalid(
            "decode attention",
            format!(
                "head dimension {} with {} query and {} key/value heads: the kernel takes a \
                 multiple of 4 up to 256, and query heads a multiple of key/value heads",
                st.head_dim, st.heads, st.kv_heads
            ),
        ));
    }
    let (span, nsplit) = attend_split(max_len, dev.info().is_cpu(), st.head_dim);
    let chunks = span.div_ceil(ATTEND_WG as usize);
    let per_chunk = st.head_dim / 4 + st.head_dim.div_ceil(64) * 64 + 8;
    if chunks * per_chunk + st.head_dim > LOOP_BUDGET || 2 * nsplit > LOOP_BUDGET {
        return Err(over_budget(
            format!("decode attention over {max_len} positions"),
            chunks * per_chunk + st.head_dim,
            LOOP_BUDGET,
        ));
    }
    let mut p = st.params()?;
    p.span = span as u32;
    p.nsplit = nsplit as u32;
    let part = if nsplit > 1 {
        Some(dev.alloc((st.n * st.heads * nsplit * (st.head_dim + 2) * 4) as u64)?)
    } else {
        None
    };
    let groups = st.n * st.heads * nsplit;
    launch(
        dev,
        &Launch {
            kernel: Kernel::Decode,
            entry: "attend",
            wg: ATTEND_WG,
            consts: &[("HD", st.head_dim as u32)],
            params: p,
            args: &[
                arg(q, dtype),
                arg(kc, dtype),
                arg(vc, dtype),
                arg(ps, DType::U32),
                arg(part.as_ref().unwrap_or(o), DType::F32),
                arg(o, dtype),
            ],
            groups: grid_1d(groups * ATTEND_WG as usize, ATTEND_WG),
        },
    )?;
    if let Some(part) = &part {
        let wg = st.head_dim.next_power_of_two().max(64) as u32;
        launch(
            dev,
            &Launch {
                kernel: Kernel::Decode,
                entry: "combine",
                wg,
                consts: &[],
                params: p,
                args: &[arg(part, DType::F32), arg(o, dtype)],
                groups: grid_1d(st.n * st.heads * wg as usize, wg),
            },
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_cover_the_cache() {
        for len in [1, 63, 64, 65, 300, 4096, 8192, 100_000] {
            for cpu in [false, true] {
                for hd in [64, 128] {
                    let (span, n) = attend_split(len, cpu, hd);
                    assert!(
                        span * n >= len && span * (n - 1) < len.max(1),
                        "{len} {cpu}"
                    );
                    let per_chunk = hd / 4 + hd.div_ceil(64) * 64 + 8;
                    assert!(span.div_ceil(64) * per_chunk + hd <= LOOP_BUDGET);
                }
            }
        }
    }
}
