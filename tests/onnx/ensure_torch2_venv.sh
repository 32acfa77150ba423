#!/usr/bin/env bash
# Makes (once) the venv of the torch 2.x interop test (onnx_import.torch2) under the build folder and
# prints its python: torch, torchvision, onnxscript (the dynamo exporter), onnxruntime, onnx, numpy from
# PyPI. PyPI's Linux torch is the CUDA build (it pulls ~3 GB of nvidia-* wheels, ~5 minutes) and runs
# on the CPU. Never touches the system Python. Exits 77 (ctest: skipped) when PyPI cannot be reached;
# with CI or FLUX_REQUIRE_ONNX_RUNTIME set that is a failure (1), as tests/onnx/ensure_venv.sh.
#   ensure_torch2_venv.sh VENV_DIR
# TORCH2_VENV=/path/to/venv reuses a venv that already holds torch 2.x (read only): VENV_DIR is then
# made on top of it (its site-packages on the path) and only what it lacks is installed there.
set -euo pipefail
venv=$1
want="import torch, torchvision, onnxscript, onnxruntime, onnx, numpy; assert int(torch.__version__.split('.')[0]) >= 2"
ready() { [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$want" 2>/dev/null; }
skip() {
  echo "SKIPPED: $*" >&2
  if [ -n "${CI:-}${FLUX_REQUIRE_ONNX_RUNTIME:-}" ]; then exit 1; fi
  exit 77
}
if ready; then
  echo "$venv/bin/python"
  exit 0
fi
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"  # one maker at a time
flock 9
if ready; then
  echo "$venv/bin/python"
  exit 0
fi
rm -rf "$venv"
pip_install() { "$venv/bin/pip" install --quiet --disable-pip-version-check "$@" >&2; }
if [ -n "${TORCH2_VENV:-}" ]; then
  [ -x "$TORCH2_VENV/bin/python" ] || skip "TORCH2_VENV=$TORCH2_VENV has no bin/python"
  "$TORCH2_VENV/bin/python" -m venv "$venv" >&2 || skip "python -m venv failed"
  # The base venv's packages come first through a .pth file; pip sees them as installed.
  "$TORCH2_VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
    >"$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/torch2_base.pth"
  missing=()
  for p in torch torchvision onnxscript onnxruntime onnx numpy pillow; do
    mod=$p
    [ "$p" = pillow ] && mod=PIL
    "$venv/bin/python" -c "import $mod" 2>/dev/null || missing+=("$p")
  done
  # Keep the base's torch: a torchvision that wants another torch would pull gigabytes.
  pin=()
  torch_version=$("$venv/bin/python" -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null || true)
  [ -n "$torch_version" ] && pin=("torch==$torch_version")
  if [ ${#missing[@]} -gt 0 ] && ! pip_install "${missing[@]}" "${pin[@]}"; then
    rm -rf "$venv"
    skip "pip could not install ${missing[*]} from PyPI on top of $TORCH2_VENV (offline?)"
  fi
else
  base=/usr/bin/python3
  [ -x "$base" ] || base=$(command -v python3 || true)
  [ -n "$base" ] || skip "no python3 to make the torch 2.x venv"
  "$base" -m venv "$venv" >&2 || skip "python3 -m venv failed (Debian: python3-venv)"
  if ! pip_install torch torchvision onnxscript onnxruntime onnx numpy pillow; then
    rm -rf "$venv"
    skip "pip could not install torch, torchvision, onnxscript, onnxruntime and onnx from PyPI (offline?)"
  fi
fi
ready || { rm -rf "$venv"; skip "the venv at $venv does not import torch 2.x, torchvision, onnxscript, onnxruntime and onnx"; }
echo "$venv/bin/python"
