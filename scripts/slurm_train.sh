#!/bin/bash
# Example SLURM job: the paper's base model on 2 nodes x 4 GPUs (8 GPUs, update_freq 1), surviving the cluster:
# - 120 s before the time limit SLURM signals this script (USR1); it passes SIGTERM to torchrun, whose workers
#   finish their update, save a complete checkpoint and exit (nmt.train's exit code 75), and the job requeues
#   itself; the requeued job runs the same command, which resumes bit-identically where it stopped;
# - preemption (SIGTERM to the job) takes the same path;
# - a worker that dies (GPU fault, OOM kill) brings the group back from the last checkpoint, up to 3 times.
# Submit from the repository root after `make install` and `make prepare-wmt14`:  sbatch scripts/slurm_train.sh
#SBATCH --job-name=relnmt-base
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=32
#SBATCH --time=48:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=outputs/slurm-%j.log

set -uo pipefail
# on SIGTERM torchrun gives its workers this long (default 30 s) to finish the update and save; inside the 120 s
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=100
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
stop=""
on_signal() { stop=1; kill -TERM "$launcher" 2>/dev/null; }
trap on_signal USR1 TERM

srun --kill-on-bad-exit=1 .venv/bin/python -m torch.distributed.run \
  --nnodes="$SLURM_NNODES" --nproc_per_node=4 --max-restarts=3 \
  --rdzv_id="$SLURM_JOB_ID" --rdzv_backend=c10d --rdzv_endpoint="$head_node:29500" \
  -m nmt.train model=base data=wmt14_en_de +experiment=paper_base train.output_dir=outputs/base_wmt14_en_de &
launcher=$!
wait "$launcher"; status=$?
while kill -0 "$launcher" 2>/dev/null; do wait "$launcher"; status=$?; done  # a trap interrupts the first wait
if [ -n "$stop" ]; then
  echo "stopped by a signal with a complete checkpoint: requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
fi
exit "$status"
