//! The elementwise ops as tables built from the library's own op lists (`Unary::ALL`,
//! `Binary::ALL`). A unary op's row in the library (`for_each_unary!`) carries its method,
//! reference and domain, so the kernel and gradient tests cover a new op without being
//! edited; the binary `match` is exhaustive, so a new binary op does not compile here until
//! it has a method and a reference.

use wgrad::Tensor;
use wgrad::kernels::elementwise::{Binary, Unary};

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

/// A unary op as its tests see it: the public method called with fixed scalars, and the
/// library's f64 reference with the same scalars.
pub struct UnaryCase {
    pub op: Unary,
    pub name: &'static str,
    pub domain: Domain,
    /// Whether it has a gradient to check (comparisons do not).
    pub differentiable: bool,
    a: f32,
    b: f32,
}

impl UnaryCase {
    pub fn run(&self, t: &Tensor) -> wgrad::Result<Tensor> {
        call(self.op, t, self.a, self.b)
    }
    pub fn cpu(&self, x: f64) -> f64 {
        self.op.reference(x, self.a as f64, self.b as f64)
    }
}

/// Calls each op's public method (so a method that does not reach its op fails the tests).
macro_rules! unary_calls {
    ($($(#[$doc:meta])* $method:ident ($($arg:ident),*) => $v:ident $code:literal { $($row:tt)* })*) => {
        fn call(op: Unary, t: &Tensor, a: f32, b: f32) -> wgrad::Result<Tensor> {
            let _ = (a, b);
            match op {
                $(Unary::$v => unary_calls!(@call t.$method($($arg),*) a b),)*
            }
        }
    };
    (@call $t:ident.$m:ident() $a:ident $b:ident) => { $t.$m() };
    (@call $t:ident.$m:ident($x:ident) $a:ident $b:ident) => { $t.$m($a) };
    (@call $t:ident.$m:ident($x:ident, $y:ident) $a:ident $b:ident) => { $t.$m($a, $b) };
}

wgrad::for_each_unary!(unary_calls);

/// One scalar: 1.7 (a fractional power, a point inside the sampled range); two: the interval
/// [-0.3, 0.4].
pub fn unary_case(op: Unary) -> UnaryCase {
    let (a, b) = match op.arity() {
        0 => (0.0, 0.0),
        1 => (1.7, 0.0),
        _ => (-0.3, 0.4),
    };
    let domain = match op.domain() {
        wgrad::kernels::elementwise::Domain::Any => Domain::Any,
        wgrad::kernels::elementwise::Domain::Positive => Domain::Positive,
        wgrad::kernels::elementwise::Domain::KinkAtZero => Domain::Avoid(&[0.0]),
        wgrad::kernels::elementwise::Domain::KinkAtScalars => match op.arity() {
            1 => Domain::Avoid(&[1.7]),
            _ => Domain::Avoid(&[-0.3, 0.4]),
        },
    };
    UnaryCase {
        op,
        name: op.method(),
        domain,
        differentiable: op.differentiable(),
        a,
        b,
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
