#!/usr/bin/env bash
# The main job on the embedded default: build tessera, synthesize a tiny GLM-shaped model (Q4_0),
# convert it to a packed .tsr, verify the packed file against the original, and generate text
# with the Vulkan runtime (Mesa lavapipe on a machine without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >/dev/null
T=build/tessera
mkdir -p out
echo "== synth: a tiny GLM-4.7-Flash-shaped model"
$T synth --preset tiny --type q4_0 --seed 1 -o out/tiny-q4_0.gguf
echo "== convert: experts into tiles, q_nope.k_b and v_b.attn_output composed"
$T convert out/tiny-q4_0.gguf -o out/tiny-q4_0.tsr
echo "== verify: bytes, composed error, checksums, metadata, and logits (Vulkan vs the CPU reference)"
$T verify out/tiny-q4_0.gguf out/tiny-q4_0.tsr --logits 8
echo "== run: greedy decode on the GPU (the model is random, so the text is too)"
$T run out/tiny-q4_0.tsr -p "The capital of France is" -n 32 --temp 0 --print-ids
