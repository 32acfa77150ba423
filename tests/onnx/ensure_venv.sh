#!/usr/bin/env bash
# Makes (once) the ONNX tests' Python venv under the build folder, with onnxruntime, numpy and onnx from
# PyPI, and prints its python. Never touches the system Python. Exits 77 (ctest: skipped) when PyPI
# cannot be reached, with the reason; with CI or FLUX_REQUIRE_ONNX_RUNTIME set that is a failure (1).
#   ensure_venv.sh VENV_DIR
set -euo pipefail
venv=$1
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import onnxruntime, numpy, onnx" 2>/dev/null; then
  echo "$venv/bin/python"
  exit 0
fi
skip() {
  echo "SKIPPED: $*" >&2
  if [ -n "${CI:-}${FLUX_REQUIRE_ONNX_RUNTIME:-}" ]; then exit 1; fi
  exit 77
}
base=/usr/bin/python3
[ -x "$base" ] || base=$(command -v python3 || true)
[ -n "$base" ] || skip "no python3 to make the ONNX Runtime venv"
mkdir -p "$(dirname "$venv")"
# One maker at a time (ctest -j runs the ONNX tests in parallel).
exec 9>"$venv.lock"
flock 9
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import onnxruntime, numpy, onnx" 2>/dev/null; then
  echo "$venv/bin/python"
  exit 0
fi
rm -rf "$venv"
"$base" -m venv "$venv" >&2 || skip "python3 -m venv failed (Debian: python3-venv)"
if ! "$venv/bin/pip" install --quiet --disable-pip-version-check onnxruntime numpy onnx >&2; then
  rm -rf "$venv"
  skip "pip could not install onnxruntime, numpy and onnx from PyPI (offline?)"
fi
echo "$venv/bin/python"
