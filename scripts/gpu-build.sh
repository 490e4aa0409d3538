#!/usr/bin/env bash
# Builds the CUDA backend, the dsv4 binary and the GPU tests (sm_90a + sm_120a) and gathers the
# executables GPU runs need in gpu-bin/.
# Usage: scripts/gpu-build.sh [build-dir]      then: scripts/gpu-check.sh gpu-bin
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
cmake -S . -B "$build" -DDSV4_CUDA=ON -DCMAKE_BUILD_TYPE=Release ${DSV4_CMAKE_ARGS:-} >/dev/null
targets=(dsv4)
for t in tests/ops/*_gpu_test.cu; do [ -e "$t" ] && targets+=("$(basename "$t" .cu)"); done
targets+=(golden_gpu_test golden_tp_gpu_test)  # the golden checks through the dsv4 commands with --backend cuda (split over two ranks)
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
rm -rf gpu-bin && mkdir -p gpu-bin
cp "$build/src/dsv4" gpu-bin/
for t in "${targets[@]:1}"; do cp "$build/tests/"*/"$t" gpu-bin/; done
# Shared libraries of Debian -dev packages the GPU machine may lack (cpp-httplib): next to the binaries.
mkdir -p gpu-bin/lib
for lib in $(ldd gpu-bin/dsv4 | awk '/libcpp-httplib/ {print $3}'); do cp -L "$lib" gpu-bin/lib/; done
# CUPTI, which the profile's replay trace opens at run time: the toolkit's own, so that its records
# match the headers the trace was built with.
cupti=$(ls /usr/local/cuda/lib64/libcupti.so.* /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.* 2>/dev/null | head -n 1 || true)
[ -n "$cupti" ] && cp -L "$cupti" gpu-bin/lib/
# The call that carries gpu-bin/ to a GPU machine has a size limit: no symbols.
strip gpu-bin/dsv4 gpu-bin/*_test 2>/dev/null || true
# The machine that runs gpu-bin/ may have no git history: record what was built.
echo "$(git rev-parse --short HEAD)$( [ -n "$(git status --porcelain --untracked-files=no)" ] && echo ' + uncommitted changes')" > gpu-bin/COMMIT
ls -la gpu-bin
