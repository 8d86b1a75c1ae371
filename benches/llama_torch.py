#!/usr/bin/env python3
"""Llama inference speed in eager PyTorch: the reference for `generate --bench`.

A plain Llama decoder with random weights (seeded): token embedding; blocks of RMSNorm,
q/k/v projections without bias, rotary embeddings (Hugging Face's rotate_half layout, base
--rope-theta), grouped-query attention through F.scaled_dot_product_attention, o projection
and residual, then RMSNorm, SwiGLU MLP (gate, up, down) and residual; a final RMSNorm and an
output head tied to the embedding. Each layer keeps a preallocated K/V cache of shape
[batch, kv_heads, capacity, head_dim], written in place. The defaults are SmolLM2-135M's shapes.

  python3 benches/llama_torch.py [--layers 30 --hidden 576 --heads 9 --kv-heads 3 --head-dim 64
                                  --intermediate 1536 --vocab 49152 --rope-theta 100000
                                  --eps 1e-5] [--prompt 512 --decode 128 --batch 8 --repeat 3]
                                 [--dtype f16|bf16|f32] [--device cuda|cpu] [--tf32]
                                 [--repeat-kv] [--threads N] [--check]

Measured as `generate --bench` measures (llama.cpp's llama-bench pp/tg tests are alike, but
its tg steps start from an empty cache, where these follow the prompt):
- prefill: --prompt tokens at batch 1 in one forward, filling the cache; the time runs from
  the prompt's upload to the argmax of the last position's logits read back to the host (the
  head is applied to the last position only);
- decode: --decode greedy steps at batch 1, and at batch --batch (that many copies of the
  prompt, prefilled, decoding together). Each step's argmax stays on the device and is the
  next step's input; the ids are read back once, at the end of the timed steps. Two untimed
  steps follow each prefill before the timed ones.
Before any timing, untimed prefills with decode steps run at batch 1 (at least one, and
250 ms of them, for the GPU's clocks) and one at batch --batch. Each timed phase runs
--repeat times; the best rate is reported, the median beside it (keys ending in _median).
Everything runs under torch.inference_mode(). f32 matmuls run with TF32 off unless --tf32.

Attention uses enable_gqa=True when the installed torch has it, else K/V heads repeated to
the query heads (--repeat-kv forces the latter).

Prints one JSON line: impl, torch, device, dtype, the shapes, prefill_tokens, decode_steps,
prefill_tokens_per_s, decode_tokens_per_s_batch1, decode_tokens_per_s_batch{B}, weight_mib,
peak_mib (torch.cuda.max_memory_allocated, null on the CPU) and peak_reserved_mib.

--check measures nothing: in f32, it prefills the prompt and decodes --decode greedy steps
through the cache at batch --batch, runs one forward without a cache over the whole sequence
(prompt and fed tokens), and prints the largest difference between the two sets of logits as
one JSON line (also for a prefill split in two chunks, and for repeated K/V heads against
enable_gqa where both exist). It exits with status 1 if a difference is over tolerance.
"""
import argparse
import inspect
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DT = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
WARM_STEPS = 2


def has_enable_gqa():
    sdpa = F.scaled_dot_product_attention
    try:
        return "enable_gqa" in inspect.signature(sdpa).parameters
    except (TypeError, ValueError):
        # A builtin without a signature: its docstring lists the arguments.
        return "enable_gqa" in (sdpa.__doc__ or "")


class RmsNorm(nn.Module):
    def __init__(self, n, eps, **kw):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n, **kw), requires_grad=False)
        self.eps = eps

    def forward(self, x):
        # As Hugging Face's LlamaRMSNorm: the statistics in f32, the scale in the model's dtype.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope(x, cos, sin):
    return x * cos + rotate_half(x) * sin


class Block(nn.Module):
    def __init__(self, a, model, **kw):
        super().__init__()
        w = lambda o, i: nn.Parameter(torch.empty(o, i, **kw).normal_(0, 0.02), requires_grad=False)
        e, hd = a.hidden, a.head_dim
        self.heads, self.kv_heads, self.hd = a.heads, a.kv_heads, hd
        self.model = model
        self.attn_norm, self.mlp_norm = RmsNorm(e, a.eps, **kw), RmsNorm(e, a.eps, **kw)
        self.wq, self.wk, self.wv = w(a.heads * hd, e), w(a.kv_heads * hd, e), w(a.kv_heads * hd, e)
        self.wo = w(e, a.heads * hd)
        self.wg, self.wu, self.wd = w(a.intermediate, e), w(a.intermediate, e), w(e, a.intermediate)

    def attend(self, q, k, v, start):
        s = q.shape[2]
        mask, causal = None, False
        if s > 1 and start == 0:
            causal = True  # keys and queries are the same positions
        elif s > 1:
            # Queries at start.., keys at 0..start+s: each query sees the keys up to its own position.
            qpos = torch.arange(start, start + s, device=q.device)[:, None]
            mask = torch.arange(start + s, device=q.device)[None, :] <= qpos
        if self.model.gqa:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
        rep = self.heads // self.kv_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)

    def forward(self, x, cos, sin, cache, start):
        b, s, _ = x.shape
        h = self.attn_norm(x)
        q = F.linear(h, self.wq).view(b, s, self.heads, self.hd).transpose(1, 2)
        k = F.linear(h, self.wk).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        v = F.linear(h, self.wv).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        if cache is not None:
            kc, vc = cache
            kc[:, :, start:start + s] = k
            vc[:, :, start:start + s] = v
            k, v = kc[:, :, :start + s], vc[:, :, :start + s]
        o = self.attend(q, k, v, start).transpose(1, 2).reshape(b, s, self.heads * self.hd)
        x = x + F.linear(o, self.wo)
        h = self.mlp_norm(x)
        return x + F.linear(F.silu(F.linear(h, self.wg)) * F.linear(h, self.wu), self.wd)


class Llama(nn.Module):
    def __init__(self, a, positions, dtype, device):
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.a, self.kw = a, kw
        self.gqa = has_enable_gqa() and not a.repeat_kv
        self.embed = nn.Parameter(torch.empty(a.vocab, a.hidden, **kw).normal_(0, 0.02), requires_grad=False)
        self.blocks = nn.ModuleList(Block(a, self, **kw) for _ in range(a.layers))
        self.norm = RmsNorm(a.hidden, a.eps, **kw)
        # Rotary tables as Hugging Face builds them: angles in f32, cos/sin cast to the dtype.
        hd = a.head_dim
        inv_freq = 1.0 / (a.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        freqs = torch.outer(torch.arange(positions, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos().to(**kw), emb.sin().to(**kw)

    def new_cache(self, batch, capacity):
        shape = (batch, self.a.kv_heads, capacity, self.a.head_dim)
        return [(torch.zeros(shape, **self.kw), torch.zeros(shape, **self.kw)) for _ in self.blocks]

    def forward(self, tokens, cache=None, start=0, last_only=False):
        """Logits [batch, positions, vocab] of `tokens` [batch, positions] placed at `start`;
        without a cache, `start` must be 0 and the tokens are the whole sequence."""
        s = tokens.shape[1]
        x = F.embedding(tokens, self.embed)
        cos, sin = self.cos[start:start + s], self.sin[start:start + s]
        for i, blk in enumerate(self.blocks):
            x = blk(x, cos, sin, None if cache is None else cache[i], start)
        if last_only:
            x = x[:, -1:]
        return F.linear(self.norm(x), self.embed)


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def phase(model, prompt, batch, cache, steps, dev):
    """A prefill of `prompt` (host tensor, [1, p]) in `batch` rows, WARM_STEPS untimed decode
    steps, then `steps` timed ones: (prefill seconds, decode seconds)."""
    p = prompt.shape[1]
    rows = prompt.expand(batch, p)
    sync(dev)
    t0 = time.perf_counter()
    ids = model(rows.to(dev), cache, 0, last_only=True)[:, -1].argmax(-1)
    ids.tolist()
    prefill = time.perf_counter() - t0
    pos = p
    for _ in range(WARM_STEPS):
        ids = model(ids.view(batch, 1), cache, pos, last_only=True)[:, -1].argmax(-1)
        pos += 1
    ids.tolist()
    t0 = time.perf_counter()
    for _ in range(steps):
        ids = model(ids.view(batch, 1), cache, pos, last_only=True)[:, -1].argmax(-1)
        pos += 1
    ids.tolist()
    return prefill, time.perf_counter() - t0


def bench(a, dev, dtype):
    capacity = a.prompt + WARM_STEPS + a.decode
    model = Llama(a, capacity, dtype, dev)
    gen = torch.Generator().manual_seed(a.seed + 1)
    prompt = torch.randint(0, a.vocab, (1, a.prompt), generator=gen)
    cache1, cache_b = model.new_cache(1, capacity), model.new_cache(a.batch, capacity)

    # Untimed: batch-1 runs for at least 250 ms (kernels chosen, clocks up), one batched run.
    t_warm, warmed = time.perf_counter(), 0
    while warmed < 1 or time.perf_counter() - t_warm < 0.25:
        phase(model, prompt, 1, cache1, WARM_STEPS, dev)
        warmed += 1
    phase(model, prompt, a.batch, cache_b, WARM_STEPS, dev)

    prefill, dec1, dec_b = [], [], []
    for _ in range(a.repeat):
        tp, t1 = phase(model, prompt, 1, cache1, a.decode, dev)
        _, tb = phase(model, prompt, a.batch, cache_b, a.decode, dev)
        prefill.append(a.prompt / tp)
        dec1.append(a.decode / t1)
        dec_b.append(a.batch * a.decode / tb)

    r2 = lambda x: round(x, 2)
    weights = sum(t.numel() * t.element_size() for t in model.parameters())
    cuda = dev == "cuda"
    out = {
        "impl": "pytorch-eager",
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "dtype": a.dtype,
        "layers": a.layers, "hidden": a.hidden, "heads": a.heads, "kv_heads": a.kv_heads,
        "head_dim": a.head_dim, "intermediate": a.intermediate, "vocab": a.vocab,
        "rope_theta": a.rope_theta, "eps": a.eps,
        "attention": "enable_gqa" if model.gqa else "repeat_kv",
        "repeat": a.repeat,
        "prefill_tokens": a.prompt,
        "decode_steps": a.decode,
        "prefill_tokens_per_s": r2(max(prefill)),
        "decode_tokens_per_s_batch1": r2(max(dec1)),
        f"decode_tokens_per_s_batch{a.batch}": r2(max(dec_b)),
        "prefill_tokens_per_s_median": r2(statistics.median(prefill)),
        "decode_tokens_per_s_batch1_median": r2(statistics.median(dec1)),
        f"decode_tokens_per_s_batch{a.batch}_median": r2(statistics.median(dec_b)),
        "weight_mib": r2(weights / 2**20),
        "peak_mib": r2(torch.cuda.max_memory_allocated() / 2**20) if cuda else None,
        "peak_reserved_mib": r2(torch.cuda.max_memory_reserved() / 2**20) if cuda else None,
    }
    print(json.dumps(out))


def check(a, dev):
    """Cached prefill + greedy decode against one uncached forward over the same sequence, in f32."""
    p, d, b = a.prompt, a.decode, a.batch
    model = Llama(a, p + d, torch.float32, dev)
    gen = torch.Generator().manual_seed(a.seed + 1)
    prompt = torch.randint(0, a.vocab, (b, p), generator=gen).to(dev)

    # Through the cache: the prompt's logits at every position, then one row per decode step.
    cache = model.new_cache(b, p + d)
    logits = [model(prompt, cache, 0)]
    ids = logits[0][:, -1].argmax(-1)
    fed = []
    for i in range(d):
        fed.append(ids)
        logits.append(model(ids.view(b, 1), cache, p + i))
        ids = logits[-1][:, -1].argmax(-1)
    cached = torch.cat(logits, dim=1)  # positions 0 .. p+d-1
    seq = torch.cat([prompt] + [t.view(b, 1) for t in fed], dim=1)
    full = model(seq)
    diff = (cached - full).abs().max().item()
    scale = full.abs().max().item()

    # The prompt in two chunks: the second attends through an explicit mask.
    half = max(1, p // 2)
    cache2 = model.new_cache(b, p)
    chunked = torch.cat([model(prompt[:, :half], cache2, 0), model(prompt[:, half:], cache2, half)], dim=1)
    diff_chunked = (chunked - full[:, :p]).abs().max().item()

    out = {
        "check": "kv-cache prefill+decode vs uncached forward", "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "dtype": "f32",
        "batch": b, "prompt": p, "decode": d,
        "attention": "enable_gqa" if model.gqa else "repeat_kv",
        "max_abs_logit": scale, "max_abs_diff": diff, "max_abs_diff_chunked_prefill": diff_chunked,
    }
    diffs = [diff, diff_chunked]
    if model.gqa:
        model.gqa = False
        diff_rep = (model(seq) - full).abs().max().item()
        model.gqa = True
        out["max_abs_diff_repeat_kv_vs_enable_gqa"] = diff_rep
        diffs.append(diff_rep)
    tol = 1e-4 * max(1.0, scale)
    out["tolerance"] = tol
    out["ok"] = max(diffs) <= tol
    print(json.dumps(out))
    return out["ok"]


def add_model_args(p):
    """The model's shapes as options, SmolLM2-135M's by default."""
    shapes = dict(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152)
    for k, v in shapes.items():
        p.add_argument(f"--{k.replace('_', '-')}", type=int, default=v)
    p.add_argument("--rope-theta", type=float, default=100000.0)
    p.add_argument("--eps", type=float, default=1e-5)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(p)
    p.add_argument("--prompt", type=int, default=512, help="prefill tokens")
    p.add_argument("--decode", type=int, default=128, help="timed decode steps")
    p.add_argument("--batch", type=int, default=8, help="rows of the batched decode")
    p.add_argument("--repeat", type=int, default=3, help="timed runs of each phase")
    p.add_argument("--dtype", choices=sorted(DT), default="f16")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tf32", action="store_true", help="TF32 for f32 matmuls (off by default)")
    p.add_argument("--repeat-kv", action="store_true", help="repeat K/V heads instead of enable_gqa")
    p.add_argument("--threads", type=int, default=0, help="torch's CPU threads (0: torch's default)")
    p.add_argument("--check", action="store_true", help="compare cached decode with an uncached forward (f32)")
    a = p.parse_args()
    if a.heads % a.kv_heads or a.head_dim % 2:
        p.error("--heads must be a multiple of --kv-heads, and --head-dim even")
    if min(a.prompt, a.decode, a.batch, a.repeat) < 1 or (a.check and a.prompt < 2):
        p.error("--prompt, --decode, --batch and --repeat must be at least 1 (--prompt 2 with --check)")
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("CUDA is not available (use --device cpu)")
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    torch.manual_seed(a.seed)
    with torch.inference_mode():
        if a.check:
            raise SystemExit(0 if check(a, a.device) else 1)
        bench(a, a.device, DT[a.dtype])


if __name__ == "__main__":
    main()
