#!/usr/bin/env bash
# Builds tessera and runs the whole test suite (GoogleTest through ctest, on Mesa lavapipe).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
export TESSERA_CACHE_DIR="${TESSERA_CACHE_DIR:-$PWD/build/cache}"
ctest --test-dir build --output-on-failure -j"$(nproc)"
