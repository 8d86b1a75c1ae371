"""Writes and checks the LoRA fixtures of the tiny Llama (tests/fixtures/tiny_llama, made by
scripts/make_tiny_llama.py), with Hugging Face's peft as the reference:

  tests/fixtures/tiny_llama_lora/peft/       an adapter made by peft: rank 4, alpha 8, on q_proj,
                                             v_proj, o_proj and down_proj, lora_B drawn at random
                                             (peft starts it at zero, which would hide a wrong
                                             B), adapter_config.json and adapter_model.safetensors
  tests/fixtures/tiny_llama_lora/peft.json   peft's logits (float32) on two prompts with it

and checks the other direction: tests/fixtures/tiny_llama_lora/wgrad/ is an adapter trained by
wgrad (`WGRAD_WRITE_LORA=1 cargo test --release --test lora`, which also writes wgrad's logits
with it to wgrad.json); this script loads it with `PeftModel.from_pretrained` and requires
peft's logits to be within 1e-4 of wgrad's. The tests check both files without Python.

    python3 -m pip install torch transformers peft safetensors
    python3 scripts/make_tiny_llama_lora.py
"""
import json
import os

import numpy as np
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures")
BASE = os.path.join(FIXTURES, "tiny_llama")
OUT = os.path.join(FIXTURES, "tiny_llama_lora")
PROMPTS = [[3, 141, 59, 26, 5, 358, 97, 9, 32, 384], [7, 7, 300, 12]]


def f32_text(values):
    return [float(np.format_float_positional(np.float32(v), unique=True, trim="-")) for v in values]


def logits(model):
    rows = []
    with torch.no_grad():
        for ids in PROMPTS:
            out = model(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()
            rows.append({"ids": ids, "logits": [f32_text(r) for r in out]})
    return rows


def base():
    return LlamaForCausalLM.from_pretrained(BASE, dtype=torch.float32).eval()


def make_peft():
    torch.manual_seed(1)
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                     target_modules=["q_proj", "v_proj", "o_proj", "down_proj"])
    model = get_peft_model(base(), cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.2)
    model.eval()
    out = os.path.join(OUT, "peft")
    model.save_pretrained(out)
    # The fixture names its base by the fixture's name, not this machine's path; peft's model
    # card is not needed.
    cpath = os.path.join(out, "adapter_config.json")
    cfg_json = json.load(open(cpath))
    cfg_json["base_model_name_or_path"] = "tiny_llama"
    with open(cpath, "w") as f:
        json.dump(cfg_json, f, indent=2, sort_keys=True)
        f.write("\n")
    if os.path.exists(os.path.join(out, "README.md")):
        os.remove(os.path.join(out, "README.md"))
    with open(os.path.join(OUT, "peft.json"), "w") as f:
        json.dump({"prompts": logits(model)}, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", os.path.join(OUT, "peft"))


def check_wgrad():
    path = os.path.join(OUT, "wgrad")
    ref = os.path.join(OUT, "wgrad.json")
    if not os.path.exists(ref):
        print("no wgrad adapter yet: run WGRAD_WRITE_LORA=1 cargo test --release --test lora")
        return
    model = PeftModel.from_pretrained(base(), path).eval()
    want = json.load(open(ref))["prompts"]
    worst = 0.0
    for got, w in zip(logits(model), want):
        assert got["ids"] == w["ids"]
        worst = max(worst, float(np.abs(np.array(got["logits"]) - np.array(w["logits"])).max()))
    print(f"wgrad's adapter in peft: largest logit difference {worst:.2e}")
    assert worst <= 1e-4, worst


if __name__ == "__main__":
    make_peft()
    check_wgrad()
