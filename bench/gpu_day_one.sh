#!/usr/bin/env bash
# GPU day one (issues 47, 63) on the GPU machine as it is lent: no package index, 64 MiB carried a call, an image
# with torch, transformers, accelerate and peft but no trl, datasets, vllm or faiss. It installs only the carried
# wheelhouse of what is missing and small (trl, datasets and their missing dependencies: bench/gpu_wheelhouse.sh
# makes it, about 2 MB), then bench/gpu_day_one.py measures each case in its own process and always writes its
# table and JSON ($OUT/gpu_day_one.{txt,json,log}). About 6 minutes on one H200; bounded at 9.5.
#
#   bench/gpu_day_one.sh [--wheels DIR] [--python PY] [--dry-run] [-- gpu_day_one.py options]
#
#   --wheels DIR   the carried wheelhouse (default .whl)
#   --python PY    the interpreter that holds the image's torch (default python3)
#   --dry-run      print the commands, run none (tests/test_gpu_day_one.py)
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=".whl" PY="python3" DRY=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --wheels) WHEELS="$2"; shift 2 ;;
    --python) PY="$2"; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --) shift; break ;;
    *) echo "gpu_day_one.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
OUT="${OUT:-runs/gpu_day_one}"

run() {
  echo "+ $*"
  if [[ $DRY -eq 0 ]]; then "$@"; fi
}

run mkdir -p "$OUT"
if [[ $DRY -eq 0 ]]; then nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true; fi
run env PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
  timeout 570 "$PY" bench/gpu_day_one.py --wheels "$WHEELS" --json "$OUT/gpu_day_one.json" "$@"
