#!/usr/bin/env bash
# The wheels the GPU machine's Python lacks for this project (it has torch + CUDA, triton, sentencepiece, sacrebleu,
# tensorboard, numpy, pyyaml, tqdm): hydra-core, omegaconf, antlr4-python3-runtime (built from its sdist, which
# has no wheel), sacremoses and what it imports, pytest and its plugins. Run where the package index is reachable:
#   scripts/gpu_wheels.sh [DIR]     -> DIR (default .whl/, ignored by git); carry it: run(carry=[".whl"])
# scripts/gpu_check.sh installs them into /tmp/relnmt-site there. PY_VERSION: the GPU machine's Python (3.12).
set -euo pipefail
cd "$(dirname "$0")/.."
d=${1:-.whl}; mkdir -p "$d"
py=${PYTHON:-python3}
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version "${PY_VERSION:-3.12}" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d "$d" hydra-core==1.3.2 omegaconf==2.3.0 sacremoses==0.1.1 click joblib pytest iniconfig pluggy
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$py" -m pip download -q --no-deps --no-binary=:all: -d "$tmp" antlr4-python3-runtime==4.9.3
"$py" -m pip wheel -q --no-deps -w "$d" "$tmp"/antlr4-python3-runtime-4.9.3.tar.gz
ls "$d"
