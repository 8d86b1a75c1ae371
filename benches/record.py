#!/usr/bin/env python3
"""Turns benchmark outputs into one results file of benches/results (the input of BENCHMARKS.md).

    python3 benches/record.py --device "NVIDIA H100 80GB HBM3" --commit c56ab12 \\
        [--suite kernels] [--date 2026-11-26] [--command "..."] [--title "..."] [--note "..."] \\
        [--driver ...] [--backend ...] [--wgpu ...] [--reference "PyTorch ..."] \\
        INPUT... > benches/results/<date>-<device>-<what>.json

then `WGRAD_WRITE_RECORD=1 cargo test --release --test record` renders BENCHMARKS.md.

Each INPUT is recognised by its contents:

- `bench --json` (wgrad.json): one row per kernel, size and dtype;
- `benches/torch_compare.py wgrad.json --out compare.json`, or its printed table (compare.txt,
  as `benches/gpu_run.sh kernels` keeps it): PyTorch's time for the same rows, and the ratio;
- `train_gpt --bench N` output, as LABEL=PATH: one row, "GPT step, LABEL" (for example
  f16=step.txt, f32=step32.txt, "f16, every block checkpointed=ckpt.txt");
- `benches/gpt_step.py` output: PyTorch's step for the train_gpt rows whose label starts
  with f16 or f32 (a checkpointed row gets only PyTorch's peak memory);
- `train_mnist` output (its `accuracy=...` line);
- `memory_bench --json`;
- a JSON list of rows already in the results schema, taken as they are (for tools whose
  output this script does not know).

device, backend and driver default to what `bench --json` reports; wgpu to Cargo.lock's;
date to today (UTC); commit to `git rev-parse --short HEAD`. The suite follows from the
inputs where they say it. ratio is wgrad's rate over the reference's (1.0 = parity), as
torch_compare.py computes it; time_ratio, for training steps, wgrad's time over PyTorch's.
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sig(x, n=5):
    """x to n significant digits, as a float that prints without trailing noise."""
    return float(f"{x:.{n}g}")


def fmt_rate(v, unit):
    """A rate as the record writes it: GFLOP/s above 1000 as TFLOP/s, GB/s above 1000 as TB/s."""
    if unit == "GFLOP/s" and v >= 1000:
        v, unit = v / 1000, "TFLOP/s"
    elif unit == "GB/s" and v >= 1000:
        v, unit = v / 1000, "TB/s"
    return f"{sig(v, 3):g} {unit}"


def key(row):
    return (row["name"], row["shape"], row["dtype"])


# --- inputs -------------------------------------------------------------------------------


def parse_compare_text(text):
    """torch_compare.py's printed table: (reference, rows with torch_ms and ratio)."""
    ref, adapter, rows = None, {}, []
    head = re.search(r"^wgrad on (.*) \((\w+)\) vs PyTorch (\S+) on", text, re.M)
    if head:
        adapter = dict(adapter=head.group(1), backend=head.group(2))
        ref = f"PyTorch {head.group(3)}"
    for line in text.splitlines():
        if line.startswith("  PyTorch TF32") and rows:
            parts = line.split()
            rows[-1]["torch_tf32_ms"] = float(parts[-4])
            continue
        parts = line.split()
        if len(parts) < 9 or line.startswith(("wgrad on", "kernel ")):
            continue
        try:
            ms, t, rate, _trate = (float(p) for p in parts[-7:-3])
            ratio = float(parts[-2])
        except ValueError:
            continue
        dtype, unit, check = parts[-8], parts[-3], parts[-1]
        left = line[: line.rindex(" " + dtype + " ")].rstrip()
        m = re.match(r"^(.*?)\s+(\d[\dx]*(?: -> \d+, \d+x\d+)?)$", left)
        if not m:
            continue
        rows.append(dict(name=m.group(1), shape=m.group(2), dtype=dtype, ms=ms, torch_ms=t,
                         rate=rate, ratio=ratio, unit=unit, check=check))
    return ref, adapter, rows


def parse_train_gpt(text):
    m = re.search(r"bench_ms_per_step=([\d.]+) tokens_per_s=(\d+) peak_mem_mb=([\d.]+)", text)
    if not m:
        return None
    out = dict(ms=float(m.group(1)), tokens=int(m.group(2)), peak=float(m.group(3)))
    h = re.search(r"records and queues a step in ([\d.]+) ms", text)
    if h:
        out["host_ms"] = float(h.group(1))
    # Launches of one step: the --profile breakdown's count ("dispatch ... kernel launches"
    # counts every launch since the process started).
    d = re.search(r"^(\d+) dispatches, [\d.]+ ms of GPU time", text, re.M)
    if d:
        out["launches"] = int(d.group(1))
    return out


def parse_gpt_step(text):
    ref, steps = None, {}
    v = re.search(r"^torch (\S+) on", text, re.M)
    if v:
        ref = f"PyTorch {v.group(1)}"
    for m in re.finditer(r"torch_(f16|f32) ms_per_step=([\d.]+) tokens_per_s=(\d+) peak_mem_mb=([\d.]+)", text):
        steps[m.group(1)] = dict(ms=float(m.group(2)), tokens=int(m.group(3)), peak=float(m.group(4)))
    return ref, steps


class Inputs:
    def __init__(self):
        self.bench = None          # bench --json
        self.compare = {}          # key -> torch_compare row
        self.reference = None
        self.steps = []            # (label, train_gpt figures)
        self.torch_steps = {}
        self.mnist = []
        self.memory = None
        self.rows = []             # rows given in the schema already
        self.suites = set()
        self.adapter = {}          # adapter and backend, where only torch_compare's table says

    def add(self, arg):
        label, path = None, arg
        if "=" in arg and not os.path.exists(arg):
            label, path = arg.rsplit("=", 1)
        text = open(path).read()
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        rows = data.get("rows") if isinstance(data, dict) else data
        first = rows[0] if isinstance(rows, list) and rows and isinstance(rows[0], dict) else {}
        if isinstance(data, dict) and "fits" in data:
            self.memory = data
            self.suites.add("memory")
        elif "torch_ms" in first:
            if isinstance(data, dict) and data.get("reference"):
                self.reference = data["reference"]
            self.compare.update({key(r): r for r in rows})
            self.suites.add("kernels")
        elif isinstance(data, dict) and "adapter" in data and "unit" in first:
            self.bench = data
            self.suites.add("kernels")
        elif isinstance(data, list):
            if not all(isinstance(r, dict) and r.get("name") for r in data):
                sys.exit(f"{path}: a JSON list, but not of rows with a name")
            self.rows.extend(data)
        elif data is not None:
            sys.exit(f"{path}: JSON this script does not know")
        elif "vs PyTorch" in text and "wgrad/torch" in text:
            ref, adapter, rows = parse_compare_text(text)
            self.reference = self.reference or ref
            self.adapter = self.adapter or adapter
            self.compare.update({key(r): r for r in rows})
            self.suites.add("kernels")
        elif "bench_ms_per_step=" in text:
            step = parse_train_gpt(text)
            self.steps.append((label or os.path.splitext(os.path.basename(path))[0], step))
            self.suites.add("training")
        elif "torch_f16 ms_per_step=" in text or "torch_f32 ms_per_step=" in text:
            ref, steps = parse_gpt_step(text)
            self.reference = self.reference or ref
            self.torch_steps.update(steps)
            self.suites.add("training")
        elif re.search(r"^accuracy=", text, re.M):
            m = re.search(r"^accuracy=([\d.]+) images_per_s=(\d+) peak_mem_mb=([\d.]+)", text, re.M)
            if not m:
                sys.exit(f"{path}: an accuracy= line this script cannot read")
            self.mnist.append((label or "train_mnist", m))
            self.suites.add("training")
        else:
            sys.exit(f"{path}: not an output this script knows")

    # --- rows -------------------------------------------------------------------------------

    def kernel_rows(self):
        out = []
        src = list(self.bench["rows"]) if self.bench else []
        seen = {key(r) for r in src}
        src += [r for k, r in self.compare.items() if k not in seen]
        for r in src:
            c = self.compare.get(key(r), {})
            row = dict(name=r["name"], size=r["shape"], dtype=r["dtype"], wgrad_ms=sig(r["ms"]))
            if c.get("torch_ms"):
                row["reference_ms"] = sig(c["torch_ms"])
                row["ratio"] = round(c["ratio"], 3)
            if "rate" in r:
                row["rate"] = fmt_rate(r["rate"], r["unit"])
                if c.get("torch_ms"):
                    row["reference_rate"] = fmt_rate(r["rate"] * r["ms"] / c["torch_ms"], r["unit"])
            check = r.get("check", c.get("check", "-"))
            if check not in ("-", None):
                row["check"] = check
            if c.get("torch_tf32_ms"):
                row["note"] = f"PyTorch with TF32: {sig(c['torch_tf32_ms'], 4):g} ms"
            out.append(row)
        return out

    def step_rows(self):
        out = []
        for label, s in self.steps:
            row = dict(name=f"GPT step, {label}", wgrad_ms=sig(s["ms"]), wgrad_tokens_per_s=s["tokens"],
                       wgrad_peak_mib=round(s["peak"]))
            for k in ("host_ms", "launches"):
                if k in s:
                    row[k] = s[k]
            prec = label.split()[0].strip(",") if label.split() else ""
            ref = self.torch_steps.get(prec)
            if ref:
                row["reference_peak_mib"] = round(ref["peak"])
                row["memory_ratio"] = round(s["peak"] / ref["peak"], 2)
                if "checkpoint" in label or "ckpt" in label:
                    row["note"] = "PyTorch's peak is its step without checkpointing"
                else:
                    row["reference_ms"] = sig(ref["ms"])
                    row["reference_tokens_per_s"] = ref["tokens"]
                    row["time_ratio"] = round(s["ms"] / ref["ms"], 3)
            out.append(row)
        for label, m in self.mnist:
            out.append(dict(name=label, accuracy=float(m.group(1)), images_per_s=int(m.group(2)),
                            peak_mib=float(m.group(3))))
        return out

    def memory_rows(self):
        d, out = self.memory, []
        base = {r["model"]: r for r in d["rows"] if r["variant"] == "f32"}
        mib = lambda b: round(b / 2**20, 1)
        for r in d["rows"]:
            b = base.get(r["model"], r)
            out.append(dict(name=r["model"], variant=r["variant"], batch=r["batch"], peak_mib=mib(r["peak"]),
                            act_mib=mib(r["act"]), fwd_mib=mib(r["fwd"]), step_ms=sig(r["ms"], 4),
                            peak_vs_f32=round(r["peak"] / b["peak"], 2), step_vs_f32=round(r["ms"] / b["ms"], 2)))
        for f in d["fits"]:
            gib = d["budget"] % 2**30 == 0
            under = f"largest batch under {d['budget'] // 2**30} GiB" if gib else \
                f"largest batch under {d['budget'] / 2**20:.0f} MiB"
            out.append(dict(name=f"{f['model']}, {under}", variant="f32", batch=f["f32"]))
            out.append(dict(name=f"{f['model']}, {under}", variant="f16+ckpt", batch=f["f16_ckpt"]))
        return out


def git(*args):
    try:
        return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def wgpu_version():
    try:
        lock = open(os.path.join(ROOT, "Cargo.lock")).read()
    except OSError:
        return ""
    m = re.search(r'name = "wgpu"\nversion = "([^"]+)"', lock)
    return m.group(1) if m else ""


ORDER = ["suite", "title", "device", "backend", "driver", "wgpu", "reference", "date", "commit",
         "commit_time", "command", "note", "columns", "rows"]


def dump(doc):
    """The results file as the repository keeps them: one key a line, one row a line."""
    lines = []
    keys = [k for k in ORDER if k in doc] + [k for k in doc if k not in ORDER]
    for k in keys:
        if k == "rows":
            rows = ",\n".join("  " + json.dumps(r, ensure_ascii=False) for r in doc["rows"])
            lines.append(f' "rows": [\n{rows}\n ]')
        else:
            lines.append(f" {json.dumps(k)}: {json.dumps(doc[k], ensure_ascii=False)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", metavar="INPUT")
    p.add_argument("--suite")
    p.add_argument("--device")
    p.add_argument("--backend")
    p.add_argument("--driver")
    p.add_argument("--wgpu")
    p.add_argument("--reference")
    p.add_argument("--date", default=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"))
    p.add_argument("--commit")
    p.add_argument("--command")
    p.add_argument("--title")
    p.add_argument("--note")
    p.add_argument("--out", help="write here instead of stdout")
    a = p.parse_args()

    inp = Inputs()
    for arg in a.inputs:
        inp.add(arg)
    suite = a.suite or (inp.suites.pop() if len(inp.suites) == 1 else None)
    if not suite:
        sys.exit("--suite: the inputs do not say which (kernels, training, memory, multi-gpu, lavapipe, llm)")
    bench = inp.bench or inp.adapter
    commit = a.commit or git("rev-parse", "--short", "HEAD")
    doc = dict(
        suite=suite,
        device=a.device or bench.get("adapter") or (inp.memory or {}).get("adapter"),
        backend=a.backend or bench.get("backend"),
        driver=a.driver or bench.get("driver"),
        wgpu=a.wgpu or wgpu_version(),
        reference=a.reference or inp.reference,
        date=a.date,
        commit=commit,
        title=a.title,
        note=a.note,
    )
    when = git("show", "-s", "--format=%ct", commit)
    if when:
        t = datetime.datetime.fromtimestamp(int(when), datetime.timezone.utc)
        doc["commit_time"] = t.strftime("%Y-%m-%dT%H:%M:%SZ")
    if a.command:
        doc["command"] = a.command
    else:
        doc["command"] = f"benches/gpu_run.sh {suite}"
        print(f"record.py: no --command; writing {doc['command']!r}", file=sys.stderr)
    rows = []
    if inp.bench or inp.compare:
        rows += inp.kernel_rows()
    rows += inp.step_rows()
    if inp.memory:
        rows += inp.memory_rows()
    rows += inp.rows
    doc["rows"] = rows
    missing = [k for k in ("device", "backend", "driver", "commit") if not doc.get(k)]
    if missing:
        sys.exit(f"record.py: give {', '.join('--' + k for k in missing)} (the inputs do not say)")
    if not rows:
        sys.exit("record.py: no rows in the inputs")
    doc = {k: v for k, v in doc.items() if v not in (None, "")}
    text = dump(doc)
    if a.out:
        open(a.out, "w").write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
