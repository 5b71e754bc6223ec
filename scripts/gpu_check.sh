#!/usr/bin/env bash
# Every open GPU question in one call, within 8 minutes on one H200 (stages, limits and their basis:
# benchmarks/gpu_check.py). At most four files come back: OUT/summary.md (read it first), answers.json, log.txt,
# archive.tar.gz.
#
#   scripts/gpu_check.sh [--dry-run] [OUT]        OUT: default results/gpu (on the device machine: "$OUT")
#
# --dry-run: the same stages on the CPU at tiny sizes (CI runs it: tests/test_gpu_check.py).
# On a machine whose Python has torch + CUDA + triton but not this project's other dependencies, carry the
# wheels in .whl/ (scripts/gpu_wheels.sh fetches them where the package index is reachable): they are installed
# into /tmp/relnmt-site and the checkout goes on PYTHONPATH (the project's torch pin is the CPU build, so the
# project is not pip-installed there). The prepared Multi30k is built there from data/ if absent (seconds).
set -uo pipefail
cd "$(dirname "$0")/.."
dry=()
if [ "${1:-}" = "--dry-run" ]; then dry=(--dry-run); shift; fi
out=${1:-${OUT:-results/gpu}}
py=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/relnmt-site .whl/*.whl \
        || echo "warning: installing .whl/ failed; the inputs stage says what is missing"
    export PYTHONPATH=/tmp/relnmt-site:$PWD${PYTHONPATH:+:$PYTHONPATH}
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
exec "$py" -m benchmarks.gpu_check "${dry[@]}" --output "$out"
