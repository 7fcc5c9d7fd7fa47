# Everything bootstraps .venv on first use: `make test` and `make dashboard` work on a fresh machine with only Python.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.lab-installed
PORT   ?= 8501
PYTEST_ARGS ?=

.PHONY: venv test test-fast dashboard lab bench bench-quick bench-gpu quality clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The whole suite: unit tests, then the notebooks under nbval (tiny sizes via LAB_FAST=1).
test: venv
	LAB_FAST=1 $(PY) -m pytest $(PYTEST_ARGS)

test-fast: venv
	$(PY) -m pytest -x -q -m "not slow" $(PYTEST_ARGS)

dashboard: venv
	$(PY) -m streamlit run dashboard/app.py --server.address 127.0.0.1 --server.port $(PORT) \
		--server.headless true --browser.gatherUsageStats false

lab: venv
	$(PY) -m pip install --quiet -e '.[lab]'  # the pinned JupyterLab (the tests need only ipykernel)
	$(PY) -m jupyter lab notebooks/ --ip 127.0.0.1

bench: venv
	$(PY) -m lab bench

bench-quick: venv
	$(PY) -m lab bench --quick

# The GPU parts of every benchmark (runs as is on a box with only torch + torchao + numpy + pandas + pyarrow).
bench-gpu:
	bash benchmarks/gpu.sh

# ruff, then the architecture contracts in pyproject.toml (layers, independent technique packages, no circle).
quality: venv
	$(PY) -m ruff check lab tests benchmarks dashboard conftest.py
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
