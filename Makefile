# capsmed developer entry points. `make help` lists them.
# `make demo` and `make test` create .venv and install on first use.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.capsmed-installed

.DEFAULT_GOAL := help
.PHONY: help install demo test lint clean gpu-check

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "} {printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first, pinned: the CPU wheel here; an unpinned torch pulls GBs of CUDA wheels
	$(PY) -m pip install --quiet -c constraints.txt torch==2.13.0
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP) ## Create .venv and install capsmed with its dev tools

demo: $(STAMP) ## Synthetic TUPAC16 -> preprocess -> train capsnet + lenet -> per-class reports
	$(VENV)/bin/capsmed demo --workdir demo_out

test: $(STAMP) ## Run the test suite (CPU, a few minutes)
	$(PY) -m pytest

# The system Python of a GPU machine (torch with CUDA), no install needed; set
# GPU_PYTHON=.venv/bin/python to use the project's environment instead.
GPU_PYTHON ?= python3
gpu-check: ## On a CUDA machine: correctness + speed check -> benchmarks/results/gpu_check.md
	PYTHONPATH=. $(GPU_PYTHON) benchmarks/gpu_check.py --out benchmarks/results

lint: $(STAMP) ## ruff over the package and tests
	$(VENV)/bin/ruff check capsmed tests

clean: ## Remove caches, demo output and build files (keeps .venv)
	rm -rf demo_out build dist *.egg-info .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -not -path './$(VENV)/*' -exec rm -rf {} +
