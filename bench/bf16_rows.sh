#!/usr/bin/env bash
# bf16 rows side by side in one run: ResNet-18 (112², b32) training step and inference, the encoder's
# training step and inference, for flux Float32, flux bf16 autocast and PyTorch's bf16 autocast, at each
# thread count; prints a markdown table of milliseconds and ratios, the CPU in its header.
# Usage: bench/bf16_rows.sh [BUILD_DIR] [THREADS...]   (defaults: build, 1 2); a second table gives the
# training steps' process CPU time, which a loaded machine distorts less than the wall clock.
# PyTorch: $FLUX_BENCH_PYTHON (e.g. scripts/bench's venv), else Debian's /usr/bin/python3 (python3-torch).
set -euo pipefail
B=${1:-build}
shift || true
THREADS=${*:-1 2}
PY=${FLUX_BENCH_PYTHON:-/usr/bin/python3}
HERE=$(cd "$(dirname "$0")" && pwd)
LOG=$(mktemp)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
run() {  # run LABEL THREADS CASE CMD...: appends "LABEL THREADS key value" lines
  local label=$1 t=$2 case=$3
  shift 3
  # PASSIVE waits at 2+ threads (as scripts/bench): spinning OpenMP threads on shared cores measure the sharing.
  local wait=ACTIVE
  [ "$t" -gt 1 ] && wait=PASSIVE
  FLUX_NUM_THREADS=$t OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t OMP_WAIT_POLICY=$wait "$@" 2>/dev/null |
    sed "s/^train_cpu_ms_per_step/${case}_cpu_ms/; s/^/$label $t /" >>"$LOG" || true
}
for t in $THREADS; do
  for case in resnet_train resnet encoder; do
    extra=()
    [ "$case" = resnet ] && extra=(--batch=32)
    run flux_f32 "$t" "$case" "$B/bin/flux_bench" "$case" cpu "${extra[@]}"
    run flux_bf16 "$t" "$case" "$B/bin/flux_bench" "$case" cpu --autocast=bf16 "${extra[@]}"
    run torch_bf16 "$t" "$case" "$PY" "$HERE/torch_bench.py" "$case" "$t" --autocast=bf16
  done
done
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
FLAGS=$(grep -o -m1 -w 'avx512_bf16\|amx_bf16\|avx512_fp16' /proc/cpuinfo | sort -u | tr '\n' ' ' || true)
TORCH=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
python3 - "$LOG" "$CPU" "$FLAGS" "$TORCH" "$THREADS" "$LOAD_BEFORE" "$LOAD_AFTER" "$(nproc)" <<'PY'
import sys
log, cpu, flags, torch, threads, load0, load1, cores = sys.argv[1:9]
v = {}
for line in open(log):
    p = line.split()
    if len(p) == 4:
        try: v[(p[0], p[1], p[2])] = float(p[3])
        except ValueError: pass
print(f"CPU: {cpu}, {cores} cores; bf16/f16 flags: {flags or 'none'}; PyTorch {torch}; load average before {load0}, after {load1}")
print()
print("| row (ms) | threads | flux f32 | flux bf16 | PyTorch bf16 autocast | flux bf16 / f32 speed-up | flux bf16 vs PyTorch bf16 |")
print("| --- | --: | --: | --: | --: | --: | --: |")
rows = [("ResNet-18 112² b32 training step", "resnet_train_ms"), ("ResNet-18 b32 inference", "resnet32_ms"),
        ("encoder D256 T128 4 layers b16 training step", "encoder_train_ms"), ("encoder inference", "encoder_infer_ms")]
for name, key in rows:
    for t in threads.split():
        f32, bf, pt = (v.get((l, t, key)) for l in ("flux_f32", "flux_bf16", "torch_bf16"))
        fmt = lambda x: f"{x:.4g}" if x else "—"
        r1 = f"{f32 / bf:.2f}x" if f32 and bf else "—"  # above 1: bf16 faster
        r2 = f"{pt / bf:.2f}x" if pt and bf else "—"
        print(f"| {name} | {t} | {fmt(f32)} | {fmt(bf)} | {fmt(pt)} | {r1} | {r2} |")
# The process's CPU time per training step (all threads; flux_bench's and torch_bench.py's
# train_cpu_ms_per_step): on a loaded machine the wall clock measures the sharing, this less so.
print()
print("| training step, CPU ms (all threads) | threads | flux f32 | flux bf16 | PyTorch bf16 autocast | flux bf16 / f32 | flux bf16 vs PyTorch bf16 |")
print("| --- | --: | --: | --: | --: | --: | --: |")
for name, key in [("ResNet-18 112² b32", "resnet_train_cpu_ms"), ("encoder D256 T128 4 layers b16", "encoder_cpu_ms")]:
    for t in threads.split():
        f32, bf, pt = (v.get((l, t, key)) for l in ("flux_f32", "flux_bf16", "torch_bf16"))
        fmt = lambda x: f"{x:.4g}" if x else "—"
        r1 = f"{f32 / bf:.2f}x" if f32 and bf else "—"
        r2 = f"{pt / bf:.2f}x" if pt and bf else "—"
        print(f"| {name} | {t} | {fmt(f32)} | {fmt(bf)} | {fmt(pt)} | {r1} | {r2} |")
PY
rm -f "$LOG"
