#!/usr/bin/env bash
# Installs the Debian 12 packages flux-cpp needs (only the missing ones). Sourced by scripts/test,
# scripts/demo and scripts/bench. Extra groups: FLUX_DEPS_EXTRA="bench" etc.
set -euo pipefail

FLUX_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libopenblas-dev libdnnl-dev libtomlplusplus-dev nlohmann-json3-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  ocl-icd-opencl-dev opencl-headers pocl-opencl-icd clinfo libclblast-dev
  hipcc libamdhip64-dev rocm-device-libs
  python3-torch python3-torchvision python3-numpy clang libclang-rt-14-dev dataset-fashion-mnist
)

flux_install_packages() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "[deps] installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

flux_install_packages "${FLUX_PACKAGES[@]}"
