# Two entry points (see README): `make demo` installs everything and runs the main job on the
# default models; `make test` installs everything and runs the fast test suite (the small real
# model included). `make test-all` adds the slow ones (statistical, real-model end to end).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SPECDEC := $(VENV)/bin/specdec

.PHONY: install demo test test-slow test-all lint models-test lowest-transformers stock-build exact-build test-exact

# llama-cpp-python is built from source for this machine by src/specdec/llama_trust/build_flags.py (it
# prints what it passes and why), with patches/ggml-cpu-repack-row-invariant.patch applied: the
# row-invariant mode that exact numerics switch on (with it off the library runs the stock
# code). The native build (-march=native), except on CPUs with AMX when the compiler is
# GCC < 13 (or cannot be asked), whose AMX kernels crash at the first decode: there it names
# the CPU's instruction sets one by one and leaves AMX out (CPU_REPACK kept). Your own
# CMAKE_ARGS are passed on after those (they win). The wheel is built with pip's cache off into
# .whl/llama-exact-<key> (key: version, flags, your CMAKE_ARGS, compiler, the patch), so a
# changed flag set is never answered with a cached old build; LLAMA_KEY changes with them.
# LLAMA_BUILD=stock (`make stock-build`) builds and installs the unpatched library instead.
LLAMA_BUILD ?= patched
LLAMA_FLAGS := $(if $(filter stock,$(LLAMA_BUILD)),--stock,)
LLAMA_KEY := $(shell $(PYTHON) src/specdec/llama_trust/build_flags.py --key $(LLAMA_FLAGS))

# torch is pinned to the CPU build that lies on this kind of machine's disk; the package itself
# only asks for a range, so GPU users keep their CUDA torch.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install torch==2.13.0
	$(PYTHON) src/specdec/llama_trust/build_flags.py --install $(PY) $(LLAMA_FLAGS)
	$(PY) -m pip install -e '.[llamacpp,dev,serve,structured]'
	touch $@

# the flag set, the patch or the build asked for changed: rebuild llama-cpp-python only
$(VENV)/.llama-$(LLAMA_KEY): src/specdec/llama_trust/build_flags.py patches/ggml-cpu-repack-row-invariant.patch | $(VENV)/.installed
	$(PYTHON) src/specdec/llama_trust/build_flags.py --install $(PY) $(LLAMA_FLAGS)
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

# The unpatched llama-cpp-python (llama.cpp as released): exact numerics then cost about 20 %
# here and stay a mode (--exact). `make install` puts the patched build back.
stock-build:
	$(MAKE) install LLAMA_BUILD=stock

# the patched build is what `make install` makes (kept as a name for older instructions)
exact-build: install

# the patch's own bitwise tests (and its fixtures) on the installed patched build
test-exact: install models-test
	$(PY) -m pytest tests/test_exact_build.py

lint: install
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

# the transformers backend's tests at the lowest transformers version pyproject.toml allows
# (installed into a temporary directory; needs the package index; part of .ci/run)
lowest-transformers: install
	.ci/lowest-transformers.sh $(PY)
