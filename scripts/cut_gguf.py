"""Cuts a Llama-family GGUF down to its first N blocks, for tests that want a real model's
weights, tokenizer and chat template in a smaller file.

The output keeps every metadata key of the input, in order and with its type, except
`<arch>.block_count`, which becomes N. It holds the tensors of blocks 0..N-1 plus
`token_embd.weight`, `output_norm.weight` and `output.weight` when the input has one. The token
embedding is re-quantized to Q4_1 (dequantized with `gguf.quants.dequantize`, quantized with
`gguf.quants.quantize`) when it is stored in another block format; `--keep-embedding-type` leaves
it as it is. Every other tensor is copied byte for byte with its type.

    python3 scripts/cut_gguf.py IN.gguf OUT.gguf --blocks 6

For SmolLM2-135M-Instruct (Q4_1 blocks, Q8_0 embedding) cut to 6 blocks the result is about
33 MB; scripts/make_smollm2_reference.py --cut 6 makes it next to the full file in the model
cache and writes the references for it. Needs `pip install gguf numpy`.
"""
import argparse
import os
import re

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

# Fields the reader exposes that describe the file itself; the writer writes its own.
HEADER_FIELDS = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}
BLOCK_TENSOR = re.compile(r"^blk\.(\d+)\.")
KEPT_GLOBAL = ("token_embd.weight", "output_norm.weight", "output.weight")


def field_value(field):
    """The field's value in the form GGUFWriter.add_key_value takes, with its types."""
    main = field.types[0]
    if main == V.ARRAY:
        sub = field.types[-1]
        if sub == V.ARRAY:
            raise ValueError(f"nested arrays are not supported ({field.name})")
        return field.contents(), main, sub
    return field.contents(), main, None


def cut(src, dst, blocks, requantize_embedding=True):
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    count_key = f"{arch}.block_count"
    total = reader.fields[count_key].contents()
    if not 0 < blocks <= total:
        raise SystemExit(f"--blocks must be in 1..{total}")

    writer = gguf.GGUFWriter(dst, arch)
    alignment = reader.fields.get("general.alignment")
    if alignment is not None:
        writer.data_alignment = alignment.contents()
    for name, field in reader.fields.items():
        if name in HEADER_FIELDS or name == "general.architecture":
            continue
        value, vtype, sub = field_value(field)
        if name == count_key:
            value = blocks
        writer.add_key_value(name, value, vtype, sub_type=sub)

    for t in reader.tensors:
        m = BLOCK_TENSOR.match(t.name)
        if m is not None:
            if int(m.group(1)) >= blocks:
                continue
        elif t.name not in KEPT_GLOBAL:
            raise SystemExit(f"unexpected tensor {t.name}; this script knows Llama-family names")
        kind = t.tensor_type
        data = t.data
        if (t.name == "token_embd.weight" and requantize_embedding
                and kind not in (Q.F32, Q.F16, Q.BF16, Q.Q4_1)):
            values = gguf.quants.dequantize(data, kind).astype(np.float32)
            data = gguf.quants.quantize(values, Q.Q4_1)
            kind = Q.Q4_1
        writer.add_tensor(t.name, np.ascontiguousarray(data), raw_dtype=kind)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="input GGUF")
    ap.add_argument("dst", help="output GGUF")
    ap.add_argument("--blocks", type=int, required=True, help="number of blocks to keep")
    ap.add_argument("--keep-embedding-type", action="store_true",
                    help="copy the token embedding as stored instead of re-quantizing it to Q4_1")
    args = ap.parse_args()
    if os.path.abspath(args.src) == os.path.abspath(args.dst):
        raise SystemExit("the output must be a different file")
    cut(args.src, args.dst, args.blocks, not args.keep_embedding_type)
    print(f"{args.dst}: {os.path.getsize(args.dst)} bytes")


if __name__ == "__main__":
    main()
