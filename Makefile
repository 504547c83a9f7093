# grpo-vram. Everything runs inside .venv/ at the repo root.
SHELL := /bin/bash
PY    := .venv/bin/python
PIP   := .venv/bin/pip
STAMP := .venv/.installed
# CPU build of torch where there is no NVIDIA driver; a user's GPU box gets the CUDA build from the range in pyproject.toml.
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH_CPU := torch==2.13.0
EXTRAS ?= sweep,dev
SWEEP_ARGS ?=

LEGACY_TRL ?= 0.14 0.17 0.19 0.23

.PHONY: install estimate test lint format sweep sweep-smoke sweep-legacy trace accuracy tables fit-overheads bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
ifneq ($(HAS_GPU),1)
	$(PIP) install -q $(TORCH_CPU)
endif
	$(PIP) install -q -e ".[$(EXTRAS)]"
	touch $(STAMP)

estimate: install
	.venv/bin/vram-estimate --model 7B --lora --gens 8

lint: install
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

format: install
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

test: lint
	HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 $(PY) -m pytest -q

# The GPU grid a user runs on a rented H100 (models load from the hub there).
sweep: install
	.venv/bin/grpo-vram-sweep --multirun +experiment=h100 $(SWEEP_ARGS)

# A CPU grid of tiny and small models; a few minutes on 2 cores.
sweep-smoke: install
	HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 .venv/bin/grpo-vram-sweep --multirun +experiment=smoke $(SWEEP_ARGS)

# Real GRPO steps of a tiny model on CPU under old TRL releases, each in its own .venvs/trl-X.Y (built once by
# sweeps/legacy/envs.sh under nice, one at a time); rows go to results/raw/legacy.jsonl, a rerun resumes.
sweep-legacy:
	bash sweeps/legacy/envs.sh $(LEGACY_TRL)
	for v in $(LEGACY_TRL); do \
	  PYTHONPATH=$(CURDIR) HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
	    nice -n 10 .venvs/trl-$$v/bin/python -m sweeps.runner.legacy --out results/raw/legacy.jsonl || exit 1; \
	done

# Real-size GRPO steps under FakeTensorMode (no GPU needed).
trace: install
	HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 .venv/bin/grpo-vram-trace --grid default
	HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 .venv/bin/grpo-vram-trace --grid headline

accuracy: install
	.venv/bin/grpo-vram-accuracy

tables: install
	.venv/bin/grpo-vram-tables

fit-overheads: install
	.venv/bin/grpo-vram-fit-overheads

bench: install
	$(PY) benchmarks/bench_cli.py

clean:
	rm -rf .venv .pytest_cache outputs multirun
