#!/usr/bin/env bash
# The long fuzz run (done once, not in CI): every target of the fuzz build to RUNS executions (default
# 10 million) at the lowest priority, one after another, each with its own growing corpus under
# WORK/<target>/. Prints each target's figures as run_fuzz.sh does.
# Usage: tests/fuzz/long_run.sh BUILD_FUZZ_DIR WORK_DIR [RUNS] [TARGET...]
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"; src="$(cd "$here/../.." && pwd)"
build="$1"; work="$2"; runs="${3:-10000000}"; shift 3 || shift $#
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(safetensors_reader safetensors_load checkpoint preferences idx text csv)
status=0
for t in "${targets[@]}"; do
  start=$(date +%s)
  nice -n 19 bash "$here/run_fuzz.sh" "$src" "$build/bin/fuzz_$t" "$t" "$work/$t" 0 "$runs" || status=1
  echo "fuzz $t: $(( $(date +%s) - start )) s wall"
done
exit $status
