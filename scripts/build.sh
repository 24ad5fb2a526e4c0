#!/usr/bin/env bash
# Configures and builds quantforge in build/ (Release). Extra arguments are
# passed to `cmake --build` (for example `--target quantforge`).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${QF_JOBS:-2}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${QF_CMAKE_ARGS:-} >/dev/null
cmake --build build -j "$jobs" "$@"
