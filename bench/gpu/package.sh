#!/usr/bin/env bash
# Builds a portable tessera (static libstdc++/libgcc, shaderc, zstd, xxhash, pcre2; Vulkan loaded
# dynamically) and puts everything the GPU machine needs into dist/ (git-ignored):
#   dist/tessera            the binary
#   dist/run.sh             the one-call benchmark (bench/gpu/run.sh)
#   dist/debs/*.deb         Debian's libvulkan1 + GL/EGL libraries (the GPU machine has no Vulkan loader)
# Ship it with the device tool: carry ["dist"], command "bash dist/run.sh".
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake -S . -B build-portable -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_PORTABLE=ON -DTESSERA_TESTS=OFF >/dev/null
cmake --build build-portable -j"$(nproc)" --target tessera
rm -rf dist && mkdir -p dist/debs
cp build-portable/tessera dist/
strip dist/tessera
cp bench/gpu/run.sh bench/gpu/ab.sh bench/gpu/vulkan_env.sh dist/
if ! ls .gl/libvulkan1_*.deb .gl/libegl1_*.deb >/dev/null 2>&1; then
  mkdir -p .gl /tmp/amd64/partial
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  apt-get $o update >/dev/null
  (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi
cp .gl/*.deb dist/debs/  # libvulkan1 + the GL/EGL libraries the NVIDIA driver loads
echo "dynamic dependencies of dist/tessera:"
ldd dist/tessera | sed 's/^/  /'
du -sh dist
