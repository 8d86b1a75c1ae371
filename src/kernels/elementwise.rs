//! Host side of `shaders/elementwise.wgsl`.

use super::{Arg, Kernel, Launch, f, grid_1d, launch, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::Block;

const WG: u32 = 256;
/// Highest rank of broadcasting ops.
pub(crate) const MAX_RANK: usize = 6;

/// Unary ops; the discriminant is the shader's op code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Unary {
    Neg = 0,
    Exp = 1,
    Log = 2,
    Sqrt = 3,
    Relu = 4,
    Gelu = 5,
    Tanh = 6,
    Sigmoid = 7,
    Abs = 8,
    Square = 9,
    Recip = 10,
    AddScalar = 11,
    MulScalar = 12,
    PowScalar = 13,
    RsubScalar = 14,
    MaxScalar = 15,
    MinScalar = 16,
    Affine = 17,
    Silu = 18,
    Clamp = 19,
    Step = 20,
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

/// Binary ops; the discriminant is the shader's op code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Binary {
    Add = 0,
    Sub = 1,
    Mul = 2,
    Div = 3,
    Max = 4,
    Min = 5,
    Pow = 6,
    Eq = 7,
    Ne = 8,
    Lt = 9,
    Le = 10,
    Gt = 11,
    Ge = 12,
}

fn pack(words: &mut Vec<u32>, v: &[usize]) {
    let mut a = [0u32; 8];
    for (k, &d) in v.iter().enumerate() {
        a[k] = d as u32;
    }
    words.extend_from_slice(&a);
}

fn params(n: u32, op: u32, a: f32, b: f32, dims: &[usize], strides: [&[usize]; 3]) -> Vec<u32> {
    let mut w = vec![n, op, f(a), f(b), dims.len() as u32, 0, 0, 0];
    pack(&mut w, dims);
    for s in strides {
        pack(&mut w, s);
    }
    w
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
    let n32 = u32_len("unary", n)?;
    launch(
        dev,
        &Launch {
            kernel: Kernel::Elementwise,
            entry: "unary",
            wg: WG,
            consts: &[],
            params: &params(n32, op as u32, a, b, &[], [&[], &[], &[]]),
            args: &[Arg::read("x", x, dtype), Arg::write("y", y, dtype)],
            groups: grid_1d(n, WG),
        },
    )
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
    let n32 = u32_len("unary backward", n)?;
    launch(
        dev,
        &Launch {
            kernel: Kernel::Elementwise,
            entry: "unary_bwd",
            wg: WG,
            consts: &[],
            params: &params(n32, op as u32, a, b, &[], [&[], &[], &[]]),
            args: &[
                Arg::read("x", v, dtype),
                Arg::read("g", g, dtype),
                Arg::write("dx", dx, dtype),
            ],
            groups: grid_1d(n, WG),
        },
    )
}

/// Element strides of a contiguous tensor of `shape` seen as `out` (right-aligned), with 0 for
/// broadcast dimensions. The caller has checked that the shapes broadcast.
pub(crate) fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; out.len()];
    let mut acc = 1;
    let off = out.len() - shape.len();
    for k in (0..shape.len()).rev() {
        strides[off + k] = if shape[k] == 1 && out[off + k] != 1 {
            0
        } else {
            acc
        };
        acc *= shape[k];
    }
    strides
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

/// `z = op(x, y)` with broadcasting; shapes are right-aligned against `out`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn binary(
    dev: &Device,
    op: Binary,
    x: &Block,
    xs: &[usize],
    y: &Block,
    ys: &[usize],
    z: &Block,
    out: &[usize],
    dtype: DType,
) -> Result<()> {
    let n: usize = out.iter().product();
    let n32 = u32_len("binary", n)?;
    if xs == out && ys == out {
        return launch(
            dev,
            &Launch {
                kernel: Kernel::Elementwise,
                entry: "binary",
                wg: WG,
                consts: &[],
                params: &params(n32, op as u32, 0.0, 0.0, &[], [&[], &[], &[]]),
                args: &[
                    Arg::read("x", x, dtype),
                    Arg::read("y", y, dtype),
                    Arg::write("z", z, dtype),
                ],
                groups: grid_1d(n, WG),
            },
        );
    }
    let (dims, st) = simplify(
        out,
        &[broadcast_strides(xs, out), broadcast_strides(ys, out)],
    );
    if dims.len() > MAX_RANK {
        return Err(Error::invalid(
            "binary",
            format!(
                "broadcast of {xs:?} and {ys:?} needs rank {} (> {MAX_RANK})",
                dims.len()
            ),
        ));
    }
    launch(
        dev,
        &Launch {
            kernel: Kernel::Elementwise,
            entry: "binary_bcast",
            wg: WG,
            consts: &[],
            params: &params(n32, op as u32, 0.0, 0.0, &dims, [&st[0], &st[1], &[]]),
            args: &[
                Arg::read("x", x, dtype),
                Arg::read("y", y, dtype),
                Arg::write("z", z, dtype),
            ],
            groups: grid_1d(n, WG),
        },
    )
}

/// `z = c != 0 ? x : y` with broadcasting.
#[allow(clippy::too_many_arguments)]
pub(crate) fn select(
    dev: &Device,
    c: &Block,
    cs: &[usize],
    cdt: DType,
    x: &Block,
    xs: &[usize],
    y: &Block,
    ys: &[usize],
    z: &Block,
    out: &[usize],
    dtype: DType,
) -> Result<()> {
    let n: usize = out.iter().product();
    let n32 = u32_len("where", n)?;
    let (dims, st) = simplify(
        out,
        &[
            broadcast_strides(cs, out),
            broadcast_strides(xs, out),
            broadcast_strides(ys, out),
        ],
    );
    if dims.len() > MAX_RANK {
        return Err(Error::invalid(
            "where",
            format!("broadcast needs rank {} (> {MAX_RANK})", dims.len()),
        ));
    }
    launch(
        dev,
        &Launch {
            kernel: Kernel::Elementwise,
            entry: "select",
            wg: WG,
            consts: &[],
            params: &params(n32, 0, 0.0, 0.0, &dims, [&st[0], &st[1], &st[2]]),
            args: &[
                Arg::read("c", c, cdt),
                Arg::read("x", x, dtype),
                Arg::read("y", y, dtype),
                Arg::write("z", z, dtype),
            ],
            groups: grid_1d(n, WG),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_and_merging() {
        assert_eq!(broadcast_strides(&[3, 1], &[2, 3, 4]), vec![0, 1, 0]);
        assert_eq!(broadcast_strides(&[4], &[2, 3, 4]), vec![0, 0, 1]);
        assert_eq!(broadcast_strides(&[2, 3, 4], &[2, 3, 4]), vec![12, 4, 1]);
        // [2,3,4] + [4]: the first two dims merge (x contiguous, y repeats).
        let (d, s) = simplify(&[2, 3, 4], &[vec![12, 4, 1], vec![0, 0, 1]]);
        assert_eq!(d, vec![6, 4]);
        assert_eq!(s, vec![vec![4, 1], vec![0, 1]]);
        // Size-1 dims vanish; an all-ones shape becomes rank 0 (one element).
        let (d, _) = simplify(&[1, 1], &[vec![1, 1]]);
        assert!(d.is_empty());
    }
}
