PY := .venv/bin/python
NPROC ?= 8

.PHONY: install test bench

install: .venv/installed
.venv/installed: pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -e '.[test]'
	touch $@

test: install
	$(PY) -m pytest

bench: install
	$(PY) scripts/bench_attention.py
