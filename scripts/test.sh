#!/usr/bin/env bash
# The test command: installs dependencies, builds (Release, -j2) and runs every
# test with ctest. Tests that need ../shared skip with a message when it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j "${QF_JOBS:-2}"
