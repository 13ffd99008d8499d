#!/usr/bin/env bash
# The main job on the embedded default: build tessera, synthesize a tiny GLM-shaped model,
# inspect it. (Extended as the pipeline grows: convert -> verify -> run.)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >/dev/null
T=build/tessera
mkdir -p out
$T synth --preset tiny --type q4_0 --seed 1 -o out/tiny-q4_0.gguf
$T inspect out/tiny-q4_0.gguf | head -n 40
