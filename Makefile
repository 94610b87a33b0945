# Two entry points (see README): `make demo` installs everything and runs the main job on the
# default models; `make test` installs everything and runs the fast test suite (the small real
# model included). `make test-all` adds the slow ones (statistical, real-model end to end).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SPECDEC := $(VENV)/bin/specdec

.PHONY: install demo test test-slow test-all lint models-test lowest-transformers

# torch is pinned to the CPU build that lies on this kind of machine's disk; the package itself
# only asks for a range, so GPU users keep their CUDA torch.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[llamacpp,dev,serve]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(SPECDEC) demo

models-test: install
	$(SPECDEC) models fetch smollm2-135m-instruct-q4_1

test: install models-test
	$(PY) -m pytest -m "not slow"

# the tests marked slow (pyproject.toml's markers): statistical, long real-model runs
test-slow: install models-test
	$(PY) -m pytest -m slow

test-all: test test-slow

lint: install
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

# the transformers backend's tests at the lowest transformers version pyproject.toml allows
# (installed into a temporary directory; needs the package index; part of .ci/run)
lowest-transformers: install
	.ci/lowest-transformers.sh $(PY)
