# Two commands on a fresh machine: `make demo` and `make test`.
# Each creates .venv if missing and installs what it needs (torch/torchvision from the index,
# as any user gets them; npm's azurite for the blob-store tests) before running. The versions
# are those of requirements.lock, the set the suite last passed with; `make test-latest` tries
# the newest that pyproject's ranges allow and rewrites the lock only when the suite passes.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
LOCK   := requirements.lock
LATEST_VENV := .venv-latest
# two test processes (pytest-xdist), one test file each at a time so a file's module fixtures
# are built once, handed out in the order tests/conftest.py gives them (the files with slow
# tests first, so that no long file starts last); PYTEST_WORKERS=0 runs the suite in this process
PYTEST_WORKERS ?= 2
XDIST := --dist loadfile --no-loadscope-reorder
PYTEST_ARGS ?= -q
AZURITE := .tools/node_modules/.bin/azurite
DEMO_OUT ?= demo-output

.PHONY: install demo test test-fast test-latest lint format bench bench-peers clean cluster-up cluster-down docs

install: $(STAMP)

$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --constraint $(LOCK) -e '.[dev]'
	touch $(STAMP)

$(AZURITE):
	mkdir -p .tools
	npm install --silent --no-audit --no-fund --prefix .tools azurite@3

demo: $(STAMP)
	$(VENV)/bin/landcover demo --out $(DEMO_OUT)

# everything (what CI runs), the 25 slowest tests listed at the end
test: $(STAMP) $(AZURITE)
	LANDCOVER_AZURITE=$(CURDIR)/$(AZURITE) $(PY) -m pytest -n $(PYTEST_WORKERS) $(XDIST) --durations=25 $(PYTEST_ARGS)

# the quick loop while changing code: no test marked slow, none that needs a service (Azurite,
# Chromium, SLURM, network namespaces, a Dask cluster: tests/conftest.py marks those), no notebook
test-fast: $(STAMP)
	$(PY) -m pytest -n $(PYTEST_WORKERS) $(XDIST) -m "not slow and not service" $(PYTEST_ARGS)

# The newest versions pyproject allows (as far as this machine's own pip settings let them),
# in a venv of their own; the lock moves to them only if the whole suite passes.
test-latest: $(AZURITE)
	rm -rf $(LATEST_VENV)
	$(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LATEST_VENV)/bin/python -m pip install --quiet --upgrade --upgrade-strategy eager -e '.[dev]'
	LANDCOVER_AZURITE=$(CURDIR)/$(AZURITE) $(LATEST_VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) $(XDIST) $(PYTEST_ARGS)
	{ sed -n '/^#/p' $(LOCK); $(LATEST_VENV)/bin/python -m pip freeze --exclude-editable; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)
	@echo "requirements.lock now pins the versions above; run make test to install them in $(VENV)"

# a real SLURM cluster of emulated nodes on this machine (root; README "Emulated nodes")
NODES ?= 2
cluster-up: $(STAMP)
	$(PY) -m tests.support.slurm_testbed up --nodes $(NODES) $(if $(BANDWIDTH),--bandwidth $(BANDWIDTH))

cluster-down: $(STAMP)
	$(PY) -m tests.support.slurm_testbed down $(PREFIX)

lint: $(STAMP)
	$(VENV)/bin/ruff check tiling landcover cluster tests benchmarks notebooks
	$(VENV)/bin/ruff format --check tiling landcover cluster tests benchmarks notebooks
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format tiling landcover cluster tests benchmarks notebooks
	$(VENV)/bin/ruff check --fix tiling landcover cluster tests benchmarks notebooks

# the documentation site (mkdocs.yml; the CLI reference and the benchmark tables are generated
# by docs/hooks/generate.py), strictly: a broken link or a missing results file fails the build
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(PY) benchmarks/bench_tile.py
	$(PY) benchmarks/bench_train.py
	$(PY) benchmarks/bench_comm.py
	$(PY) benchmarks/bench_predict.py

# TorchGeo, geoai and Raster Vision side by side with ours (benchmarks/bench_peers.py), in a venv
# of their own. Only torch and torchvision are held to the lock: Raster Vision's boto3 needs
# python-dateutil < 3, which the lock's pin rules out.
PEERS_VENV := .venv-peers
bench-peers:
	test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	grep -E '^(torch|torchvision)==' $(LOCK) > $(PEERS_VENV)/torch-constraints.txt
	$(PEERS_VENV)/bin/python -m pip install --quiet \
		--constraint $(PEERS_VENV)/torch-constraints.txt -e '.[peers]'
	$(PEERS_VENV)/bin/python benchmarks/bench_peers.py --json benchmarks/results/peers.json
	$(PEERS_VENV)/bin/python benchmarks/bench_state.py --from-peers benchmarks/results/peers.json

clean:
	rm -rf $(VENV) $(LATEST_VENV) .tools $(DEMO_OUT) .pytest_cache .mypy_cache .ruff_cache site
