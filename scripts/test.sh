#!/usr/bin/env bash
# Sets up (dependencies + build, CUDA kernels included when nvcc is present) and runs every test.
# GPU tests report "skipped" on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
