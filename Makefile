# capsmed developer entry points. `make help` lists them.
# `make demo` and `make test` create .venv and install on first use.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.capsmed-installed

.DEFAULT_GOAL := help
.PHONY: help install demo test test-fast lint docs clean gpu-check reproduce-smoke reproduce-jimenez2018 \
	reproduce-vigueras2021 reproduce-gu2021 reproduce-routing2019 reproduce-digits \
	reproduce-medmnist

help: ## List the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "} {printf "  make %-22s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml setup.py constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first, pinned: the CPU wheel here; an unpinned torch pulls GBs of CUDA wheels
	$(PY) -m pip install --quiet -c constraints.txt torch==2.13.0
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP) ## Create .venv, install capsmed and dev tools

demo: $(STAMP) ## Synthetic TUPAC16: preprocess, train, report
	$(VENV)/bin/capsmed demo --workdir demo_out

test: $(STAMP) ## Run the test suite (CPU, a few minutes)
	$(PY) -m pytest

test-fast: $(STAMP) ## The suite without the slow end-to-end tests (~6 min on 2 cores)
	$(PY) -m pytest -m "not slow"

# Whole studies (pipelines/*.yaml) through capsmed run; rerunning skips finished runs.
#   make reproduce-jimenez2018 DATA_ROOT=/data GPUS=0,1
#   make reproduce-vigueras2021 DATA_ROOT=/data EXECUTOR=slurm PARTITION=gpu ACCOUNT=lab
# GPUS: the local executor's GPUs [all visible]. On Slurm, PARTITION, ACCOUNT, QOS,
# TIME (minutes per job) and GPUS_PER_RUN override every job's resources (the paper
# studies ask for 1 GPU per run and 24 h); RUN_FLAGS adds any other capsmed run
# option, e.g. RUN_FLAGS=--detach (then: capsmed run wait PIPELINE) or --allow-cpu.
DATA_ROOT    ?= data
EXECUTOR     ?= local
GPUS         ?=
PARTITION    ?=
ACCOUNT      ?=
QOS          ?=
TIME         ?=
GPUS_PER_RUN ?=
RUN_FLAGS    ?=
RUN           = $(VENV)/bin/capsmed run --executor $(EXECUTOR) --set data_root=$(DATA_ROOT) \
                $(if $(GPUS),--gpus $(GPUS)) \
                $(if $(PARTITION),--slurm-partition $(PARTITION)) \
                $(if $(ACCOUNT),--slurm-account $(ACCOUNT)) \
                $(if $(QOS),--slurm-qos $(QOS)) $(if $(TIME),--slurm-time $(TIME)) \
                $(if $(GPUS_PER_RUN),--slurm-gpus $(GPUS_PER_RUN)) $(RUN_FLAGS)

reproduce-smoke: $(STAMP) ## Toy study on synthetic data (the batch machinery)
	$(RUN) pipelines/smoke.yaml

reproduce-digits: $(STAMP) ## Real digit scans (scikit-learn): paper 000's low-data study, ~15 min CPU
	$(RUN) pipelines/digits-lowdata.yaml

reproduce-jimenez2018: $(STAMP) ## Paper 000: 432 runs, Table 2 and Fig. 2
	$(RUN) pipelines/jimenez2018.yaml

reproduce-vigueras2021: $(STAMP) ## Paper 001: AML, 5-fold CV, parallel capsnets
	$(RUN) pipelines/vigueras2021.yaml

reproduce-gu2021: $(STAMP) ## Paper 004: ablations, affNIST, compactness
	$(RUN) pipelines/gu2021.yaml

reproduce-routing2019: $(STAMP) ## Paper 003: routing sweep, manifold, transfer
	$(RUN) pipelines/routing2019.yaml

reproduce-medmnist: $(STAMP) ## MedMNIST v2: 6 sets, capsnets beside ConvNets
	$(RUN) pipelines/medmnist.yaml

# The system Python of a GPU machine (torch with CUDA), no install needed; set
# GPU_PYTHON=.venv/bin/python to use the project's environment instead.
GPU_PYTHON ?= python3
gpu-check: ## On a CUDA machine: correctness and speed check
	PYTHONPATH=. $(GPU_PYTHON) benchmarks/gpu_check.py --out benchmarks/results

docs: $(STAMP) ## The API reference and guides as a site, in site/ (mkdocs)
	$(VENV)/bin/mkdocs build --strict --quiet

lint: $(STAMP) ## ruff over the package and tests
	$(VENV)/bin/ruff check capsmed tests benchmarks examples

clean: ## Remove caches, demo output, builds (keeps .venv)
	rm -rf demo_out build dist site *.egg-info .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -not -path './$(VENV)/*' -exec rm -rf {} +
