#!/usr/bin/env bash
# Builds the safetensors reader fuzzer with clang (libFuzzer + ASan + UBSan) and runs it for a bounded
# time on the seed corpus. Usage: run_fuzz.sh SOURCE_DIR WORK_DIR SECONDS
# Prints "fuzz executions: N" at the end; exits 77 (skipped) when clang++ or libFuzzer is missing.
set -euo pipefail
src="$1"; work="$2"; seconds="${3:-60}"
cxx=""
for c in clang++ clang++-14 clang++-15 clang++-16; do
  if command -v "$c" >/dev/null 2>&1; then cxx="$c"; break; fi
done
if [ -z "$cxx" ]; then
  echo "SKIPPED: clang++ not found (install clang and libclang-rt-14-dev; scripts/deps.sh does)"; exit 77
fi
mkdir -p "$work/corpus"
bin="$work/fuzz_safetensors_reader"
if ! "$cxx" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I"$src" -I"$src/include" "$src/tests/fuzz/fuzz_safetensors_reader.cpp" "$src/src/io/safetensors_format.cpp" \
    -o "$bin" 2> "$work/build.log"; then
  cat "$work/build.log"
  if grep -q "libclang_rt.fuzzer\|cannot find -l\|fuzzer" "$work/build.log"; then
    echo "SKIPPED: $cxx cannot link libFuzzer (install libclang-rt-14-dev)"; exit 77
  fi
  exit 1
fi
cp -n "$src"/tests/fuzz/corpus/* "$work/corpus/" 2>/dev/null || true
"$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 -print_final_stats=1 \
  -dict="$src/tests/fuzz/safetensors.dict" -artifact_prefix="$work/" "$work/corpus" 2>&1 | tee "$work/fuzz.log" | tail -25
status=${PIPESTATUS[0]}
runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/fuzz.log" | grep -o '[0-9]*$' || echo 0)
echo "fuzz executions: $runs in ${seconds} s (corpus $(ls "$work/corpus" | wc -l) inputs)"
exit "$status"
