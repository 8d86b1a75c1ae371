//! The GGUF container: header, metadata, tensor table and the aligned data section.
//!
//! Layout (all little-endian, versions 2 and 3; version 1 used 32-bit counts and lengths):
//!
//! ```text
//! magic "GGUF" | version: u32 | tensor_count: u64 | metadata_count: u64
//! metadata_count x (key: string | value_type: u32 | value)
//! tensor_count   x (name: string | n_dims: u32 | dims: [u64; n_dims] | type: u32 | offset: u64)
//! padding to general.alignment (default 32)
//! data section: each tensor at data_start + offset, offsets multiples of the alignment
//! ```
//!
//! A string is `len: u64 | len bytes of UTF-8`; an array value is `elem_type: u32 | count: u64 |
//! count values`. `dims[0]` is the innermost (contiguous) dimension, as in ggml.
//!
//! Every read is bounds-checked, and every count or length read from the file is compared with
//! what the rest of the file could hold before anything is allocated for it, so a damaged or
//! hostile file is an [`Error::Format`] naming the field, never a panic or a huge allocation.

use super::quant::{self, GgmlType};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::fmt;
use std::path::Path;

/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// ggml's limit on tensor rank.
const MAX_DIMS: u32 = 4;

/// Arrays of arrays are allowed by the format but nested this deep only by a damaged file; the
/// limit keeps the recursive reader's stack bounded.
const MAX_NESTING: usize = 8;

/// Fewest bytes a tensor table entry takes: name length, n_dims, type, offset.
const MIN_TENSOR_INFO: u64 = 8 + 4 + 4 + 8;

/// Fewest bytes a metadata entry takes: key length, value type, a one-byte value.
const MIN_METADATA: u64 = 8 + 4 + 1;

/// The type of a metadata value, with its id in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// `u8`, id 0.
    U8,
    /// `i8`, id 1.
    I8,
    /// `u16`, id 2.
    U16,
    /// `i16`, id 3.
    I16,
    /// `u32`, id 4.
    U32,
    /// `i32`, id 5.
    I32,
    /// `f32`, id 6.
    F32,
    /// One byte, non-zero for true, id 7.
    Bool,
    /// Length-prefixed UTF-8, id 8.
    String,
    /// Element type, count, elements, id 9.
    Array,
    /// `u64`, id 10.
    U64,
    /// `i64`, id 11.
    I64,
    /// `f64`, id 12.
    F64,
}

impl ValueType {
    /// The type with file id `id`, if any.
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Lower-case name ("u32", "string").
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// Fewest bytes one value of this type takes in the file.
    fn min_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 4 + 8,
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `u8`.
    U8(u8),
    /// `i8`.
    I8(i8),
    /// `u16`.
    U16(u16),
    /// `i16`.
    I16(i16),
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `f32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// A string.
    String(String),
    /// An array of one element type.
    Array(Array),
    /// `u64`.
    U64(u64),
    /// `i64`.
    I64(i64),
    /// `f64`.
    F64(f64),
}

/// A metadata array: its elements, stored by element type so that a vocabulary's scores are a
/// `&[f32]` and its tokens a `&[String]`.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    /// `u8` elements.
    U8(Vec<u8>),
    /// `i8` elements.
    I8(Vec<i8>),
    /// `u16` elements.
    U16(Vec<u16>),
    /// `i16` elements.
    I16(Vec<i16>),
    /// `u32` elements.
    U32(Vec<u32>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `f32` elements.
    F32(Vec<f32>),
    /// `bool` elements.
    Bool(Vec<bool>),
    /// String elements.
    String(Vec<String>),
    /// Array elements, each with its own element type.
    Array(Vec<Array>),
    /// `u64` elements.
    U64(Vec<u64>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `f64` elements.
    F64(Vec<f64>),
}

impl Value {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// An integer of any width, widened.
    fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// An integer of any type whose value fits a `u32` (converters differ in the widths they
    /// write counts with).
    pub fn as_u32(&self) -> Option<u32> {
        self.as_i128().and_then(|v| u32::try_from(v).ok())
    }

    /// An integer of any type whose value fits a `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// An integer of any type whose value fits an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| i64::try_from(v).ok())
    }

    /// An `f32` value (not an `f64`: narrowing would change it).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            _ => None,
        }
    }

    /// An `f32` or `f64` value, as `f64` (widening is exact).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    /// A `bool` value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(v) => Some(v),
            _ => None,
        }
    }

    /// An array value.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(v) => Some(v),
            _ => None,
        }
    }
}

impl Array {
    /// The type of the elements.
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Writes at most this many array elements; the rest as a count.
const DISPLAY_ITEMS: usize = 8;

fn list<T>(
    f: &mut fmt::Formatter<'_>,
    items: &[T],
    one: impl Fn(&mut fmt::Formatter<'_>, &T) -> fmt::Result,
) -> fmt::Result {
    f.write_str("[")?;
    for (i, x) in items.iter().take(DISPLAY_ITEMS).enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        one(f, x)?;
    }
    if items.len() > DISPLAY_ITEMS {
        write!(f, ", ... ({} items)", items.len())?;
    }
    f.write_str("]")
}

/// Scalars as Rust writes them, strings quoted and escaped, arrays as their first eight
/// elements and a count.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(v) => write!(f, "{v:?}"),
            Value::Array(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
        }
    }
}

/// As [`Value`]'s `Display`.
impl fmt::Display for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn d<T: fmt::Display>(f: &mut fmt::Formatter<'_>, x: &T) -> fmt::Result {
            write!(f, "{x}")
        }
        match self {
            Array::U8(v) => list(f, v, d),
            Array::I8(v) => list(f, v, d),
            Array::U16(v) => list(f, v, d),
            Array::I16(v) => list(f, v, d),
            Array::U32(v) => list(f, v, d),
            Array::I32(v) => list(f, v, d),
            Array::F32(v) => list(f, v, d),
            Array::Bool(v) => list(f, v, d),
            Array::String(v) => list(f, v, |f, s| write!(f, "{s:?}")),
            Array::Array(v) => list(f, v, d),
            Array::U64(v) => list(f, v, d),
            Array::I64(v) => list(f, v, d),
            Array::F64(v) => list(f, v, d),
        }
    }
}

/// A value as its `Display` writes it, cut to 60 characters for an error message.
fn brief(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(60) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s,
    }
}

/// One entry of the tensor table, checked against the file: its data lies inside it.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    offset: u64,
    n_elements: u64,
    start: usize,
    len: usize,
}

impl TensorInfo {
    /// The tensor's name ("blk.0.attn_q.weight").
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The dimensions as stored, innermost (contiguous) first, as ggml's `ne`: a 4096 x 11008
    /// row-major matrix (11008 rows of 4096) has `dims() == [4096, 11008]`.
    pub fn dims(&self) -> &[u64] {
        &self.dims
    }

    /// The dimensions outermost first (row-major order, as PyTorch and wgrad's tensors list
    /// them): `dims()` reversed.
    pub fn shape(&self) -> Vec<usize> {
        // Each dim fits a usize: their product, at least as large, was checked to.
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// The element format.
    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }

    /// The offset of the data from the start of the data section, as stored.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The offset of the data from the start of the file.
    pub fn file_offset(&self) -> u64 {
        self.start as u64
    }

    /// Number of values (the product of the dimensions; 1 for a rank-0 tensor).
    pub fn n_elements(&self) -> u64 {
        self.n_elements
    }

    /// Bytes of data.
    pub fn n_bytes(&self) -> u64 {
        self.len as u64
    }
}

/// A GGUF file, memory-mapped: metadata and the tensor table parsed and checked at
/// [`open`](GgufFile::open), tensor data read in place.
///
/// ```
/// use wgrad::gguf::{GgmlType, GgufFile};
///
/// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/quant_blocks.gguf");
/// let file = GgufFile::open(path)?;
/// assert_eq!(file.get_str("general.architecture")?, "wgrad-test");
/// let info = file.tensor("q4_k.raw").ok_or("the fixture has no q4_k.raw")?;
/// assert_eq!((info.ggml_type(), info.shape()), (GgmlType::Q4_K, vec![4, 256]));
/// assert_eq!(file.tensor_bytes(info)?.len(), 4 * 144);
/// let values: Vec<f32> = file.dequantize("q4_k.raw")?;
/// assert_eq!(values.len(), 1024);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct GgufFile {
    path: String,
    map: Bytes,
    header: Header,
}

/// The mapped file, or nothing for an empty one (which cannot be mapped, and does not parse).
enum Bytes {
    Map(memmap2::Mmap),
    Empty,
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Map(m) => m,
            Bytes::Empty => &[],
        }
    }
}

/// What [`parse`] reads from the bytes before the data section.
#[derive(Debug)]
struct Header {
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, Value)>,
    keys: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    names: HashMap<String, usize>,
}

impl GgufFile {
    /// Maps and parses the GGUF file at `path` (versions 2 and 3, little-endian).
    ///
    /// Anything malformed is an [`Error::Format`] naming the file and the field: a wrong magic,
    /// another version, a truncated header, a count or string length larger than the rest of
    /// the file, an unknown value or tensor type, a dimension product that overflows, an offset
    /// that is not a multiple of the alignment, tensor data outside the file. Nothing is
    /// allocated for a count before it is checked against the file's size.
    ///
    /// The file is mapped, not read: tensor data is paged in when touched. As with any mapped
    /// file, truncating it while mapped makes later reads of the lost pages fault.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let file = std::fs::File::open(path)?;
        let map = if file.metadata()?.len() == 0 {
            Bytes::Empty
        } else {
            // SAFETY: the map is read-only and owned by the GgufFile; the slices handed out
            // borrow it. A file changed underneath us can change or fault those reads (the
            // caveat documented above) but cannot make them reach outside the mapping.
            Bytes::Map(unsafe { memmap2::Mmap::map(&file)? })
        };
        let header = parse(&name, map.as_slice())?;
        Ok(GgufFile {
            path: name,
            map,
            header,
        })
    }

    /// The path the file was opened with, as errors name it.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// The alignment of tensor data: `general.alignment`, or [`DEFAULT_ALIGNMENT`].
    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// Where the data section starts in the file.
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }

    /// The metadata value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.header
            .keys
            .get(key)
            .and_then(|&i| self.header.metadata.get(i))
            .map(|(_, v)| v)
    }

    /// Every metadata entry, in file order.
    pub fn metadata(&self) -> impl ExactSizeIterator<Item = (&str, &Value)> {
        self.header.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The value of `key` through `conv`, or an error naming the key when it is missing or
    /// `conv` refuses its type.
    fn typed<'a, T>(
        &'a self,
        key: &str,
        want: &str,
        conv: impl Fn(&'a Value) -> Option<T>,
    ) -> Result<T> {
        let v = self
            .get(key)
            .ok_or_else(|| self.err(format!("metadata key {key:?} is missing")))?;
        conv(v).ok_or_else(|| {
            self.err(format!(
                "metadata key {key:?} is {} {}, expected {want}",
                v.value_type(),
                brief(v)
            ))
        })
    }

    /// `key` as a `u32`: an integer of any type whose value fits.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.typed(key, "an integer that fits u32", Value::as_u32)
    }

    /// `key` as a `u64`: an integer of any type whose value fits.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.typed(key, "an integer that fits u64", Value::as_u64)
    }

    /// `key` as an `i64`: an integer of any type whose value fits.
    pub fn get_i64(&self, key: &str) -> Result<i64> {
        self.typed(key, "an integer that fits i64", Value::as_i64)
    }

    /// `key` as an `f32` (stored as `f32`).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.typed(key, "f32", Value::as_f32)
    }

    /// `key` as an `f64` (stored as `f32` or `f64`).
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        self.typed(key, "f32 or f64", Value::as_f64)
    }

    /// `key` as a `bool`.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        self.typed(key, "bool", Value::as_bool)
    }

    /// `key` as a string.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.typed(key, "string", Value::as_str)
    }

    /// `key` as an array of any element type.
    pub fn get_array(&self, key: &str) -> Result<&Array> {
        self.typed(key, "array", Value::as_array)
    }

    /// `key` as an array of strings (a vocabulary's `tokenizer.ggml.tokens`, its merges).
    pub fn get_str_array(&self, key: &str) -> Result<&[String]> {
        self.typed(key, "array of string", |v| match v {
            Value::Array(Array::String(a)) => Some(a.as_slice()),
            _ => None,
        })
    }

    /// `key` as an array of `f32` (a vocabulary's scores).
    pub fn get_f32_array(&self, key: &str) -> Result<&[f32]> {
        self.typed(key, "array of f32", |v| match v {
            Value::Array(Array::F32(a)) => Some(a.as_slice()),
            _ => None,
        })
    }

    /// `key` as an array of `i32` (a vocabulary's token types).
    pub fn get_i32_array(&self, key: &str) -> Result<&[i32]> {
        self.typed(key, "array of i32", |v| match v {
            Value::Array(Array::I32(a)) => Some(a.as_slice()),
            _ => None,
        })
    }

    /// The tensor table, in file order.
    pub fn tensors(&self) -> std::slice::Iter<'_, TensorInfo> {
        self.header.tensors.iter()
    }

    /// The table entry of the tensor `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.header
            .names
            .get(name)
            .and_then(|&i| self.header.tensors.get(i))
    }

    /// The bytes of a tensor's data, in place in the mapping (no copy).
    ///
    /// Every entry of [`tensors`](GgufFile::tensors) lies inside the file; an entry from
    /// another file that does not is an error, not a panic.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> Result<&[u8]> {
        let bytes = self.map.as_slice();
        info.start
            .checked_add(info.len)
            .and_then(|end| bytes.get(info.start..end))
            .ok_or_else(|| {
                self.err(format!(
                    "tensor {:?}: data [{}..{}) outside the file ({} bytes)",
                    info.name,
                    info.start,
                    info.start as u128 + info.len as u128,
                    bytes.len()
                ))
            })
    }

    /// The values of tensor `name` decoded to f32, in storage order (innermost dimension
    /// fastest). A missing tensor, or a type without a decoder
    /// ([`GgmlType::can_dequantize`]), is an [`Error::Format`] naming the tensor.
    pub fn dequantize(&self, name: &str) -> Result<Vec<f32>> {
        let info = self
            .tensor(name)
            .ok_or_else(|| self.err(format!("no tensor named {name:?}")))?;
        let bytes = self.tensor_bytes(info)?;
        let n = usize::try_from(info.n_elements).map_err(|_| {
            self.err(format!(
                "tensor {name:?}: too many elements for this machine"
            ))
        })?;
        quant::dequantize(info.ty, bytes, n).map_err(|e| {
            let detail = match e {
                Error::Invalid { detail, .. } => detail,
                other => other.to_string(),
            };
            self.err(format!("tensor {name:?} ({}): {detail}", info.ty))
        })
    }

    fn err(&self, detail: String) -> Error {
        Error::format(self.path.clone(), detail)
    }
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.header.version)
            .field("metadata", &self.header.metadata.len())
            .field("tensors", &self.header.tensors.len())
            .finish()
    }
}

/// A bounds-checked reader over the file's bytes. `what` closures name the field being read,
/// built only when an error needs them.
struct Cursor<'a> {
    file: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

type What<'w> = &'w dyn Fn() -> String;

impl<'a> Cursor<'a> {
    fn err(&self, what: What, detail: impl fmt::Display) -> Error {
        Error::format(self.file, format!("{}: {detail}", what()))
    }

    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos.min(self.bytes.len())) as u64
    }

    fn take(&mut self, n: u64, what: What) -> Result<&'a [u8]> {
        let slice = usize::try_from(n)
            .ok()
            .and_then(|n| Some(self.pos..self.pos.checked_add(n)?))
            .and_then(|r| self.bytes.get(r));
        match slice {
            Some(s) => {
                self.pos += s.len();
                Ok(s)
            }
            None => Err(self.err(
                what,
                format!(
                    "truncated: {n} bytes needed at offset {}, the file has {} bytes",
                    self.pos,
                    self.bytes.len()
                ),
            )),
        }
    }

    fn array<const N: usize>(&mut self, what: What) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: What) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: What) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A count of items of at least `min` bytes each, checked against the rest of the file.
    fn count(&mut self, min: u64, what: What) -> Result<usize> {
        let n = self.u64(what)?;
        let left = self.remaining();
        if n > left / min.max(1) {
            return Err(self.err(
                what,
                format!("{n} cannot fit in the {left} bytes left in the file (each takes at least {min})"),
            ));
        }
        // n <= left, and left is the length of an in-memory slice.
        Ok(n as usize)
    }

    fn string(&mut self, what: What) -> Result<String> {
        let len = self.u64(what)?;
        let left = self.remaining();
        if len > left {
            return Err(self.err(
                what,
                format!("string length {len} exceeds the {left} bytes left in the file"),
            ));
        }
        let s = self.take(len, what)?;
        match std::str::from_utf8(s) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(self.err(what, format!("string is not UTF-8 ({e})"))),
        }
    }

    fn value_type(&mut self, what: What) -> Result<ValueType> {
        let id = self.u32(what)?;
        ValueType::from_id(id).ok_or_else(|| self.err(what, format!("unknown value type {id}")))
    }

    fn value(&mut self, ty: ValueType, depth: usize, what: What) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.array(what)?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::Bool => Value::Bool(self.array::<1>(what)?[0] != 0),
            ValueType::String => Value::String(self.string(what)?),
            ValueType::Array => Value::Array(self.array_value(depth, what)?),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
        })
    }

    /// `n` fixed-size elements decoded by `conv`; `n` was checked against the file.
    fn fixed<const N: usize, T>(
        &mut self,
        n: usize,
        what: What,
        conv: fn([u8; N]) -> T,
    ) -> Result<Vec<T>> {
        let bytes = self.take((n as u64) * N as u64, what)?;
        let (chunks, _) = bytes.as_chunks::<N>();
        Ok(chunks.iter().map(|c| conv(*c)).collect())
    }

    fn array_value(&mut self, depth: usize, what: What) -> Result<Array> {
        if depth >= MAX_NESTING {
            return Err(self.err(what, format!("arrays nested deeper than {MAX_NESTING}")));
        }
        let elem = self.value_type(&|| format!("{}: array element type", what()))?;
        let n = self.count(elem.min_size(), &|| format!("{}: array count", what()))?;
        Ok(match elem {
            ValueType::U8 => Array::U8(self.fixed(n, what, u8::from_le_bytes)?),
            ValueType::I8 => Array::I8(self.fixed(n, what, i8::from_le_bytes)?),
            ValueType::U16 => Array::U16(self.fixed(n, what, u16::from_le_bytes)?),
            ValueType::I16 => Array::I16(self.fixed(n, what, i16::from_le_bytes)?),
            ValueType::U32 => Array::U32(self.fixed(n, what, u32::from_le_bytes)?),
            ValueType::I32 => Array::I32(self.fixed(n, what, i32::from_le_bytes)?),
            ValueType::F32 => Array::F32(self.fixed(n, what, f32::from_le_bytes)?),
            ValueType::Bool => Array::Bool(self.fixed(n, what, |b: [u8; 1]| b[0] != 0)?),
            ValueType::U64 => Array::U64(self.fixed(n, what, u64::from_le_bytes)?),
            ValueType::I64 => Array::I64(self.fixed(n, what, i64::from_le_bytes)?),
            ValueType::F64 => Array::F64(self.fixed(n, what, f64::from_le_bytes)?),
            ValueType::String => {
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(self.string(&|| format!("{}[{i}]", what()))?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(self.array_value(depth + 1, &|| format!("{}[{i}]", what()))?);
                }
                Array::Array(v)
            }
        })
    }
}

/// Parses everything before the data section and checks every tensor's data lies in `bytes`.
fn parse(file: &str, bytes: &[u8]) -> Result<Header> {
    let mut c = Cursor {
        file,
        bytes,
        pos: 0,
    };
    let magic = c.array::<4>(&|| "magic".into())?;
    if &magic != b"GGUF" {
        return Err(c.err(
            &|| "magic".into(),
            format!("{magic:02x?} is not \"GGUF\": not a GGUF file"),
        ));
    }
    let version = c.u32(&|| "version".into())?;
    if version != 2 && version != 3 {
        let hint = if matches!(version.swap_bytes(), 2 | 3) {
            " (a big-endian file; only little-endian GGUF is read)"
        } else if version == 1 {
            " (version 1, with 32-bit counts, is obsolete)"
        } else {
            ""
        };
        return Err(c.err(
            &|| "version".into(),
            format!("version {version} is not supported, only 2 and 3{hint}"),
        ));
    }
    let n_tensors = c.u64(&|| "tensor count".into())?;
    let n_kv = c.count(MIN_METADATA, &|| "metadata count".into())?;
    // The tensor count is checked once the metadata is read, against what is left after it;
    // checking it here too catches an absurd one before any metadata is parsed.
    let tensor_limit = |c: &Cursor| -> Result<usize> {
        let left = c.remaining();
        if n_tensors > left / MIN_TENSOR_INFO {
            return Err(c.err(
                &|| "tensor count".into(),
                format!(
                    "{n_tensors} cannot fit in the {left} bytes left in the file (each takes at least {MIN_TENSOR_INFO})"
                ),
            ));
        }
        Ok(n_tensors as usize)
    };
    tensor_limit(&c)?;

    let mut metadata = Vec::with_capacity(n_kv);
    let mut keys = HashMap::with_capacity(n_kv);
    let mut alignment = DEFAULT_ALIGNMENT;
    for i in 0..n_kv {
        let key = c.string(&|| format!("metadata key #{i}"))?;
        let what = || format!("metadata key {key:?}");
        let ty = c.value_type(&|| format!("{}: value type", what()))?;
        let value = c.value(ty, 0, &what)?;
        if key == "general.alignment" {
            alignment = match value {
                Value::U32(a) if a.is_power_of_two() => a.into(),
                _ => {
                    return Err(c.err(
                        &what,
                        format!(
                            "{} {} is not a u32 power of two",
                            value.value_type(),
                            brief(&value)
                        ),
                    ));
                }
            };
        }
        if keys.insert(key.clone(), i).is_some() {
            return Err(c.err(&what, "appears twice"));
        }
        metadata.push((key, value));
    }

    let n_tensors = tensor_limit(&c)?;
    let mut tensors = Vec::with_capacity(n_tensors);
    let mut names = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = c.string(&|| format!("tensor #{i} name"))?;
        let what = |field: &str| format!("tensor {name:?}: {field}");
        let n_dims = c.u32(&|| what("n_dims"))?;
        if n_dims > MAX_DIMS {
            return Err(c.err(
                &|| what("n_dims"),
                format!("{n_dims} dimensions, at most {MAX_DIMS}"),
            ));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for j in 0..n_dims {
            dims.push(c.u64(&|| what(&format!("dims[{j}]")))?);
        }
        let id = c.u32(&|| what("type"))?;
        let ty = GgmlType::from_id(id)
            .ok_or_else(|| c.err(&|| what("type"), format!("unknown type id {id}")))?;
        let offset = c.u64(&|| what("offset"))?;
        let n_elements = dims
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| {
                c.err(
                    &|| what("dims"),
                    format!("{dims:?} overflow the element count"),
                )
            })?;
        let row = dims.first().copied().unwrap_or(1);
        if !row.is_multiple_of(ty.block_size() as u64) {
            return Err(c.err(
                &|| what("dims[0]"),
                format!(
                    "{row} is not a multiple of {ty}'s block of {} values",
                    ty.block_size()
                ),
            ));
        }
        // A whole number of blocks, so bytes_for only fails on overflow.
        let n_bytes = ty.bytes_for(n_elements).ok_or_else(|| {
            c.err(
                &|| what("dims"),
                format!("{dims:?} of {ty} overflow the byte count"),
            )
        })?;
        if !offset.is_multiple_of(alignment) {
            return Err(c.err(
                &|| what("offset"),
                format!("{offset} is not a multiple of the alignment {alignment}"),
            ));
        }
        let len = usize::try_from(n_bytes).map_err(|_| {
            c.err(
                &|| what("dims"),
                format!("{n_bytes} bytes do not fit this machine"),
            )
        })?;
        if names.insert(name.clone(), i).is_some() {
            return Err(c.err(&|| what("name"), "appears twice"));
        }
        // `start` is set below, once the data section's start is known.
        tensors.push(TensorInfo {
            name,
            dims,
            ty,
            offset,
            n_elements,
            start: 0,
            len,
        });
    }

    // The data section starts at the first multiple of the alignment after the table.
    let data_offset = (c.pos as u64).next_multiple_of(alignment);
    for t in &mut tensors {
        let range = data_offset
            .checked_add(t.offset)
            .and_then(|s| Some((s, s.checked_add(t.len as u64)?)));
        match range {
            Some((s, e)) if e <= bytes.len() as u64 => {
                t.start = s as usize;
            }
            _ => {
                let s = data_offset as u128 + t.offset as u128;
                return Err(Error::format(
                    file,
                    format!(
                        "tensor {:?}: data [{s}..{}) outside the file ({} bytes)",
                        t.name,
                        s + t.len as u128,
                        bytes.len()
                    ),
                ));
            }
        }
    }
    Ok(Header {
        version,
        alignment,
        data_offset,
        metadata,
        keys,
        tensors,
        names,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header of `version` with the given counts, then `rest`.
    fn file(version: u32, n_tensors: u64, n_kv: u64, rest: &[u8]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(version.to_le_bytes());
        b.extend(n_tensors.to_le_bytes());
        b.extend(n_kv.to_le_bytes());
        b.extend(rest);
        b
    }

    fn string(s: &str) -> Vec<u8> {
        let mut b = (s.len() as u64).to_le_bytes().to_vec();
        b.extend(s.as_bytes());
        b
    }

    fn message(bytes: &[u8]) -> String {
        match parse("t.gguf", bytes) {
            Err(Error::Format { path, detail }) => {
                assert_eq!(path, "t.gguf");
                detail
            }
            other => panic!("expected a format error, got {other:?}"),
        }
    }

    #[test]
    fn gguf_empty_file_parses() {
        let h = parse("t.gguf", &file(3, 0, 0, &[])).unwrap();
        assert_eq!((h.version, h.alignment, h.data_offset), (3, 32, 32));
        assert!(h.tensors.is_empty() && h.metadata.is_empty());
    }

    #[test]
    fn gguf_header_errors_name_the_field() {
        assert!(message(&[]).starts_with("magic: truncated"));
        assert!(message(b"GGUF\x03\x00").starts_with("version: truncated"));
        assert!(message(&file(1, 0, 0, &[])).contains("version 1"));
        assert!(message(&file(3 << 24, 0, 0, &[])).contains("big-endian"));
        assert!(message(&file(3, 1 << 60, 0, &[])).starts_with("tensor count"));
        assert!(message(&file(3, 0, 1 << 40, &[])).starts_with("metadata count"));
    }

    #[test]
    fn gguf_nesting_is_limited() {
        // An array of arrays of arrays ... each with one element.
        let mut kv = string("deep");
        kv.extend(9u32.to_le_bytes());
        for _ in 0..64 {
            kv.extend(9u32.to_le_bytes());
            kv.extend(1u64.to_le_bytes());
        }
        let m = message(&file(3, 0, 1, &kv));
        assert!(m.contains("nested deeper"), "{m}");
    }
}
