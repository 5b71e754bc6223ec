#!/bin/bash
# Example SLURM job: a recipe on N nodes x G GPUs, surviving the cluster. The batch is the recipe's
# (train.tokens_per_update): the trainer derives the accumulation from the node and GPU counts, so 2 x 4 GPUs,
# 1 x 8 or 4 x 2 train the same batch, and the job log's "effective batch:" line says so.
# - 120 s before the time limit SLURM signals this script (USR1); it passes SIGTERM to torchrun, whose workers
#   finish their update, save a complete checkpoint and exit (nmt.train's exit code 75), and the job requeues
#   itself; the requeued job runs the same command, which resumes bit-identically where it stopped;
# - preemption (SIGTERM to the job) takes the same path;
# - a worker that dies (GPU fault, OOM kill) brings the group back from the last checkpoint, up to 3 times;
# - a step that fails beyond that (a node lost: srun ends the step on its first bad exit) after a checkpoint of
#   this job requeues the job, up to MAX_REQUEUES times (default 3), and the requeued job resumes from it; a
#   step that saved nothing (a refused config: the job log's ERROR line says why) ends the job.
# Submit from the repository root after `make install` and `make prepare-wmt14`:
#   sbatch scripts/slurm_train.sh                                  # the paper's base on WMT14 En-De
#   sbatch scripts/slurm_train.sh paper_big big wmt14_en_de        # RECIPE MODEL DATA, then any overrides:
#   sbatch --nodes=4 scripts/slurm_train.sh paper_base base wmt14_en_fr train.max_tokens=2048
# (4 nodes x 4 GPUs: the recipe's 32,768 tokens are 16 micro-batches of 2,048, one a GPU.) The run trains in
# OUTPUT if set, else the paper's recipe in outputs/MODEL_DATA and any other in a folder named by the overrides
# that define it (outputs/base_wmt14_en_fr.experiment-paper_base+train.max_tokens-2048), never another run's;
# for sweeps of many runs, Hydra's submitit launcher (configs/hydra/launcher/slurm.yaml) submits one job per
# cell. The job log is relnmt-<job id>.log in the submit folder (SLURM opens it before this script runs, so it cannot be under a
# folder the script would create); the run's own log is its folder's train.log.
#SBATCH --job-name=relnmt
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=32
#SBATCH --time=48:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=relnmt-%j.log

set -uo pipefail
recipe=${1:-paper_base}; model=${2:-base}; data=${3:-wmt14_en_de}
shift $(( $# < 3 ? $# : 3 ))
python=${PYTHON:-.venv/bin/python}
# the run's folder: OUTPUT, else the paper's recipe as it is in outputs/MODEL_DATA (make train-base's), and
# anything else beside it, named by the fields that define it (as a sweep names its cells: nmt/run_names.py)
if [ -n "${OUTPUT:-}" ]; then output=$OUTPUT
elif [ $# -eq 0 ] && [ "$recipe" = "paper_$model" ]; then output=outputs/${model}_${data}
else output=outputs/$("$python" -c 'import sys; from nmt.compose import register_schemas; register_schemas()
from nmt.compose import cell_name_for; print(cell_name_for(sys.argv[1:]))' "model=$model" "data=$data" \
  "+experiment=$recipe" "$@") || exit 2
fi
saved() { stat -c %Y "$output/checkpoint_last.pt" 2>/dev/null || echo 0; }  # when the last whole state was saved
saved_before=$(saved)
gpus=${SLURM_GPUS_ON_NODE:-${SLURM_GPUS_PER_NODE:-4}}; gpus=${gpus##*:}  # "h100:4" -> 4
# on SIGTERM torchrun gives its workers this long (default 30 s) to finish the update and save; inside the 120 s
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-100}
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
stop=""
on_signal() { stop=1; kill -TERM "$launcher" 2>/dev/null; }
trap on_signal USR1 TERM

srun --kill-on-bad-exit=1 "$python" -m torch.distributed.run \
  --nnodes="$SLURM_NNODES" --nproc_per_node="$gpus" --max-restarts=3 \
  --rdzv_id="$SLURM_JOB_ID" --rdzv_backend=c10d --rdzv_endpoint="$head_node:${RDZV_PORT:-29500}" \
  -m nmt.train model="$model" data="$data" +experiment="$recipe" train.output_dir="$output" "$@" &
launcher=$!
wait "$launcher"; status=$?
while kill -0 "$launcher" 2>/dev/null; do wait "$launcher"; status=$?; done  # a trap interrupts the first wait
if [ -n "$stop" ]; then
  echo "stopped by a signal with a complete checkpoint: requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
fi
# a failed step that had saved in this job (a node lost mid-run) is requeued, up to MAX_REQUEUES times in all (counted
# in the submit folder, apart from the signals' requeues); one that never saved (a refused config) ends here
failures=.relnmt-$SLURM_JOB_ID.failures
if [ "$status" -ne 0 ] && [ "$(saved)" != "$saved_before" ] && \
   [ "$(cat "$failures" 2>/dev/null | wc -l)" -lt "${MAX_REQUEUES:-3}" ]; then
  echo "failed" >>"$failures"
  echo "the job step failed (exit $status) after saving: requeueing job $SLURM_JOB_ID to resume from" \
       "$output/checkpoint_last.pt (requeue $(wc -l <"$failures") of ${MAX_REQUEUES:-3} for failures)"
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
fi
rm -f "$failures"  # the job ends here: its count of requeues ends with it
exit "$status"
