//! Printing a tensor's values: `Display` shows them nested by axis, as PyTorch and candle do,
//! and `Debug` the shape, dtype and the first few values.
//!
//! Both read the values back from the device, so printing waits for the work that computes
//! them. Only what is shown is read: an axis longer than [`EDGE`] ` * 2` is cut to its first
//! and last `EDGE` entries on the device before the read-back, so printing a large tensor
//! reads a few hundred values, not the tensor. A read-back that fails prints the error in
//! place of the values.
//!
//! ```
//! # fn main() -> wgrad::Result<()> {
//! let dev = wgrad::Device::new()?;
//! let x = dev.tensor(&[1.0f32, 2.5, -3.0, 4.0], &[2, 2])?;
//! assert_eq!(x.to_string(), "[[1, 2.5],\n [-3, 4]]\nTensor[2, 2] f32");
//! assert_eq!(format!("{x:?}"), "Tensor([2, 2], f32, [1, 2.5, -3, 4])");
//! // u32 values print exactly, also past 2^24.
//! let ids = dev.tensor(&[16_777_217u32, 3], &[2])?;
//! assert_eq!(format!("{ids:?}"), "Tensor([2], u32, [16777217, 3])");
//! # Ok(())
//! # }
//! ```

use crate::autograd::no_grad;
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;
use std::fmt;

/// Entries shown at each end of a long axis.
pub const EDGE: usize = 3;

/// Values `Debug` shows.
const DEBUG_VALUES: usize = 8;

/// The tensor cut to the first and last `EDGE` entries of each axis longer than `2 * EDGE`
/// (on the device), and which axes were cut.
fn edges(t: &Tensor) -> Result<(Tensor, Vec<bool>)> {
    no_grad(|| {
        let mut t = t.clone();
        let mut cut = vec![false; t.rank()];
        for (a, c) in cut.iter_mut().enumerate() {
            let n = t.shape()[a];
            if n > 2 * EDGE {
                let head = t.narrow(a as isize, 0, EDGE)?;
                let tail = t.narrow(a as isize, n - EDGE, EDGE)?;
                t = Tensor::cat(&[&head, &tail], a as isize)?;
                *c = true;
            }
        }
        Ok((t, cut))
    })
}

/// The values of `t` as text: u32 read as integers (exact past 2^24, where f32 is not),
/// floats as the shortest text that reads back as the same value.
fn texts(t: &Tensor) -> Result<Vec<String>> {
    Ok(if t.dtype() == DType::U32 {
        t.to_vec::<u32>()?.iter().map(u32::to_string).collect()
    } else {
        t.to_f32_vec()?.iter().map(f32::to_string).collect()
    })
}

/// Writes `values` (of `shape`, row-major) nested by axis, with `...` where an axis was cut.
fn nested(out: &mut String, values: &[String], shape: &[usize], cut: &[bool], depth: usize) {
    let Some((&n, rest)) = shape.split_first() else {
        out.push_str(values.first().map_or("?", String::as_str));
        return;
    };
    let inner: usize = rest.iter().product();
    // Entries of the innermost axis share a line; outer entries start lines, indented.
    let separate = |out: &mut String| {
        if rest.is_empty() {
            out.push(' ');
        } else {
            out.push('\n');
            out.push_str(&" ".repeat(depth + 1));
        }
    };
    out.push('[');
    for i in 0..n {
        if i > 0 {
            out.push(',');
            separate(out);
        }
        if cut[0] && i == EDGE {
            out.push_str("...,");
            separate(out);
        }
        let part = &values[i * inner..(i + 1) * inner];
        nested(out, part, rest, &cut[1..], depth + 1);
    }
    out.push(']');
}

fn shape_text(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    dims.join(", ")
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = String::new();
        match edges(self).and_then(|(t, cut)| Ok((texts(&t)?, t.shape().to_vec(), cut))) {
            Ok((values, shape, cut)) => nested(&mut text, &values, &shape, &cut, 0),
            Err(e) => text = format!("<values not readable: {e}>"),
        }
        write!(
            f,
            "{text}\nTensor[{}] {}",
            shape_text(self.shape()),
            self.dtype()
        )
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let first = no_grad(|| {
            let flat = if self.is_contiguous() {
                self.reshape(&[self.numel()])?
            } else {
                let (t, _) = edges(self)?;
                t.contiguous()?.reshape(&[t.numel()])?
            };
            let shown = flat.numel().min(DEBUG_VALUES);
            let values = texts(&flat.narrow(0, 0, shown)?)?;
            Ok::<_, crate::Error>((values, flat.numel() > shown || !self.is_contiguous()))
        });
        let values = match first {
            Ok((v, more)) => {
                let mut parts = v;
                if more {
                    parts.push("...".into());
                }
                format!("[{}]", parts.join(", "))
            }
            Err(e) => format!("<values not readable: {e}>"),
        };
        write!(
            f,
            "Tensor([{}], {}{}{}, {values})",
            shape_text(self.shape()),
            self.dtype(),
            if self.is_contiguous() { "" } else { ", view" },
            if self.requires_grad() { ", grad" } else { "" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_and_cut_axes() {
        let mut s = String::new();
        let v: Vec<String> = (0..12).map(|i| i.to_string()).collect();
        nested(&mut s, &v, &[2, 6], &[false, true], 0);
        assert_eq!(s, "[[0, 1, 2, ..., 3, 4, 5],\n [6, 7, 8, ..., 9, 10, 11]]");
        let mut s = String::new();
        nested(&mut s, &["7".to_string()], &[], &[], 0);
        assert_eq!(s, "7");
    }
}
