#!/usr/bin/env python3
"""Runs flux_bench and its peers as separate processes, alternating, and prints ONE markdown table.

Usage: bench/run_bench.py BUILD_DIR [--reps N] [--threads 1,2] [--cases seed,mnist,...,resnet,lstm,transformer,amp]
                         [--peers lt113,lt2,py2,ort] [--quick]

Processes per case and thread count, in rotating order within each repetition:
  flux-cpp      : the environment WITHOUT OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (flux needs no variable),
                  FLUX_NUM_THREADS = OPENBLAS_NUM_THREADS = OMP_NUM_THREADS (oneDNN's threads) = threads
  lt113 (Debian LibTorch 1.13, BUILD_DIR/bin/torch_bench), two columns:
    user env    : the environment as given (this machine sets OPENBLAS_CORETYPE=Haswell),
                  torch::set_num_threads, OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = threads
    best        : as user, but OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE removed (OpenBLAS detects the CPU)
                  and OMP_WAIT_POLICY=PASSIVE; for the convolutional and sequence cases also without PASSIVE, the
                  better of the two counts (when the user environment is that one, its run serves)
  lt2 (LibTorch 2.x C++ of PyPI's torch wheel, BUILD_DIR/torch2/torch_bench: torch_bench.cpp built
       against it), py2 (PyTorch 2.x eager, bench/torch_bench.py in BUILD_DIR/venv), and ort (ONNX
       Runtime, bench/ort_bench.py, inference rows only, models exported by torch.onnx into
       BUILD_DIR/onnx): the environment without OPENBLAS_* / OMP_WAIT_POLICY, threads set through the
       API and OMP_NUM_THREADS = MKL_NUM_THREADS = threads; at 2+ threads each also runs with its
       threads told not to spin (OMP_WAIT_POLICY=PASSIVE; for ONNX Runtime
       session.intra_op.allow_spinning=0) and its better figure counts, as for LibTorch 1.13.
serve (row 13): flux_bench serve and torch_bench serve, one model called from 1 and from 2 threads at once;
  "threads" is the pool size (FLUX_NUM_THREADS; at::set_num_threads in every LibTorch caller thread); the
  2 callers / 1 caller row is each program's own ratio, measured in one process; below the table, whether
  every 2-caller output was bitwise that of one caller.
amp: the mixed-precision rows (issue 36), float32 against bf16 autocast, in their own table (bench/amp_rows.py).
Each figure is the best of the repetitions (highest rate, lowest time); "best peer" is the best figure
of all peer columns in that row, and the ratio compares flux with it. Only ratios from one run mean
anything. --quick: one repetition of the MLP cases (seed, mnist, wide, infer) against one peer (LibTorch
2.x C++ if built, else Debian LibTorch 1.13, else PyTorch 2.x), one wait setting (PASSIVE at 2+
threads), no sgemm limit and no OpenCL rows.
"""
import argparse
import datetime
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ["seed", "mnist", "mnist_converged", "wide", "overhead", "infer", "lenet", "fmnist", "resnet", "lstm",
         "lstm_converged", "transformer", "serve", "amp"]
MLP_CASES = ["seed", "mnist", "wide", "infer"]
CNN_CASES = ["lenet", "fmnist", "resnet"]
SEQ_CASES = ["lstm", "lstm_converged", "transformer"]
# The converged variants (bench_common.hpp's k*ConvergeSteps of training before the timed steps) and
# the from-initialisation case each is compared with.
CONVERGED_OF = {"mnist_converged": "mnist", "lstm_converged": "lstm"}
# LibTorch 1.13 "best" takes the better of OMP_WAIT_POLICY=PASSIVE and the default for these cases.
BOTH_WAIT_CASES = CNN_CASES + SEQ_CASES + ["serve"]
ORT_CASES = ["infer", "resnet"]  # the inference rows
# serve (issue 37): one model called from 1 and 2 threads at once; the C++ programs only (torch_bench.cpp
# for LibTorch 1.13 and 2.x; not PyTorch eager or ONNX Runtime). The "threads" column is the pool size:
# FLUX_NUM_THREADS for flux, at::set_num_threads in every caller thread for LibTorch.
SERVE_MODELS = {"mlp32": "MNIST MLP 784-512-512-10, batch 32", "resnet1": "ResNet-18 {hw}, batch 1",
                "resnet32": "ResNet-18 {hw}, batch 32", "lstm4": "LSTM(64 => 128) + Dense, batch 4, T 32"}
SERVE_PEERS = ("lt113", "lt2")
# metric -> (label, unit, higher_is_better)
METRICS = {
    "seed_steps_per_s": ("1. seed MLP 10-64-1 training", "steps/s", True),
    "mnist_steps_per_s": ("2. MNIST MLP 784-512-512-10 training", "steps/s", True),
    "mnist_converged_steps_per_s": ("2c. MNIST MLP training, converged (after 1000 steps)", "steps/s", True),
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
    "lstm_steps_per_s": ("11. char LSTM 62-256 (+Dense 256-62), T 64, batch 32 training", "steps/s", True),
    "lstm_converged_steps_per_s": ("11c. char LSTM training, after 300 steps", "steps/s", True),
    "transformer_steps_per_s": ("12. tiny transformer (2 blocks, D 64, T 64, 4 heads), batch 32 training", "steps/s", True),
}
for _k, _name in SERVE_MODELS.items():
    METRICS[f"serve_{_k}_1c_per_s"] = (f"13. serve {_name}, 1 caller", "calls/s", True)
    METRICS[f"serve_{_k}_2c_per_s"] = (f"13. serve {_name}, 2 callers", "calls/s, total", True)
    METRICS[f"serve_{_k}_scaling"] = (f"13. serve {_name}, 2 callers / 1 caller", "× total throughput", True)
# The serve scaling targets (issue 37), on flux's own figure: >= 1.8x with a pool of 1 thread, never
# below one caller with a larger pool.
SERVE_SCALING_TARGET = {1: 1.8}
CASE_OF = {"seed_steps_per_s": "seed", "mnist_steps_per_s": "mnist", "wide_steps_per_s": "wide",
           "wide_gflops": "wide", "add16_us": "overhead", "dense16_us": "overhead", "infer1_us": "infer",
           "infer128_us": "infer", "peak_rss_mb": "wide", "lenet_steps_per_s": "lenet", "fmnist_steps_per_s": "fmnist",
           "resnet1_ms": "resnet", "resnet32_ms": "resnet", "lstm_steps_per_s": "lstm",
           "transformer_steps_per_s": "transformer", "mnist_converged_steps_per_s": "mnist_converged",
           "lstm_converged_steps_per_s": "lstm_converged"}
CASE_OF.update({m: "serve" for m in METRICS if m.startswith("serve_")})
# The peer columns: key -> heading ({v} is filled with the peer's version).
PEER_COLUMNS = {"lt113_user": "LibTorch {v} (user env)", "lt113": "LibTorch {v} (best)", "lt2": "LibTorch {v} C++",
                "py2": "PyTorch {v} eager", "ort": "ONNX Runtime {v}"}
PEER_OF_COLUMN = {"lt113_user": "lt113", "lt113": "lt113", "lt2": "lt2", "py2": "py2", "ort": "ort"}
# Targets (issue 17: the MLP rows, every inference row against ONNX Runtime; the convolutional rows
# keep their earlier ones against LibTorch 1.13):
# metric -> list of (peer columns, ratio flux must reach against the best of them, text).
NEW_PEERS = ("lt2", "py2")
TARGETS = {
    "seed_steps_per_s": [(tuple(PEER_COLUMNS), 3.0, "≥ 3× every peer")],
    "mnist_steps_per_s": [(("lt113", "lt113_user"), 1.5, "≥ 1.5× LibTorch 1.13"), (NEW_PEERS, 1.0, "ahead of 2.x")],
    "infer1_us": [(("ort",), 1.0, "ahead of ONNX Runtime")],
    "infer128_us": [(("ort",), 1.0, "ahead of ONNX Runtime")],
    "lenet_steps_per_s": [(("lt113", "lt113_user"), 1.3, "≥ 1.3× LibTorch 1.13")],
    "fmnist_steps_per_s": [(("lt113", "lt113_user"), 1.3, "≥ 1.3× LibTorch 1.13")],
    "resnet1_ms": [(("lt113", "lt113_user"), 1.2, "≥ 1.2× LibTorch 1.13"), (("ort",), 1.0, "ahead of ONNX Runtime")],
    "resnet32_ms": [(("lt113", "lt113_user"), 1.2, "≥ 1.2× LibTorch 1.13"), (("ort",), 1.0, "ahead of ONNX Runtime")],
    # issue 12: against LibTorch's torch::nn::LSTM / an equivalent LibTorch model
    "lstm_steps_per_s": [(("lt113", "lt113_user"), 1.3, "≥ 1.3× LibTorch 1.13")],
    "transformer_steps_per_s": [(("lt113", "lt113_user"), 1.3, "≥ 1.3× LibTorch 1.13")],
}


# --max-isa avx2: every program runs its AVX2 code paths on this (AVX-512) CPU, to measure the AVX2 kind
# of machine on the core at hand: flux's own kernels (FLUX_BENCH_MAX_ISA, read by flux_bench), OpenBLAS's
# kernels (OPENBLAS_CORETYPE=Haswell), oneDNN 2.x and 3.x (flux, Debian LibTorch, the torch wheel),
# ATen's vectorised kernels (ATEN_CPU_CAPABILITY) and MKL. ONNX Runtime's MLAS has no such switch: it
# runs under BUILD_DIR/lib/libflux_cpuid_avx2.so (bench/cpuid_avx2.c, preloaded: CPUID answers without
# AVX-512, through Linux's CPUID faulting), checked before the run; where that library is missing or the
# machine has no CPUID faulting, ONNX Runtime keeps its AVX-512 kernels and the header says so.
MAX_ISA_ENV = {
    "avx2": dict(FLUX_BENCH_MAX_ISA="avx2", OPENBLAS_CORETYPE="Haswell", ONEDNN_MAX_CPU_ISA="AVX2",
                 DNNL_MAX_CPU_ISA="AVX2", ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2"),
}
MAX_ISA = None
# --blas-core NAME (issue 44): OPENBLAS_CORETYPE=NAME for every program that loads Debian's OpenBLAS (flux and
# both LibTorch 1.13 columns; the torch wheel uses MKL): what runs on a CPU model that OpenBLAS does not
# know (Prescott: its SSE3 kernels, as on the Xeon of ../shared/measurements/2026-12-06-intel-xeon-amx.md).
BLAS_CORE = None
ORT_PRELOAD = None  # --max-isa avx2: the CPUID library ONNX Runtime runs under, once checked


def cpuid_cap(build):
    """(library, None) when BUILD/lib/libflux_cpuid_avx2.so hides AVX-512 from a checked program, else
    (None, why not)."""
    lib = os.path.join(build, "lib", "libflux_cpuid_avx2.so")
    check = os.path.join(build, "bin", "flux_cpuid_avx2_check")
    if not (os.path.exists(lib) and os.path.exists(check)):
        return None, "BUILD_DIR/lib/libflux_cpuid_avx2.so not built (x86-64 Linux, -DFLUX_BENCH=ON)"
    r = subprocess.run([check, "bits"], env=dict(os.environ, LD_PRELOAD=lib), capture_output=True, text=True)
    if r.returncode == 97:
        return None, "no CPUID faulting on this kernel or CPU"
    if r.returncode != 0 or "avx512f=0" not in r.stdout:
        return None, f"the CPUID library did not hide AVX-512 (exit {r.returncode}: {r.stdout.strip()} {r.stderr.strip()})"
    return lib, None


def capped(env):
    if MAX_ISA:
        env.update(MAX_ISA_ENV[MAX_ISA])
    if BLAS_CORE:
        env["OPENBLAS_CORETYPE"] = BLAS_CORE
    return env


def base_env():
    env = dict(os.environ)
    for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "FLUX_NUM_THREADS", "OMP_WAIT_POLICY"):
        env.pop(k, None)
    return capped(env)


def flux_env(threads):
    env = base_env()
    # OMP_NUM_THREADS: oneDNN (Debian's is built on OpenMP) otherwise runs on every core whatever
    # FLUX_NUM_THREADS says, and its idle OpenMP threads spin against flux's pool (bench/README.md).
    env.update(FLUX_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    return env


def torch_env(threads, best):
    env = base_env() if best else capped(dict(os.environ))
    env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    if best:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def torch_active_env(threads):
    """LibTorch best without OMP_WAIT_POLICY=PASSIVE; None when that is the user environment itself."""
    env = base_env()
    env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    return None if env == torch_env(threads, False) else env


def peer_env(threads, quiet):
    """The 2.x peers (MKL, oneDNN, their own OpenMP or thread pool): threads set, spin-waiting or not."""
    env = base_env()
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    if quiet:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
        env["FLUX_BENCH_ORT_SPINNING"] = "0"
    return env


def ort_env(threads, quiet):
    env = peer_env(threads, quiet)
    if ORT_PRELOAD:
        env["LD_PRELOAD"] = " ".join(p for p in (ORT_PRELOAD, env.get("LD_PRELOAD", "")) if p)
    return env


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def isa():
    """AVX2 / AVX-512 (with its BF16, VNNI, FP16 extensions) / AMX, as the CPU reports them."""
    flags = cpu_flags()
    if "avx512f" in flags:
        ext = [n for f, n in (("avx512_bf16", "BF16"), ("avx512_vnni", "VNNI"), ("avx512_fp16", "FP16")) if f in flags]
        text = "AVX-512" + (f" ({', '.join(ext)})" if ext else "")
    elif "avx2" in flags:
        text = "AVX2" + ("+FMA" if "fma" in flags else "") + ", no AVX-512"
    else:
        text = "no AVX2"
    amx = [n for f, n in (("amx_bf16", "BF16"), ("amx_int8", "INT8"), ("amx_fp16", "FP16")) if f in flags]
    return text + (f", AMX ({', '.join(amx)})" if "amx_tile" in flags else ", no AMX")


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def run_raw(cmd, env, timeout=300):
    """stdout of cmd, or None (with the reason on stderr)."""
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"[bench] timeout: {' '.join(cmd)}", file=sys.stderr)
        return None
    except OSError as e:
        print(f"[bench] cannot run {' '.join(cmd)}: {e}", file=sys.stderr)
        return None
    if out.returncode != 0:
        print(f"[bench] failed ({out.returncode}): {' '.join(cmd)}\n{out.stderr[-2000:]}", file=sys.stderr)
        return None
    return out.stdout


def run(cmd, env, timeout=300):
    res = {}
    for line in (run_raw(cmd, env, timeout) or "").splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                res[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return res


def run_text(cmd, env):
    """'key text...' lines (versions, configuration) as a list of (key, text)."""
    out = run_raw(cmd, env, timeout=120) or ""
    return [tuple(l.split(" ", 1)) for l in out.splitlines() if " " in l]


def merge(store, key, res):
    for m, v in res.items():
        if m.endswith("_bitwise"):  # serve: 1 when every 2-caller output equals the 1-caller one; 0 wins
            old = store.setdefault(key, {}).get(m)
            store[key][m] = v if old is None else min(old, v)
            continue
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


def short_config(text):
    """torch's build configuration lines, shortened for the header ('MKL 2024.2', 'oneDNN v3.13.3')."""
    for pattern, repl in ((r"Intel\(R\) (?:oneAPI )?Math Kernel Library Version (\S+?)-Product.*", r"MKL \1"),
                          (r"Intel\(R\) MKL-DNN (v\S+).*", r"oneDNN \1"),
                          (r"OpenMP \d+ \(a\.k\.a\. OpenMP ([0-9.]+)\)", r"OpenMP \1"),
                          (r"CPU capability usage: (\S+)", r"CPU capability \1")):
        text = re.sub(pattern, repl, text)
    return text


def read_file(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


class Peers:
    """Which peers exist in BUILD_DIR, how to run each, and why a missing one is missing."""

    def __init__(self, build, wanted):
        self.build = build
        self.python = os.path.join(build, "venv", "bin", "python")
        self.onnx_dir = os.path.join(build, "onnx")
        self.programs = {"lt113": os.path.join(build, "bin", "torch_bench"),
                         "lt2": os.path.join(build, "torch2", "torch_bench")}
        have_venv = os.path.exists(self.python)
        status = read_file(os.path.join(build, "peers-status.txt"))  # written by scripts/bench
        lt2_status = read_file(os.path.join(build, "torch2-status.txt"))
        onnx_status = read_file(os.path.join(build, "onnx-status.txt"))
        self.present, self.missing = [], {}
        checks = {
            "lt113": (os.path.exists(self.programs["lt113"]), "torch_bench not built (scripts/deps.sh bench: libtorch-dev)"),
            "lt2": (os.path.exists(self.programs["lt2"]),
                    lt2_status or status or "BUILD_DIR/torch2/torch_bench not built (scripts/bench builds it)"),
            "py2": (have_venv, status or "no virtual environment BUILD_DIR/venv (scripts/bench makes it)"),
            "ort": (have_venv and os.path.exists(os.path.join(self.onnx_dir, "mnist_mlp.onnx")),
                    status or onnx_status or "no exported ONNX models in BUILD_DIR/onnx (scripts/bench exports them)"),
        }
        for p in wanted:
            if p not in checks:
                sys.exit(f"run_bench.py: unknown peer '{p}' (peers: {', '.join(checks)})")
            ok, why = checks[p]
            if ok:
                self.present.append(p)
            else:
                self.missing[p] = why

    def command(self, peer, case, threads):
        if peer in self.programs:
            return [self.programs[peer], case, str(threads)]
        if peer == "py2":
            return [self.python, os.path.join(HERE, "torch_bench.py"), case, str(threads)]
        return [self.python, os.path.join(HERE, "ort_bench.py"), case, str(threads), self.onnx_dir]

    def versions(self):
        """peer -> (version, [configuration lines])."""
        info = {}
        for p in self.present:
            if p in self.programs:
                lines = run_text([self.programs[p], "versions"], base_env())
            else:  # the Python peers' versions were recorded when the venv was made (import torch costs seconds)
                cached = read_file(os.path.join(self.build, "peers-versions.txt"))
                if not cached:
                    script = "torch_bench.py" if p == "py2" else "ort_bench.py"
                    cached = run_raw([self.python, os.path.join(HERE, script), "versions"], base_env()) or ""
                lines = [tuple(l.split(" ", 1)) for l in cached.splitlines() if " " in l]
                if p == "ort":
                    lines = [l for l in lines if l[1].startswith("onnxruntime")]
                else:
                    lines = [l for l in lines if not (l[0] == "version" and l[1].startswith("onnxruntime"))]
            version = next((t.split()[-1] for k, t in lines if k == "version"), "?")
            info[p] = (version, [short_config(t) for k, t in lines if k == "config" and "cmake_prefix_path" not in t])
        return info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--peers", default="lt113,lt2,py2,ort")
    ap.add_argument("--opencl-cases", default="seed,mnist,overhead,infer")
    ap.add_argument("--amp-cases", default=None, metavar="CASES",
                    help="with --cases amp: only these of its programs' cases (e.g. resnet_train,encoder; "
                         "bench/amp_rows.py CASES), for more repetitions of the rows that matter")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--max-isa", choices=sorted(MAX_ISA_ENV), default=None,
                    help="run every program's AVX2 code paths on an AVX-512 CPU (see MAX_ISA_ENV)")
    ap.add_argument("--blas-core", default=None, metavar="NAME",
                    help="OPENBLAS_CORETYPE=NAME for every program on Debian's OpenBLAS, flux included (see BLAS_CORE)")
    args = ap.parse_args()
    global MAX_ISA, ORT_PRELOAD, BLAS_CORE
    MAX_ISA = args.max_isa
    BLAS_CORE = args.blas_core
    ort_cap_why = None
    if MAX_ISA == "avx2":
        ORT_PRELOAD, ort_cap_why = cpuid_cap(args.build)
    bindir = os.path.join(args.build, "bin")
    flux = os.path.join(bindir, "flux_bench")
    peers = Peers(args.build, [p for p in args.peers.split(",") if p])
    limit = True
    if args.quick:
        args.reps, args.cases, args.opencl_cases, limit = 1, ",".join(MLP_CASES), "", False
        one = next((p for p in ("lt2", "lt113", "py2") if p in peers.present), None)
        peers.present = [one] if one else []
    have_opencl = os.path.exists(os.path.join(args.build, "lib", "libflux-opencl.so")) and args.opencl_cases
    threads = [int(t) for t in args.threads.split(",")]
    cases = args.cases.split(",")

    # The header: machine, ISA, BLAS core, peer versions.
    blas = dict(run_text([flux, "blas"], flux_env(1)))
    blas_user = dict(run_text([flux, "blas"], capped(dict(os.environ, OPENBLAS_NUM_THREADS="1"))))
    info = peers.versions()
    commit = (run_raw(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], dict(os.environ)) or "?").strip()
    print(f"flux-cpp benchmarks, {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, commit {commit}, "
          f"{os.cpu_count()} cores: {cpu_model()}")
    print(f"- ISA: {isa()}")
    if MAX_ISA:
        print(f"- **Capped to {MAX_ISA.upper()}** (--max-isa): {', '.join(f'{k}={v}' for k, v in MAX_ISA_ENV[MAX_ISA].items())} "
              f"for every program; " + (f"ONNX Runtime under {os.path.basename(ORT_PRELOAD)} (CPUID without AVX-512: "
                                         f"its AVX2 kernels)" if ORT_PRELOAD else
                                         f"ONNX Runtime's kernels are NOT capped ({ort_cap_why}): its column is no AVX2 figure"))
    if BLAS_CORE:
        print(f"- **OpenBLAS forced to its {BLAS_CORE} kernels** (--blas-core: OPENBLAS_CORETYPE={BLAS_CORE} for flux and "
              f"Debian's LibTorch 1.13, as on a CPU model OpenBLAS does not know; the torch wheel's MKL is not affected)")
    core = blas.get("blas_core", "?")
    user_core = blas_user.get("blas_core", "?")
    user_note = "" if user_core == core else \
        f"; in the user environment (OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '')}): {user_core}"
    print(f"- BLAS: {blas.get('blas_config', 'OpenBLAS ?')}, core type {core} (detected: flux and the 'best' peer "
          f"columns){user_note}")
    libraries = dict(run_text([flux, "info"], flux_env(1))).get("libraries")
    if libraries:
        print(f"- flux's libraries (versioninfo): {libraries.strip()}")
    for p in peers.present:
        v, cfg = info.get(p, ("?", []))
        name = {"lt113": "LibTorch (Debian libtorch-dev)", "lt2": "LibTorch C++ (PyPI torch wheel)",
                "py2": "PyTorch (PyPI torch wheel, Python)", "ort": "ONNX Runtime (PyPI)"}[p]
        print(f"- {name} {v}" + (f": {'; '.join(cfg)}" if cfg else ""))
    for p, why in peers.missing.items():
        print(f"- {PEER_COLUMNS[p].format(v='').replace('  ', ' ').replace('()', '').strip()}: not measured: {why}")
    if "amp" in cases:
        import amp_rows  # bench/amp_rows.py: the mixed-precision rows, their own table
        for line in amp_rows.header(sys.modules[__name__], flux):
            print(line)
    print(f"- load average at start: {loadavg()}", flush=True)
    if "amp" in cases:
        cases.remove("amp")
        print("\n### Mixed precision: float32 and bf16 (issue 36)\n")
        amp_rows.run(sys.modules[__name__], args, peers, info, flux, threads)
        if not cases:
            print(f"Load average at end: {loadavg()}")
            return
        print()

    results = {}  # (impl, threads) -> metric -> value
    engines = {}  # (case, threads) -> float32 GEMM calls of flux on (OpenBLAS, oneDNN)
    variants = {}  # (column, threads) -> impl keys whose best figure the column shows
    for t in threads:
        for case in cases:
            for rep in range(args.reps):
                jobs = [("flux", [flux, case], flux_env(t))]
                if "lt113" in peers.present:
                    cmd = peers.command("lt113", case, t)
                    jobs.append(("lt113_user", cmd, torch_env(t, False)))
                    jobs.append(("lt113", cmd, torch_env(t, True)))
                    variants[("lt113_user", t)] = ["lt113_user"]
                    variants[("lt113", t)] = ["lt113"]
                    if case in BOTH_WAIT_CASES:
                        active = torch_active_env(t)
                        # the better of PASSIVE and the default wait policy (the user run when it is that env)
                        variants[("lt113", t)] = ["lt113", "lt113_active" if active else "lt113_user"]
                        if active:
                            jobs.append(("lt113_active", cmd, active))
                for p in ("lt2", "py2", "ort"):
                    if p not in peers.present or (p == "ort" and case not in ORT_CASES) or \
                            (case == "serve" and p not in SERVE_PEERS):
                        continue
                    cmd = peers.command(p, case, t)
                    settings = [t > 1] if args.quick else ([False, True] if t > 1 else [False])
                    variants[(p, t)] = []
                    for quiet in settings:
                        key = p + ("_quiet" if quiet else "")
                        variants[(p, t)].append(key)
                        jobs.append((key, cmd, ort_env(t, quiet) if p == "ort" else peer_env(t, quiet)))
                if case in CNN_CASES:
                    e = flux_env(t)
                    e["FLUX_LIBRARY_KERNELS"] = "0"
                    jobs.append(("flux_im2col", [flux, case], e))
                    if case == "resnet":
                        # before/after of the inference conv + BatchNorm (+ relu, + residual) fusion
                        e = flux_env(t)
                        e["FLUX_CONV_FUSION"] = "0"
                        jobs.append(("flux_unfused", [flux, case], e))
                    if t > 1:
                        # diagnostic: oneDNN's OpenMP threads sleeping instead of spinning
                        e = flux_env(t)
                        e["OMP_WAIT_POLICY"] = "PASSIVE"
                        jobs.append(("flux_passive", [flux, case], e))
                if case == "wide" and limit:
                    # The limit, in the same alternation: OpenBLAS sgemm alone on the wide MLP's GEMM
                    # shapes, with OpenBLAS's own CPU detection and with SkylakeX (Haswell on a CPU
                    # without AVX-512, where SkylakeX's kernels stop on an illegal instruction) forced;
                    # the better counts.
                    jobs.append(("limit", [flux, "sgemm"], flux_env(t)))
                    e = flux_env(t)
                    e["OPENBLAS_CORETYPE"] = "SkylakeX" if "avx512f" in cpu_flags() and not MAX_ISA else "Haswell"
                    jobs.append(("limit", [flux, "sgemm"], e))
                if case in CONVERGED_OF:
                    # diagnostic: the same steps with IEEE subnormals in flux's kernels
                    e = flux_env(t)
                    e["FLUX_FLUSH_DENORMALS"] = "0"
                    jobs.append(("flux_ieee", [flux, case], e))
                if have_opencl and case in args.opencl_cases.split(","):
                    e = flux_env(t)
                    e.setdefault("POCL_CACHE_DIR", os.path.join(args.build, "pocl-cache"))
                    e["POCL_MAX_PTHREAD_COUNT"] = str(t)
                    jobs.append(("opencl", [flux, case, "opencl"], e))
                k = rep % len(jobs)
                for impl, cmd, env in jobs[k:] + jobs[:k]:  # rotate the order between repetitions
                    res = run(cmd, env)
                    if impl == "flux":  # the engines its float32 GEMMs ran on, counted per process
                        engines[(case, t)] = (res.get("flux_gemm_openblas_calls", 0), res.get("flux_gemm_onednn_calls", 0))
                    merge(results, (impl, t), res)

    end_load = loadavg()

    def raw(impl, t, m):
        return results.get((impl, t), {}).get(m)

    def best_of(m, values):
        values = [v for v in values if v is not None]
        if not values:
            return None
        return max(values) if METRICS.get(m, ("", "", True))[2] else min(values)

    def get(col, t, m):
        return best_of(m, [raw(k, t, m) for k in variants.get((col, t), [col])])

    columns = [c for c in PEER_COLUMNS if PEER_OF_COLUMN[c] in peers.present]
    headings = [PEER_COLUMNS[c].format(v=info.get(PEER_OF_COLUMN[c], ("", []))[0]) for c in columns]

    def best_peer(t, m, among=None):
        cands = [(get(c, t, m), c) for c in columns if among is None or c in among]
        cands = [(v, c) for v, c in cands if v is not None]
        if not cands:
            return None, None
        return (max if METRICS[m][2] else min)(cands)

    def speedup(m, f, b):
        return f / b if METRICS[m][2] else b / f  # how many times faster flux is

    short = {"lt113_user": "LT 1.13 user", "lt113": "LT 1.13", "lt2": "LT 2 C++", "py2": "PyTorch", "ort": "ORT"}
    lines = ["| benchmark | threads | flux-cpp | " + " | ".join(headings) + " | flux vs best peer | target | met |",
             "| --- | ---: | ---: | " + " | ".join("---:" for _ in columns) + " | ---: | --- | --- |"]
    hw = None
    for (impl, t), res in results.items():
        hw = hw or res.get("resnet_hw")
    hw_text = f"{int(hw)}x{int(hw)}" if hw else ""

    def engine(t, m):
        """' [GEMMs: oneDNN]' and the like: the engines flux's float32 GEMMs ran on in the row's case."""
        n_blas, n_dnn = engines.get((CASE_OF[m], t), (0, 0))
        if not n_blas and not n_dnn:
            return ""
        if not n_dnn or not n_blas:
            return f" [GEMMs: {'OpenBLAS' if n_blas else 'oneDNN'}]"
        return f" [GEMMs: oneDNN {100 * n_dnn / (n_blas + n_dnn):.0f}% of calls, OpenBLAS the rest]"

    def cell(c, t, m):
        if (c == "ort" and CASE_OF[m] not in ORT_CASES) or \
                (CASE_OF[m] == "serve" and PEER_OF_COLUMN[c] not in SERVE_PEERS):
            return "n/a"
        return fmt(get(c, t, m))

    for m, (label, unit, higher) in METRICS.items():
        if CASE_OF[m] not in cases:
            continue
        label = label.format(hw=hw_text)
        for t in threads:
            f = get("flux", t, m)
            b, bc = best_peer(t, m)
            ratio_text, target, met = "—", "", ""
            if f is not None and b is not None and f > 0 and b > 0:
                if m == "peak_rss_mb":
                    ratio_text = f"{f / b:.2f}× RSS ({short[bc]})"
                    target, met = "≤ 0.7×", "yes" if f / b <= 0.7 else "**no**"
                elif m.endswith("_scaling"):
                    ratio_text = "—"  # a ratio of ratios says little: the columns are there to compare
                else:
                    ratio_text = f"{speedup(m, f, b):.2f}× ({short[bc]})"
            if m in TARGETS and f:
                texts, oks = [], []
                for among, need, text in TARGETS[m]:
                    texts.append(text)
                    pb, _ = best_peer(t, m, among)
                    oks.append(None if not pb else speedup(m, f, pb) >= need)
                target = "; ".join(texts)
                met = ("yes" if all(oks) else "**no**") if all(o is not None for o in oks) else \
                    ("**no**" if False in oks else "not all measured")
            if m == "add16_us" and f is not None:
                target, met = "≤ 0.3 µs", "yes" if f <= 0.3 else "**no**"
            if m == "dense16_us" and f is not None:
                target, met = "≤ 5 µs", "yes" if f <= 5 else "**no**"
            if m.endswith("_scaling") and f is not None:
                need = SERVE_SCALING_TARGET.get(t, 1.0)
                target, met = f"≥ {need:.1f}×", "yes" if f >= need else "**no**"
            lines.append(f"| {label}{engine(t, m)} ({unit}) | {t} | {fmt(f)} | " + " | ".join(cell(c, t, m) for c in columns) +
                         f" | {ratio_text} | {target} | {met} |")
        blank = " | ".join("—" for _ in columns)
        if CASE_OF[m] in CNN_CASES:
            # the same flux case with the portable conv path (im2col + GEMM) forced, and with PASSIVE
            for key, what, vs_what in (("flux_im2col", "flux im2col+GEMM path", "of oneDNN path"),
                                       ("flux_unfused", "flux without conv+BatchNorm fusion (FLUX_CONV_FUSION=0)",
                                        "of plain flux"),
                                       ("flux_passive", "flux with OMP_WAIT_POLICY=PASSIVE", "of plain flux")):
                for t in threads:
                    f, fo = get(key, t, m), get("flux", t, m)
                    if f is None and key in ("flux_passive", "flux_unfused"):
                        continue
                    b, bc = best_peer(t, m)
                    rs = "—" if not f or not b else f"{speedup(m, f, b):.2f}× ({short[bc]})"
                    vs = "" if not f or not fo else f"{speedup(m, f, fo):.2f}× {vs_what}"
                    lines.append(f"| {label}, {what} ({unit}) | {t} | {fmt(f)} | {blank} | {rs} | info | {vs} |")
        if CASE_OF[m] in CONVERGED_OF:
            # flux with IEEE subnormals, then every column's converged rate as a share of its fresh one
            fresh_m = CONVERGED_OF[CASE_OF[m]] + "_steps_per_s"
            for t in threads:
                f, fo = get("flux_ieee", t, m), get("flux", t, m)
                if f is None:
                    continue
                b, bc = best_peer(t, m)
                rs = "—" if not f or not b else f"{speedup(m, f, b):.2f}× ({short[bc]})"
                vs = "" if not f or not fo else f"{speedup(m, f, fo):.2f}× of plain flux"
                lines.append(f"| {label}, flux with IEEE subnormals (FLUX_FLUSH_DENORMALS=0) ({unit}) | {t} | {fmt(f)} | "
                             f"{blank} | {rs} | info | {vs} |")
            if CONVERGED_OF[CASE_OF[m]] in cases:
                def share(c, t):
                    v, v0 = get(c, t, m), get(c, t, fresh_m)
                    return None if not v or not v0 else v / v0
                for t in threads:
                    fs = share("flux", t)
                    pct = lambda v: "—" if v is None else f"{100 * v:.0f}%"
                    met = "" if fs is None else ("yes" if fs >= 0.9 else "**no**")
                    lines.append(f"| {label.split('.')[0]}. converged as % of from-init steps/s | {t} | {pct(fs)} | " +
                                 " | ".join(pct(share(c, t)) for c in columns) + f" | — | ≥ 90% | {met} |")
        if m == "wide_gflops" and "wide" in cases and limit:
            for t in threads:
                lim = get("limit", t, "sgemm_gflops")
                pct = lambda v: "—" if v is None or not lim else f"{100 * v / lim:.0f}%"
                f = get("flux", t, m)
                ok = f is not None and lim and f / lim >= 0.9
                lines.append(f"| 3. wide MLP, % of sgemm limit ({fmt(lim)} GFLOP/s) | {t} | {pct(f)} | " +
                             " | ".join(pct(get(c, t, m)) for c in columns) +
                             f" | — | ≥ 90% | {'yes' if ok else '**no**'} |")
    if have_opencl:
        blank = " | ".join("—" for _ in columns)
        for m, (label, unit, higher) in METRICS.items():
            if CASE_OF[m] not in args.opencl_cases.split(",") or CASE_OF[m] not in cases:
                continue
            for t in threads:
                o, c = get("opencl", t, m), get("flux", t, m)
                rs = "—" if not o or not c else f"{speedup(m, o, c):.2f}× of CPU"
                lines.append(f"| 7. OpenCL (PoCL): {label} ({unit}) | {t} | {fmt(o)} | {blank} | {rs} | info | |")
    elif set(args.opencl_cases.split(",")) & set(cases):
        lines.append("| 7. OpenCL backend on PoCL | — | skipped: libflux-opencl.so not built | " +
                     " | ".join("" for _ in columns) + " | | info | |")
    print("\n".join(lines))
    if "serve" in cases:
        # serve: were the 2-caller outputs bitwise those of 1 caller (every call compared)?
        flags = []
        for col in ["flux"] + [c for c in columns if PEER_OF_COLUMN[c] in SERVE_PEERS]:
            for t in threads:
                keys = variants.get((col, t), [col])
                got = {}
                for k in keys:
                    for m, v in results.get((k, t), {}).items():
                        if m.endswith("_bitwise"):
                            name = m[len("serve_"):-len("_bitwise")]
                            got[name] = min(got.get(name, 1), v)
                if got:
                    flags.append(f"{'flux' if col == 'flux' else short[col]} @{t}: " +
                                 ", ".join(f"{n} {'equal' if v == 1 else '**DIFFERENT**'}" for n, v in got.items()))
        print("\nServe, 2 callers' outputs bitwise equal to 1 caller's: " + ("; ".join(flags) or "not measured"))

    # Which wait setting won for each peer with two (2+ threads).
    notes = []
    for (col, t), keys in sorted(variants.items()):
        if len(keys) < 2:
            continue
        won = {}
        for m in METRICS:
            if CASE_OF[m] not in cases or m in ("wide_gflops", "peak_rss_mb"):  # same runs as wide_steps_per_s
                continue
            vals = [(raw(k, t, m), k) for k in keys]
            vals = [(v, k) for v, k in vals if v is not None]
            if len(vals) == 2:
                v, k = (max if METRICS[m][2] else min)(vals)
                quiet = k.endswith("_quiet") or k == "lt113"
                name = m.replace("_steps_per_s", "").replace("_us", "").replace("_ms", "")
                won.setdefault("quiet" if quiet else "spinning", []).append(name)
        if won:
            notes.append(f"{short[col]} @{t}: " + ", ".join(f"{w}: {' '.join(ms)}" for w, ms in sorted(won.items())))
    if notes:
        print("\nWait setting that won (quiet = OMP_WAIT_POLICY=PASSIVE / ORT allow_spinning=0): " + "; ".join(notes))
    print(f"Load average at end: {end_load}")


if __name__ == "__main__":
    main()
