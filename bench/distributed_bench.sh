#!/usr/bin/env bash
# Data-parallel scaling benchmark (issue 13): builds DIR/bin/distributed_bench if needed and runs
# bench/distributed_bench.py (1 rank vs `mpirun -np 2`, overlapped and not, alternating; prints the
# scaling efficiency and the hidden fraction of the allreduce against their targets).
#   bench/distributed_bench.sh [--build DIR] [distributed_bench.py options: --reps N --model wide --batch N ...]
#   bench/distributed_bench.sh --stages    sharded training (distributed::shard stages 1, 2, 3) vs data-parallel at np 2,
#                                          memory also at np 4 (--mem-np N; --old-build DIR adds another build's rows)
# DIR defaults to build-bench, scripts/bench's tree (-DFLUX_BENCH=ON); it is configured as
# scripts/bench does when absent. Installs Open MPI (libopenmpi-dev openmpi-bin) when mpirun is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-bench
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done

if ! command -v mpirun >/dev/null || ! dpkg -s libopenmpi-dev >/dev/null 2>&1; then
  echo "distributed_bench.sh: installing Open MPI (scripts/deps.sh mpi)"
  bash scripts/deps.sh mpi
fi
if [ ! -f "$build/build.ninja" ] && [ ! -f "$build/Makefile" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLUX_BENCH=ON -DFLUX_CUDA=OFF -DFLUX_AMDGPU=OFF
elif ! grep -q "^FLUX_BENCH:BOOL=ON" "$build/CMakeCache.txt"; then
  echo "distributed_bench.sh: $build is configured without -DFLUX_BENCH=ON; pass --build DIR of a tree that has it" >&2
  exit 1
fi
cmake --build "$build" -j2 --target distributed_bench
exec /usr/bin/python3 bench/distributed_bench.py --build "$build" ${args[@]+"${args[@]}"}
