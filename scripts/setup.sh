#!/usr/bin/env bash
# Installs tessera's build and test dependencies (Debian 12 packages only). Idempotent.
set -euo pipefail
pkgs=(cmake ninja-build g++ pkg-config git
      libvulkan-dev mesa-vulkan-drivers libshaderc-dev glslc
      libeigen3-dev libzstd-dev libcli11-dev libxxhash-dev libpcre2-dev
      libgtest-dev libbenchmark-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
