//! Element types a tensor can hold.

use half::f16;
use std::fmt;

/// The element type of a tensor's storage. Arithmetic in kernels is always f32; `F16` is a
/// storage format (half the bytes), `U32` holds indices and labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float (storage); computed in f32.
    F16,
    /// 32-bit unsigned integer (indices, labels, argmax results).
    U32,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::F16 => 2,
        }
    }

    /// True for the floating-point dtypes.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16)
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
            DType::U32 => "u32",
        })
    }
}

/// A host type that maps to a [`DType`]: `f32`, `half::f16` or `u32`.
pub trait Element: bytemuck::Pod + Copy + Send + Sync + 'static {
    /// The matching dtype.
    const DTYPE: DType;
    /// Widen to f64 (for references and comparisons).
    fn to_f64(self) -> f64;
    /// Narrow from f64 (rounding as the type does).
    fn from_f64(v: f64) -> Self;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
}

impl Element for u32 {
    const DTYPE: DType = DType::U32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as u32
    }
}
