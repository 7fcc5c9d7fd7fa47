# Everything bootstraps .venv on first use: `make test` and `make dashboard` work on a fresh machine with only Python.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.lab-installed
PORT   ?= 8501
PYTEST_ARGS ?=

.PHONY: venv docs test test-avx2 test-as-avx2 test-fast notebooks notebooks-docs dashboard lab bench bench-quick bench-gpu quality clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The manual: docs/ (mkdocs.yml) into .cache/site (not tracked). --strict: a broken link or anchor, or a page left
# out of the nav, fails the build. `make test` builds it first (about a second), so CI checks it.
docs: venv
	$(PY) -m mkdocs build --strict --site-dir .cache/site

# The whole suite: the docs (make docs), then unit tests, then the notebooks under nbval (tiny sizes via
# LAB_FAST=1); then the tests whose expectation depends on the CPU once more as an AVX2-only machine sees them
# (test-avx2).
# Each suite compiles into its own Inductor cache (.cache/, not tracked): never the per-user /tmp one that every
# other torch process on the machine shares, and never the capped suite's.
# Two pytest-xdist workers, one test file each at a time (--dist loadfile: a notebook's cells share one kernel, and
# a file's module fixtures are built once). On 2 cores the serial suite kept 1.2 of them busy: most tests wait on
# one core for Inductor's compile, an import in a child process, a page or a rank. TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile)
test: venv docs
	TORCHINDUCTOR_CACHE_DIR=$(CURDIR)/.cache/inductor LAB_FAST=1 LAB_SOLUTIONS=1 $(PY) -m pytest $(XDIST) $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-avx2

# The `capability` tests (tests/conftest.py) with ATen's and oneDNN's kernels capped at AVX2: no AVX-512, VNNI,
# AMX, native bf16 / fp16, whatever this CPU has (lab/measure/cpu.py says what the cap cannot emulate).
# On a CPU that is itself AVX2-class the cap hides nothing, so the main suite already ran these as that machine
# sees them: skipped, said. Only the test files that can hold a capability test are collected (a word below in the
# file: ~4 s of the pass's ~12 s start-up is collecting the other ~100 files); tests/conftest.py fails the main
# suite's collection when a capability test lives in a file without one, so none drops out of this pass unseen.
CAPABILITY_WORDS := capability|native_bf16|native_fp16|int8_vnni|amx|cpu_caps
test-avx2: venv
	@if $(PY) -c "import sys; from lab.measure.cpu import hardware_flags; from lab.measure.env import isa_class; \
		sys.exit(isa_class(hardware_flags()) != 'avx2')"; then \
		echo "test-avx2: skipped, this CPU is AVX2-class: the capability tests above already ran as an AVX2 machine sees them"; \
	else \
		TORCHINDUCTOR_CACHE_DIR=$(CURDIR)/.cache/inductor-avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 LAB_FAST=1 \
			$(PY) -m pytest $$(grep -rlE '$(CAPABILITY_WORDS)' tests --include='test_*.py' | sort) -m capability \
			$(XDIST) $(PYTEST_ARGS); \
	fi

# The whole suite as an AVX2-only machine sees it (kernels capped, a cold Inductor cache of its own): how long
# CI takes on that class, measured from any x86 CPU (docs/every-cpu.md). Not part of `make test`.
test-as-avx2: venv
	rm -rf $(CURDIR)/.cache/inductor-as-avx2
	TORCHINDUCTOR_CACHE_DIR=$(CURDIR)/.cache/inductor-as-avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
		LAB_FAST=1 LAB_SOLUTIONS=1 $(PY) -m pytest --durations=15 $(XDIST) $(PYTEST_ARGS)

test-fast: venv
	$(PY) -m pytest -x -q -m "not slow" $(PYTEST_ARGS)

# Every notebook at its default size (LAB_FAST unset; the exercises filled by lab/teach/solutions.py), one
# notebook per pytest under nbval, its wall time printed; any error in any cell fails. Not part of `make test`
# (minutes per notebook). One or a few: make notebooks NOTEBOOKS="notebooks/06_ablations.ipynb".
NOTEBOOKS ?= $(sort $(wildcard notebooks/*.ipynb))
notebooks: venv
	@fail=0; for nb in $(NOTEBOOKS); do start=$$(date +%s); \
		env -u LAB_FAST LAB_SOLUTIONS=1 TORCHINDUCTOR_CACHE_DIR=$(CURDIR)/.cache/inductor $(PY) -m pytest -q \
			-p no:randomly -p no:cacheprovider --nbval-lax --timeout=1800 --durations=0 $(PYTEST_ARGS) "$$nb" \
			&& ok=passed || { ok=FAILED; fail=1; }; \
		echo "make notebooks: $$nb $$ok in $$(( $$(date +%s) - start )) s (default size)"; done; exit $$fail

# The executed copies the docs site renders (docs/notebooks/, committed like benchmarks/results/): each notebook
# at its default size as above, from one commit of a clean tree (refused otherwise, the dirty files named), on a
# quiet machine (waits up to 15 min per notebook, then refuses), each on a fresh results store, its runs held to
# lab/teach/sanity.py's rules and a static PNG beside each plotly figure (kaleido, the [docs] extra); stamped with
# commit, date, machine id and load (lab/teach/render.py). A failing or rule-breaking notebook keeps its previous
# copy and fails the target. One: NOTEBOOKS=notebooks/03_pruning.ipynb; RENDER_ARGS=--force writes copies made
# on a busy machine or breaking a rule, each saying so (--allow-dirty, --wait S, --no-static-images: --help).
RENDER_ARGS ?=
notebooks-docs: venv
	@$(PY) -c "import kaleido" 2>/dev/null || $(PY) -m pip install --quiet -e '.[docs]'
	env -u LAB_FAST LAB_SOLUTIONS=1 TORCHINDUCTOR_CACHE_DIR=$(CURDIR)/.cache/inductor $(PY) -m lab.teach.render \
		--out docs/notebooks $(RENDER_ARGS) $(NOTEBOOKS)

dashboard: venv
	$(PY) -m streamlit run dashboard/app.py --server.address 127.0.0.1 --server.port $(PORT) \
		--server.headless true --browser.gatherUsageStats false

# JupyterLab (pinned in [dev], so `make venv` installs it; tests/e2e/test_jupyter_lab.py checks it serves).
lab: venv
	$(PY) -m jupyter lab notebooks/ --ip 127.0.0.1 $$([ "$$(id -u)" = 0 ] && echo --allow-root)  # Jupyter exits as root without it

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
	rm -rf $(VENV) .pytest_cache .ruff_cache .cache
