"""Writes tests/fixtures/quant_blocks.gguf, the file tests/gguf.rs reads: for each block format
wgrad decodes, a quantized tensor `<type>.raw` and the `gguf` package's own dequantization of it
as an F32 tensor `<type>.ref`, plus one metadata key of every GGUF value type with known values.

The reference values come from `gguf.quants.dequantize` (the Python twin of ggml's decoders), so
the Rust test checks wgrad's decoders against an implementation it shares no code with. Where the
package can quantize a format, the first two rows of `<type>.raw` are its quantization of seeded
normal data (realistic blocks) and the last two are seeded random bytes with finite scales (every
bit pattern of the quants); where it cannot, all four rows are random bytes with finite scales.
Q8_K, which the package does not decode, is checked against `d * q` computed here in float32, as
ggml defines it; the integer and F64 tensors against numpy's conversion to float32.

    python3 -m pip install gguf numpy && python3 scripts/make_gguf_fixture.py
"""
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                   "quant_blocks.gguf")

rng = np.random.default_rng(20240611)
ROWS, COLS = 4, 256

# Byte offsets of the float16 scales in each block (d, and m or dmin where the format has one):
# random bytes there would be NaN or infinity about one time in thirty, so they are overwritten
# with finite values. A signed field may be negative (legacy formats store d = max / -8).
SCALES = {
    Q.Q4_0: [(0, True)],
    Q.Q4_1: [(0, True), (2, True)],
    Q.Q5_0: [(0, True)],
    Q.Q5_1: [(0, True), (2, True)],
    Q.Q8_0: [(0, True)],
    Q.Q2_K: [(80, False), (82, False)],
    Q.Q3_K: [(108, False)],
    Q.Q4_K: [(0, False), (2, False)],
    Q.Q5_K: [(0, False), (2, False)],
    Q.Q6_K: [(208, False)],
}


def random_blocks(ty, n_blocks):
    """Random bytes for n_blocks blocks of ty, with finite float16 scales."""
    _, type_size = gguf.GGML_QUANT_SIZES[ty]
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for off, signed in SCALES[ty]:
        mag = rng.uniform(1e-3, 0.5, size=n_blocks)
        if signed:
            mag *= rng.choice([-1.0, 1.0], size=n_blocks)
        raw[:, off:off + 2] = mag.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return raw


def block_tensor(ty):
    """ROWS x COLS values of ty as bytes, one row per line of blocks."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[ty]
    per_row = COLS // block_size
    try:
        data = rng.normal(0.0, 1.0, size=(2, COLS)).astype(np.float32)
        quantized = gguf.quants.quantize(data, ty).reshape(2, per_row * type_size)
        rand = random_blocks(ty, 2 * per_row).reshape(2, per_row * type_size)
        return np.concatenate([quantized, rand], axis=0)
    except NotImplementedError:
        return random_blocks(ty, ROWS * per_row).reshape(ROWS, per_row * type_size)


w = gguf.GGUFWriter(OUT, arch="wgrad-test")

# Block formats, decoded by the package.
for ty in [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]:
    raw = block_tensor(ty)
    ref = gguf.quants.dequantize(raw, ty).astype(np.float32)
    assert ref.shape == (ROWS, COLS)
    name = ty.name.lower()
    w.add_tensor(f"{name}.raw", raw, raw_dtype=ty)
    w.add_tensor(f"{name}.ref", ref)

# Q8_K: float32 d, 256 int8 quants, 16 int16 sums of 16 quants each; the value is d * q.
n_blocks = ROWS * COLS // 256
d = rng.uniform(1e-3, 0.5, size=n_blocks).astype(np.float32)
q = rng.integers(-128, 128, size=(n_blocks, 256), dtype=np.int8)
bsums = q.astype(np.int16).reshape(n_blocks, 16, 16).sum(axis=-1, dtype=np.int16)
q8k = np.concatenate([d.view(np.uint8).reshape(n_blocks, 4), q.view(np.uint8),
                      bsums.view(np.uint8).reshape(n_blocks, 32)], axis=1)
w.add_tensor("q8_k.raw", q8k.reshape(ROWS, -1), raw_dtype=Q.Q8_K)
w.add_tensor("q8_k.ref", (d.reshape(n_blocks, 1) * q.astype(np.float32)).reshape(ROWS, COLS))

# Float formats: normal values plus the edge cases (subnormal, signed zero, largest, infinity).
special = np.array([0.0, -0.0, 65504.0, -65504.0, 6e-8, -6e-5, np.inf, -np.inf], np.float32)
f32 = rng.normal(0.0, 3.0, size=(ROWS, 64)).astype(np.float32)
f32[0, :8] = special
w.add_tensor("f32.raw", f32)
w.add_tensor("f32.ref", f32)
# A three-dimensional tensor, so the test sees GGUF's innermost-first dimension order.
f16 = f32.reshape(ROWS, 2, 32).astype(np.float16)
w.add_tensor("f16.raw", f16)
w.add_tensor("f16.ref", gguf.quants.dequantize(f16.view(np.uint8), Q.F16).astype(np.float32))
bf16 = gguf.quants.quantize(f32 * np.float32(1e20), Q.BF16)
w.add_tensor("bf16.raw", bf16, raw_dtype=Q.BF16)
w.add_tensor("bf16.ref", gguf.quants.dequantize(bf16, Q.BF16).astype(np.float32))

# Integer and F64 tensors, whose value is numpy's conversion to float32.
for dtype, scale in [(np.int8, 100), (np.int16, 30000), (np.int32, 2**30), (np.int64, 2**62)]:
    ints = (rng.uniform(-1.0, 1.0, size=(2, 16)) * scale).astype(dtype)
    name = np.dtype(dtype).name.replace("int", "i")
    w.add_tensor(f"{name}.raw", ints)
    w.add_tensor(f"{name}.ref", ints.astype(np.float32))
f64 = rng.normal(0.0, 1e10, size=(2, 16))
w.add_tensor("f64.raw", f64)
w.add_tensor("f64.ref", f64.astype(np.float32))

# Metadata: one key of every value type, with values the test knows.
w.add_key_value("test.u8", 200, V.UINT8)
w.add_key_value("test.i8", -100, V.INT8)
w.add_key_value("test.u16", 60000, V.UINT16)
w.add_key_value("test.i16", -30000, V.INT16)
w.add_key_value("test.u32", 4000000000, V.UINT32)
w.add_key_value("test.i32", -2000000000, V.INT32)
w.add_key_value("test.f32", 0.1, V.FLOAT32)
w.add_key_value("test.bool", True, V.BOOL)
w.add_key_value("test.string", "h\u00e9llo \u2713", V.STRING)
w.add_key_value("test.u64", 2**63 + 5, V.UINT64)
w.add_key_value("test.i64", -(2**62), V.INT64)
w.add_key_value("test.f64", 0.1, V.FLOAT64)
w.add_key_value("test.array.i32", [1, -2, 3], V.ARRAY, sub_type=V.INT32)
w.add_key_value("test.array.f32", [0.5, -1.25, 3.0e38], V.ARRAY, sub_type=V.FLOAT32)
w.add_key_value("test.array.bool", [True, False, True], V.ARRAY, sub_type=V.BOOL)
w.add_key_value("test.array.u8", [0, 7, 255], V.ARRAY, sub_type=V.UINT8)
w.add_key_value("test.array.str", ["a", "bc", "", "\u00fc\u00f1\u00ee"], V.ARRAY,
                sub_type=V.STRING)
w.add_key_value("test.array.nested", [[1, 2], [3]], V.ARRAY, sub_type=V.ARRAY)

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(OUT, os.path.getsize(OUT), "bytes")
