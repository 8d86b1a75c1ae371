#!/usr/bin/env bash
# Runs wgrad's GPU-side checks and benchmarks on a machine with a GPU and no Rust toolchain.
# Build here first (docs/performance.md, "Numbers on a GPU"), put the binaries (optionally gzip'd or xz'd) in .gpu/,
# then run:  benches/gpu_run.sh tests|kernels|training|llm|finetune   (logs go to $OUT, default
# gpu-out/)
# `llm` wants in .gpu/: a SmolLM2 file cut by scripts/cut_gguf.py, `generate` (built with
# --features tokenizers), optionally `llama-bench` (benches/llama_cpp.sh) and `test_smollm2`.
# `finetune` wants the cut file and `finetune` (built with --features tokenizers).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$root/gpu-out}
mkdir -p "$OUT"
# The lent machines can come without a Vulkan loader and the glvnd libraries NVIDIA's Vulkan
# driver loads: their Debian packages in .gl/ (docs/performance.md, "Numbers on a GPU") are unpacked then.
if ! ldconfig -p | grep -q libvulkan.so.1 && [ -d "$root/.gl" ]; then
  for f in "$root"/.gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -e "$icd" ]; then export VK_DRIVER_FILES=$icd; fi
# Tests and examples find data/ and tests/fixtures/ above the directory they run in (.gpu/)
# when the checkout they were built in is not on this machine.
cd "$root/.gpu"
for f in *.gz; do [ -e "$f" ] && gunzip -f "$f"; done
for f in *.xz; do [ -e "$f" ] && xz -d -f "$f"; done
chmod +x ./* 2>/dev/null
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
case "${1:-all}" in
  tests|all)
    for t in test_*; do
      # test_api's check of the examples' command lines needs every example binary beside
      # the test's build directory; CI runs it.
      skip=(); [ "$t" = test_api ] && skip=(--skip examples_answer_help)
      timeout 150 "./$t" "${skip[@]}" > "$OUT/tests.tmp" 2>&1
      echo "$t: rc=$? $(grep -h 'test result' "$OUT/tests.tmp")" | tee -a "$OUT/tests.log"
      grep -h -A4 'panicked' "$OUT/tests.tmp" | head -12 >> "$OUT/tests.log"
    done
    rm -f "$OUT/tests.tmp" ;;&
  kernels|all)
    timeout 300 ./bench --json > "$OUT/wgrad.json" 2> "$OUT/bench.log"
    python3 "$root/benches/torch_compare.py" "$OUT/wgrad.json" > "$OUT/compare.txt" 2>&1
    cat "$OUT/compare.txt" ;;&
  training|all)
    timeout 200 ./train_mnist > "$OUT/mnist.log" 2>&1; grep -E "^epoch|accuracy=" "$OUT/mnist.log"
    timeout 250 ./memory_bench > "$OUT/memory.log" 2>&1; grep -v -E "^(adapter|driver|memory |features|limits|missing)" "$OUT/memory.log" | tail -22
    timeout 120 ./loader_bench --batch 512 > "$OUT/loader.log" 2>&1; tail -9 "$OUT/loader.log" ;;&
  llm)
    # wgrad (weights as stored and decoded), eager PyTorch and llama.cpp's Vulkan backend on the
    # same cut file, alternating, three rounds; then the cut model against transformers.
    model=$(ls ./*.cut*.gguf | head -1)
    blocks=$(echo "$model" | sed -E 's/.*\.cut([0-9]+)\..*/\1/')
    for round in 1 2 3; do
      timeout 120 ./generate --model "$model" --bench >> "$OUT/llm_wgrad.jsonl" 2>> "$OUT/llm.log"
      timeout 120 ./generate --model "$model" --bench --decoded >> "$OUT/llm_wgrad_decoded.jsonl" 2>> "$OUT/llm.log"
      timeout 200 python3 "$root/benches/llama_torch.py" --layers "$blocks" >> "$OUT/llm_torch.jsonl" 2>> "$OUT/llm.log"
      if [ -x ./llama-bench ]; then
        GGML_VK_VISIBLE_DEVICES=0 timeout 200 ./llama-bench -m "$model" -p 512 -n 128 -r 3 -fa 0,1 \
          -o jsonl >> "$OUT/llm_llama_cpp.jsonl" 2>> "$OUT/llm.log"
      fi
      echo "round $round done"
    done
    if [ -x ./test_smollm2 ]; then
      WGRAD_MODEL_DIR=$PWD timeout 200 ./test_smollm2 --ignored --nocapture cut6 2>&1 | grep -E "prompt|result"
    fi ;;
  finetune)
    # LoRA on the cut file, wgrad (without and with checkpointing) beside eager PyTorch
    # (benches/lora_torch.py: the same batch, context, rank and adapters), alternating, two
    # rounds. wgrad's last line is `val_before=... step_ms=... peak_mib=...`.
    model=$(ls ./*.cut*.gguf | head -1)
    blocks=$(echo "$model" | sed -E 's/.*\.cut([0-9]+)\..*/\1/')
    for round in 1 2; do
      for ck in "" --checkpointing; do
        echo "wgrad ${ck:-plain}: $(timeout 200 ./finetune --model "$model" --steps 60 --lr 2e-3 \
          --budget 1GiB $ck --out "$OUT/finetune" 2>> "$OUT/finetune.log")" | tee -a "$OUT/finetune.txt"
      done
      timeout 200 python3 "$root/benches/lora_torch.py" --layers "$blocks" | tee -a "$OUT/lora_torch.jsonl"
    done ;;
esac
