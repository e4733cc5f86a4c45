# Two commands on a fresh machine: `make demo` and `make test`.
# Each creates .venv if missing and installs what it needs (torch/torchvision from the index,
# as any user gets them; npm's azurite for the blob-store tests) before running.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
AZURITE := .tools/node_modules/.bin/azurite
DEMO_OUT ?= demo-output

.PHONY: install demo test lint format bench clean cluster-up cluster-down

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(AZURITE):
	mkdir -p .tools
	npm install --silent --no-audit --no-fund --prefix .tools azurite@3

demo: $(STAMP)
	$(VENV)/bin/landcover demo --out $(DEMO_OUT)

test: $(STAMP) $(AZURITE)
	LANDCOVER_AZURITE=$(CURDIR)/$(AZURITE) $(PY) -m pytest -q

# a real SLURM cluster of emulated nodes on this machine (root; README "Emulated nodes")
NODES ?= 2
cluster-up: $(STAMP)
	$(PY) -m cluster.testbed up --nodes $(NODES) $(if $(BANDWIDTH),--bandwidth $(BANDWIDTH))

cluster-down: $(STAMP)
	$(PY) -m cluster.testbed down $(PREFIX)

lint: $(STAMP)
	$(VENV)/bin/ruff check tiling landcover cluster tests benchmarks notebooks
	$(VENV)/bin/ruff format --check tiling landcover cluster tests benchmarks notebooks
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format tiling landcover cluster tests benchmarks notebooks
	$(VENV)/bin/ruff check --fix tiling landcover cluster tests benchmarks notebooks

bench: $(STAMP)
	$(PY) benchmarks/bench_tile.py
	$(PY) benchmarks/bench_train.py
	$(PY) benchmarks/bench_comm.py
	$(PY) benchmarks/bench_predict.py

clean:
	rm -rf $(VENV) .tools $(DEMO_OUT) .pytest_cache .mypy_cache .ruff_cache
