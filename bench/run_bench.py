#!/usr/bin/env python3
"""Runs flux_bench and torch_bench as separate processes, alternating, and prints ONE markdown table.

Usage: bench/run_bench.py BUILD_DIR [--reps N] [--threads 1,2] [--cases seed,mnist,...,lenet,fmnist,resnet]

Processes per case and thread count, in rotating order within each repetition:
  flux-cpp      : the environment WITHOUT OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (flux needs no variable),
                  FLUX_NUM_THREADS = OPENBLAS_NUM_THREADS = OMP_NUM_THREADS (oneDNN's threads) = threads
  LibTorch user : the environment as given (this machine sets OPENBLAS_CORETYPE=Haswell),
                  torch::set_num_threads, OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = threads
  LibTorch best : as user, but OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE removed (OpenBLAS detects the CPU:
                  Cooperlake kernels, the same as SkylakeX or better here) and OMP_WAIT_POLICY=PASSIVE
The convolutional cases (lenet, fmnist, resnet) add two processes:
  flux-cpp im2col: flux with FLUX_LIBRARY_KERNELS=0 (the portable im2col + GEMM conv path, no oneDNN)
  flux-cpp PASSIVE (2+ threads, diagnostic): flux with OMP_WAIT_POLICY=PASSIVE for oneDNN's OpenMP threads
  LibTorch best, OMP_WAIT_POLICY unset: the "best" column takes the better of PASSIVE and the default
                  (LibTorch's convolutions are oneDNN on OpenMP, where spinning threads can pay); when the
                  user environment already is that environment, the user run serves as this one.
Each figure is the best of the repetitions (highest rate, lowest time); ratios compare figures from
the same run. The OpenCL rows (flux on PoCL vs flux on CPU) appear when libflux-opencl.so was built.
"""
import argparse
import os
import subprocess
import sys

CASES = ["seed", "mnist", "wide", "overhead", "infer", "lenet", "fmnist", "resnet"]
CNN_CASES = ["lenet", "fmnist", "resnet"]
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
    "lenet_steps_per_s": ("8. LeNet-5 training, 28x28 batch 128", "steps/s", True),
    "fmnist_steps_per_s": ("9. Fashion-MNIST CNN training, batch 128", "steps/s", True),
    "resnet1_ms": ("10. ResNet-18 inference {hw}, batch 1", "ms", False),
    "resnet32_ms": ("10. ResNet-18 inference {hw}, batch 32", "ms", False),
}
# metric -> (target ratio against LibTorch best, text)
TARGETS = {
    "seed_steps_per_s": 3.0, "mnist_steps_per_s": 1.3,
    "lenet_steps_per_s": 1.3, "fmnist_steps_per_s": 1.3, "resnet1_ms": 1.2, "resnet32_ms": 1.2,
}
CASE_OF = {"seed_steps_per_s": "seed", "mnist_steps_per_s": "mnist", "wide_steps_per_s": "wide",
           "wide_gflops": "wide", "add16_us": "overhead", "dense16_us": "overhead", "infer1_us": "infer",
           "infer128_us": "infer", "peak_rss_mb": "wide", "lenet_steps_per_s": "lenet", "fmnist_steps_per_s": "fmnist",
           "resnet1_ms": "resnet", "resnet32_ms": "resnet"}


def base_env():
    env = dict(os.environ)
    for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "FLUX_NUM_THREADS", "OMP_WAIT_POLICY"):
        env.pop(k, None)
    return env


def flux_env(threads):
    env = base_env()
    # OMP_NUM_THREADS: oneDNN (Debian's is built on OpenMP) otherwise runs on every core whatever
    # FLUX_NUM_THREADS says, and its idle OpenMP threads spin against flux's pool (bench/README.md).
    env.update(FLUX_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    return env


def torch_env(threads, best):
    env = base_env() if best else dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    if best:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def torch_active_env(threads):
    """LibTorch best without OMP_WAIT_POLICY=PASSIVE; None when that is the user environment itself."""
    env = base_env()
    env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    return None if env == torch_env(threads, False) else env


def isa():
    flags = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = line.split()
                break
    for name in ("avx512f", "avx2", "sse4_2"):
        if name in flags:
            extra = [x for x in ("avx512_bf16", "avx512_vnni", "amx_tile") if x in flags] if name == "avx512f" else []
            return " ".join([name.upper().replace("_", ".")] + extra)
    return "baseline x86-64"


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def run(cmd, env, timeout=300):
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"[bench] timeout: {' '.join(cmd)}", file=sys.stderr)
        return {}
    except OSError as e:
        print(f"[bench] cannot run {' '.join(cmd)}: {e}", file=sys.stderr)
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
        if m not in METRICS and m not in ("sgemm_gflops", "resnet_hw"):
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
    print(f"ISA: {isa()}; load average at start: {loadavg()}", flush=True)
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
                    if case in CNN_CASES:
                        active = torch_active_env(t)
                        jobs.append(("torch_active", [torch, case, str(t)], active) if active else None)
                if case in CNN_CASES:
                    e = flux_env(t)
                    e["FLUX_LIBRARY_KERNELS"] = "0"
                    jobs.append(("flux_im2col", [flux, case], e))
                    if t > 1:
                        # diagnostic: oneDNN's OpenMP threads sleeping instead of spinning
                        e = flux_env(t)
                        e["OMP_WAIT_POLICY"] = "PASSIVE"
                        jobs.append(("flux_passive", [flux, case], e))
                jobs = [j for j in jobs if j]
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

    end_load = loadavg()

    def raw(impl, t, m):
        return results.get((impl, t), {}).get(m)

    def best_of(m, values):
        values = [v for v in values if v is not None]
        if not values:
            return None
        return max(values) if METRICS[m][2] else min(values)

    def get(impl, t, m):
        if impl == "torch_best" and CASE_OF.get(m) in CNN_CASES:
            # the better of PASSIVE and the default wait policy (the user run when it is that environment)
            other = "torch_active" if torch_active_env(t) else "torch_user"
            return best_of(m, [raw("torch_best", t, m), raw(other, t, m)])
        return raw(impl, t, m)

    def winner(t, m):
        other = "torch_active" if torch_active_env(t) else "torch_user"
        p, a = raw("torch_best", t, m), raw(other, t, m)
        if p is None or a is None:
            return ""
        return "PASSIVE" if best_of(m, [p, a]) == p else "default"

    lines = []
    lines.append("| benchmark | threads | flux-cpp | LibTorch (user env) | LibTorch (best) | flux vs best | target | met |")
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |")
    hw = None
    for (impl, t), res in results.items():
        hw = hw or res.get("resnet_hw")
    hw_text = f"{int(hw)}x{int(hw)}" if hw else ""
    for m, (label, unit, higher) in METRICS.items():
        if CASE_OF[m] not in cases:
            continue
        label = label.format(hw=hw_text)
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
                    if m in TARGETS:
                        target, ok = f"≥ {TARGETS[m]:g}×", ratio >= TARGETS[m]
                met = "" if target == "" else ("yes" if ok else "**no**")
            elif m in TARGETS:
                target, met = f"≥ {TARGETS[m]:g}×", "not measured"
            if m == "add16_us" and f is not None:
                target, met = "≤ 0.3 µs", "yes" if f <= 0.3 else "**no**"
            if m == "dense16_us" and f is not None:
                target, met = "≤ 5 µs", "yes" if f <= 5 else "**no**"
            rs = "—" if ratio is None else (f"{ratio:.2f}× RSS" if m == "peak_rss_mb" else f"{ratio:.2f}×")
            lines.append(f"| {label} ({unit}) | {t} | {fmt(f)} | {fmt(u)} | {fmt(b)} | {rs} | {target} | {met} |")
        if CASE_OF[m] in CNN_CASES:
            # the same flux case with the portable conv path (im2col + GEMM) forced
            for t in threads:
                f, b, fo = get("flux_im2col", t, m), get("torch_best", t, m), get("flux", t, m)
                rs = "—" if not f or not b else f"{(f / b if higher else b / f):.2f}×"
                vs = "" if not f or not fo else f"{(f / fo if higher else fo / f):.2f}× of oneDNN path"
                lines.append(f"| {label}, flux im2col+GEMM path ({unit}) | {t} | {fmt(f)} | — | {fmt(b)} | {rs} | info | {vs} |")
            for t in threads:
                f, b, fo = get("flux_passive", t, m), get("torch_best", t, m), get("flux", t, m)
                if f is None:
                    continue
                rs = "—" if not f or not b else f"{(f / b if higher else b / f):.2f}×"
                vs = "" if not f or not fo else f"{(f / fo if higher else fo / f):.2f}× of plain flux"
                lines.append(f"| {label}, flux with OMP_WAIT_POLICY=PASSIVE ({unit}) | {t} | {fmt(f)} | — | {fmt(b)} | {rs} "
                             f"| diagnostic | {vs} |")
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
    notes = []
    for m in METRICS:
        if CASE_OF[m] in CNN_CASES and CASE_OF[m] in cases:
            for t in threads:
                w = winner(t, m)
                if w:
                    notes.append(f"{m}@{t}: {w}")
    if notes:
        print("\nLibTorch (best) wait policy that won: " + ", ".join(notes))
    print(f"Load average at end: {end_load}")


if __name__ == "__main__":
    main()
