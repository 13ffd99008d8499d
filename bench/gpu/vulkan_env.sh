#!/usr/bin/env bash
# Sourced by run.sh and ab.sh on the GPU machine: makes the NVIDIA Vulkan driver usable by the
# portable tessera. The machine has the driver but no Vulkan loader: the loader and the GL/EGL
# libraries the driver loads come as Debian packages in dist/debs/, unpacked into /; when the
# loader still finds no driver, VK_DRIVER_FILES points at the NVIDIA ICD file.
# vulkan_env DIST_DIR TESSERA LOG: exports what is needed; prints what it did.
vulkan_env() {
  local here="$1" t="$2" log="$3"
  for deb in "$here"/debs/*.deb; do
    [ -e "$deb" ] && dpkg -x "$deb" / 2>>"$log"
  done
  ldconfig 2>>"$log" || true
  if ! "$t" devices >/dev/null 2>>"$log"; then
    for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json \
      /etc/vulkan/icd.d/nvidia_icd.json; do
      if [ -e "$icd" ]; then
        export VK_DRIVER_FILES="$icd"
        local egl="${icd%/vulkan/icd.d/*}/glvnd/egl_vendor.d/10_nvidia.json"
        [ -e "$egl" ] && export __EGL_VENDOR_LIBRARY_FILENAMES="$egl"
        echo "== no Vulkan driver found by default: VK_DRIVER_FILES=$icd"
        break
      fi
    done
  fi
}
