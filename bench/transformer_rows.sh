#!/usr/bin/env bash
# Transformer rows side by side in one run (issues 44 and 45): the encoder (D256 T128 4 layers b16) and
# the GPT-style decoder (D768 12 heads T512 causal 4 layers b4), inference and training step, Float32
# and bf16 autocast, for flux (one or two builds: "after" and an optional "before") and PyTorch (eager /
# torch.autocast("cpu", bfloat16)), at each thread count. Prints markdown tables of the process CPU time
# per call / step (all threads; steadier than the wall clock on a shared machine) and of wall time.
# Usage: bench/transformer_rows.sh AFTER_LIBDIR [BEFORE_LIBDIR|-] [THREADS...]
#   The flux_bench binary is build/bin/flux_bench (FLUX_BENCH_BIN), run against each library folder
#   (LD_LIBRARY_PATH); PyTorch: $FLUX_BENCH_PYTHON (default build-bench/venv/bin/python).
set -euo pipefail
AFTER=$1
BEFORE=${2:--}
shift 2 || shift $#
THREADS=${*:-1 2}
BIN=${FLUX_BENCH_BIN:-build/bin/flux_bench}
PY=${FLUX_BENCH_PYTHON:-build-bench/venv/bin/python}
HERE=$(cd "$(dirname "$0")" && pwd)
LOG=$(mktemp)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
run() {  # run LABEL THREADS PREC:CASE CMD...: appends "LABEL THREADS PREC:CASE key value" lines
  local label=$1 t=$2 prec=$3
  shift 3
  local wait=ACTIVE
  [ "$t" -gt 1 ] && wait=PASSIVE
  FLUX_NUM_THREADS=$t OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t OMP_WAIT_POLICY=$wait "$@" 2>/dev/null |
    sed "s/^/$label $t $prec /" >>"$LOG" || true
}
for t in $THREADS; do
  for case in encoder decoder; do
    for prec in f32 bf16; do
      extra=()
      [ "$prec" = bf16 ] && extra=(--autocast=bf16)
      [ "$BEFORE" != - ] && run before "$t" "$prec:$case" env LD_LIBRARY_PATH="$BEFORE" "$BIN" "$case" cpu "${extra[@]}"
      run after "$t" "$prec:$case" env LD_LIBRARY_PATH="$AFTER" "$BIN" "$case" cpu "${extra[@]}"
      run torch "$t" "$prec:$case" "$PY" "$HERE/torch_bench.py" "$case" "$t" "${extra[@]}"
    done
  done
done
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
TORCH=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
python3 - "$LOG" "$CPU" "$TORCH" "$THREADS" "$LOAD_BEFORE" "$LOAD_AFTER" "$(nproc)" <<'PY'
import sys
log, cpu, torch, threads, load0, load1, cores = sys.argv[1:8]
v = {}
for line in open(log):
    p = line.split()
    if len(p) == 5:
        try: v[(p[0], p[1], p[2], p[3])] = float(p[4])
        except ValueError: pass
have_before = any(k[0] == "before" for k in v)
print(f"CPU: {cpu}, {cores} cores; PyTorch {torch}; load average before {load0}, after {load1}")
fmt = lambda x: f"{x:.4g}" if x else "—"
ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "—"
for title, keys in [("process CPU time, ms (all threads)", {"infer": "{c}_infer_cpu_ms", "train": "train_cpu_ms_per_step"}),
                    ("wall time, ms", {"infer": "{c}_infer_ms", "train": "{c}_train_ms"})]:
    print()
    print(f"{title}; ratio = PyTorch / flux (above 1: flux faster)")
    print()
    head = "| row | threads | " + ("flux before | " if have_before else "") + "flux after | PyTorch 2.x | " + \
        ("before vs PyTorch | " if have_before else "") + "after vs PyTorch |"
    print(head)
    print("|" + " --- |" + " --: |" * (head.count("|") - 2))
    for c, cname in [("encoder", "encoder D256 T128 4L b16"), ("decoder", "decoder D768 T512 causal 4L b4")]:
        for prec in ("f32", "bf16"):
            for kind in ("infer", "train"):
                for t in threads.split():
                    key = keys[kind].format(c=c)
                    get = lambda l: v.get((l, t, prec + ":" + c, key))
                    b, a, p = get("before"), get("after"), get("torch")
                    row = f"| {cname} {prec} {'inference' if kind == 'infer' else 'training step'} | {t} | "
                    if have_before: row += f"{fmt(b)} | "
                    row += f"{fmt(a)} | {fmt(p)} | "
                    if have_before: row += f"{ratio(p, b)} | "
                    row += f"{ratio(p, a)} |"
                    print(row)
PY
rm -f "$LOG"
