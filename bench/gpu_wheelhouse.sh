#!/usr/bin/env bash
# The wheelhouse bench/gpu_day_one.sh carries to the lent GPU machine (no package index there): what its image
# lacks and the day-one check needs, for its Python 3.12, pinned to the versions this project resolves. The image
# holds every other requirement of trl 1.16 and datasets 5.2 (accelerate, transformers, pyarrow, pandas, fsspec,
# xxhash, huggingface-hub, ...); pip there takes only what is missing from this folder. multiprocess is also
# fetched for this machine's Python, so the CPU rehearsal installs from the same folder. datasets 5.2 needs
# pyarrow>=24: if the image's is older, the check's rows say so with pip's error; then add pyarrow's cp312 wheel
# to the folder (pip download as below) and check that the tree and the folder stay under 64 MiB.
#
#   bench/gpu_wheelhouse.sh [--faiss] [DIR]   (default .whl, git-ignored; 1.9 MB, 20 MB with --faiss)
#
#   --faiss   also faiss-cpu 1.15.1 (18 MB, one abi3 wheel for 3.10+): the check's FAISS row is then measured
set -euo pipefail
cd "$(dirname "$0")/.."
FAISS=0
if [[ "${1:-}" == "--faiss" ]]; then FAISS=1; shift; fi
DIR="${1:-.whl}"
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
pip download --quiet --no-deps --only-binary=:all: --implementation cp --python-version 3.12 "${PLATFORMS[@]}" \
  -d "$DIR" trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
here="$(python3 -c 'import sys; print(f"{sys.version_info.major}.{sys.version_info.minor}")')"
if [[ "$here" != "3.12" ]]; then
  pip download --quiet --no-deps --only-binary=:all: --implementation cp --python-version "$here" "${PLATFORMS[@]}" \
    -d "$DIR" multiprocess==0.70.19
fi
if [[ $FAISS -eq 1 ]]; then
  pip download --quiet --no-deps --only-binary=:all: --implementation cp --python-version 3.12 "${PLATFORMS[@]}" \
    --platform manylinux_2_27_x86_64 -d "$DIR" faiss-cpu==1.15.1
fi
du -sh "$DIR"
