#!/usr/bin/env bash
# GPU day one (issue 47): install the GPU set, then check `maps-train plan` against one GPU on randomly initialised
# real shapes (bench/gpu_day_one.py: LoRA SFT peaks of Qwen3-0.6B/1.7B/4B, a vLLM engine with three LoRA adapters,
# FAISS search). One table out, also written to $OUT/gpu_day_one.json. Fits in 10 minutes on one H200.
#
#   bench/gpu_day_one.sh [--wheels DIR] [--extra gpu|gpu-faiss] [--venv DIR] [--no-install] [--dry-run]
#
#   --wheels DIR   install offline from a wheelhouse (a machine without a package index), made beforehand where
#                  PyPI is reachable:  pip download -d DIR -e ".[gpu]"
#   --extra NAME   the set to install (pyproject.toml): gpu (FAISS in host memory, default) or gpu-faiss
#   --venv DIR     where (default .venv-gpu); --no-install uses it as it is
#   --dry-run      print the commands, run none (tests/test_gpu_day_one.py)
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS="" EXTRA="gpu" VENV=".venv-gpu" INSTALL=1 DRY=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --wheels) WHEELS="$2"; shift 2 ;;
    --extra) EXTRA="$2"; shift 2 ;;
    --venv) VENV="$2"; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    --dry-run) DRY=1; shift ;;
    *) echo "gpu_day_one.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
OUT="${OUT:-runs/gpu_day_one}"

run() {
  echo "+ $*"
  if [[ $DRY -eq 0 ]]; then "$@"; fi
}

if [[ $INSTALL -eq 1 ]]; then
  if [[ -n "$WHEELS" ]]; then
    source=(--no-index --find-links "$WHEELS")
  else
    source=()
  fi
  run python3 -m venv "$VENV"
  run "$VENV/bin/pip" install --quiet "${source[@]}" -e ".[$EXTRA]"
fi
run mkdir -p "$OUT"
run nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
# The whole check is bounded: 9 minutes for the measurements, whatever the install took.
run env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
  timeout 540 "$VENV/bin/python" bench/gpu_day_one.py --json "$OUT/gpu_day_one.json"
