#!/usr/bin/env bash
# Build llama.cpp's own server (llama-server) from the llama.cpp sources that the
# llama-cpp-python package ships in its source distribution (vendor/llama.cpp), so that the
# server and specdec's llama.cpp backend run the same llama.cpp. Nothing is fetched but that
# sdist, through pip (from the package registry or pip's cache).
#
#   benchmarks/engines/build_llama_server.sh [BUILD_ROOT]
#
# BUILD_ROOT (default /tmp/specdec-engines) receives src/ (the sdist, unpacked) and
# llama.cpp-build/ (CMake build tree); the binary is BUILD_ROOT/llama.cpp-build/bin/llama-server.
# Environment: PYTHON (default: .venv/bin/python, else python3), LLAMA_CPP_PYTHON_VERSION
# (default: the installed llama-cpp-python's version), JOBS (default 2).
set -euo pipefail

root="${1:-/tmp/specdec-engines}"
here="$(cd "$(dirname "$0")/../.." && pwd)"
py="${PYTHON:-$here/.venv/bin/python}"
[ -x "$py" ] || py=python3
version="${LLAMA_CPP_PYTHON_VERSION:-$("$py" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))')}"
jobs="${JOBS:-2}"

mkdir -p "$root/src"
sdist="$root/src/llama_cpp_python-$version.tar.gz"
if [ ! -f "$sdist" ]; then
    "$py" -m pip download "llama-cpp-python==$version" --no-deps --no-binary :all: -d "$root/src"
fi
src="$root/src/llama_cpp_python-$version"
[ -d "$src" ] || tar -xzf "$sdist" -C "$root/src"
llama="$src/vendor/llama.cpp"
[ -f "$llama/CMakeLists.txt" ] || { echo "no vendor/llama.cpp in $sdist" >&2; exit 2; }

build="$root/llama.cpp-build"
cmake -S "$llama" -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DBUILD_SHARED_LIBS=OFF
cmake --build "$build" --target llama-server -j "$jobs"
"$build/bin/llama-server" --version 2>&1 | tail -n 2
echo "built $build/bin/llama-server (llama.cpp from llama-cpp-python $version)"
