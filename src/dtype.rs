//! Element types a tensor can hold.

use half::{bf16, f16};
use std::fmt;

/// The element type of a tensor's storage. Arithmetic in kernels is always f32; `F16` and
/// `BF16` are storage formats (half the bytes), `U32` holds indices and labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float (storage); computed in f32.
    F16,
    /// bfloat16 (storage: f32's exponent range with 8 significant bits, so training needs no
    /// loss scaler); computed in f32. WGSL has no bf16 type: kernels keep two values per
    /// 32-bit word on every adapter.
    BF16,
    /// 32-bit unsigned integer (indices, labels, argmax results).
    U32,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// True for the floating-point dtypes.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// Bytes for `n` elements, before any alignment.
    pub fn bytes(self, n: usize) -> u64 {
        (n as u64) * self.size() as u64
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::U32 => "u32",
        })
    }
}

impl std::str::FromStr for DType {
    type Err = String;

    /// `f32`, `f16`, `bf16` or `u32` (what `Display` writes), for command lines.
    fn from_str(s: &str) -> Result<DType, String> {
        match s {
            "f32" => Ok(DType::F32),
            "f16" => Ok(DType::F16),
            "bf16" => Ok(DType::BF16),
            "u32" => Ok(DType::U32),
            _ => Err(format!("{s:?} is not f32, f16, bf16 or u32")),
        }
    }
}

/// A host type that maps to a [`DType`]: `f32`, `half::f16`, `half::bf16` or `u32`.
pub trait Element: bytemuck::Pod + Copy + Send + Sync + 'static {
    /// The matching dtype.
    const DTYPE: DType;
    /// Widen to f64 (for references and comparisons).
    fn to_f64(self) -> f64;
    /// Narrow from f64 (rounding as the type does).
    fn from_f64(v: f64) -> Self;
}

macro_rules! element {
    ($t:ty, $d:ident, |$x:ident| $to:expr, |$v:ident| $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn to_f64(self) -> f64 {
                let $x = self;
                $to
            }
            fn from_f64($v: f64) -> Self {
                $from
            }
        }
    };
}

element!(f32, F32, |x| x as f64, |v| v as f32);
element!(f16, F16, |x| x.to_f64(), |v| f16::from_f64(v));
element!(bf16, BF16, |x| x.to_f64(), |v| bf16::from_f64(v));
element!(u32, U32, |x| x as f64, |v| v as u32);
