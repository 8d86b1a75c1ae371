//! Host side of `shaders/elementwise.wgsl`.

use super::copy::pack8;
use super::{Arg, Kernel, arg, launch_flat, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::Block;

const WG: u32 = 256;
/// Highest rank of broadcasting ops.
pub(crate) const MAX_RANK: usize = 6;

crate::codes! {
    /// Unary ops (shader constants `UN_*`).
    #[allow(missing_docs)]
    pub enum Unary: "UN" {
        Neg = "NEG",
        Exp = "EXP",
        Log = "LOG",
        Sqrt = "SQRT",
        Relu = "RELU",
        Gelu = "GELU",
        Tanh = "TANH",
        Sigmoid = "SIGMOID",
        Abs = "ABS",
        Square = "SQUARE",
        Recip = "RECIP",
        AddScalar = "ADD_SCALAR",
        MulScalar = "MUL_SCALAR",
        PowScalar = "POW_SCALAR",
        RsubScalar = "RSUB_SCALAR",
        MaxScalar = "MAX_SCALAR",
        MinScalar = "MIN_SCALAR",
        Affine = "AFFINE",
        Silu = "SILU",
        Clamp = "CLAMP",
        Step = "STEP",
    }
}

impl Unary {
    /// Whether the gradient is computed from the op's output (else from its input).
    pub fn grad_uses_output(self) -> bool {
        matches!(
            self,
            Unary::Exp | Unary::Sqrt | Unary::Tanh | Unary::Sigmoid | Unary::Recip
        )
    }
}

crate::codes! {
    /// Binary ops (shader constants `BIN_*`).
    #[allow(missing_docs)]
    pub enum Binary: "BIN" {
        Add = "ADD",
        Sub = "SUB",
        Mul = "MUL",
        Div = "DIV",
        Max = "MAX",
        Min = "MIN",
        Pow = "POW",
        Eq = "EQ",
        Ne = "NE",
        Lt = "LT",
        Le = "LE",
        Gt = "GT",
        Ge = "GE",
    }
}

impl Binary {
    /// Comparisons give 0/1 and have no gradient.
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            Binary::Eq | Binary::Ne | Binary::Lt | Binary::Le | Binary::Gt | Binary::Ge
        )
    }
}

crate::params! {
    /// `struct Params` of elementwise.wgsl.
    pub struct EwParams {
        n: u32,
        op: u32,
        a: f32,
        b: f32,
        rank: u32,
        off0: u32,
        off1: u32,
        off2: u32,
        dims: [[u32; 4]; 2],
        s0: [[u32; 4]; 2],
        s1: [[u32; 4]; 2],
        s2: [[u32; 4]; 2],
    }
}

fn run(dev: &Device, entry: &'static str, p: EwParams, args: &[Arg<'_>]) -> Result<()> {
    launch_flat(dev, Kernel::Elementwise, entry, WG, p, args, p.n as usize)
}

/// `y = op(x; a, b)` over `n` elements.
#[allow(clippy::too_many_arguments)]
pub(crate) fn unary(
    dev: &Device,
    op: Unary,
    x: &Block,
    y: &Block,
    dtype: DType,
    n: usize,
    a: f32,
    b: f32,
) -> Result<()> {
    let p = EwParams {
        n: u32_len("unary", n)?,
        op: op as u32,
        a,
        b,
        ..Default::default()
    };
    run(dev, "unary", p, &[arg(x, dtype), arg(y, dtype)])
}

/// `dx = g * op'(v)`, where `v` is the op's saved input or output (`Unary::grad_uses_output`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn unary_bwd(
    dev: &Device,
    op: Unary,
    v: &Block,
    g: &Block,
    dx: &Block,
    dtype: DType,
    n: usize,
    a: f32,
    b: f32,
) -> Result<()> {
    let p = EwParams {
        n: u32_len("unary backward", n)?,
        op: op as u32,
        a,
        b,
        ..Default::default()
    };
    run(
        dev,
        "unary_bwd",
        p,
        &[arg(v, dtype), arg(g, dtype), arg(dx, dtype)],
    )
}

/// Drops size-1 dimensions and merges neighbours that are contiguous in every operand, so most
/// broadcasts run at rank 1 to 3 (fewer divisions per element) and any rank up to
/// [`MAX_RANK`] after merging works.
pub(crate) fn simplify(dims: &[usize], strides: &[Vec<usize>]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut d: Vec<usize> = Vec::new();
    let mut s: Vec<Vec<usize>> = vec![Vec::new(); strides.len()];
    for k in 0..dims.len() {
        if dims[k] == 1 {
            continue;
        }
        let mergeable = !d.is_empty()
            && strides.iter().enumerate().all(|(j, st)| {
                let last = s[j].len() - 1;
                s[j][last] == st[k] * dims[k]
            });
        if mergeable {
            let last = d.len() - 1;
            d[last] *= dims[k];
            for (j, st) in strides.iter().enumerate() {
                let l = s[j].len() - 1;
                s[j][l] = st[k];
            }
        } else {
            d.push(dims[k]);
            for (j, st) in strides.iter().enumerate() {
                s[j].push(st[k]);
            }
        }
    }
    (d, s)
}

/// An input of a broadcasting kernel: its block, and where its elements sit for each
/// coordinate of the output (strides over the output's dimensions, 0 where it broadcasts, and
/// its offset).
pub(crate) struct Operand<'a> {
    pub block: &'a Block,
    pub strides: Vec<usize>,
    pub offset: usize,
}

/// The merged iteration shape and strides of `ops` over `out`, or an error past MAX_RANK.
fn plan(
    op: &'static str,
    out: &[usize],
    ops: &[&Operand<'_>],
) -> Result<(Vec<usize>, Vec<Vec<usize>>)> {
    let strides: Vec<Vec<usize>> = ops.iter().map(|o| o.strides.clone()).collect();
    let (dims, st) = simplify(out, &strides);
    if dims.len() > MAX_RANK {
        return Err(Error::invalid(
            op,
            format!(
                "operands over {out:?} need rank {} (> {MAX_RANK})",
                dims.len()
            ),
        ));
    }
    Ok((dims, st))
}

/// `z = op(x, y)` over the dense output `z` of shape `out`, the inputs at any layout
/// (broadcasting, views).
pub(crate) fn binary(
    dev: &Device,
    op: Binary,
    x: &Operand<'_>,
    y: &Operand<'_>,
    z: &Block,
    out: &[usize],
    dtype: DType,
) -> Result<()> {
    let n: usize = out.iter().product();
    let n32 = u32_len("binary", n)?;
    let args = [arg(x.block, dtype), arg(y.block, dtype), arg(z, dtype)];
    let dense = crate::layout::contiguous_strides(out);
    if x.strides == dense && y.strides == dense && x.offset == 0 && y.offset == 0 {
        let p = EwParams {
            n: n32,
            op: op as u32,
            ..Default::default()
        };
        return run(dev, "binary", p, &args);
    }
    let (dims, st) = plan("binary", out, &[x, y])?;
    let p = EwParams {
        n: n32,
        op: op as u32,
        rank: dims.len() as u32,
        off0: u32_len("binary offset", x.offset)?,
        off1: u32_len("binary offset", y.offset)?,
        dims: pack8(&dims),
        s0: pack8(&st[0]),
        s1: pack8(&st[1]),
        ..Default::default()
    };
    run(dev, "binary_bcast", p, &args)
}

/// `z = c != 0 ? x : y` over the dense output `z`, the inputs at any layout.
#[allow(clippy::too_many_arguments)]
pub(crate) fn select(
    dev: &Device,
    c: &Operand<'_>,
    cdt: DType,
    x: &Operand<'_>,
    y: &Operand<'_>,
    z: &Block,
    out: &[usize],
    dtype: DType,
) -> Result<()> {
    let n: usize = out.iter().product();
    let n32 = u32_len("where", n)?;
    let (dims, st) = plan("where", out, &[c, x, y])?;
    let p = EwParams {
        n: n32,
        rank: dims.len() as u32,
        off0: u32_len("where offset", c.offset)?,
        off1: u32_len("where offset", x.offset)?,
        off2: u32_len("where offset", y.offset)?,
        dims: pack8(&dims),
        s0: pack8(&st[0]),
        s1: pack8(&st[1]),
        s2: pack8(&st[2]),
        ..Default::default()
    };
    run(
        dev,
        "select",
        p,
        &[
            arg(c.block, cdt),
            arg(x.block, dtype),
            arg(y.block, dtype),
            arg(z, dtype),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_and_merging() {
        // [2,3,4] + [4]: the first two dims merge (x contiguous, y repeats).
        let (d, s) = simplify(&[2, 3, 4], &[vec![12, 4, 1], vec![0, 0, 1]]);
        assert_eq!(d, vec![6, 4]);
        assert_eq!(s, vec![vec![4, 1], vec![0, 1]]);
        // Size-1 dims vanish; an all-ones shape becomes rank 0 (one element).
        let (d, _) = simplify(&[1, 1], &[vec![1, 1]]);
        assert!(d.is_empty());
    }
}
