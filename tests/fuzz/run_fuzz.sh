#!/usr/bin/env bash
# Runs one libFuzzer target (built in the fuzz build, scripts/test --fuzz) on its seed corpus
# (tests/fuzz/corpus/<target>/, copied into WORK/corpus so new inputs stay out of the source tree) and
# its dictionary (tests/fuzz/<target>.dict, when present), for SECONDS or, with RUNS, for that many
# executions. Prints libFuzzer's final statistics and one summary line; a crash fails (exit != 0) and
# leaves the input as WORK/crash-*.
# Usage: run_fuzz.sh SOURCE_DIR BINARY TARGET WORK_DIR SECONDS [RUNS]
set -euo pipefail
src="$1"; bin="$2"; target="$3"; work="$4"; seconds="${5:-10}"; runs="${6:-}"
mkdir -p "$work/corpus"
cp -n "$src/tests/fuzz/corpus/$target/"* "$work/corpus/" 2>/dev/null || true
args=(-timeout=10 -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 -artifact_prefix="$work/")
[ -f "$src/tests/fuzz/$target.dict" ] && args+=(-dict="$src/tests/fuzz/$target.dict")
if [ -n "$runs" ]; then args+=(-runs="$runs"); else args+=(-max_total_time="$seconds"); fi
# Leaks in a fuzzed reader would pile up over millions of runs: LeakSanitizer stays on.
set +e
"$bin" "${args[@]}" "$work/corpus" > "$work/fuzz.log" 2>&1
status=$?
set -e
tail -20 "$work/fuzz.log"
execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/fuzz.log" | grep -o '[0-9]*$' || echo 0)
rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$work/fuzz.log" | grep -o '[0-9]*$' || echo 0)
cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$work/fuzz.log" | tail -1 || true)
echo "fuzz $target: $execs executions, $rate exec/s, $cov, corpus $(ls "$work/corpus" | wc -l) inputs, exit $status"
exit "$status"
