#!/usr/bin/env python3
"""Runs flux_bench and torch_bench as separate processes, alternating, and prints ONE markdown table.

Usage: bench/run_bench.py BUILD_DIR [--reps N] [--threads 1,2] [--cases seed,mnist,...]

Processes per case and thread count, in rotating order within each repetition:
  flux-cpp      : the environment WITHOUT OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (flux needs no variable),
                  FLUX_NUM_THREADS = OPENBLAS_NUM_THREADS = threads
  LibTorch user : the environment as given (this machine sets OPENBLAS_CORETYPE=Haswell),
                  torch::set_num_threads, OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = threads
  LibTorch best : as user, but OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE removed (OpenBLAS detects the CPU:
                  Cooperlake kernels, the same as SkylakeX or better here) and OMP_WAIT_POLICY=PASSIVE
Each figure is the best of the repetitions (highest rate, lowest time); ratios compare figures from
the same run. The OpenCL rows (flux on PoCL vs flux on CPU) appear when libflux-opencl.so was built.
"""
import argparse
import os
import subprocess
import sys

CASES = ["seed", "mnist", "wide", "overhead", "infer"]
# metric -> (label, unit, higher_is_better)
METRICS = {
    "seed_steps_per_s": ("1. seed MLP 10-64-1 training", "steps/s", True),
    "mnist_steps_per_s": ("2. MNIST MLP 784-512-512-10 training", "steps/s", True),
    "wide_steps_per_s": ("3. wide MLP 1024-4096-4096-1024 training", "steps/s", True),
    "wide_gflops": ("3. wide MLP achieved", "GFLOP/s", True),
    "add16_us": ("4. add, two 16-element tensors", "µs/op, thread CPU time", False),
    "dense16_us": ("4. Dense 16x16 forward+backward", "µs, thread CPU time", False),
    "infer1_us": ("5. MNIST MLP inference, batch 1", "µs", False),
    "infer128_us": ("5. MNIST MLP inference, batch 128", "µs", False),
    "peak_rss_mb": ("6. peak RSS of (3)", "MB", False),
}
CASE_OF = {"seed_steps_per_s": "seed", "mnist_steps_per_s": "mnist", "wide_steps_per_s": "wide",
           "wide_gflops": "wide", "add16_us": "overhead", "dense16_us": "overhead", "infer1_us": "infer",
           "infer128_us": "infer", "peak_rss_mb": "wide"}


def base_env():
    env = dict(os.environ)
    for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "FLUX_NUM_THREADS", "OMP_WAIT_POLICY"):
        env.pop(k, None)
    return env


def flux_env(threads):
    env = base_env()
    env.update(FLUX_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    return env


def torch_env(threads, best):
    env = base_env() if best else dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    if best:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def run(cmd, env, timeout=300):
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"[bench] timeout: {' '.join(cmd)}", file=sys.stderr)
        return {}
    if out.returncode != 0:
        print(f"[bench] failed ({out.returncode}): {' '.join(cmd)}\n{out.stderr[-2000:]}", file=sys.stderr)
        return {}
    res = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                res[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return res


def merge(store, key, res):
    for m, v in res.items():
        if m not in METRICS and m != "sgemm_gflops":
            continue
        higher = METRICS[m][2] if m in METRICS else True
        old = store.setdefault(key, {}).get(m)
        if old is None or (v > old if higher else v < old):
            store[key][m] = v


def fmt(v):
    if v is None:
        return "—"
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--opencl-cases", default="seed,mnist,overhead,infer")
    args = ap.parse_args()
    bindir = os.path.join(args.build, "bin")
    flux = os.path.join(bindir, "flux_bench")
    torch = os.path.join(bindir, "torch_bench")
    have_torch = os.path.exists(torch)
    have_opencl = os.path.exists(os.path.join(args.build, "lib", "libflux-opencl.so"))
    threads = [int(t) for t in args.threads.split(",")]
    cases = args.cases.split(",")
    results = {}  # (impl, threads) -> metric -> value
    for t in threads:
        for case in cases:
            for rep in range(args.reps):
                jobs = [("flux", [flux, case], flux_env(t))]
                if have_torch:
                    jobs.append(("torch_user", [torch, case, str(t)], torch_env(t, False)))
                    jobs.append(("torch_best", [torch, case, str(t)], torch_env(t, True)))
                if case == "wide":
                    # The limit, in the same alternation: OpenBLAS sgemm alone on the wide MLP's GEMM
                    # shapes, with OpenBLAS's own CPU detection and with SkylakeX forced; the better counts.
                    jobs.append(("limit", [flux, "sgemm"], flux_env(t)))
                    e = flux_env(t)
                    e["OPENBLAS_CORETYPE"] = "SkylakeX"
                    jobs.append(("limit", [flux, "sgemm"], e))
                if have_opencl and case in args.opencl_cases.split(","):
                    e = flux_env(t)
                    e.setdefault("POCL_CACHE_DIR", os.path.join(args.build, "pocl-cache"))
                    e["POCL_MAX_PTHREAD_COUNT"] = str(t)
                    jobs.append(("opencl", [flux, case, "opencl"], e))
                k = rep % len(jobs)
                for impl, cmd, env in jobs[k:] + jobs[:k]:  # rotate the order between repetitions
                    merge(results, (impl, t), run(cmd, env))

    def get(impl, t, m):
        return results.get((impl, t), {}).get(m)

    lines = []
    lines.append("| benchmark | threads | flux-cpp | LibTorch (user env) | LibTorch (best) | flux vs best | target | met |")
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |")
    for m, (label, unit, higher) in METRICS.items():
        if CASE_OF[m] not in cases:
            continue
        for t in threads:
            f, u, b = get("flux", t, m), get("torch_user", t, m), get("torch_best", t, m)
            ratio, target, met = None, "", ""
            if f is not None and b is not None and f > 0 and b > 0:
                if m == "peak_rss_mb":
                    ratio = f / b
                    target, ok = "≤ 0.7×", ratio <= 0.7
                else:
                    ratio = f / b if higher else b / f  # how many times faster flux is
                    ok = None
                    if m == "seed_steps_per_s":
                        target, ok = "≥ 3×", ratio >= 3
                    elif m == "mnist_steps_per_s":
                        target, ok = "≥ 1.3×", ratio >= 1.3
                met = "" if target == "" else ("yes" if ok else "**no**")
            if m == "add16_us" and f is not None:
                target, met = "≤ 0.3 µs", "yes" if f <= 0.3 else "**no**"
            if m == "dense16_us" and f is not None:
                target, met = "≤ 5 µs", "yes" if f <= 5 else "**no**"
            rs = "—" if ratio is None else (f"{ratio:.2f}× RSS" if m == "peak_rss_mb" else f"{ratio:.2f}×")
            lines.append(f"| {label} ({unit}) | {t} | {fmt(f)} | {fmt(u)} | {fmt(b)} | {rs} | {target} | {met} |")
        if m == "wide_gflops" and "wide" in cases:
            for t in threads:
                lim = get("limit", t, "sgemm_gflops")
                f, u, b = get("flux", t, m), get("torch_user", t, m), get("torch_best", t, m)
                pct = lambda v: "—" if v is None or not lim else f"{100 * v / lim:.0f}%"
                ok = f is not None and lim and f / lim >= 0.9
                lines.append(f"| 3. wide MLP, % of sgemm limit ({fmt(lim)} GFLOP/s) | {t} | {pct(f)} | {pct(u)} | "
                             f"{pct(b)} | — | ≥ 90% | {'yes' if ok else '**no**'} |")
    if have_opencl:
        for m, (label, unit, higher) in METRICS.items():
            if CASE_OF[m] not in args.opencl_cases.split(","):
                continue
            for t in threads:
                o, c = get("opencl", t, m), get("flux", t, m)
                rs = "—" if not o or not c else f"{(o / c if higher else c / o):.2f}× of CPU"
                lines.append(f"| 7. OpenCL (PoCL): {label} ({unit}) | {t} | {fmt(o)} | — | — | {rs} | info | |")
    else:
        lines.append("| 7. OpenCL backend on PoCL | — | skipped: libflux-opencl.so not built | | | | info | |")
    if not have_torch:
        lines.append("| LibTorch | — | torch_bench not built (install libtorch-dev) | | | | | |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
