#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU, builds everything (CUDA plugin ON, cuDNN when the
# toolkit has it), runs the whole ctest suite (the device-parameterised suites then include CUDA:0..
# against the float64 CPU reference, and FLUX_EXPECT_GPU=CUDA makes "not functional" a failure),
# prints the conv / pool / norm / dropout / gradient-parity rows on CUDA_0, reruns those suites on CUDA:0 with
# FLUX_LIBRARY_KERNELS=0 (the im2col path instead of cuDNN), trains the CNN examples on CUDA:0 and
# prints their test accuracies, runs NCCL on a one-rank communicator (and the MPI tests under
# mpirun -np 2 where Open MPI is installed: NCCL itself needs a GPU per rank, so its suites skip on
# one GPU with a line saying so), runs GPU benchmarks when flux_bench has a CUDA mode, and prints a
# short table. Meant to finish well inside 10 minutes on a 16-core H200 machine.
#
#   scripts/gpu-check.sh --fetch-deps [--with-fashion-mnist]
#                                       (here, with network) download the Debian 12 .debs it needs into
#                                       .gpu-deps/ (git-ignored via .git/info/exclude); with the flag
#                                       also dataset-fashion-mnist (31 MB) into .gpu-deps/data/
#   scripts/gpu-check.sh                (there) unpack .gpu-deps/*.deb into a private prefix if the
#                                       system lacks them, build in build-gpu/, test, print the table
#
# What the GPU machine must have: nvcc (CUDA 13) and a driver, cmake >= 3.25, ninja, a C++20 g++.
# What it usually lacks and has no network to install: OpenBLAS, toml++, nlohmann-json, GoogleTest,
# pkg-config. Those come from .gpu-deps/: carry that folder with the working tree (device tool:
# carry [".gpu-deps"]; it is ~25 MiB). The .debs are Debian 12's (glibc 2.36); on an older glibc the
# unpacked libraries may not load, and the script says so.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEPS_DIR=$ROOT/.gpu-deps
BUILD=${FLUX_GPU_BUILD:-$ROOT/build-gpu}
PREFIX=${FLUX_GPU_DEPS_PREFIX:-/tmp/flux-gpu-deps}
DEBS=(libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0 libgfortran5 libquadmath0
      libtomlplusplus-dev libtomlplusplus3 nlohmann-json3-dev libgtest-dev libgmock-dev
      libbenchmark-dev libbenchmark1debian zlib1g-dev pkgconf pkgconf-bin libpkgconf3)

if [ "${1:-}" = "--fetch-deps" ]; then
  mkdir -p "$DEPS_DIR"
  grep -qx '/.gpu-deps/' .git/info/exclude 2>/dev/null || echo '/.gpu-deps/' >> .git/info/exclude
  (cd "$DEPS_DIR" && apt-get download "${DEBS[@]}") || { echo "[gpu-check] apt-get download failed"; exit 1; }
  if [ "${2:-}" = "--with-fashion-mnist" ]; then
    mkdir -p "$DEPS_DIR/data"
    (cd "$DEPS_DIR/data" && apt-get download dataset-fashion-mnist) || { echo "[gpu-check] apt-get download dataset-fashion-mnist failed"; exit 1; }
  fi
  du -sh "$DEPS_DIR"
  echo "[gpu-check] now run scripts/gpu-check.sh on the GPU machine, carrying .gpu-deps"
  exit 0
fi

say() { echo "[gpu-check] $*"; }
t0=$(date +%s)

# ---- 1. the GPU and the tools ----
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  say "no NVIDIA GPU/driver visible (nvidia-smi -L fails): this script is for a GPU machine"
  say "on a machine without a GPU, scripts/test checks that libflux-cuda.so loads as not functional"
  exit 2
fi
gpu_name=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
missing=()
for tool in nvcc cmake ninja c++; do command -v $tool >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
  say "missing tools: ${missing[*]} (these cannot come from .debs here; the GPU image must provide them)"
  exit 3
fi

# ---- 2. libraries: the system's, else the carried .debs unpacked into $PREFIX ----
have_system_deps() {
  command -v pkg-config >/dev/null && pkg-config --exists openblas tomlplusplus 2>/dev/null &&
    [ -e /usr/include/nlohmann/json.hpp ] && [ -e /usr/include/gtest/gtest.h ]
}
if have_system_deps; then
  say "using the system's OpenBLAS, toml++, nlohmann-json and GoogleTest"
else
  if ! ls "$DEPS_DIR"/*.deb >/dev/null 2>&1; then
    say "the system lacks OpenBLAS/toml++/nlohmann-json/GoogleTest/pkg-config and there is no .gpu-deps/"
    say "run 'scripts/gpu-check.sh --fetch-deps' on a machine with network and carry .gpu-deps here"
    exit 4
  fi
  say "unpacking $(ls "$DEPS_DIR"/*.deb | wc -l) carried .debs into $PREFIX"
  mkdir -p "$PREFIX"
  for deb in "$DEPS_DIR"/*.deb; do dpkg-deb -x "$deb" "$PREFIX" 2>/dev/null || dpkg -x "$deb" "$PREFIX"; done
  lib=$PREFIX/usr/lib/x86_64-linux-gnu
  # Debian selects OpenBLAS through update-alternatives, whose links dpkg -x does not make: use the
  # pthread variant's own .pc (its paths get the prefix through PKG_CONFIG_SYSROOT_DIR).
  mkdir -p "$lib/pkgconfig"
  cp -f "$lib/openblas-pthread/pkgconfig/openblas.pc" "$lib/pkgconfig/openblas.pc"
  export PATH=$PREFIX/usr/bin:$PATH
  command -v pkg-config >/dev/null || ln -sf pkgconf "$PREFIX/usr/bin/pkg-config"
  export PKG_CONFIG_PATH=$lib/pkgconfig:$PREFIX/usr/share/pkgconfig
  export PKG_CONFIG_SYSROOT_DIR=$PREFIX
  export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export CMAKE_PREFIX_PATH=$PREFIX/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export CPATH=$PREFIX/usr/include${CPATH:+:$CPATH}  # nlohmann-json, gtest (no .pc used for them)
  if ! "$PREFIX/usr/bin/pkgconf" --version >/dev/null 2>&1; then
    say "the carried pkgconf does not run here (glibc $(ldd --version | head -1 | awk '{print $NF}') vs Debian 12's 2.36)"
  fi
fi

# ---- 3. build ----
tb=$(date +%s)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLUX_CUDA=ON -DFLUX_AMDGPU=OFF -DFLUX_WERROR=ON \
  > "$BUILD.configure.log" 2>&1 || { cat "$BUILD.configure.log"; say "configure failed"; exit 5; }
cmake --build "$BUILD" -j"$(nproc)" > "$BUILD.build.log" 2>&1 || { tail -60 "$BUILD.build.log"; say "build failed"; exit 6; }
build_s=$(( $(date +%s) - tb ))
"$BUILD/bin/flux-info" > "$BUILD.info.log" 2>&1
cuda_line=$(grep -m1 '^CUDA:' "$BUILD.info.log")
dev_line=$(grep -m1 -A4 '^CUDA:' "$BUILD.info.log" | grep -m1 '^  0:' | sed 's/^  0: //')

dnn_line=$(grep -m1 -A6 '^CUDA:' "$BUILD.info.log" | grep -m1 'DNN:' | sed 's/^ *DNN: //')

# Fashion-MNIST: Debian's folder, else the carried .deb unpacked into $PREFIX.
FASHION=/usr/share/datasets/fashion-mnist
if [ ! -d "$FASHION" ] && ls "$DEPS_DIR"/data/dataset-fashion-mnist*.deb >/dev/null 2>&1; then
  mkdir -p "$PREFIX"
  for deb in "$DEPS_DIR"/data/dataset-fashion-mnist*.deb; do dpkg-deb -x "$deb" "$PREFIX" 2>/dev/null || dpkg -x "$deb" "$PREFIX"; done
  FASHION=$PREFIX/usr/share/datasets/fashion-mnist
fi
[ -d "$FASHION" ] || FASHION=

# ---- 4. the whole suite, CUDA included ----
# The CNN examples' CUDA_0 entries run in step 5 instead (their accuracies go into the table); the
# Fashion-MNIST entries read Debian's folder, so they are left out when the data is elsewhere or absent.
tt=$(date +%s)
export FLUX_EXPECT_GPU=CUDA
export POCL_CACHE_DIR=$BUILD/pocl-cache
exclude='^examples\.(digits_lenet|fashion_mnist_cnn)\.CUDA_0$'
[ "$FASHION" = /usr/share/datasets/fashion-mnist ] || exclude='^examples\.(digits_lenet\.CUDA_0|fashion_mnist_cnn\.(CPU|OpenCL_0|CUDA_0))$'
(cd "$BUILD" && ctest --output-on-failure -j"$(nproc)" --timeout 300 -E "$exclude") > "$BUILD.ctest.log" 2>&1
ctest_rc=$?
test_s=$(( $(date +%s) - tt ))
summary=$(grep -E 'tests passed|tests failed' "$BUILD.ctest.log" | tail -1)
cuda_total=$(grep -cE 'Test +#[0-9]+: .*CUDA_[0-9]' "$BUILD.ctest.log")
cuda_failed=$(grep -E 'Test +#[0-9]+: .*CUDA_[0-9]' "$BUILD.ctest.log" | grep -vc 'Passed')

# Rows per test family on CUDA_0: "passed/run" and the first failures' names.
family_row() {  # label, regex of suite names
  local lines run passed failed
  lines=$(grep -E "Test +#[0-9]+: ([^ /]+/)?($2)\.[^ ]*/CUDA_0 " "$BUILD.ctest.log")
  run=$(printf '%s' "$lines" | grep -c 'Test')
  passed=$(printf '%s' "$lines" | grep -c ' Passed')
  failed=$(printf '%s\n' "$lines" | grep -v ' Passed' | grep -oE '#[0-9]+: [^ ]+' | sed 's/^#[0-9]*: //' | head -3 | tr '\n' ' ')
  family_rows+=("$1 (CUDA_0)|$passed/$run passed${failed:+; not passed: $failed}")
}
family_rows=()
family_row "conv" 'ConvDevice|ConvKernels|ConvLayers'
family_row "pool" 'Pooling|PoolKernels'
family_row "norm" 'Norm'
family_row "dropout/random" 'Random|RandomKernels'
family_row "layers" 'Layers'
family_row "gradient parity" 'GradientParity'
family_row "f16/bf16 kernels" 'LowPrecisionKernels'

# f16/bf16 on CUDA:0 (issue 36): cuBLAS GemmEx and cuDNN in Float16/BFloat16 against float64, required
# on a GPU with the tensor cores; FLUX_DEBUG_BACKENDS shows which cuDNN algorithms (tensor-op or not).
tl=$(date +%s)
FLUX_DEBUG_BACKENDS=1 timeout 120 "$BUILD/bin/flux_tests" --gtest_color=no --gtest_filter='CudaLowPrecision.*' \
  > "$BUILD.lowprec.log" 2>&1
lowprec_rc=$?
lowprec_plans=$(grep -cE 'cuDNN .* (Float16|BFloat16): algorithm' "$BUILD.lowprec.log")
lowprec_tensor=$(grep -cE 'cuDNN .* (Float16|BFloat16): algorithm .*tensor-op' "$BUILD.lowprec.log")
lowprec_row="$(grep -m1 -E '^\[  PASSED  \]' "$BUILD.lowprec.log" | sed 's/\[  PASSED  \] //')$(grep -m1 -E '^\[  FAILED  \] [0-9]+ test' "$BUILD.lowprec.log" | sed 's/\[  FAILED  \] / failed: /'); cuDNN f16/bf16 plans: $lowprec_plans ($lowprec_tensor tensor-op) (rc $lowprec_rc, $(( $(date +%s) - tl )) s)"

# The same suites on CUDA:0 through the portable im2col + GEMM path (no cuDNN): one gtest run.
tp=$(date +%s)
FLUX_LIBRARY_KERNELS=0 FLUX_TEST_DEVICES=CUDA:0 timeout 240 "$BUILD/bin/flux_tests" \
  --gtest_filter='*/ConvDevice.*:*/ConvKernels.*:*/ConvLayers.*:*/Pooling.*:*/PoolKernels.*:*/Norm.*:*/GradientParity.*' \
  > "$BUILD.portable.log" 2>&1
portable_rc=$?
portable_row="$(grep -E '^\[  PASSED  \]' "$BUILD.portable.log" | sed 's/\[  PASSED  \] //') $(grep -E '^\[  FAILED  \] [0-9]+ test' "$BUILD.portable.log" | sed 's/\[  FAILED  \] /failed: /') (rc $portable_rc, $(( $(date +%s) - tp )) s)"

# ---- 4b. data-parallel training (issue 13): NCCL on one rank; MPI ranks where Open MPI is installed ----
# NCCL refuses two ranks of one communicator on one GPU, and the core never calls the device
# collectives for one rank, so with one GPU: DistributedSingle.DeviceCollectivesOnOneRank drives
# the plugin's NCCL calls (ncclCommInitRank, AllReduce, Broadcast, AllGather, the event wait) on a
# one-rank communicator; under mpirun the device suites skip CUDA naming why (one device per rank
# needed) and run on the CPU. Open MPI is not among the carried .debs: without it the MPI rows say so.
dist_rows=()
mpi_line=$(grep -m1 'flux: MPI for distributed training' "$BUILD.configure.log" | sed 's/^-- //')
nccl_line=$(grep -m1 -E 'libflux-cuda.so (with|without) NCCL' "$BUILD.configure.log" | sed 's/^-- //')
dist_rows+=("MPI / NCCL in this build|${mpi_line:-MPI: unknown}; ${nccl_line:-NCCL: unknown}")
td=$(date +%s)
timeout 120 "$BUILD/bin/flux_tests" --gtest_color=no --gtest_filter='DistributedSingle.DeviceCollectivesOnOneRank' \
  > "$BUILD.nccl.log" 2>&1
nccl_rc=$?
if grep -q '^\[  PASSED  \] 1 test' "$BUILD.nccl.log"; then nccl_state="passed"
elif grep -q '^\[  SKIPPED \]' "$BUILD.nccl.log"; then nccl_state="skipped: $(grep -m1 -o 'no functional device backend.*' "$BUILD.nccl.log")"
else nccl_state="FAILED: $(grep -m1 -E 'Failure|error|failed' "$BUILD.nccl.log" | cut -c1-160)"; fi
dist_rows+=("NCCL, 1 rank (CUDA)|$nccl_state (rc $nccl_rc, $(( $(date +%s) - td )) s)")
nccl_ok=0
case "$nccl_state" in passed) nccl_ok=1 ;; skipped*) case "$nccl_line" in *without*) nccl_ok=1 ;; esac ;; esac
if [ -x "$BUILD/bin/flux_mpi_tests" ] && command -v mpirun >/dev/null; then
  tm=$(date +%s)
  OPENBLAS_NUM_THREADS=1 FLUX_NUM_THREADS=1 FLUX_DISTRIBUTED_TIMEOUT=60 FLUX_TEST_DEVICES=CPU,CUDA:0 \
    timeout 300 mpirun --allow-run-as-root -x OPENBLAS_NUM_THREADS -x FLUX_NUM_THREADS -x FLUX_DISTRIBUTED_TIMEOUT \
    -x FLUX_TEST_DEVICES ${LD_LIBRARY_PATH:+-x LD_LIBRARY_PATH} -np 2 "$BUILD/bin/flux_mpi_tests" --gtest_color=no \
    > "$BUILD.mpi.log" 2>&1
  mpi_rc=$?
  mpi_sum="$(grep -m1 -E '^\[  PASSED  \]' "$BUILD.mpi.log" | sed 's/\[  PASSED  \] //') $(grep -m1 -E '^\[  FAILED  \] [0-9]+ test' "$BUILD.mpi.log" | sed 's/\[  FAILED  \] /failed: /')"
  mpi_skip=$(grep -m1 -o 'CUDA has device collectives (NCCL), which need one device per rank[^"]*' "$BUILD.mpi.log")
  dist_rows+=("mpirun -np 2, CPU + CUDA:0|$mpi_sum(rc $mpi_rc, $(( $(date +%s) - tm )) s)${mpi_skip:+; CUDA suites skipped: $mpi_skip}")
else
  mpi_rc=0
  dist_rows+=("mpirun -np 2|skipped: no Open MPI on this machine (mpirun / libopenmpi-dev absent), flux_mpi_tests not built")
fi

# ---- 5. the CNN examples on CUDA:0, accuracies ----
example_rows=()
run_example() {  # label, log name, command...
  local label=$1 log=$BUILD.$2.log; shift 2
  local te rc acc
  te=$(date +%s)
  timeout 200 "$@" > "$log" 2>&1
  rc=$?
  acc=$(grep -m1 -E '^test accuracy [0-9.]+ ' "$log")
  example_rows+=("$label|${acc:-no accuracy line} (rc $rc, $(( $(date +%s) - te )) s)")
}
run_example "digits_lenet CUDA:0" lenet "$BUILD/bin/digits_lenet" --device CUDA:0 --epochs 15 --min-accuracy 0.98 \
  "$ROOT/data/digits.csv.gz"
if [ -n "$FASHION" ]; then
  run_example "fashion_mnist_cnn CI CUDA:0" fashion-ci "$BUILD/bin/fashion_mnist_cnn" --device CUDA:0 --epochs 1 \
    --train-limit 6000 --test-limit 2000 --min-accuracy 0.70 --save "$BUILD/fashion_ci.safetensors" "$FASHION"
  # The full run (60,000 images, 5 epochs, bar 0.90) while the check is still well inside its time.
  if [ $(( $(date +%s) - t0 )) -lt 330 ]; then
    run_example "fashion_mnist_cnn full CUDA:0" fashion-full "$BUILD/bin/fashion_mnist_cnn" --device CUDA:0 \
      --epochs 5 --min-accuracy 0.90 --save "$BUILD/fashion_full.safetensors" "$FASHION"
  else
    example_rows+=("fashion_mnist_cnn full CUDA:0|skipped: $(( $(date +%s) - t0 )) s already spent")
  fi
else
  example_rows+=("fashion_mnist_cnn CUDA:0|skipped: no Fashion-MNIST (carry .gpu-deps/data from --fetch-deps --with-fashion-mnist)")
fi

# ---- 6. GPU benchmarks, where flux_bench has a CUDA mode ----
bench_rows=()
if grep -q '"cuda"' bench/flux_bench.cpp 2>/dev/null; then
  cmake -S . -B "$BUILD" -DFLUX_BENCH=ON >/dev/null 2>&1 && cmake --build "$BUILD" -j"$(nproc)" --target flux_bench >/dev/null 2>&1
  for c in seed mnist wide infer; do
    out=$("$BUILD/bin/flux_bench" $c cuda 2>&1 | tr '\n' ' ')
    bench_rows+=("bench $c (CUDA)|$out")
  done
else
  bench_rows+=("benchmarks|skipped: bench/flux_bench.cpp has no CUDA device mode yet")
fi

# ---- 7. the table ----
echo
echo "flux-cpp GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null)"
printf '%-28s %s\n' "GPU" "$gpu_name"
printf '%-28s %s\n' "CUDA plugin" "${cuda_line:-missing}"
printf '%-28s %s\n' "CUDA:0" "${dev_line:-none}"
printf '%-28s %s\n' "DNN" "${dnn_line:-unknown}"
printf '%-28s %s s\n' "build (all, -j$(nproc))" "$build_s"
printf '%-28s %s (%s s, rc %s)\n' "ctest (whole suite)" "${summary:-no summary}" "$test_s" "$ctest_rc"
printf '%-28s %s run, %s not passed\n' "ctest entries on CUDA_*" "$cuda_total" "$cuda_failed"
for row in "${family_rows[@]}"; do printf '%-28s %s\n' "${row%%|*}" "${row#*|}"; done
printf '%-28s %s\n' "conv/pool/norm, im2col path" "$portable_row"
printf '%-28s %s\n' "f16/bf16 GEMM+conv CUDA:0" "$lowprec_row"
for row in "${dist_rows[@]}"; do printf '%-28s %s\n' "${row%%|*}" "${row#*|}"; done
for row in "${example_rows[@]}"; do printf '%-28s %s\n' "${row%%|*}" "${row#*|}"; done
for row in "${bench_rows[@]}"; do printf '%-28s %s\n' "${row%%|*}" "${row#*|}"; done
printf '%-28s %s s\n' "total" "$(( $(date +%s) - t0 ))"
echo "logs: $BUILD.{configure,build,info,ctest,portable,lowprec,nccl,mpi,lenet,fashion-ci,fashion-full}.log"
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then cp "$BUILD".*.log "$OUT"/ 2>/dev/null; fi
examples_ok=1
for row in "${example_rows[@]}"; do case "$row" in *"(rc 0,"*|*skipped*) ;; *) examples_ok=0 ;; esac; done
[ "$ctest_rc" -eq 0 ] && [ "$cuda_total" -gt 0 ] && [ "$portable_rc" -eq 0 ] && [ "$lowprec_rc" -eq 0 ] && [ "$examples_ok" -eq 1 ] &&
  [ "$nccl_ok" -eq 1 ] && [ "$mpi_rc" -eq 0 ]
