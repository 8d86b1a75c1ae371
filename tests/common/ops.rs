//! The elementwise ops as tables built from the library's own op lists (`Unary::ALL`,
//! `Binary::ALL`). Each `match` below is exhaustive: an op added to the library does not
//! compile here until it has a public method, a CPU reference and a domain, and the kernel
//! and gradient tests then cover it without being edited.

use wgrad::Tensor;
use wgrad::kernels::elementwise::{Binary, Unary};
use wgrad::reference as cpu;

/// Where test inputs are drawn.
#[derive(Clone, Copy)]
pub enum Domain {
    /// Uniform in [-3, 3).
    Any,
    /// In [0.1, 1.1) (log, sqrt, recip, fractional powers).
    Positive,
    /// In [-3, 3) but at least 0.05 away from each listed point (where the op is not smooth).
    Avoid(&'static [f64]),
}

pub struct UnaryCase {
    pub name: &'static str,
    pub run: fn(&Tensor) -> wgrad::Result<Tensor>,
    pub cpu: fn(f64) -> f64,
    pub domain: Domain,
    /// Whether it has a gradient to check (comparisons do not).
    pub differentiable: bool,
}

fn sig(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

pub fn unary_case(op: Unary) -> UnaryCase {
    use Domain::*;
    let c = |name, run, cpu, domain| UnaryCase {
        name,
        run,
        cpu,
        domain,
        differentiable: true,
    };
    match op {
        Unary::Neg => c("neg", |t| t.neg(), |x| -x, Any),
        Unary::Exp => c("exp", |t| t.exp(), f64::exp, Any),
        Unary::Log => c("log", |t| t.log(), f64::ln, Positive),
        Unary::Sqrt => c("sqrt", |t| t.sqrt(), f64::sqrt, Positive),
        Unary::Relu => c("relu", |t| t.relu(), |x| x.max(0.0), Avoid(&[0.0])),
        Unary::Gelu => c("gelu", |t| t.gelu(), cpu::gelu, Any),
        Unary::Tanh => c("tanh", |t| t.tanh(), f64::tanh, Any),
        Unary::Sigmoid => c("sigmoid", |t| t.sigmoid(), sig, Any),
        Unary::Silu => c("silu", |t| t.silu(), |x| x * sig(x), Any),
        Unary::Abs => c("abs", |t| t.abs(), f64::abs, Avoid(&[0.0])),
        Unary::Square => c("square", |t| t.square(), |x| x * x, Any),
        Unary::Recip => c("recip", |t| t.recip(), |x| 1.0 / x, Positive),
        Unary::AddScalar => c("add_scalar", |t| t.add_scalar(0.75), |x| x + 0.75, Any),
        Unary::MulScalar => c("mul_scalar", |t| t.mul_scalar(-1.5), |x| x * -1.5, Any),
        Unary::PowScalar => c(
            "pow_scalar",
            |t| t.pow_scalar(1.7),
            |x| x.powf(1.7),
            Positive,
        ),
        Unary::RsubScalar => c("rsub_scalar", |t| t.rsub_scalar(1.0), |x| 1.0 - x, Any),
        Unary::MaxScalar => c(
            "maximum_scalar",
            |t| t.maximum_scalar(0.25),
            |x| x.max(0.25),
            Avoid(&[0.25]),
        ),
        Unary::MinScalar => c(
            "minimum_scalar",
            |t| t.minimum_scalar(-0.4),
            |x| x.min(-0.4),
            Avoid(&[-0.4]),
        ),
        Unary::Affine => c("affine", |t| t.affine(0.5, 2.0), |x| 0.5 * x + 2.0, Any),
        Unary::Clamp => c(
            "clamp",
            |t| t.clamp(-0.3, 0.4),
            |x| x.clamp(-0.3, 0.4),
            Avoid(&[-0.3, 0.4]),
        ),
        Unary::Step => UnaryCase {
            differentiable: false,
            ..c(
                "gt_scalar",
                |t| t.gt_scalar(0.2),
                |x| (x > 0.2) as u8 as f64,
                Avoid(&[0.2]),
            )
        },
    }
}

/// `n` inputs from `domain` (uniform values from `rng`, mapped).
pub fn sample(rng: &mut super::Rng, domain: Domain, n: usize) -> Vec<f32> {
    rng.vec(n)
        .into_iter()
        .map(|u| match domain {
            Domain::Any => u * 3.0,
            Domain::Positive => u.abs() + 0.1,
            Domain::Avoid(points) => {
                let mut x = u * 3.0;
                // Step away from each kink (a second pass cannot land on another: kinks are
                // further than 0.1 apart in every table entry).
                for &p in points {
                    if ((x as f64) - p).abs() < 0.05 {
                        x = p as f32 + 0.1_f32.copysign(x - p as f32);
                    }
                }
                x
            }
        })
        .collect()
}

pub struct BinaryCase {
    pub name: &'static str,
    pub run: fn(&Tensor, &Tensor) -> wgrad::Result<Tensor>,
    pub cpu: fn(f64, f64) -> f64,
    pub differentiable: bool,
}

pub fn binary_case(op: Binary) -> BinaryCase {
    let c = |name, run, cpu| BinaryCase {
        name,
        run,
        cpu,
        differentiable: true,
    };
    let cmp = |name, run, cpu| BinaryCase {
        name,
        run,
        cpu,
        differentiable: false,
    };
    match op {
        Binary::Add => c("add", |a, b| a.add(b), |a, b| a + b),
        Binary::Sub => c("sub", |a, b| a.sub(b), |a, b| a - b),
        Binary::Mul => c("mul", |a, b| a.mul(b), |a, b| a * b),
        Binary::Div => c("div", |a, b| a.div(b), |a, b| a / b),
        Binary::Max => c("maximum", |a, b| a.maximum(b), f64::max),
        Binary::Min => c("minimum", |a, b| a.minimum(b), f64::min),
        Binary::Pow => c("pow", |a, b| a.pow(b), f64::powf),
        Binary::Eq => cmp("eq", |a, b| a.eq(b), |a, b| (a == b) as u8 as f64),
        Binary::Ne => cmp("ne", |a, b| a.ne(b), |a, b| (a != b) as u8 as f64),
        Binary::Lt => cmp("lt", |a, b| a.lt(b), |a, b| (a < b) as u8 as f64),
        Binary::Le => cmp("le", |a, b| a.le(b), |a, b| (a <= b) as u8 as f64),
        Binary::Gt => cmp("gt", |a, b| a.gt(b), |a, b| (a > b) as u8 as f64),
        Binary::Ge => cmp("ge", |a, b| a.ge(b), |a, b| (a >= b) as u8 as f64),
    }
}
