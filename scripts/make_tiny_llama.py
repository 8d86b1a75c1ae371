"""Writes a tiny random Llama checkpoint in Hugging Face's layout, and transformers' outputs for
it, for the tests that load Hugging Face checkpoints:

  tests/fixtures/tiny_llama/          config.json, model.safetensors (float32), reference.json
  tests/fixtures/tiny_llama_bf16/     the same weights rounded to bfloat16 (no reference of its
                                      own: tests compare it to the float32 one, loosely)
  tests/fixtures/tiny_llama_sharded/  the same float32 weights in several shards with a
                                      model.safetensors.index.json; its config.json is written
                                      in the older key style most published checkpoints use
                                      (top-level "rope_theta" and "torch_dtype" where newer
                                      transformers writes "rope_parameters" and "dtype"), so
                                      the two fixtures cover both

The model is `LlamaForCausalLM` with torch.manual_seed(0) initialisation: 2 layers, hidden 64,
4 heads, 2 kv heads (head dim 16), MLP 160, vocab 512, rope base 10000, RMSNorm eps 1e-5,
untied output head, no attention bias. Its initial weights have std 0.02, with which every
attention score is nearly zero and attention nearly uniform, so a wrong rotary embedding or
mask would barely show; so that the logits and greedy tokens are a discriminating check, the
weights are redrawn from the same seeded generator: every matrix from a normal with std
1/sqrt(fan_in), the embedding with std 1, the norm weights as 1 + 0.1 * normal.

reference.json holds, for each prompt (a list of token ids), `logits` (float32, one row of
`vocab_size` values per prompt position, written as the shortest decimal that reads back as the
same float32) and `generated`: the 16 tokens of `model.generate(do_sample=False,
max_new_tokens=16, use_cache=True)`. The script asserts they are also the argmax at each
position of a plain forward pass over prompt + generated tokens, and that none is the
end-of-sequence id, so a test can generate them greedily without any stopping rule.

    python3 -m pip install torch transformers safetensors && python3 scripts/make_tiny_llama.py
"""
import json
import math
import os
import shutil

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIXTURES = os.path.join(ROOT, "tests", "fixtures")

PROMPTS = [
    [1, 17, 300, 5, 42, 99, 7, 250],
    [1, 400, 3, 77, 128, 511, 0, 64, 2, 300, 301, 9, 46],
]
NEW_TOKENS = 16


def build():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_act="silu",
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name == "model.embed_tokens.weight":
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[1]))
    return model


def f32_text(values):
    """Python floats whose repr is the shortest decimal that reads back as the same float32."""
    return [float(str(v)) for v in np.asarray(values, dtype=np.float32).ravel()]


def fresh_dir(path):
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)


def legacy_config(path):
    with open(path) as f:
        cfg = json.load(f)
    rope = cfg.pop("rope_parameters", None)
    if rope is not None:
        assert rope.get("rope_type", "default") == "default", rope
        cfg["rope_theta"] = rope["rope_theta"]
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    with open(path, "w") as f:
        json.dump(dict(sorted(cfg.items())), f, indent=2)
        f.write("\n")


def main():
    model = build()
    cases = []
    with torch.no_grad():
        for ids in PROMPTS:
            x = torch.tensor([ids])
            logits = model(x, use_cache=False).logits[0].float().numpy()
            out = model.generate(
                x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=NEW_TOKENS,
                use_cache=True, pad_token_id=0,
            )
            generated = out[0, len(ids):].tolist()
            assert len(generated) == NEW_TOKENS, generated
            # The greedy tokens must agree with argmax over a plain forward of the whole sequence.
            full = model(out, use_cache=False).logits[0]
            assert full[len(ids) - 1:-1].argmax(-1).tolist() == generated
            assert model.config.eos_token_id not in generated
            cases.append({
                "ids": ids,
                "logits": [f32_text(row) for row in logits],
                "generated": generated,
            })

    ref = {
        "model": "LlamaForCausalLM, torch.manual_seed(0), weights redrawn as in make_tiny_llama.py",
        "dtype": "float32",
        "attn_implementation": "eager",
        "generate": {"do_sample": False, "max_new_tokens": NEW_TOKENS, "use_cache": True},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "prompts": cases,
    }

    out = os.path.join(FIXTURES, "tiny_llama")
    fresh_dir(out)
    model.save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f, separators=(",", ":"))
        f.write("\n")

    sharded = os.path.join(FIXTURES, "tiny_llama_sharded")
    fresh_dir(sharded)
    model.save_pretrained(sharded, safe_serialization=True, max_shard_size="100KB")

    legacy_config(os.path.join(sharded, "config.json"))

    bf16 = os.path.join(FIXTURES, "tiny_llama_bf16")
    fresh_dir(bf16)
    model.to(torch.bfloat16).save_pretrained(bf16, safe_serialization=True)

    for d in (out, sharded, bf16):
        # generation_config.json only repeats config.json's token ids; the loaders don't read it.
        gc = os.path.join(d, "generation_config.json")
        if os.path.exists(gc):
            os.remove(gc)
        total = sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d))
        print(f"{os.path.relpath(d, ROOT)}: {sorted(os.listdir(d))}, {total} bytes")


if __name__ == "__main__":
    main()
