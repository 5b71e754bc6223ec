#!/usr/bin/env bash
# Trainer throughput, code at the start of this session (a38313b) vs now, alternating, 40 updates of the demo recipe.
set -u
py=/work/main/.venv/bin/python
for round in 1 2; do
  for tree in old main; do
    out=/tmp/ab_${tree}_${round}; rm -rf $out
    (cd /work/$tree && PYTHONPATH=/work/$tree $py -m nmt.train model=tiny data=multi30k_en_de +experiment=demo \
      train.max_steps=40 train.log_every=10 train.save_every_steps=1000 train.valid_every=1000 train.valid_bleu_sentences=0 \
      train.average_last=0 train.keep_last=1 train.threads=2 train.precision=bf16 train.output_dir=$out \
      data.prepared_dir=/work/main/prepared/multi30k_en_de > $out.log 2>&1)
    echo "$tree round $round: $(grep -o 'train update [0-9]*: .*tokens_per_s [0-9.e+]*' $out/train.log | tail -3 | grep -o 'tokens_per_s [0-9.e+]*' | tr '\n' ' ')"
  done
done
