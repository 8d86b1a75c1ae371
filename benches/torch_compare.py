#!/usr/bin/env python3
"""Times PyTorch on every row of a wgrad bench JSON (examples/bench.rs --json) and prints both.

    python3 benches/torch_compare.py wgrad.json [--out compare.json]

--out writes the rows, each with PyTorch's time (torch_ms), rate and the ratio, as JSON beside
the reference's name and GPU; `benches/record.py wgrad.json compare.json` turns them into a
results file for BENCHMARKS.md.

Same sizes, same dtypes, same GPU, same run. PyTorch is timed with CUDA events: 250 ms of
untimed runs (as wgrad's bench, for the GPU's clocks), then the median of 5 loops sized to
~300 ms. fp32 matmuls run with TF32 off (true fp32, as wgrad computes). The last column,
wgrad/torch, is wgrad's rate over PyTorch's (1.0 = parity). Rows of wgrad's
`MatmulPrecision::High` (f32 products split into f16 parts on tensor cores) are compared with
fp32 (their accuracy class); a line under each gives PyTorch's own "high" precision, TF32
(10-bit mantissas, far less accurate), for scale.
"""
import json, sys
import torch
import torch.nn.functional as F

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = "cuda"
DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def median_ms(fn, target_ms=300.0, warm_ms=250.0):
    fn(); torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); fn(); e.record(); torch.cuda.synchronize()
    one = max(s.elapsed_time(e), 1e-3)
    chunk, warmed = max(1, min(10000, int(warm_ms / 4 / one))), 0.0
    while warmed < warm_ms:
        s.record()
        for _ in range(chunk):
            fn()
        e.record(); torch.cuda.synchronize()
        warmed += s.elapsed_time(e)
    s.record(); fn(); e.record(); torch.cuda.synchronize()
    n = max(1, min(10000, int(target_ms / 5 / max(s.elapsed_time(e), 1e-3))))
    runs = []
    for _ in range(5):
        s.record()
        for _ in range(n):
            fn()
        e.record(); torch.cuda.synchronize()
        runs.append(s.elapsed_time(e) / n)
    return sorted(runs)[2]


def dims(shape):
    return [int(x) for x in shape.replace(" -> ", "x").replace(", ", "x").split("x") if x.isdigit()]


def bench(row):
    name, dt = row["name"], DT[row["dtype"]]
    d = dims(row["shape"])
    r = lambda *s: torch.rand(*s, device=dev, dtype=dt) * 2 - 1
    if name.startswith("copy"):
        x, y = r(d[0]), torch.empty(d[0], device=dev, dtype=dt)
        return median_ms(lambda: y.copy_(x))
    if name == "add":
        x, y = r(d[0]), r(d[0])
        return median_ms(lambda: x + y)
    if name == "softmax":
        x = r(d[0], d[1])
        return median_ms(lambda: torch.softmax(x, -1))
    if name == "column sum":
        x = r(d[0], d[1])
        return median_ms(lambda: x.sum(0))
    if name == "layer_norm":
        x = r(d[0], d[1]); g = torch.ones(d[1], device=dev, dtype=dt); b = torch.zeros(d[1], device=dev, dtype=dt)
        return median_ms(lambda: F.layer_norm(x, (d[1],), g, b, 1e-5))
    if name.startswith("matmul A^T B"):
        m, n, k = d
        a, b = r(k, m), r(k, n)
        return median_ms(lambda: a.t() @ b)
    if name.startswith("matmul"):
        m, n, k = d
        a, b = r(m, k), r(k, n)
        return median_ms(lambda: a @ b)
    if name.startswith("linear+bias+relu"):
        m, n, k = d
        x, w, b = r(m, k), r(n, k), torch.zeros(n, device=dev, dtype=dt)
        return median_ms(lambda: F.relu(F.linear(x, w, b)))
    if name.startswith("conv2d"):
        n, c, h, w_, o, k = d[:6]
        x, w = r(n, c, h, w_), r(o, c, k, k)
        if "bwd" in name:
            x.requires_grad_(); w.requires_grad_()
            g = torch.ones(n, o, h, w_, device=dev, dtype=dt)
            def step():
                F.conv2d(x, w, padding=k // 2).backward(g)
                x.grad = w.grad = None
            return median_ms(step)
        return median_ms(lambda: F.conv2d(x, w, padding=k // 2))
    if name.startswith("attention"):
        b, h, s, hd = d
        q, k, v = r(b, h, s, hd), r(b, h, s, hd), r(b, h, s, hd)
        causal = "causal" in name
        if "bwd" in name:
            q.requires_grad_(); k.requires_grad_(); v.requires_grad_()
            g = torch.ones_like(q)
            def step():
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                o.backward(g)
                q.grad = k.grad = v.grad = None
            return median_ms(step)
        return median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    return None


def main():
    data = json.load(open(sys.argv[1]))
    out = []
    print(f"wgrad on {data['adapter']} ({data['backend']}) vs PyTorch {torch.__version__} on {torch.cuda.get_device_name()}")
    print(f"{'kernel':<28} {'size':<26} {'dtype':<5} {'wgrad ms':>10} {'torch ms':>10} {'wgrad rate':>12} {'torch rate':>12} {'unit':<8} {'wgrad/torch':>11} {'err':>8}")
    for row in data["rows"]:
        t = bench(row)
        if t is None:
            continue
        trate = row["rate"] * row["ms"] / t
        ratio = t / row["ms"]
        out.append(dict(row, torch_ms=t, torch_rate=trate, ratio=ratio))
        print(f"{row['name']:<28} {row['shape']:<26} {row['dtype']:<5} {row['ms']:>10.4f} {t:>10.4f} {row['rate']:>12.1f} {trate:>12.1f} {row['unit']:<8} {ratio:>11.3f} {row['check']:>8}")
        if "High" in row["name"]:
            torch.backends.cuda.matmul.allow_tf32 = True
            t32 = bench(row)
            torch.backends.cuda.matmul.allow_tf32 = False
            out[-1]["torch_tf32_ms"] = t32
            print(f"{'  PyTorch TF32':<28} {row['shape']:<26} {'':<5} {'':>10} {t32:>10.4f} {'':>12} {row['rate'] * row['ms'] / t32:>12.1f} {row['unit']:<8} {t32 / row['ms']:>11.3f}")
    if "--out" in sys.argv:
        doc = {"reference": f"PyTorch {torch.__version__}", "device": torch.cuda.get_device_name(), "rows": out}
        json.dump(doc, open(sys.argv[sys.argv.index("--out") + 1], "w"), indent=1)


if __name__ == "__main__":
    main()
