//! Reading GGUF files, the format llama.cpp and ggml publish quantized models in.
//!
//! [`GgufFile`] maps a file and checks its header, metadata and tensor table; tensor data is
//! read in place ([`GgufFile::tensor_bytes`]) or decoded to f32 ([`GgufFile::dequantize`],
//! [`dequantize`]) from any of the common block formats ([`GgmlType`]): F32, F16, BF16, F64,
//! the integer types, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K formats Q2_K to Q8_K.
//!
//! The format is specified in ggml's `docs/gguf.md`; the decoders reproduce ggml's reference
//! dequantization bit for bit (tests/gguf.rs checks them against the `gguf` Python package).

mod file;
pub mod quant;

pub use file::{Array, DEFAULT_ALIGNMENT, GgufFile, TensorInfo, Value, ValueType};
pub use quant::{GgmlType, dequantize, dequantize_into};
