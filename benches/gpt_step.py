#!/usr/bin/env python3
"""The GPT training step of examples/train_gpt.rs in eager PyTorch, for the same-run comparison.

Same model (token + position embeddings, pre-norm blocks with causal attention and a GELU MLP
4x, dropout on the embeddings and both residual branches, final LayerNorm, head tied to the token embedding),
same optimizer (AdamW, betas 0.9/0.99, weight decay 0.1 on every parameter, clipping at 1),
same batch shape. One step = forward, cross-entropy, backward, update.

  python3 benches/gpt_step.py [--steps 20] [--layers 6 --heads 6 --width 384 --context 256
                               --batch 64 --vocab 65 --dropout 0.2]

Prints one line per precision: f32 (TF32 off) and f16 (autocast + GradScaler), with ms per
step, tokens/s and peak memory, in the same `key=value` form as train_gpt --bench.
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, e, h, p):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(e), nn.LayerNorm(e)
        self.qkv, self.out = nn.Linear(e, 3 * e), nn.Linear(e, e)
        self.fc1, self.fc2 = nn.Linear(e, 4 * e), nn.Linear(4 * e, e)
        self.h, self.drop = h, nn.Dropout(p)

    def forward(self, x):
        b, s, e = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.h, e // self.h).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.out(a.transpose(1, 2).reshape(b, s, e)))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class Gpt(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.tok = nn.Embedding(a.vocab, a.width)
        self.pos = nn.Embedding(a.context, a.width)
        self.blocks = nn.ModuleList(Block(a.width, a.heads, a.dropout) for _ in range(a.layers))
        self.ln = nn.LayerNorm(a.width)
        self.drop = nn.Dropout(a.dropout)

    def forward(self, idx):
        x = self.drop(self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device)))
        for b in self.blocks:
            x = b(x)
        return self.ln(x) @ self.tok.weight.t()


def run(a, half):
    torch.manual_seed(0)
    dev = "cuda"
    model = Gpt(a).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    scaler = torch.amp.GradScaler("cuda", enabled=half)
    x = torch.randint(0, a.vocab, (a.batch, a.context), device=dev)
    y = torch.randint(0, a.vocab, (a.batch * a.context,), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.float16, enabled=half):
            loss = F.cross_entropy(model(x).view(-1, a.vocab).float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss

    # At least 3 steps and 250 ms of them, as train_gpt --bench: the GPU's clock falls while
    # the first steps set up their kernels.
    t_warm, warmed = time.perf_counter(), 0
    while warmed < 3 or time.perf_counter() - t_warm < 0.25:
        step()
        torch.cuda.synchronize()
        warmed += 1
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3 / a.steps
    peak = torch.cuda.max_memory_allocated() / 2**20
    tps = a.batch * a.context / ms * 1e3
    name = "f16" if half else "f32"
    print(f"torch_{name} ms_per_step={ms:.3f} tokens_per_s={tps:.0f} peak_mem_mb={peak:.1f}")


def main():
    p = argparse.ArgumentParser()
    for k, v in dict(steps=20, layers=6, heads=6, width=384, context=256, batch=64, vocab=65).items():
        p.add_argument(f"--{k}", type=int, default=v)
    p.add_argument("--dropout", type=float, default=0.2)
    # PyTorch's "high" matmul precision (TF32) for the f32 step, to set beside wgrad's
    # MatmulPrecision::High (split f32, more accurate than TF32); off by default.
    p.add_argument("--tf32", action="store_true")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    run(a, half=False)
    run(a, half=True)


if __name__ == "__main__":
    main()
