#!/usr/bin/env bash
# Builds llama.cpp 0c1e570 from the llama-cpp-python 0.3.36 source package on
# PyPI (its vendor/llama.cpp), for side-by-side benchmarks. Cached: a second run
# with the binaries in place does nothing. Prints the bin directory.
#
#   scripts/build-llama-cpp.sh [TARGET ...]   (default: llama-bench)
#
# Installs cmake with pip when the machine has none. Output under
# target/llama.cpp/ (git-ignored); $LLAMA_CPP_DIR overrides it.
# LLAMA_CPP_NO_LLAMAFILE=1 builds without llamafile's sgemm (a separate build
# directory, build-no-llamafile/): its tiles make a row's result depend on
# the batch (scripts/bench-code-vs-llama-cpp.py --llama-batch-invariant).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.3.36
dir=${LLAMA_CPP_DIR:-$PWD/target/llama.cpp}
src="$dir/llama_cpp_python-$VERSION/vendor/llama.cpp"
build="$dir/build"
extra=()
if [[ ${LLAMA_CPP_NO_LLAMAFILE:-} == 1 ]]; then
    build="$dir/build-no-llamafile"
    extra=(-DGGML_LLAMAFILE=OFF)
fi
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(llama-bench)

missing=()
for t in "${targets[@]}"; do
    [[ -x "$build/bin/$t" ]] || missing+=("$t")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    echo "$build/bin"
    exit 0
fi

mkdir -p "$dir"
if [[ ! -d "$src" ]]; then
    echo "downloading llama-cpp-python==$VERSION (source) ..." >&2
    python3 -m pip download --no-deps --no-binary llama-cpp-python --disable-pip-version-check \
        -d "$dir" "llama-cpp-python==$VERSION" >&2
    tar -xzf "$dir/llama_cpp_python-$VERSION.tar.gz" -C "$dir"
fi
if ! command -v cmake >/dev/null 2>&1; then
    echo "installing cmake with pip ..." >&2
    python3 -m pip install --quiet cmake >&2 || python3 -m pip install --quiet --break-system-packages cmake >&2
fi
# the HTTP server only when asked for (it takes longest to build)
server=OFF
for t in "${targets[@]}"; do
    [[ $t == llama-server ]] && server=ON
done
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=$server "${extra[@]}" >&2
cmake --build "$build" -j "$(nproc)" --target "${missing[@]}" >&2
echo "$build/bin"
