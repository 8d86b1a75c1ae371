"""Writes tests/fixtures/smollm2_reference.json: what Hugging Face transformers computes for
SmolLM2-135M-Instruct loaded from its GGUF file, for wgrad's GGUF model tests to match token for
token. With `--cut N` it first cuts the file to its first N blocks (scripts/cut_gguf.py; the cut
file goes next to the full one, in the model cache, never in the repository) and writes
tests/fixtures/smollm2_cutN_reference.json from the cut file instead.

transformers dequantizes every GGUF tensor (Q4_1, Q8_0, F32) to float32 when it loads the file
and runs the model in float32 on the CPU with eager attention. For each prompt the JSON has:

  text            the prompt (for the chat prompt: `messages` and `text`, the template's
                  rendering with add_generation_prompt=True)
  ids             the prompt's token ids (encoded without adding special tokens; the chat text
                  carries its own)
  prompt_top5     for every prompt position, [[id, ...5], [log-softmax, ...5]] of the next-token
                  distribution, best first
  generated       48 greedy new tokens, each the argmax of one step over the model's KV cache,
                  going on past the end-of-sequence token (which the chat prompt reaches), so
                  every prompt checks 48 steps of the cache
  generated_top5  for every generated token, the same top 5 of the distribution it was chosen
                  from, taken from one forward pass over prompt + generated tokens (the first
                  entry repeats the last of prompt_top5); `top1_is_generated` says whether each
                  top-1 id equals the generated token
Log-probabilities are rounded to 5 decimals.

    python3 -m pip install torch transformers gguf
    python3 scripts/make_smollm2_reference.py [--model PATH] [--cut 6]

Without --model the file's path comes from scripts/fetch_smollm2.sh (which downloads it once).
"""
import argparse
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
FIXTURES = os.path.join(ROOT, "tests", "fixtures")

PLAIN_PROMPTS = [
    "The quick brown fox",
    "To be, or not to be: that is the question. 1604!",
]
CHAT_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
NEW_TOKENS = 48
TOP = 5


def model_path(arg):
    if arg:
        return os.path.abspath(arg)
    out = subprocess.run(["bash", os.path.join(HERE, "fetch_smollm2.sh")], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()
    return out[-1]


def load(path):
    d, name = os.path.split(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    kwargs = {"gguf_file": name, "attn_implementation": "eager"}
    # transformers renamed torch_dtype to dtype; pass whichever this version takes.
    major = int(transformers.__version__.split(".")[0])
    kwargs["dtype" if major >= 5 else "torch_dtype"] = torch.float32
    model = AutoModelForCausalLM.from_pretrained(d, **kwargs).eval()
    return tok, model


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def top(logits):
    lp = torch.log_softmax(logits.double(), dim=-1)
    v, i = lp.topk(TOP, dim=-1)
    return [[i[p].tolist(), [round(x, 5) for x in v[p].tolist()]] for p in range(lp.shape[0])]


def run_prompt(tok, model, ids):
    x = torch.tensor([ids])
    with torch.no_grad():
        prompt_logits = model(x, use_cache=False).logits[0].float()
        # Greedy steps over the model's own KV cache, written out rather than through
        # generate(), which stops at the end-of-sequence token whatever its settings say.
        past, step, generated = None, x, []
        for _ in range(NEW_TOKENS):
            out = model(step, past_key_values=past, use_cache=True)
            past = out.past_key_values
            nxt = int(out.logits[0, -1].argmax())
            generated.append(nxt)
            step = torch.tensor([[nxt]])
        out = torch.tensor([ids + generated])
        assert len(generated) == NEW_TOKENS, len(generated)
        full_logits = model(out, use_cache=False).logits[0].float()
    gen_top = top(full_logits[len(ids) - 1:len(ids) - 1 + len(generated)])
    return {
        "ids": ids,
        "prompt_top5": top(prompt_logits),
        "generated": generated,
        "generated_text": tok.decode(generated),
        "generated_top5": gen_top,
        "top1_is_generated": [t[0][0] == g for t, g in zip(gen_top, generated)],
    }


def reference(path):
    tok, model = load(path)
    prompts = []
    for text in PLAIN_PROMPTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        prompts.append({"kind": "text", "text": text, **run_prompt(tok, model, ids)})
    chat = tok.apply_chat_template(CHAT_MESSAGES, add_generation_prompt=True, tokenize=False)
    ids = tok(chat, add_special_tokens=False)["input_ids"]
    prompts.append({"kind": "chat", "messages": CHAT_MESSAGES, "text": chat,
                    **run_prompt(tok, model, ids)})
    cfg = model.config
    return {
        "model_file": os.path.basename(path),
        "model_file_bytes": os.path.getsize(path),
        "model_file_sha256": sha256(path),
        "how": ("transformers AutoModelForCausalLM.from_pretrained(gguf_file=...): every GGUF "
                "tensor dequantized to float32 at load; float32 on CPU, eager attention"),
        "config": {
            "num_hidden_layers": cfg.num_hidden_layers,
            "hidden_size": cfg.hidden_size,
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads,
            "intermediate_size": cfg.intermediate_size,
            "vocab_size": cfg.vocab_size,
            "rms_norm_eps": cfg.rms_norm_eps,
            "tie_word_embeddings": cfg.tie_word_embeddings,
        },
        "eos_token_id": tok.eos_token_id,
        "generate": {"greedy_steps": NEW_TOKENS, "use_cache": True, "stops_at_eos": False},
        "log_prob_decimals": 5,
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "gguf": importlib.metadata.version("gguf"),
        },
        "prompts": prompts,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="the SmolLM2-135M-Instruct GGUF (default: fetch_smollm2.sh)")
    ap.add_argument("--cut", type=int, help="cut the model to this many blocks first")
    args = ap.parse_args()
    path = model_path(args.model)
    out = os.path.join(FIXTURES, "smollm2_reference.json")
    if args.cut:
        sys.path.insert(0, HERE)
        import cut_gguf
        full = path
        stem = full[:-len(".Q4_1.gguf")] if full.endswith(".Q4_1.gguf") else full[:-len(".gguf")]
        path = f"{stem}.cut{args.cut}.Q4_1.gguf"
        cut_gguf.cut(full, path, args.cut)
        out = os.path.join(FIXTURES, f"smollm2_cut{args.cut}_reference.json")
    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    ref = reference(path)
    with open(out, "w") as f:
        json.dump(ref, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    for p in ref["prompts"]:
        print(repr(p["text"]), len(p["ids"]), "->", repr(p["generated_text"]),
              all(p["top1_is_generated"]))
    print(f"{out}: {os.path.getsize(out)} bytes")


if __name__ == "__main__":
    main()
