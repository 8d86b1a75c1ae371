//! Arithmetic operators on tensors: `&a + &b`, `&a * 2.0`, `-&a`, ...
//!
//! Every operator can fail (shapes that do not broadcast, dtypes that differ, a full memory
//! budget), so each returns [`Result<Tensor>`](crate::Result), as the named methods do:
//! `(&a + &b)?` is [`Tensor::add`], `(&a * 2.0)?` is [`Tensor::affine`]`(2.0, 0.0)`. Owned
//! tensors and references both work; a reference keeps the tensor for later use.
//!
//! ```
//! # fn main() -> wgrad::Result<()> {
//! let dev = wgrad::Device::new()?;
//! let a = dev.tensor(&[1.0f32, 2.0, 3.0], &[3])?;
//! let b = dev.tensor(&[10.0f32], &[1])?;
//! let c = ((&a + &b)? * 2.0)?;
//! assert_eq!(c.to_vec::<f32>()?, vec![22.0, 24.0, 26.0]);
//! let d = (1.0 - (-&a)?)?;
//! assert_eq!(d.to_vec::<f32>()?, vec![2.0, 3.0, 4.0]);
//! # Ok(())
//! # }
//! ```

use crate::error::Result;
use crate::tensor::Tensor;
use std::ops::{Add, Div, Mul, Neg, Sub};

/// `tensor op tensor` for every pairing of owned and borrowed operands.
macro_rules! tensor_tensor {
    ($trait:ident, $fn:ident, $method:ident) => {
        impl $trait<&Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $fn(self, rhs: &Tensor) -> Result<Tensor> {
                Tensor::$method(self, rhs)
            }
        }
        impl $trait<Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $fn(self, rhs: Tensor) -> Result<Tensor> {
                Tensor::$method(self, &rhs)
            }
        }
        impl $trait<&Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $fn(self, rhs: &Tensor) -> Result<Tensor> {
                Tensor::$method(&self, rhs)
            }
        }
        impl $trait<Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $fn(self, rhs: Tensor) -> Result<Tensor> {
                Tensor::$method(&self, &rhs)
            }
        }
    };
}

tensor_tensor!(Add, add, add);
tensor_tensor!(Sub, sub, sub);
tensor_tensor!(Mul, mul, mul);
tensor_tensor!(Div, div, div);

/// `tensor op scalar` and `scalar op tensor` as one affine map `a * x + b` of the tensor
/// (one kernel, differentiable): `(a, b)` from the scalar `s`.
macro_rules! tensor_scalar {
    ($trait:ident, $fn:ident, |$s:ident| $right:expr, $left:expr) => {
        impl $trait<f32> for &Tensor {
            type Output = Result<Tensor>;
            fn $fn(self, $s: f32) -> Result<Tensor> {
                let (a, b) = $right;
                self.affine(a, b)
            }
        }
        impl $trait<f32> for Tensor {
            type Output = Result<Tensor>;
            fn $fn(self, $s: f32) -> Result<Tensor> {
                let (a, b) = $right;
                self.affine(a, b)
            }
        }
        impl $trait<&Tensor> for f32 {
            type Output = Result<Tensor>;
            fn $fn(self, rhs: &Tensor) -> Result<Tensor> {
                let $s = self;
                $left(rhs)
            }
        }
        impl $trait<Tensor> for f32 {
            type Output = Result<Tensor>;
            fn $fn(self, rhs: Tensor) -> Result<Tensor> {
                let $s = self;
                $left(&rhs)
            }
        }
    };
}

tensor_scalar!(Add, add, |s| (1.0, s), |t: &Tensor| t.affine(1.0, s));
tensor_scalar!(Sub, sub, |s| (1.0, -s), |t: &Tensor| t.affine(-1.0, s));
tensor_scalar!(Mul, mul, |s| (s, 0.0), |t: &Tensor| t.affine(s, 0.0));
// x / s as x * (1 / s): within an ulp of the quotient; s / x through the reciprocal.
tensor_scalar!(Div, div, |s| (1.0 / s, 0.0), |t: &Tensor| t
    .recip()
    .and_then(|r| r.affine(s, 0.0)));

impl Neg for &Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(self)
    }
}

impl Neg for Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(&self)
    }
}
