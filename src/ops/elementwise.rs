//! Elementwise tensor ops: unary, scalar, binary with broadcasting, comparisons, `where`.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::elementwise::{self as ew, Binary, Operand, Unary};
use crate::layout::Dims;
use crate::tensor::Tensor;
use crate::tensor::graph::{record, record_fn};

/// A unary op's gradient, from its saved input or output (`Unary::grad_uses_output`), which
/// must be dense.
fn unary_grad(op: Unary, a: f32, b: f32, saved: &Tensor, g: Tensor) -> Result<Tensor> {
    let g = g.contiguous()?;
    let dx = Tensor::uninit(g.device(), g.shape(), g.dtype())?;
    let saved = saved.to_dtype(g.dtype())?;
    ew::unary_bwd(
        g.device(),
        op,
        saved.dense_block("unary backward")?,
        g.dense_block("unary backward")?,
        dx.dense_block("unary backward")?,
        g.dtype(),
        g.numel(),
        a,
        b,
    )?;
    Ok(dx)
}

/// The `Tensor` method of every unary op (`neg`, `exp`, ..., `clamp(lo, hi)`), from the op
/// table in `kernels::elementwise`.
macro_rules! unary_methods {
    ($($(#[$doc:meta])* $method:ident ($($arg:ident),*) => $v:ident $code:literal { $($row:tt)* })*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                pub fn $method(&self, $($arg: f32),*) -> Result<Tensor> {
                    let s = [$($arg,)* 0.0, 0.0];
                    self.unary(Unary::$v, s[0], s[1])
                }
            )*
        }
    };
}

crate::for_each_unary!(unary_methods);

/// A broadcasting binary op's gradients (inputs x, y), summed back to each input's shape;
/// `None` for an input that needs none (a loss scale, a mask, a constant), whose gradient
/// would cost kernels and a sum over the broadcast for nothing.
fn binary_grads(op: Binary, xy: &[Tensor], out: &Tensor, g: Tensor) -> Result<Vec<Option<Tensor>>> {
    let (x, y) = (&xy[0], &xy[1]);
    let (want_x, want_y) = (x.requires_grad(), y.requires_grad());
    // Each side's gradient, computed only where wanted.
    let side =
        |want: bool, f: &dyn Fn() -> Result<Tensor>, shape: &[usize]| -> Result<Option<Tensor>> {
            if want {
                Ok(Some(f()?.sum_to(shape)?))
            } else {
                Ok(None)
            }
        };
    let (gx, gy) = match op {
        Binary::Add => (
            side(want_x, &|| Ok(g.clone()), x.shape())?,
            side(want_y, &|| Ok(g.clone()), y.shape())?,
        ),
        Binary::Sub => (
            side(want_x, &|| Ok(g.clone()), x.shape())?,
            side(want_y, &|| g.neg(), y.shape())?,
        ),
        Binary::Mul => (
            side(want_x, &|| g.mul(y), x.shape())?,
            side(want_y, &|| g.mul(x), y.shape())?,
        ),
        Binary::Div => {
            let gx = g.div(y)?;
            (
                side(want_x, &|| Ok(gx.clone()), x.shape())?,
                side(want_y, &|| gx.mul(x)?.div(y)?.neg(), y.shape())?,
            )
        }
        Binary::Max | Binary::Min => {
            // Ties split the gradient evenly, as PyTorch does.
            let wins = if op == Binary::Max {
                x.gt(y)?
            } else {
                x.lt(y)?
            };
            let ties = x.eq(y)?.mul_scalar(0.5)?;
            let mx = wins.add(&ties)?;
            (
                side(want_x, &|| g.mul(&mx), x.shape())?,
                side(want_y, &|| g.mul(&mx.rsub_scalar(1.0)?), y.shape())?,
            )
        }
        Binary::Pow => {
            // d/dx x^y = y x^(y-1); d/dy x^y = x^y ln x, taken as 0 where x = 0 and y >= 0
            // (PyTorch's convention; 0 * -inf would be NaN).
            let gx = || g.mul(y)?.mul(&x.pow(&y.add_scalar(-1.0)?)?);
            let gy = || {
                let zero_base = x.eq(&Tensor::zeros(x.device(), &[1], x.dtype())?)?;
                let safe_log = x.add(&zero_base)?.log()?;
                g.mul(out)?.mul(&safe_log)
            };
            (side(want_x, &gx, x.shape())?, side(want_y, &gy, y.shape())?)
        }
        Binary::Eq | Binary::Ne | Binary::Lt | Binary::Le | Binary::Gt | Binary::Ge => {
            return Err(Error::Internal("a comparison was recorded".into()));
        }
    };
    Ok(vec![gx, gy])
}

/// `where`'s gradients (inputs: the two branches): to the selected branch; the condition
/// gets none.
fn select_grads(c: &Tensor, xy: &[Tensor], g: Tensor) -> Result<Vec<Option<Tensor>>> {
    let zero = Tensor::zeros(g.device(), &[1], g.dtype())?;
    let gx = Tensor::where_cond(c, &g, &zero)?;
    let gy = Tensor::where_cond(c, &zero, &g)?;
    Ok(vec![
        Some(gx.sum_to(xy[0].shape())?),
        Some(gy.sum_to(xy[1].shape())?),
    ])
}

/// `t` read as an input of a kernel over `out`: its strides broadcast to `out`.
fn operand<'a>(t: &'a Tensor, out: &[usize]) -> Result<Operand<'a>> {
    let l = t
        .layout()
        .broadcast_to(out)
        .ok_or_else(|| Error::Internal(format!("{:?} does not broadcast to {out:?}", t.shape())))?;
    Ok(Operand {
        block: t.block(),
        strides: Dims::from_slice(l.strides()),
        offset: l.offset(),
        dense: l.is_dense(),
    })
}

/// The shape two shapes broadcast to (numpy rules, right-aligned), or an error naming `op`.
pub fn broadcast_shape(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for k in 0..r {
        let da = if k + a.len() >= r {
            a[k + a.len() - r]
        } else {
            1
        };
        let db = if k + b.len() >= r {
            b[k + b.len() - r]
        } else {
            1
        };
        out[k] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::shape(
                    op,
                    format!("{a:?} and {b:?} do not broadcast"),
                ));
            }
        };
    }
    Ok(out)
}

pub(crate) fn same_dtype(op: &'static str, a: &Tensor, b: &Tensor) -> Result<DType> {
    if a.dtype() != b.dtype() {
        return Err(Error::DType {
            op,
            expected: a.dtype(),
            got: b.dtype(),
        });
    }
    Ok(a.dtype())
}

pub(crate) fn float_only(op: &'static str, t: &Tensor) -> Result<()> {
    if !t.dtype().is_float() {
        return Err(Error::DType {
            op,
            expected: DType::F32,
            got: t.dtype(),
        });
    }
    Ok(())
}

pub(crate) fn same_device(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if !a.device().same(b.device()) {
        return Err(Error::invalid(op, "tensors live on different devices"));
    }
    Ok(())
}

impl Tensor {
    /// Applies a unary op (`a`, `b` are its scalar arguments, where it has them).
    pub(crate) fn unary(&self, op: Unary, a: f32, b: f32) -> Result<Tensor> {
        float_only("unary op", self)?;
        let x = self.contiguous()?;
        let out = Tensor::uninit(self.device(), self.shape(), self.dtype())?;
        ew::unary(
            self.device(),
            op,
            x.dense_block("unary")?,
            out.dense_block("unary")?,
            self.dtype(),
            self.numel(),
            a,
            b,
        )?;
        if !op.differentiable() {
            return Ok(out);
        }
        let saved = if op.grad_uses_output() {
            out.detach()
        } else {
            x.detach()
        };
        let rec = record_fn(op.method(), self, move |_, g| {
            unary_grad(op, a, b, &saved, g)
        });
        Ok(out.with_node(rec))
    }

    /// Applies a binary op with broadcasting.
    pub(crate) fn binary(&self, op: Binary, other: &Tensor) -> Result<Tensor> {
        let name = op.method();
        let dtype = same_dtype(name, self, other)?;
        same_device(name, self, other)?;
        // Comparisons of u32 operands (labels against an argmax) are exact and give f32.
        let exact_u32 = dtype == DType::U32 && op.is_comparison();
        if !exact_u32 {
            float_only(name, self)?;
        }
        let shape = broadcast_shape(name, self.shape(), other.shape())?;
        let out_dtype = if exact_u32 { DType::F32 } else { dtype };
        let out = Tensor::uninit(self.device(), &shape, out_dtype)?;
        let (x, y) = (operand(self, &shape)?, operand(other, &shape)?);
        let z = out.dense_block(name)?;
        if exact_u32 {
            ew::compare_u32(self.device(), op, &x, &y, z, &shape)?;
            return Ok(out);
        }
        ew::binary(self.device(), op, &x, &y, z, &shape, dtype)?;
        let rec = if op.is_comparison() {
            None
        } else {
            record("binary", &[self, other], || {
                move |xy: &[Tensor], out: &Tensor, g| binary_grads(op, xy, out, g)
            })
        };
        Ok(out.with_node(rec))
    }

    /// `self + other` (broadcasting).
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(Binary::Add, other)
    }
    /// `self - other` (broadcasting).
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(Binary::Sub, other)
    }
    /// `self * other` (broadcasting).
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(Binary::Mul, other)
    }
    /// `self / other` (broadcasting).
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(Binary::Div, other)
    }
    /// Elementwise maximum (ties split the gradient).
    pub fn maximum(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(Binary::Max, other)
    }
    /// Elementwise minimum (ties split the gradient).
    pub fn minimum(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(Binary::Min, other)
    }
    /// `self ^ other` elementwise, with C's rules for negative bases and zero
    /// (`(-2)^3 = -8`, `0^0 = 1`).
    pub fn pow(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(Binary::Pow, other)
    }
    /// 1.0 where equal, else 0.0 (not differentiable). Comparisons take float tensors of one
    /// dtype, giving that dtype, or two u32 tensors (class labels against an `argmax`),
    /// compared exactly and giving f32.
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let pred = dev.tensor(&[3u32, 1, 4, 1], &[4])?;
    /// let labels = dev.tensor(&[3u32, 1, 5, 9], &[4])?;
    /// let accuracy = pred.eq(&labels)?.mean_all()?.to_scalar()?;
    /// assert_eq!(accuracy, 0.5);
    /// # Ok(())
    /// # }
    /// ```
    pub fn eq(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(Binary::Eq, other)
    }
    /// 1.0 where not equal.
    pub fn ne(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(Binary::Ne, other)
    }
    /// 1.0 where `self < other`.
    pub fn lt(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(Binary::Lt, other)
    }
    /// 1.0 where `self <= other`.
    pub fn le(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(Binary::Le, other)
    }
    /// 1.0 where `self > other`.
    pub fn gt(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(Binary::Gt, other)
    }
    /// 1.0 where `self >= other`.
    pub fn ge(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(Binary::Ge, other)
    }

    /// `cond != 0 ? on_true : on_false`, broadcasting all three. Gradients flow to the
    /// selected branch; `cond` gets none.
    pub fn where_cond(cond: &Tensor, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        let name = "where";
        let dtype = same_dtype(name, on_true, on_false)?;
        same_device(name, cond, on_true)?;
        same_device(name, on_true, on_false)?;
        let shape = broadcast_shape(
            name,
            &broadcast_shape(name, cond.shape(), on_true.shape())?,
            on_false.shape(),
        )?;
        let out = Tensor::uninit(on_true.device(), &shape, dtype)?;
        ew::select(
            on_true.device(),
            &operand(cond, &shape)?,
            cond.dtype(),
            &operand(on_true, &shape)?,
            &operand(on_false, &shape)?,
            out.dense_block(name)?,
            &shape,
            dtype,
        )?;
        let c = cond.detach();
        let rec = record("where", &[on_true, on_false], || {
            move |xy: &[Tensor], _: &Tensor, g| select_grads(&c, xy, g)
        });
        Ok(out.with_node(rec))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_rules() {
        assert_eq!(broadcast_shape("t", &[2, 3], &[3]).ok(), Some(vec![2, 3]));
        assert_eq!(
            broadcast_shape("t", &[2, 1, 4], &[3, 1]).ok(),
            Some(vec![2, 3, 4])
        );
        assert_eq!(broadcast_shape("t", &[], &[5]).ok(), Some(vec![5]));
        let e = broadcast_shape("add", &[2, 3], &[4])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("add") && e.contains("[2, 3]") && e.contains("[4]"),
            "{e}"
        );
    }
}
