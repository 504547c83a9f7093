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

.PHONY: install estimate test lint format sweep sweep-smoke trace validate heldout band accuracy tables fit-overheads bench clean

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

# Real-size GRPO steps under FakeTensorMode (no GPU needed).
trace: install
	HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 .venv/bin/grpo-vram-trace --grid default
	HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 .venv/bin/grpo-vram-trace --grid headline

# Issue 9's out-of-sample grids (seeded, resumable: rerun to continue; skips are recorded with their reason).
validate: install
	HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 nice -n 10 $(PY) -W ignore -m sweeps.trace.run_random --set validation

heldout: install
	HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 nice -n 10 $(PY) -W ignore -m sweeps.trace.run_random --set heldout

# estimator/band.json from the validation rows (never from the held-out ones)
band: install
	$(PY) -m sweeps.report.band

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
