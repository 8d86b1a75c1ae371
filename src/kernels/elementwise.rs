//! Host side of `shaders/elementwise.wgsl`.

use super::copy::pack8;
use super::{Arg, Kernel, Launch, arg, grid_1d, launch, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::Dims;
use crate::memory::Block;

const WG: u32 = 256;
/// Highest rank of broadcasting ops.
pub(crate) const MAX_RANK: usize = 6;

/// Every unary op, one row each, and the whole op is its row: the public `Tensor` method and
/// its scalar arguments, the op code, the forward and the derivative in WGSL, which value the
/// gradient reads, where the op is smooth, and an f64 CPU reference. Adding an op is adding a
/// row: the enum, the shader's `unary_op` / `unary_grad` switches, the `Tensor` method and the
/// kernel and gradient tests all come from here.
///
/// Row: `method(scalars) => Variant "CODE" { fwd, grad, domain, cpu }`, where
/// * `fwd` is a WGSL expression in `x` (the input) and the scalars `a`, `b`;
/// * `grad_x` or `grad_y` is f' in WGSL as a function of `v`, the saved input (`grad_x`) or
///   the saved output (`grad_y`: cheaper where f' is a function of f, as for exp, tanh or
///   sigmoid); `no_grad` marks an op without a gradient;
/// * `domain` says where tests sample the op ([`Domain`]);
/// * `cpu` is the reference `|x, a, b| -> f64`.
///
/// A consumer is a macro that takes the rows (`for_each_unary!(my_macro)`), as
/// `declare_unary` below and the `Tensor` methods in `ops::elementwise`.
#[macro_export]
#[doc(hidden)]
macro_rules! for_each_unary {
    ($m:ident) => {
        $m! {
            /// `-self`.
            neg() => Neg "NEG" { fwd: "-x", grad_x: "-1.0", domain: Any, cpu: |x, _, _| -x }
            /// `e^self`.
            exp() => Exp "EXP" { fwd: "exp(x)", grad_y: "v", domain: Any, cpu: |x, _, _| x.exp() }
            /// Natural logarithm.
            log() => Log "LOG" {
                fwd: "log(x)", grad_x: "1.0 / v", domain: Positive, cpu: |x, _, _| x.ln()
            }
            /// Square root.
            sqrt() => Sqrt "SQRT" {
                fwd: "sqrt(x)", grad_y: "0.5 / v", domain: Positive, cpu: |x, _, _| x.sqrt()
            }
            /// `max(self, 0)`.
            relu() => Relu "RELU" {
                fwd: "max(x, 0.0)", grad_x: "select(0.0, 1.0, v > 0.0)", domain: KinkAtZero,
                cpu: |x, _, _| x.max(0.0)
            }
            /// GELU (the exact, erf-based form).
            gelu() => Gelu "GELU" {
                fwd: "0.5 * x * (1.0 + erf_(x * 0.7071067811865476))", grad_x: "gelu_grad_(v)",
                domain: Any, cpu: |x, _, _| $crate::reference::gelu(x)
            }
            /// Hyperbolic tangent.
            tanh() => Tanh "TANH" {
                fwd: "tanh_(x)", grad_y: "1.0 - v * v", domain: Any, cpu: |x, _, _| x.tanh()
            }
            /// Logistic sigmoid.
            sigmoid() => Sigmoid "SIGMOID" {
                fwd: "sigmoid_(x)", grad_y: "v * (1.0 - v)", domain: Any,
                cpu: |x, _, _| 1.0 / (1.0 + (-x).exp())
            }
            /// Absolute value.
            abs() => Abs "ABS" {
                fwd: "abs(x)", grad_x: "sign(v)", domain: KinkAtZero, cpu: |x, _, _| x.abs()
            }
            /// `self * self`.
            square() => Square "SQUARE" {
                fwd: "x * x", grad_x: "2.0 * v", domain: Any, cpu: |x, _, _| x * x
            }
            /// `1 / self`.
            recip() => Recip "RECIP" {
                fwd: "1.0 / x", grad_y: "-v * v", domain: Positive, cpu: |x, _, _| 1.0 / x
            }
            /// `self + a`.
            add_scalar(a) => AddScalar "ADD_SCALAR" {
                fwd: "x + a", grad_x: "1.0", domain: Any, cpu: |x, a, _| x + a
            }
            /// `self * a`.
            mul_scalar(a) => MulScalar "MUL_SCALAR" {
                fwd: "x * a", grad_x: "a", domain: Any, cpu: |x, a, _| x * a
            }
            /// `self ^ a`, exact for integral `a` and negative bases (as PyTorch). Its
            /// gradient `a self^(a-1)` is 0 for `a = 0`, where `self^0` is constant.
            pow_scalar(a) => PowScalar "POW_SCALAR" {
                fwd: "pow_(x, a)", grad_x: "select(a * pow_(v, a - 1.0), 0.0, a == 0.0)",
                domain: Positive, cpu: |x, a, _| x.powf(a)
            }
            /// `a - self`.
            rsub_scalar(a) => RsubScalar "RSUB_SCALAR" {
                fwd: "a - x", grad_x: "-1.0", domain: Any, cpu: |x, a, _| a - x
            }
            /// `max(self, a)`.
            maximum_scalar(a) => MaxScalar "MAX_SCALAR" {
                fwd: "max(x, a)", grad_x: "select(0.0, 1.0, v > a)", domain: KinkAtScalars,
                cpu: |x, a, _| x.max(a)
            }
            /// `min(self, a)`.
            minimum_scalar(a) => MinScalar "MIN_SCALAR" {
                fwd: "min(x, a)", grad_x: "select(0.0, 1.0, v < a)", domain: KinkAtScalars,
                cpu: |x, a, _| x.min(a)
            }
            /// `a * self + b`.
            affine(a, b) => Affine "AFFINE" {
                fwd: "a * x + b", grad_x: "a", domain: Any, cpu: |x, a, b| a * x + b
            }
            /// SiLU (`x * sigmoid(x)`).
            silu() => Silu "SILU" {
                fwd: "x * sigmoid_(x)", grad_x: "silu_grad_(v)", domain: Any,
                cpu: |x, _, _| x / (1.0 + (-x).exp())
            }
            /// `self` clamped to [lo, hi].
            clamp(lo, hi) => Clamp "CLAMP" {
                fwd: "clamp(x, a, b)", grad_x: "select(0.0, 1.0, v >= a && v <= b)",
                domain: KinkAtScalars, cpu: |x, a, b| x.clamp(a, b)
            }
            /// 1.0 where `self > a` (not differentiable).
            gt_scalar(a) => Step "STEP" {
                fwd: "select(0.0, 1.0, x > a)", no_grad: "0.0", domain: KinkAtScalars,
                cpu: |x, a, _| if x > a { 1.0 } else { 0.0 }
            }
            /// Sine.
            sin() => Sin "SIN" { fwd: "sin(x)", grad_x: "cos(v)", domain: Any, cpu: |x, _, _| x.sin() }
            /// Cosine.
            cos() => Cos "COS" {
                fwd: "cos(x)", grad_x: "-sin(v)", domain: Any, cpu: |x, _, _| x.cos()
            }
        }
    };
}

/// Where a unary op is defined and smooth: where its tests draw inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Domain {
    /// Everywhere.
    Any,
    /// For positive inputs (log, sqrt, recip, fractional powers).
    Positive,
    /// Everywhere, with a kink at 0 (relu, abs).
    KinkAtZero,
    /// Everywhere, with kinks at the op's scalar arguments (clamp, max with a scalar).
    KinkAtScalars,
}

/// Declares `Unary` and everything read off its rows (see [`for_each_unary`]).
macro_rules! declare_unary {
    ($($(#[$doc:meta])* $method:ident ($($arg:ident),*) => $v:ident $code:literal {
        fwd: $fwd:literal, $from:ident: $grad:literal, domain: $dom:ident,
        cpu: |$rx:pat_param, $ra:pat_param, $rb:pat_param| $cpu:expr $(,)?
    })*) => {
        /// Unary ops (shader constants `UN_*`), declared by [`for_each_unary`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub enum Unary { $($(#[$doc])* $v),* }

        impl Unary {
            /// Every op, in code order.
            pub const ALL: &'static [Unary] = &[$(Unary::$v),*];

            /// The codes, and the `unary_op` / `unary_grad` WGSL switches built from the rows.
            pub const CODES: $crate::kernels::decl::Codes = $crate::kernels::decl::Codes {
                consts: &[$((concat!("UN_", $code), Unary::$v as u32)),*],
                wgsl: concat!(
                    "\nfn unary_op(op: u32, x: f32, a: f32, b: f32) -> f32 {\n  switch op {\n",
                    $("    case UN_", $code, ": { return ", $fwd, "; }\n",)*
                    "    default: { return x; }\n  }\n}\n",
                    "fn unary_grad(op: u32, v: f32, a: f32, b: f32) -> f32 {\n  switch op {\n",
                    $("    case UN_", $code, ": { return ", $grad, "; }\n",)*
                    "    default: { return 0.0; }\n  }\n}\n",
                ),
            };

            /// The public `Tensor` method.
            pub fn method(self) -> &'static str {
                match self { $(Unary::$v => stringify!($method)),* }
            }

            /// How many scalar arguments the method takes (0 to 2: `a`, then `b`).
            pub fn arity(self) -> usize {
                match self { $(Unary::$v => <[&str]>::len(&[$(stringify!($arg)),*])),* }
            }

            /// Whether the gradient is computed from the op's output (else from its input).
            pub fn grad_uses_output(self) -> bool {
                match self { $(Unary::$v => stringify!($from) == "grad_y"),* }
            }

            /// Whether the op has a gradient.
            pub fn differentiable(self) -> bool {
                match self { $(Unary::$v => stringify!($from) != "no_grad"),* }
            }

            /// Where the op is smooth.
            pub fn domain(self) -> Domain {
                match self { $(Unary::$v => Domain::$dom),* }
            }

            /// The f64 CPU reference, `op(x; a, b)`.
            pub fn reference(self, x: f64, a: f64, b: f64) -> f64 {
                match self {
                    $(Unary::$v => {
                        let ($rx, $ra, $rb) = (x, a, b);
                        $cpu
                    })*
                }
            }
        }
    };
}

for_each_unary!(declare_unary);

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
    /// The name of the `Tensor` method that applies it, for errors.
    pub fn method(self) -> &'static str {
        match self {
            Binary::Add => "add",
            Binary::Sub => "sub",
            Binary::Mul => "mul",
            Binary::Div => "div",
            Binary::Max => "maximum",
            Binary::Min => "minimum",
            Binary::Pow => "pow",
            Binary::Eq => "eq",
            Binary::Ne => "ne",
            Binary::Lt => "lt",
            Binary::Le => "le",
            Binary::Gt => "gt",
            Binary::Ge => "ge",
        }
    }

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

fn run(
    dev: &Device,
    entry: &'static str,
    p: EwParams,
    args: &[Arg<'_>],
    consts: &[(&'static str, u32)],
) -> Result<()> {
    launch(
        dev,
        &Launch {
            kernel: Kernel::Elementwise,
            entry,
            wg: WG,
            consts,
            params: p,
            args,
            groups: grid_1d(p.n as usize, WG),
        },
    )
}

/// Runs the four-elements-a-thread entry `vec` (with `consts`) where the element count
/// divides by 4 (every operand is a whole block, starting at element 0, so the vectors are
/// aligned), else `scalar`. The unary ones take their op as the constant OP, a pipeline per
/// op, without the switch over all of them.
fn run_vec(
    dev: &Device,
    (scalar, vec): (&'static str, &'static str),
    p: EwParams,
    args: &[Arg<'_>],
    consts: &[(&'static str, u32)],
) -> Result<()> {
    if p.n.is_multiple_of(4) {
        return run(dev, vec, EwParams { n: p.n / 4, ..p }, args, consts);
    }
    run(dev, scalar, p, args, &[])
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
    let p = unary_params("unary", op, n, a, b)?;
    let args = [arg(x, dtype), arg(y, dtype)];
    run_vec(dev, ("unary", "unary4"), p, &args, &[("OP", p.op)])
}

fn unary_params(what: &'static str, op: Unary, n: usize, a: f32, b: f32) -> Result<EwParams> {
    Ok(EwParams {
        n: u32_len(what, n)?,
        op: op as u32,
        a,
        b,
        ..Default::default()
    })
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
    let p = unary_params("unary backward", op, n, a, b)?;
    let args = [arg(v, dtype), arg(g, dtype), arg(dx, dtype)];
    run_vec(dev, ("unary_bwd", "unary_bwd4"), p, &args, &[("OP", p.op)])
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
    pub strides: Dims,
    pub offset: usize,
    /// Whether it is the plain row-major buffer of the output's shape (`Layout::is_dense`).
    pub dense: bool,
}

/// The merged iteration shape and strides of `ops` over `out`, or an error past MAX_RANK.
fn plan(
    op: &'static str,
    out: &[usize],
    ops: &[&Operand<'_>],
) -> Result<(Vec<usize>, Vec<Vec<usize>>)> {
    let strides: Vec<Vec<usize>> = ops.iter().map(|o| o.strides.to_vec()).collect();
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
    if x.dense && y.dense {
        let p = EwParams {
            n: n32,
            op: op as u32,
            ..Default::default()
        };
        return run_vec(dev, ("binary", "binary4"), p, &args, &[]);
    }
    let p = two_operand_params("binary", op, x, y, out)?;
    run(dev, "binary_bcast", p, &args, &[])
}

/// The parameters of a two-operand kernel over the dense output `out`, the operands at any
/// layout (strides, offsets, broadcasting).
fn two_operand_params(
    what: &'static str,
    op: Binary,
    x: &Operand<'_>,
    y: &Operand<'_>,
    out: &[usize],
) -> Result<EwParams> {
    let n: usize = out.iter().product();
    let (dims, st) = plan(what, out, &[x, y])?;
    Ok(EwParams {
        n: u32_len(what, n)?,
        op: op as u32,
        rank: dims.len() as u32,
        off0: u32_len(what, x.offset)?,
        off1: u32_len(what, y.offset)?,
        dims: pack8(&dims),
        s0: pack8(&st[0]),
        s1: pack8(&st[1]),
        ..Default::default()
    })
}

/// A comparison of two u32 operands at any layout, exact for every value: `z` (f32, dense)
/// is 1.0 where it holds, else 0.0.
pub(crate) fn compare_u32(
    dev: &Device,
    op: Binary,
    x: &Operand<'_>,
    y: &Operand<'_>,
    z: &Block,
    out: &[usize],
) -> Result<()> {
    let p = two_operand_params("compare", op, x, y, out)?;
    let args = [
        arg(x.block, DType::U32),
        arg(y.block, DType::U32),
        arg(z, DType::F32),
    ];
    run(dev, "compare_u32", p, &args, &[])
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
        &[],
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
