PY := .venv/bin/python
NPROC ?= 8
# The batch belongs to the recipe (train.tokens_per_update in configs/experiment/): the trainer derives the
# accumulation from NPROC and the per-device micro-batch, logs the product and refuses what cannot reach it.
# MAX_TOKENS= changes only the micro-batch (e.g. MAX_TOKENS=32768 NPROC=1 on a large GPU), never the batch.
MAX_TOKENS ?=
# A worker that dies (a node's GPU fault, an OOM kill) brings the group back from the last checkpoint, up to
# MAX_RESTARTS times; SIGTERM to torchrun (SLURM's time limit, preemption) stops every worker after its update.
MAX_RESTARTS ?= 3
# TORCH_ELASTIC_SHUTDOWN_TIMEOUT: on SIGTERM torchrun gives its workers this long to finish the update and save.
LAUNCH = TORCH_ELASTIC_SHUTDOWN_TIMEOUT=300 $(PY) -m torch.distributed.run --standalone --nproc_per_node=$(NPROC) --max-restarts=$(MAX_RESTARTS) -m nmt.train
PAIR ?= en-de
TGT = $(word 2,$(subst -, ,$(PAIR)))
CKPT ?= outputs/base_wmt14_en_de/averaged.pt
# outputs are named after the test set: newstest2014 (Table 1) or newstest2013 (the ablations) from sacrebleu
# (its cache folder, ~/.sacrebleu or $$SACREBLEU, works offline once filled), or the local files SRC= and REF=
TESTSET ?= $(if $(SRC)$(REF),$(basename $(notdir $(or $(SRC),$(REF)))),newstest2014)
SACREBLEU_SET = $(if $(filter newstest2013,$(TESTSET)),wmt13,wmt14/full)
NEWSTEST = $(dir $(CKPT))$(TESTSET).$(PAIR)
MODEL ?= base
DATA ?= wmt14_en_de
RECIPE ?= paper_$(MODEL)
EXTRA ?=

.PHONY: table1 table2 table3 beyond descendants lr_check length-study plots install test test-all demo prepare-wmt14 prepare-wmt14-fr train-base train-big train-smoke average export decode score \
        ablate-k ablate-kv bench check-kernels

install: .venv/installed
.venv/installed: pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -e '.[test]'
	touch $@

# make test: the suite without the slow tests (under 10 minutes on 2 cores); make test-all: everything, as CI runs it
test: install
	$(PY) -m pytest -m "not slow"

test-all: install
	$(PY) -m pytest

# The embedded default: prepare, train, decode and score the bundled Multi30k on a CPU. The budget is in
# updates (configs/experiment/demo.yaml; UPDATES=N for another), so every machine trains the same model.
UPDATES ?=
LINES ?=
DEMO_OUT ?= outputs/demo$(if $(UPDATES),_$(UPDATES))  # another budget is another run: a folder of its own
demo: install
	$(PY) scripts/demo.py $(if $(UPDATES),--updates $(UPDATES)) $(if $(LINES),--lines $(LINES)) --output $(DEMO_OUT)

# offline: EXTRA=data.hub_name=DIR, a copy of the hub repository wmt/wmt14
prepare-wmt14: install
	$(PY) -m nmt.prepare data=wmt14_en_de $(EXTRA)

prepare-wmt14-fr: install
	$(PY) -m nmt.prepare data=wmt14_en_fr $(EXTRA)

# Shaw et al. 2018 base and big: the recipes are configs/experiment/paper_{base,big}.yaml (updates, batch,
# checkpoint cadence, averaging); here only the device count (and, if given, the micro-batch) are added.
# DATA=wmt14_en_fr (after make prepare-wmt14-fr) for En-Fr.
MICRO = $(if $(MAX_TOKENS),train.max_tokens=$(MAX_TOKENS))
train-base: install
	$(LAUNCH) model=base data=$(DATA) +experiment=paper_base $(MICRO) $(EXTRA)

train-big: install
	$(LAUNCH) model=big data=$(DATA) +experiment=paper_big $(MICRO) $(EXTRA)

# Two CPU processes (gloo) of the tiny model for 30 updates: proof that the DDP path runs end to end.
train-smoke: install
	rm -rf outputs/smoke
	$(PY) -m nmt.prepare data=multi30k_en_de
	OMP_NUM_THREADS=1 $(PY) -m torch.distributed.run --standalone --nproc_per_node=2 --max-restarts=$(MAX_RESTARTS) \
	  -m nmt.train \
	  model=tiny data=multi30k_en_de train.output_dir=outputs/smoke train.max_steps=30 train.max_tokens=1024 \
	  train.save_every_steps=10 train.average_last=2 train.log_every=10 train.valid_every=0 train.device=cpu

average: install
	$(PY) -m nmt.average directory=$(dir $(CKPT)) last=$(or $(LAST),20) output=$(CKPT)

# A CTranslate2 model directory beside the checkpoint (QUANT=int8 for int8 weights); python -m nmt.translate
# checkpoint=<that directory> translates with it
EXPORT ?= $(dir $(CKPT))ctranslate2$(if $(QUANT),_$(QUANT))
export: install
	$(PY) -m nmt.export checkpoint=$(CKPT) output=$(EXPORT) $(if $(QUANT),quantization=$(QUANT))

# newstest2014 from sacrebleu's wmt14/full (3,003 sentences for en-de), newstest2013 (TESTSET=newstest2013) from
# its wmt13; offline: make decode SRC=local/file
decode: install
	@mkdir -p $(dir $(CKPT))
	$(if $(SRC),cp $(SRC) $(NEWSTEST).src,.venv/bin/sacrebleu -t $(SACREBLEU_SET) -l $(PAIR) --echo src > $(NEWSTEST).src)
	$(PY) -m nmt.translate checkpoint=$(CKPT) input=$(NEWSTEST).src output=$(NEWSTEST).hyp

score: install
	$(if $(REF),cp $(REF) $(NEWSTEST).ref,.venv/bin/sacrebleu -t $(SACREBLEU_SET) -l $(PAIR) --echo ref > $(NEWSTEST).ref)
	$(PY) -m nmt.score hyp=$(NEWSTEST).hyp ref=$(NEWSTEST).ref lang=$(TGT) output=$(NEWSTEST).json

# Tables 2 and 3, each down to its table, as one Hydra sweep over the ablation presets (configs/ablation/: k0 ... k256,
# key, value, neither; k16 is also Table 3's a^K + a^V row, one run for both): each cell trains in
# $(SWEEP_DIR)/<its overrides> with the recipe's batch (RECIPE=paper_$(MODEL)), is decoded (beam 4, alpha 0.6) and
# scored on the prepared SPLIT (valid: newstest2013 for the WMT14 presets), then table2.md / table3.md collect the
# cells. LAUNCHER=local: the cells one after another on this node under torchrun (NPROC processes; on a CPU:
# MODEL=tiny DATA=multi30k_en_de RECIPE=table1 NPROC=1); LAUNCHER=slurm: one SLURM job per cell through Hydra's
# submitit launcher (configs/hydra/launcher/slurm.yaml; SLURM= adds its overrides, e.g.
# SLURM="hydra.launcher.partition=gpu"). Run again, a sweep skips its scored cells and continues the others.
# CLIPS= / KV= choose the rows, SEEDS=1,2,3 the seeds.
LAUNCHER ?= local
SLURM ?=
SEEDS ?= 1
CLIPS ?= 0 1 2 4 16 64 256
KV ?= k16 key value neither
SPLIT ?= valid
SWEEP_DIR ?= multirun/$(MODEL)_$(DATA)
comma := ,
space := $(subst ,, )
LAUNCHERS = local slurm
SWEEP = $(if $(filter slurm,$(LAUNCHER)),$(PY) -m nmt.train -m hydra/launcher=slurm $(SLURM),$(LAUNCH) -m)
SHARED = experiment=$(RECIPE) $(MICRO) $(EXTRA)  # what every cell of this sweep holds: its table's rows
ABLATE = $(if $(filter $(LAUNCHER),$(LAUNCHERS)),,$(error LAUNCHER=$(LAUNCHER): local or slurm)) \
	$(SWEEP) model=$(MODEL) data=$(DATA) +experiment=$(RECIPE) $(MICRO) train.score_split=$(SPLIT) \
	train.seed=$(SEEDS) hydra.sweep.dir=$(SWEEP_DIR) $(EXTRA)
ablate-k: install
	$(ABLATE) +ablation=$(subst $(space),$(comma),$(addprefix k,$(CLIPS)))
	$(PY) -m nmt.table $(SWEEP_DIR) --rows $(addprefix ablation=k,$(CLIPS)) --where $(SHARED) \
	  $(if $(filter 16,$(CLIPS)),--baseline ablation=k16) > $(SWEEP_DIR)/table2.md.tmp \
	  && mv $(SWEEP_DIR)/table2.md.tmp $(SWEEP_DIR)/table2.md && cat $(SWEEP_DIR)/table2.md

ablate-kv: install
	$(ABLATE) +ablation=$(subst $(space),$(comma),$(KV))
	$(PY) -m nmt.table $(SWEEP_DIR) --rows $(addprefix ablation=,$(KV)) --where $(SHARED) \
	  $(if $(filter k16,$(KV)),--baseline ablation=k16) > $(SWEEP_DIR)/table3.md.tmp \
	  && mv $(SWEEP_DIR)/table3.md.tmp $(SWEEP_DIR)/table3.md && cat $(SWEEP_DIR)/table3.md

# The paper's Tables 1-3, the length study, Beyond, the descendants and the learning-rate check at small scale (tiny
# model, bundled Multi30k, several seeds): each one Hydra sweep of the cell path (configs/study/<name>.yaml) into
# results/cells, JOBS cells at a time on this machine (Hydra's joblib launcher); a cell two tables share is trained
# once, a scored cell is skipped, a stopped one continues from its checkpoint. Then the page's tables are rebuilt.
JOBS ?= 2
STUDY = $(PY) -m nmt.train -m hydra.launcher.n_jobs=$(JOBS) hydra.sweep.dir=results/cells +study=
table1 table2 table3 descendants lr_check: install
	$(STUDY)$@ $(EXTRA)
	$(PY) -m nmt.table results/README.md

beyond: install
	$(STUDY)beyond $(EXTRA)
	$(STUDY)beyond +ablation=shared data=multi30k_en_de $(EXTRA)
	$(PY) -m nmt.table results/README.md

length-study: install
	$(STUDY)length $(EXTRA)
	$(PY) -m nmt.table results/README.md

# results/README.md's tables, curves and the length study's positions from results/cells (matplotlib comes with
# make install)
SAMPLES ?= 1000  # the paired bootstrap's resamples
plots: install
	$(PY) -m nmt.table results/README.md --samples $(SAMPLES) --cite README.md docs/*.md
	$(PY) -m experiments.chance --cite results/README.md README.md
	$(PY) -m experiments.plot_curves table1 table2 table3 length beyond
	$(PY) -m experiments.length_positions

# The fused kernel compiled for sm_90 and sm_80 without a GPU: fails on register spills or shared memory over the limit.
check-kernels: install
	TRITON_INTERPRET= $(PY) -m nmt.kernels.resources --output results/kernels/resources.json

bench: install
	$(PY) -m benchmarks.attention
	$(PY) -m benchmarks.data
	$(PY) -m benchmarks.prepare
	$(PY) -m benchmarks.decode
