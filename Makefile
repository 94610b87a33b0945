# Two entry points (see README): `make demo` installs everything and runs the main job on the
# default models; `make test` installs everything and runs the fast test suite (the small real
# model included). `make test-all` adds the slow ones (statistical, real-model end to end).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SPECDEC := $(VENV)/bin/specdec

.PHONY: install demo test test-slow test-all lint models-test lowest-transformers exact-build test-exact

# llama-cpp-python is built from source for this machine by src/specdec/build_flags.py (it
# prints what it passes and why): the native build (-march=native), except on CPUs with AMX
# when the compiler is GCC < 13, whose AMX kernels crash at the first decode; there it names
# the CPU's instruction sets one by one and leaves AMX out (CPU_REPACK kept). The wheel is
# built with pip's cache off into .whl/llama-<key> (key: version, flags, compiler), so a
# changed flag set is never answered with a cached old build; LLAMA_KEY changes with them.
LLAMA_KEY := $(shell $(PYTHON) src/specdec/build_flags.py --key)

# torch is pinned to the CPU build that lies on this kind of machine's disk; the package itself
# only asks for a range, so GPU users keep their CUDA torch.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install torch==2.13.0
	$(PYTHON) src/specdec/build_flags.py --install $(PY)
	$(PY) -m pip install -e '.[llamacpp,dev,serve]'
	touch $@

# the flag set changed (another machine, another compiler): rebuild llama-cpp-python only
$(VENV)/.llama-$(LLAMA_KEY): src/specdec/build_flags.py | $(VENV)/.installed
	$(PYTHON) src/specdec/build_flags.py --install $(PY)
	rm -f $(VENV)/.llama-*
	touch $@

install: $(VENV)/.installed $(VENV)/.llama-$(LLAMA_KEY)

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

# Opt-in: llama-cpp-python with patches/ggml-cpu-repack-row-invariant.patch applied (its source
# archive from PyPI, SHA-256 checked): repacked kernels that compute each row of an n-row
# product as the one-row product does when GGML_CPU_REPACK_ROW_INVARIANT=1 (exact numerics set
# it), so --exact keeps them. Without that variable it computes what the stock build does.
# `make install` (and so `make test`) puts the stock build back; `make test-exact` runs the
# patch's own bitwise tests on it.
exact-build: install
	$(PYTHON) src/specdec/build_flags.py --install-exact $(PY)
	rm -f $(VENV)/.llama-*

test-exact: exact-build
	$(SPECDEC) models fetch smollm2-135m-instruct-q4_1
	$(PY) -m pytest tests/test_exact_build.py

lint: install
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

# the transformers backend's tests at the lowest transformers version pyproject.toml allows
# (installed into a temporary directory; needs the package index; part of .ci/run)
lowest-transformers: install
	.ci/lowest-transformers.sh $(PY)
