#!/bin/bash
# Example SLURM job: the paper's base model on 2 nodes x 4 GPUs (8 GPUs, update_freq 1).
# Submit from the repository root after `make install` and `make prepare-wmt14`:  sbatch scripts/slurm_train.sh
#SBATCH --job-name=relnmt-base
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=32
#SBATCH --time=48:00:00
#SBATCH --output=outputs/slurm-%j.log

set -euo pipefail
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun .venv/bin/python -m torch.distributed.run \
  --nnodes="$SLURM_NNODES" --nproc_per_node=4 \
  --rdzv_id="$SLURM_JOB_ID" --rdzv_backend=c10d --rdzv_endpoint="$head_node:29500" \
  -m nmt.train model=base data=wmt14_en_de +experiment=paper_base train.output_dir=outputs/base_wmt14_en_de
