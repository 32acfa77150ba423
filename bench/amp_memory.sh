#!/usr/bin/env bash
# ResNet-18 training memory, float32 against emulated bf16 autocast (issue 36): builds
# DIR/bin/flux_amp_memory if needed, runs each precision RUNS times in its own process, alternating,
# with FLUX_NUM_THREADS=1, and prints each run's figures and the bf16/f32 ratios of their medians.
# With --min-limit it also finds, per precision, the smallest FLUX_CPU_MEMORY_LIMIT (to 2 MiB) under
# which the run completes (the pool then gives its cached blocks back when it must), with glibc told
# to return freed blocks to the system (MALLOC_MMAP_THRESHOLD_), and that run's peak RSS: the memory
# the training needs, apart from what the allocators keep.
#   bench/amp_memory.sh [--build DIR] [--runs N] [--min-limit] [flux_amp_memory options: --batch N --size S --steps K]
# DIR defaults to build-bench, scripts/bench's tree (-DFLUX_BENCH=ON), configured as there when absent.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-bench
runs=3
min_limit=0
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --min-limit) min_limit=1; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ ! -f "$build/build.ninja" ] && [ ! -f "$build/Makefile" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLUX_BENCH=ON -DFLUX_CUDA=OFF -DFLUX_AMDGPU=OFF
elif ! grep -q "^FLUX_BENCH:BOOL=ON" "$build/CMakeCache.txt"; then
  echo "amp_memory.sh: $build is configured without -DFLUX_BENCH=ON; pass --build DIR of a tree that has it" >&2
  exit 1
fi
cmake --build "$build" -j2 --target flux_amp_memory
bin="$build/bin/flux_amp_memory"
export FLUX_NUM_THREADS=1

field() { awk -v k="$1" '$1 == k { print $2 }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
keys="tape_mb forward_peak_mb backward_peak_mb storage_peak_mb pool_reserved_mb peak_rss_mb"
declare -A all
echo "precision run $keys"
for ((r = 1; r <= runs; ++r)); do
  for p in f32 bf16; do
    out=$("$bin" "$p" ${args[@]+"${args[@]}"})
    line="$p $r"
    for k in $keys; do
      v=$(printf '%s\n' "$out" | field "$k")
      all[$p.$k]+="$v "
      line+=" $v"
    done
    echo "$line"
  done
done
echo
echo "medians (MiB): f32 / bf16 / bf16:f32"
for k in $keys; do
  a=$(printf '%s\n' ${all[f32.$k]} | median)
  b=$(printf '%s\n' ${all[bf16.$k]} | median)
  awk -v k="$k" -v a="$a" -v b="$b" 'BEGIN { printf "  %-18s %8.1f %8.1f   %.3f\n", k, a, b, b / a }'
done

if [ "$min_limit" = 1 ]; then
  echo
  echo "smallest FLUX_CPU_MEMORY_LIMIT that completes (MALLOC_MMAP_THRESHOLD_=65536):"
  declare -A need rss
  for p in f32 bf16; do
    peak=$(printf '%s\n' ${all[$p.storage_peak_mb]} | median)
    lo=$(awk -v v="$peak" 'BEGIN { printf "%d", v }')  # below the storage peak: fails
    hi=$((lo * 2))
    while ((hi - lo > 2)); do
      mid=$(((lo + hi) / 2))
      if out=$(MALLOC_MMAP_THRESHOLD_=65536 FLUX_CPU_MEMORY_LIMIT="${mid}M" "$bin" "$p" ${args[@]+"${args[@]}"} 2>/dev/null); then
        hi=$mid
        rss[$p]=$(printf '%s\n' "$out" | field peak_rss_mb)
      else
        lo=$mid
      fi
    done
    if [ -z "${rss[$p]:-}" ]; then
      out=$(MALLOC_MMAP_THRESHOLD_=65536 FLUX_CPU_MEMORY_LIMIT="${hi}M" "$bin" "$p" ${args[@]+"${args[@]}"})
      rss[$p]=$(printf '%s\n' "$out" | field peak_rss_mb)
    fi
    need[$p]=$hi
    echo "  $p: ${hi} MiB, peak RSS ${rss[$p]} MiB"
  done
  awk -v a="${need[f32]}" -v b="${need[bf16]}" -v ra="${rss[f32]}" -v rb="${rss[bf16]}" \
    'BEGIN { printf "  bf16:f32  limit %.3f, peak RSS %.3f\n", b / a, rb / ra }'
fi
