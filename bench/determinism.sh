#!/usr/bin/env bash
# Determinism across processes: runs `flux_bench CASE --checksum` twice per case and thread count, each
# time in a fresh process, and prints a markdown table of the checksums (FNV-1a over the bits of the
# outputs, or of the training losses and parameters: flux_bench.cpp's --checksum) and whether the two
# runs agree. Exit status 1 when any pair differs.
# Usage: bench/determinism.sh [BUILD_DIR] [--threads 1,2] [--cases resnet,mnist,infer]
# BUILD_DIR (default build) holds bin/flux_bench (-DFLUX_BENCH=ON). The environment is run_bench.py's
# for flux: FLUX_NUM_THREADS = OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = threads, OPENBLAS_CORETYPE unset;
# FLUX_BENCH_MAX_ISA, if set, passes through.
set -uo pipefail
cd "$(dirname "$0")/.."
build=build threads=1,2 cases=resnet,mnist,infer
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads=$2; shift 2 ;;
    --cases) cases=$2; shift 2 ;;
    -*) echo "determinism.sh: unknown option $1" >&2; exit 2 ;;
    *) build=$1; shift ;;
  esac
done
bench=$build/bin/flux_bench
[ -x "$bench" ] || { echo "determinism.sh: $bench not built (cmake -DFLUX_BENCH=ON, target flux_bench)" >&2; exit 2; }

checksums() {  # CASE THREADS -> "key value" lines
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE FLUX_NUM_THREADS="$2" OPENBLAS_NUM_THREADS="$2" OMP_NUM_THREADS="$2" \
    "$bench" "$1" --checksum | grep '_checksum ' | sort
}

echo "flux_bench determinism, $(date -u '+%Y-%m-%d %H:%M') UTC, commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)," \
  "$(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')," \
  "flux ISA $("$bench" blas >/dev/null && "$bench" infer --batch=1 | sed -n 's/^flux_cpu_isa //p')${FLUX_BENCH_MAX_ISA:+ (FLUX_BENCH_MAX_ISA=$FLUX_BENCH_MAX_ISA)}"
echo
echo "| case | threads | output | run 1 | run 2 | equal |"
echo "| --- | ---: | --- | --- | --- | --- |"
status=0
for t in ${threads//,/ }; do
  for c in ${cases//,/ }; do
    a=$(checksums "$c" "$t") b=$(checksums "$c" "$t")
    [ -n "$a" ] || { echo "| $c | $t | no checksum printed | | | **failed** |"; status=1; continue; }
    while read -r key va; do
      vb=$(awk -v k="$key" '$1 == k { print $2 }' <<<"$b")
      if [ "$va" = "$vb" ]; then eq=yes; else eq="**no**"; status=1; fi
      echo "| $c | $t | ${key%_checksum} | $va | ${vb:-—} | $eq |"
    done <<<"$a"
  done
done
exit $status
