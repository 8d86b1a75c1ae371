"""Writes tests/fixtures/smollm2_tokenizer.json: how Hugging Face transformers tokenizes text
with the tokenizer it builds from SmolLM2-135M-Instruct's GGUF metadata (byte-level BPE,
pre-tokenizer "smollm"), for wgrad's tokenizer tests to match id for id.

The JSON holds:
  tokenizer     the class transformers built and whether it is a fast (Rust) tokenizer
  special       bos / eos / pad / unk as {"id", "token"}
  chat_template the `tokenizer.chat_template` string from the GGUF metadata, verbatim
  chat          `messages` and `text`: the template rendered with add_generation_prompt=True
  cases         a list of {"text", "ids"} (and "decoded", the decoding of the ids, where present):
                the first 200 lines of data/tinyshakespeare/input.txt, each encoded alone, then
                edge cases (digits, runs of whitespace, emoji, CJK, accents, special tokens
                written in the text); all encoded with add_special_tokens=False

transformers does not know the GGUF's pre-tokenizer name "smollm" (`tokenizer.ggml.pre`) and
falls back to the plain GPT-2 byte-level split. llama.cpp's "smollm" split, like the
tokenizer.json published with the model, first cuts every digit off on its own and only then
applies the GPT-2 split. The two agree on most text but not where whitespace runs into a digit
("a  7", " \n7"). For those cases the JSON also has "ids_smollm": the encoding by the same
vocabulary and merges (tokenizers' BPE) behind a Digits(individual_digits) + ByteLevel
pre-tokenizer. "ids" is always transformers' own answer.

    python3 -m pip install torch transformers gguf
    python3 scripts/make_tokenizer_reference.py [--model PATH]

Without --model the file's path comes from scripts/fetch_smollm2.sh (which downloads it once).
"""
import argparse
import importlib.metadata
import json
import os
import subprocess

import gguf
import transformers
from tokenizers import Tokenizer, pre_tokenizers
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "smollm2_tokenizer.json")
SHAKESPEARE = os.path.join(ROOT, "data", "tinyshakespeare", "input.txt")
LINES = 200

EDGE_CASES = [
    "12345 67.89",
    "a  b   c\n\n\nd \t e",
    "I ❤️ 🦀 rust",
    "你好，世界。日本語のテキスト",
    "Café naïve façade — résumé, Ångström, Straße, ñandú",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "",
    " ",
    "   leading and trailing spaces   ",
    "\n",
    "line one\r\nline two\r\n",
    "x=1_000_000; y=3.14159e-10; z=0xFF",
    "don't can't I'm we'll they've she'd IT'S",
    "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct?x=1&y=2",
    "fn main() {\n    println!(\"hi\");\n}\n",
    "Ελληνικά Русский עברית العربية हिन्दी",
    "tab\tseparated\tvalues",
    "The year 2024 had 366 days; 1000000 is a million.",
    "<|im_start|>",
    "<|im_end|><|endoftext|>text",
    # Whitespace before digits: where transformers' tokenizer and the "smollm" split differ.
    "a  7",
    "x \n7 \t8",
    "    1. first\n    2. second",
    "total:   42",
]
CHAT_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def model_path(arg):
    if arg:
        return os.path.abspath(arg)
    out = subprocess.run(["bash", os.path.join(HERE, "fetch_smollm2.sh")], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()
    return out[-1]


def special(tok, name):
    token = getattr(tok, f"{name}_token")
    return None if token is None else {"id": getattr(tok, f"{name}_token_id"), "token": str(token)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="the SmolLM2-135M-Instruct GGUF (default: fetch_smollm2.sh)")
    args = ap.parse_args()
    path = model_path(args.model)
    d, name = os.path.split(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    fields = gguf.GGUFReader(path).fields
    template = fields["tokenizer.chat_template"].contents()
    pre = fields["tokenizer.ggml.pre"].contents()
    smollm = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    smollm.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])

    with open(SHAKESPEARE, encoding="utf-8") as f:
        lines = f.read().split("\n")[:LINES]
    cases = []
    for i, text in enumerate(lines + EDGE_CASES):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        case = {"text": text, "ids": ids}
        alt = smollm.encode(text, add_special_tokens=False).ids
        if alt != ids:
            case["ids_smollm"] = alt
        # Decodings for a sample of Shakespeare lines and every edge case.
        if i >= LINES or i % 20 == 1:
            case["decoded"] = tok.decode(ids, skip_special_tokens=False)
        cases.append(case)

    chat = tok.apply_chat_template(CHAT_MESSAGES, add_generation_prompt=True, tokenize=False)
    ref = {
        "model_file": name,
        "tokenizer": {"class": type(tok).__name__, "is_fast": bool(tok.is_fast),
                      "gguf_pre_tokenizer": pre,
                      "pre_tokenizer": json.loads(tok.backend_tokenizer.to_str())["pre_tokenizer"]},
        "add_special_tokens": False,
        "special": {n: special(tok, n) for n in ("bos", "eos", "pad", "unk")},
        "chat_template": template,
        "chat_template_matches_tokenizer": tok.chat_template == template,
        "chat": {"messages": CHAT_MESSAGES, "add_generation_prompt": True, "text": chat,
                 "ids": tok(chat, add_special_tokens=False)["input_ids"]},
        "versions": {"transformers": transformers.__version__,
                     "tokenizers": importlib.metadata.version("tokenizers"),
                     "gguf": importlib.metadata.version("gguf")},
        "cases": cases,
    }
    with open(OUT, "w") as f:
        json.dump(ref, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    differ = sum("ids_smollm" in c for c in cases)
    print(f"{OUT}: {os.path.getsize(OUT)} bytes, {len(cases)} cases, {type(tok).__name__}, "
          f"{differ} where the smollm split differs")


if __name__ == "__main__":
    main()
