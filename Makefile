# grpo-vram. Everything runs inside .venv/ at the repo root.
SHELL := /bin/bash
PY    := .venv/bin/python
PIP   := .venv/bin/pip --disable-pip-version-check
STAMP := .venv/.installed
# CPU build of torch where there is no NVIDIA driver; a user's GPU box gets the CUDA build from the range in pyproject.toml.
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH_CPU := torch==2.13.0
EXTRAS ?= sweep,dev
SWEEP_ARGS ?=
# Air-gapped installs: `make install WHEELHOUSE=wheelhouse` installs from that folder only (see `make wheelhouse`).
WHEELHOUSE ?=
PIP_SOURCE := $(if $(WHEELHOUSE),--no-index --find-links $(abspath $(WHEELHOUSE)))
# Where `make sweep-smoke` measures: a git-ignored scratch folder, so a fresh clone measures (the committed
# results/raw/smoke.jsonl would make every config a skip). SMOKE_DIR=results/raw updates the published rows.
SMOKE_DIR ?= results/raw/scratch

LEGACY_TRL ?= 0.14 0.17 0.19 0.23

.PHONY: install estimate test lint format sweep sweep-smoke sweep-legacy gpu-validate trace trace-multigpu accuracy tables fit-overheads bench examples clean wheelhouse allocator-check allocator-streams validate heldout band

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q $(PIP_SOURCE) --upgrade pip
ifeq ($(HAS_GPU)$(WHEELHOUSE),)
	$(PIP) install -q $(PIP_SOURCE) $(TORCH_CPU)
endif
	$(PIP) install -q $(PIP_SOURCE) -e ".[$(EXTRAS)]"
	touch $(STAMP)

# Every wheel the sweep needs, for the Python and platform of the machine that will install them (defaults: this
# one's), downloaded into $(WHEEL_DIR)/ on a machine with internet. Copy the checkout with that folder to the
# cluster and run `make install WHEELHOUSE=wheelhouse` there (its python3 must be WHEEL_PYTHON). Linux targets:
# WHEEL_PYTHON=3.11 WHEEL_GLIBC=2.28 WHEEL_ARCH=x86_64 describe a cluster that differs from this machine
# (`ldd --version` prints its glibc); WHEEL_EXTRAS=sweep,dev,vllm adds vLLM. torch comes from PyPI (its Linux
# wheels are the CUDA build, with the nvidia-* libraries); TORCH_INDEX=https://download.pytorch.org/whl/cu128
# (or .../cpu) takes it from PyTorch's index instead.
WHEEL_DIR ?= wheelhouse
WHEEL_PYTHON ?= $(shell python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
WHEEL_GLIBC ?= $(shell python3 -c 'import platform; print(platform.libc_ver()[1])')
WHEEL_ARCH ?= $(shell uname -m)
# pip takes the named platform tags only (it widens manylinux2014 alone): every manylinux_2_N from the target's
# glibc down to 2_17, then manylinux2014 (which pip widens to the older ones)
WHEEL_PLATFORMS ?= $(shell python3 -c 'import sys; major, minor = map(int, sys.argv[1].split(".")[:2]); a = sys.argv[2]; print(" ".join([f"manylinux_{major}_{m}_{a}" for m in range(minor, 16, -1)] + [f"manylinux2014_{a}"]))' $(WHEEL_GLIBC) $(WHEEL_ARCH))
WHEEL_EXTRAS ?= sweep,dev
WHEEL_PIP ?= $(if $(wildcard .venv/bin/pip),.venv/bin/pip,python3 -m pip)
TORCH_INDEX ?=
# dependencies published as source only (pure Python): built into wheels here, since a download for another
# platform takes wheels only (antlr4: hydra-core's parser runtime)
SDIST_ONLY ?= antlr4-python3-runtime==4.9.3

wheelhouse:
	mkdir -p $(WHEEL_DIR)
	$(WHEEL_PIP) wheel -q --no-deps -w $(WHEEL_DIR) $(SDIST_ONLY)
	$(WHEEL_PIP) download -d $(WHEEL_DIR) --find-links $(WHEEL_DIR) --only-binary=:all: \
	  --python-version $(WHEEL_PYTHON) $(addprefix --platform ,$(WHEEL_PLATFORMS)) --implementation cp \
	  $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) \
	  pip "setuptools>=68" wheel ".[$(WHEEL_EXTRAS)]"
	@echo "$(WHEEL_DIR)/: $$(ls $(WHEEL_DIR) | wc -l) files, $$(du -sh $(WHEEL_DIR) | cut -f1) for Python $(WHEEL_PYTHON) on glibc $(WHEEL_GLIBC) $(WHEEL_ARCH)"

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

# One short GPU lease (~25 min on an H100 80GB, measured: 12 rows took 19 min): 16 rows covering every term, random weights built from
# the catalog (no hub), then the overhead fit and the tables. The vLLM row runs only where vLLM imports.
VALIDATE_ROWS := r00,r01,r02,r03,r04,r05,r06,r07,r08,r09,r10,r11,r12,r13,r14,r15
gpu-validate: install
	HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 .venv/bin/grpo-vram-sweep --multirun +experiment=gpu-validate \
	  validate_row=$(VALIDATE_ROWS)$$($(PY) -c 'import vllm' >/dev/null 2>&1 && echo ,r16) $(SWEEP_ARGS)
	$(MAKE) fit-overheads
	$(MAKE) tables

# A CPU grid of tiny and small models; a few minutes on 2 cores. Measures into $(SMOKE_DIR) and prints the
# estimator against what it measured (delete $(SMOKE_DIR)/smoke.jsonl to measure again).
sweep-smoke: install
	HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 .venv/bin/grpo-vram-sweep --multirun +experiment=smoke sweep.results_dir=$(SMOKE_DIR) $(SWEEP_ARGS)
	.venv/bin/grpo-vram-accuracy $(SMOKE_DIR)/smoke.jsonl

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

# Rank 0 of 2/4/8 FSDP2 ranks on a fake process group (results/traced/multigpu.jsonl; resumes).
trace-multigpu: install
	HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 nice -n 10 $(PY) -m sweeps.trace.multigpu

# Issue 9's out-of-sample grids (seeded, resumable: rerun to continue; skips are recorded with their reason).
validate: install
	HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 nice -n 10 $(PY) -W ignore -m sweeps.trace.run_random --set validation

HELDOUT_SETS ?= heldout heldout-c heldout-d heldout-e heldout-f heldout-g heldout-h heldout-i
heldout: install
	for s in $(HELDOUT_SETS); do \
	  HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 nice -n 10 $(PY) -W ignore -m sweeps.trace.run_random --set $$s || exit 1; \
	done

# estimator/band.json from the validation rows (never from the held-out ones)
band: install
	$(PY) -m sweeps.report.band

accuracy: install
	.venv/bin/grpo-vram-accuracy

tables: install
	.venv/bin/grpo-vram-tables

fit-overheads: install
	.venv/bin/grpo-vram-fit-overheads

# The worked examples (issue 12's four cases): what vram-estimate says, regenerated from their config files.
examples: install
	$(PY) examples/make_examples.py

# Replays results/streams/ through torch's real caching allocator and compares with the simulation (skips without CUDA).
allocator-check: install
	$(PY) -m sweeps.report.allocator_check
	$(PY) -m sweeps.report.allocator_check --conf expandable_segments:True

# Records the allocation streams of a few 3-step traced runs and simulates them (results/streams/).
allocator-streams: install
	HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 $(PY) -m sweeps.trace.streams

bench: install
	$(PY) benchmarks/bench_cli.py

clean:
	rm -rf .venv .pytest_cache outputs multirun
