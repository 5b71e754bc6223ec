#!/usr/bin/env bash
# One prepared GPU session: CUDA correctness of the fused kernel, the attention and training benchmarks,
# and a short real training run, each writing under OUT (default results/gpu/). Runs in about 8 minutes on one H200.
#
#   scripts/gpu_check.sh [OUT]
#
# On a machine whose Python has torch + CUDA + triton but not this project's other dependencies, first put
# their wheels in .whl/ (../shared/gpu/fetch_wheels.sh on the build machine) and the prepared Multi30k in
# prepared/ (python -m nmt.prepare data=multi30k_en_de); the script installs the wheels to /tmp/site and puts
# the checkout on PYTHONPATH (the project's torch pin is the CPU build, so it is not pip-installed there).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-results/gpu}}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
py=python3
step() { echo "== $1 ($(date +%T))"; }

step "machine" | tee "$out/machine.txt"
{ nvidia-smi -L; $py -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"; } \
    2>&1 | tee -a "$out/machine.txt"

step "kernel resources on this triton (sm_90 and sm_80, no spills, shared memory within the limit)"
$py -m nmt.kernels.resources --jobs 16 --output "$out/kernel_resources.json" 2>&1 | tail -60 | tee "$out/kernel_resources.txt"

step "the kernel's GPU questions: head 64/128/256 in bf16 and fp32, B*H > 65,535, a bf16 base step, n_spills"
$py scripts/gpu_questions.py --output "$out/questions.json" 2>&1 | tee "$out/questions.txt"

step "kernel and attention tests on CUDA"
$py -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_attention.py 2>&1 | tail -15 | tee "$out/tests.txt"

step "attention layer: fused kernel / PyTorch path / SDPA / OpenNMT-py (if installed)"
$py scripts/bench_attention.py --device cuda --dtype bfloat16 --repeats 50 --model-repeats 20 \
    --output "$out/bench_attention.json" 2>&1 | tee "$out/bench_attention.txt"

step "training step: tiny/base/big, relative/absolute, 25k-token batches, eager and compiled"
for compiled in "" "--compile"; do
    $py scripts/bench_train.py --device cuda --precision bf16 --presets tiny base big --max-tokens 25000 \
        --steps 20 --rounds 2 --peak-tflops 989 $compiled --output "$out/bench_train${compiled:+_compiled}.json" \
        2>&1 | tee "$out/bench_train${compiled:+_compiled}.txt"
done

step "the real trainer: base relative, 25k-token micro-batches, 300 updates (compare tokens/s with the step above)"
$py -m nmt.train model=base data=multi30k_en_de train.device=cuda train.precision=bf16 train.max_tokens=25000 \
    train.update_freq=1 train.max_steps=300 train.log_every=50 train.save_every_steps=100000 train.valid_every=100000 \
    train.output_dir="$out/trainer_base" 2>&1 | tail -12 | tee "$out/trainer_base.txt"
rm -f "$out"/trainer_base/*.pt

step "decoding: fp32 vs bf16 autocast (what nmt.translate precision=auto picks on a GPU)"
for precision in fp32 bf16; do
    $py scripts/bench_decode.py --device cuda --precision $precision --output "$out/bench_decode_$precision.json" \
        2>&1 | tee "$out/bench_decode_$precision.txt"
done
step "done"
