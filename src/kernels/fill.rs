//! Host side of `shaders/fill.wgsl`: constants, random numbers, dropout.

use super::{Arg, Kernel, arg, launch_flat, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::Block;

const WG: u32 = 256;

crate::params! {
    /// `struct Params` of fill.wgsl.
    pub struct FillParams {
        n: u32,
        a: f32,
        b: f32,
        seed_lo: u32,
        seed_hi: u32,
        bits: u32,
    }
}

fn run(dev: &Device, entry: &'static str, p: FillParams, args: &[Arg<'_>]) -> Result<()> {
    launch_flat(dev, Kernel::Fill, entry, WG, p, args, p.n as usize)
}

/// A distribution for [`random`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum Dist {
    /// Uniform in [lo, hi).
    Uniform(f32, f32),
    /// Normal with mean and standard deviation.
    Normal(f32, f32),
}

fn seed_words(seed: u64) -> (u32, u32) {
    (seed as u32, (seed >> 32) as u32)
}

/// `out[i] = value` for `n` elements of `dtype`. For u32 storage `value`'s bit pattern is the
/// stored word (so `0.0` is 0).
pub(crate) fn fill(dev: &Device, out: &Block, dtype: DType, n: usize, value: f32) -> Result<()> {
    let n32 = u32_len("fill", n)?;
    // A u32 block is filled through an f32 view: the word stored is value's bit pattern.
    let view = if dtype == DType::U32 {
        DType::F32
    } else {
        dtype
    };
    let p = FillParams {
        n: n32,
        a: value,
        ..Default::default()
    };
    run(dev, "fill", p, &[arg(out, view)])
}

/// Every 32-bit word of `block` set to `bits` (poisoning for tests).
pub(crate) fn fill_words(dev: &Device, block: &Block, bits: u32) -> Result<()> {
    let words = (block.size() / 4) as usize;
    let p = FillParams {
        n: u32_len("poison", words)?,
        bits,
        ..Default::default()
    };
    run(dev, "words", p, &[arg(block, DType::U32)])
}

/// Random numbers from `dist`, a pure function of (seed, index).
pub(crate) fn random(
    dev: &Device,
    out: &Block,
    dtype: DType,
    n: usize,
    dist: Dist,
    seed: u64,
) -> Result<()> {
    let n32 = u32_len("random", n)?;
    let (lo, hi) = seed_words(seed);
    let (entry, a, b) = match dist {
        Dist::Uniform(lo, hi) => ("uniform", lo, hi),
        Dist::Normal(m, s) => ("normal", m, s),
    };
    let p = FillParams {
        n: n32,
        a,
        b,
        seed_lo: lo,
        seed_hi: hi,
        bits: 0,
    };
    run(dev, entry, p, &[arg(out, dtype)])
}

/// `y = r + x * mask / (1 - p)`, n a multiple of 4, with `dropout`'s mask for the same seed:
/// a residual add and its branch's dropout in one pass.
#[allow(clippy::too_many_arguments)]
pub(crate) fn add_dropout(
    dev: &Device,
    r: &Block,
    x: &Block,
    y: &Block,
    dtype: DType,
    n: usize,
    p: f32,
    seed: u64,
) -> Result<()> {
    if !n.is_multiple_of(4) {
        return Err(crate::error::Error::Internal(format!(
            "add_dropout of {n} elements, not a multiple of 4"
        )));
    }
    let params = FillParams {
        n: u32_len("dropout", n)? / 4,
        ..dropout_params(p, seed)
    };
    run(
        dev,
        "add_dropout4",
        params,
        &[arg(r, dtype), arg(x, dtype), arg(y, dtype)],
    )
}

/// The dropout entries' parameters but the count: drop probability, the kept values' scale
/// 1 / (1 - p), and the seed.
fn dropout_params(p: f32, seed: u64) -> FillParams {
    let (lo, hi) = seed_words(seed);
    FillParams {
        n: 0,
        a: p,
        b: if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 },
        seed_lo: lo,
        seed_hi: hi,
        bits: 0,
    }
}

/// `y = x * mask / (1 - p)` with the mask drawn from (seed, index). Applying it to `dy` with the
/// same seed is the backward pass.
pub(crate) fn dropout(
    dev: &Device,
    x: &Block,
    y: &Block,
    dtype: DType,
    n: usize,
    p: f32,
    seed: u64,
) -> Result<()> {
    let n32 = u32_len("dropout", n)?;
    let params = FillParams {
        n: n32,
        ..dropout_params(p, seed)
    };
    // Four elements a thread where they divide evenly (blocks start at element 0).
    if n.is_multiple_of(4) {
        let params = FillParams {
            n: n32 / 4,
            ..params
        };
        return run(dev, "dropout4", params, &[arg(x, dtype), arg(y, dtype)]);
    }
    run(dev, "dropout", params, &[arg(x, dtype), arg(y, dtype)])
}
