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
# `nice -n 19` alone is not the lowest priority on a kernel with autogroup scheduling (Debian's default,
# /proc/sys/kernel/sched_autogroup_enabled = 1): CPU is shared fairly between sessions first, so a
# fuzzer started in its own session took as much CPU as a whole build (seen on 2026-12-04: builds
# ran at a seventh of their speed beside five fuzzers). Each target therefore runs in a session of
# its own (setsid) whose autogroup is set to nice 19 as well.
lowest() {
  setsid bash -c 'echo 19 > /proc/self/autogroup 2>/dev/null; exec nice -n 19 "$@"' lowest "$@" &
  wait $!
}
for t in "${targets[@]}"; do
  start=$(date +%s)
  lowest bash "$here/run_fuzz.sh" "$src" "$build/bin/fuzz_$t" "$t" "$work/$t" 0 "$runs" || status=1
  echo "fuzz $t: $(( $(date +%s) - start )) s wall"
done
exit $status
