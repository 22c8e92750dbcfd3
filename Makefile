# Two commands for a fresh machine; each creates .venv and installs what it needs on first use.
#   make demo   the main job on a CPU machine: the CPU testbed (see README)
#   make test   ruff, then the test suite (what CI runs)
#   make rehearse  optional: GRPO, Dr. GRPO, APO and CoDaPO through verl's whole training loop on the CPU (see README)
# TORCH selects the torch build installed beside verl, in the same pip call: pinning it there is what keeps
# pip from resolving a multi-GB CUDA build on a CPU-only machine. GPU users: see README, "Install", and docs/training.md.

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
# Extra pip arguments, e.g. PyTorch's CPU wheel index on a CPU-only machine where a plain torch==2.13.0 resolves
# to a CUDA build: make test TORCH=torch==2.13.0+cpu PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu"
PIP_ARGS ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.recipe-apo-installed

.PHONY: demo test rehearse bench clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --no-compile $(PIP_ARGS) "$(TORCH)" -e ".[test]"
	$(PY) -c "$$COMPILE_ALL"
	touch $(STAMP)

# pip compiles the installed packages' bytecode on one core (most of a fresh install's minute and a half); this
# compiles them on every core. Files that are not Python 3.11 (torch ships one) are skipped, as pip skips them.
define COMPILE_ALL
import compileall, sysconfig
compileall.compile_dir(sysconfig.get_path("purelib"), quiet=2, workers=0)
endef
export COMPILE_ALL

demo: $(STAMP)
	$(PY) -W ignore::UserWarning -m recipe_apo.testbed

# ruff first (seconds); then every test, two processes side by side, whole files each, the longest first
# (tests/conftest.py, pyproject's addopts). PYTEST_ARGS, e.g. PYTEST_ARGS='-m "not e2e"' or PYTEST_ARGS=-n0.
PYTEST_ARGS ?=
test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -n 2 $(PYTEST_ARGS)

# REHEARSAL_ARGS, e.g. REHEARSAL_ARGS="--steps 4 --out /tmp/rehearsal"
REHEARSAL_ARGS ?=
rehearse: $(STAMP)
	$(PY) -m recipe_apo.cpu.rehearse $(REHEARSAL_ARGS)

bench: $(STAMP)
	$(PY) scripts/bench_estimator.py
	$(PY) scripts/bench_loss.py
	$(PY) scripts/bench_reward.py
	$(PY) scripts/bench_e2e.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis rehearsal
