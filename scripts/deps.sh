#!/usr/bin/env bash
# Installs the Debian 12 packages flux-cpp needs, by purpose, and only those not yet installed.
#
#   scripts/deps.sh GROUP...            install the groups' missing packages (apt-get, as root or via sudo)
#   scripts/deps.sh --list [GROUP...]   print the packages of each group (all groups without arguments)
#   source scripts/deps.sh GROUP...     the same from another script (scripts/test, bench), which then
#                                       has flux_install_groups / flux_install_packages / flux_group
#   source scripts/deps.sh --functions  only those functions (scripts/demo picks its groups later)
#
# Groups (a package appears in the first group that needs it):
#   core     compiler, CMake, Ninja, pkg-config, OpenBLAS, oneDNN, toml++, nlohmann-json, zlib: libflux,
#            flux-info and the examples on the CPU (what ./scripts/demo installs on a machine without a GPU)
#   opencl   OpenCL headers, ICD loader and CLBlast: builds libflux-opencl.so (the GPU's own OpenCL
#            driver comes from its vendor, or mesa-opencl-icd)
#   pocl     PoCL, an OpenCL driver that runs on the CPU (the OpenCL tests' device; never auto-selected)
#   hip      hipcc, the HIP runtime and device libraries (ROCm 5.2): builds libflux-amdgpu.so
#   cuda     nothing from Debian: libflux-cuda.so needs NVIDIA's CUDA toolkit (nvcc >= 12) and driver
#   test     GoogleTest, clang + libFuzzer (the safetensors fuzz test), Fashion-MNIST, git
#   onnx     ONNX 1.12 + protobuf 3.21 (libflux's onnx::save/load), python3-onnx (the tests' checker), python3-venv (the tests' ONNX Runtime venv)
#   interop  PyTorch and torchvision for the interop tests (python3-torch, python3-torchvision)
#   bench    LibTorch (the benchmarks' peer) and Google Benchmark
#   mpi      Open MPI for multi-process (data-parallel) training and its tests
#   plot     gnuplot, which draws the demo's loss/accuracy plot (without it: a CSV and the command)
#   all      every group above; what a machine needs for everything including the benchmarks
#   tests    what ./scripts/test needs: every group but bench (CI runs it on a clean Debian 12)
# FLUX_DEPS_EXTRA="bench mpi" adds groups to whatever a script asks for.
set -euo pipefail

FLUX_GROUP_core=(build-essential cmake ninja-build pkg-config
  libopenblas-dev libdnnl-dev libtomlplusplus-dev nlohmann-json3-dev zlib1g-dev)
FLUX_GROUP_opencl=(ocl-icd-opencl-dev opencl-headers libclblast-dev clinfo)
FLUX_GROUP_pocl=(pocl-opencl-icd)
FLUX_GROUP_hip=(hipcc libamdhip64-dev rocm-device-libs)
FLUX_GROUP_cuda=()
FLUX_GROUP_test=(libgtest-dev libgmock-dev clang libclang-rt-14-dev dataset-fashion-mnist git)
FLUX_GROUP_onnx=(libonnx-dev libprotobuf-dev python3-onnx python3-venv)
FLUX_GROUP_interop=(python3-torch python3-torchvision python3-numpy)
FLUX_GROUP_bench=(libtorch-dev libbenchmark-dev)
FLUX_GROUP_mpi=(libopenmpi-dev openmpi-bin)
FLUX_GROUP_plot=(gnuplot-nox)
FLUX_GROUPS=(core opencl pocl hip cuda test onnx interop bench mpi plot)
FLUX_GROUP_ALIASES_tests=(core opencl pocl hip cuda test onnx interop mpi plot)
FLUX_GROUP_ALIASES_all=("${FLUX_GROUPS[@]}")

# flux_group NAME: prints the packages of one group (or alias) on one line; fails for an unknown name.
flux_group() {
  local name=$1 g
  case "$name" in
    all | tests)
      local -n members="FLUX_GROUP_ALIASES_$name"
      for g in "${members[@]}"; do flux_group "$g"; done | tr '\n' ' ' | sed 's/ *$//;s/  */ /g'
      echo
      ;;
    *)
      if ! declare -p "FLUX_GROUP_$name" >/dev/null 2>&1; then
        echo "[deps] unknown group '$name' (groups: ${FLUX_GROUPS[*]} all tests)" >&2
        return 2
      fi
      local -n pkgs="FLUX_GROUP_$name"
      echo "${pkgs[*]}"
      ;;
  esac
}

# flux_install_packages PKG...: installs the ones not yet installed, in one apt-get call.
flux_install_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "[deps] installing ${#missing[@]} Debian packages: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null; then
      echo "[deps] not root and no sudo: as root, run  apt-get install ${missing[*]}" >&2
      return 1
    fi
    sudo="sudo"
  fi
  local t0=$SECONDS
  if ! { $sudo apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; then
    echo "[deps] apt-get failed (offline? not Debian 12?); the packages needed: ${missing[*]}" >&2
    return 1
  fi
  echo "[deps] installed in $((SECONDS - t0)) s"
}

# flux_install_groups GROUP...: the groups' packages plus those of $FLUX_DEPS_EXTRA.
flux_install_groups() {
  local pkgs=() g line
  for g in "$@" ${FLUX_DEPS_EXTRA:-}; do
    line=$(flux_group "$g") || return 2
    [ -n "$line" ] && read -r -a more <<< "$line" && pkgs+=("${more[@]}")
    if [ "$g" = cuda ] && ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
      echo "[deps] group cuda: nothing to install from Debian; libflux-cuda.so needs NVIDIA's CUDA toolkit (nvcc), not found"
    fi
  done
  if [ ${#pkgs[@]} -gt 0 ]; then flux_install_packages "${pkgs[@]}" || return 1; fi
  return 0
}

if [ "${1:-}" = "--list" ]; then
  shift
  flux_list=("$@")
  [ ${#flux_list[@]} -eq 0 ] && flux_list=("${FLUX_GROUPS[@]}")
  for g in "${flux_list[@]}"; do
    line=$(flux_group "$g")
    printf '%-8s %s\n' "$g" "${line:-(nothing from Debian: nvcc comes with the NVIDIA CUDA toolkit)}"
  done
  [ "${BASH_SOURCE[0]}" = "$0" ] && exit 0 || return 0
fi
if [ $# -eq 0 ] && [ "${BASH_SOURCE[0]}" = "$0" ]; then
  echo "usage: scripts/deps.sh GROUP... | --list [GROUP...]   (groups: ${FLUX_GROUPS[*]} all tests)" >&2
  exit 2
fi
# --functions: only the functions above (a sourcing script without arguments would pass its own).
[ "${1:-}" = "--functions" ] && shift
[ $# -gt 0 ] && flux_install_groups "$@"
true
