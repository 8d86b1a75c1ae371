"""The eager PyTorch reference for LoRA fine-tuning speed and memory: the plain Llama of
benches/llama_torch.py (frozen random f16 weights, SmolLM2-135M's shapes) with LoRA adapters on
chosen projections (f32 parameters, rank and alpha as wgrad's examples/finetune takes them),
trained under autocast f16 with a gradient scaler and AdamW on the adapters only. It times
training steps on batches of random tokens (next-token cross-entropy over every position)
after warm-up steps, and reports the median step and the peak memory, as one JSON line.

    python3 benches/lora_torch.py --layers 6 [--batch 4] [--context 128] [--rank 8]
        [--alpha 16] [--targets q,v] [--steps 40]

Run it beside `finetune --model <the same cut file> --steps ...` (benches/gpu_run.sh llm's
file): the same batch, context, adapters and dtype. The GPU machine has torch but not peft;
the adapters here are written out (x A^T B^T scaled by alpha / rank, dropout on x).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_torch as lt  # noqa: E402


def lora_forward(model, tokens, adapters, scale, dropout):
    """Logits [b, t, vocab] of `tokens` from position 0 with the adapters' updates."""
    b, s = tokens.shape
    x = F.embedding(tokens, model.embed)
    cos, sin = model.cos[:s], model.sin[:s]
    for blk, ad in zip(model.blocks, adapters):
        h = blk.attn_norm(x)

        def proj(w, name):
            y = F.linear(h, w)
            if name in ad:
                a, bb = ad[name]
                y = y + F.linear(F.linear(F.dropout(h, dropout, True), a), bb) * scale
            return y

        q = proj(blk.wq, "q").view(b, s, blk.heads, blk.hd).transpose(1, 2)
        k = proj(blk.wk, "k").view(b, s, blk.kv_heads, blk.hd).transpose(1, 2)
        v = proj(blk.wv, "v").view(b, s, blk.kv_heads, blk.hd).transpose(1, 2)
        q, k = lt.rope(q, cos, sin), lt.rope(k, cos, sin)
        o = blk.attend(q, k, v, 0).transpose(1, 2).reshape(b, s, blk.heads * blk.hd)
        x = x + F.linear(o, blk.wo)
        h = blk.mlp_norm(x)
        x = x + F.linear(F.silu(F.linear(h, blk.wg)) * F.linear(h, blk.wu), blk.wd)
    return F.linear(model.norm(x), model.embed)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    lt.add_model_args(p)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=float, default=16.0)
    p.add_argument("--dropout", type=float, default=0.05)
    p.add_argument("--targets", default="q,v", help="comma-separated of q,k,v")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--steps", type=int, default=40, help="timed steps")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeat-kv", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    dev = "cuda"
    torch.manual_seed(a.seed)
    model = lt.Llama(a, a.context, torch.float16, dev)
    for prm in model.parameters():
        prm.requires_grad_(False)
    sizes = {"q": a.heads * a.head_dim, "k": a.kv_heads * a.head_dim, "v": a.kv_heads * a.head_dim}
    adapters, params = [], []
    for _ in model.blocks:
        ad = {}
        for t in a.targets.split(","):
            A = torch.empty(a.rank, a.hidden, device=dev).uniform_(-a.hidden ** -0.5, a.hidden ** -0.5)
            B = torch.zeros(sizes[t], a.rank, device=dev)
            A.requires_grad_(True)
            B.requires_grad_(True)
            ad[t] = (A, B)
            params += [A, B]
        adapters.append(ad)
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.0)
    scaler = torch.amp.GradScaler("cuda")
    scale = a.alpha / a.rank

    def step():
        tok = torch.randint(0, a.vocab, (a.batch, a.context + 1), device=dev)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            logits = lora_forward(model, tok[:, :-1], adapters, scale, a.dropout)
            loss = F.cross_entropy(logits.float().reshape(-1, a.vocab), tok[:, 1:].reshape(-1))
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        scaler.step(opt)
        scaler.update()

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    mib = lambda b: round(b / 2 ** 20, 1)
    print(json.dumps({
        "impl": "pytorch-eager-lora", "torch": torch.__version__, "device": torch.cuda.get_device_name(),
        "dtype": "autocast f16", "layers": a.layers, "batch": a.batch, "context": a.context,
        "rank": a.rank, "targets": a.targets, "adapter_params": sum(x.numel() for x in params),
        "step_ms_median": round(statistics.median(times), 2), "step_ms_best": round(min(times), 2),
        "peak_allocated_mib": mib(torch.cuda.max_memory_allocated()),
        "peak_reserved_mib": mib(torch.cuda.max_memory_reserved()),
    }))


if __name__ == "__main__":
    main()
