#!/usr/bin/env python3
"""Data-parallel scaling of flux-cpp (issue 13), measured side by side in one run.

Runs build/bin/distributed_bench (bench/distributed_bench.cpp) as
  (a) 1 rank  (a plain process),
  (b) 2 ranks `mpirun --allow-run-as-root -np 2`, gradients reduced during backward (overlapped),
  (b') the same without the reducer's progress thread (--no-progress-thread: MPI progresses only at
       each gradient report), to show what the thread changes,
  (c) 2 ranks, gradients reduced after backward (--no-overlap),
  (d) a control: two independent 1-rank processes at once (no MPI), which splits the loss into the
      machine's part (two busy cores share memory bandwidth, caches and clock) and communication's,
each with FLUX_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 per rank and the same batch per
rank (weak scaling, as DDP reports it), alternating the three over --reps repetitions. Prints:
  scaling efficiency = throughput(2 ranks, samples/s) / (2 x throughput(1 rank))       target >= 85%
  hidden fraction    = 1 - wait(overlapped) / wait(not overlapped)                      target >= 50%
where wait is the reducer's own "allreduce wait after backward" (distributed::last_gradient_stats()),
and, as a check on it, the net saving (step(not overlapped) - step(overlapped)) / wait(not overlapped).
Every run records `uptime` and the mean number of OTHER runnable tasks while it ran (from
/proc/loadavg, minus our own ranks), so a loaded machine shows in the output.

Usage: bench/distributed_bench.py [--build build-bench] [--reps 3] [--model wide] [--batch 256] [--steps 6]
                                  [--warmup 2] [--bucket-mb X] [--wait-quiet LOAD] [--json FILE]
(bench/distributed_bench.sh builds the program first and calls this.)
"""
import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time

TARGET_EFFICIENCY = 0.85
TARGET_HIDDEN = 0.50


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:
        return ""


def uptime():
    return sh("uptime")


def cpu_header():
    model, flags = "?", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    isa = "AVX-512 (" + " ".join(x for x in ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16") if x in flags) + ")" \
        if "avx512f" in flags else ("AVX2+FMA" if {"avx2", "fma"} <= flags else "SSE only")
    return model, isa


class RunQueueSampler:
    """Mean of /proc/loadavg's runnable-task count while a run goes on (includes this sampler: -1)."""

    def __init__(self):
        self.samples = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.is_set():
            try:
                with open("/proc/loadavg") as f:
                    self.samples.append(int(f.read().split()[3].split("/")[0]) - 1)
            except Exception:
                pass
            self._stop.wait(0.25)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *a):
        self._stop.set()
        self._t.join()

    def mean(self):
        return statistics.mean(self.samples) if self.samples else float("nan")


def parse_kv(text):
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_0-9]+) (.+)$", line.strip())
        if not m:
            continue
        k, v = m.group(1), m.group(2)
        try:
            out[k] = float(v)
        except ValueError:
            out[k] = v
    return out


def run_stages(a, exe, mpi, env, args):
    """2 ranks: plain data-parallel against distributed::shard stages 1, 2 (and bf16 on the wire) and 3,
    alternating order; then each once at --mem-np ranks (oversubscribed) for the memory columns. With
    --old-build, the same rows (stages 1 and 2) of another build's program in the same repetitions."""
    configs = {
        "data-parallel": mpi + [exe] + args,
        "data-parallel, after backward": mpi + [exe] + args + ["--no-overlap"],
        "stage 1": mpi + [exe] + args + ["--stage", "1"],
        "stage 2": mpi + [exe] + args + ["--stage", "2"],
        "stage 2, bf16 wire": mpi + [exe] + args + ["--stage", "2", "--wire-bf16"],
        "stage 3": mpi + [exe] + args + ["--stage", "3"],
    }
    # the wait after backward that each run's overlap is measured against (the same traffic, not overlapped)
    reference = {"data-parallel": "data-parallel, after backward", "stage 2": "stage 1", "stage 2, bf16 wire": "stage 1",
                 "stage 3": "stage 1"}
    run_env = {k: env for k in configs}
    if a.old_build:
        old_exe = os.path.join(a.old_build, "bin", "distributed_bench")
        old_env = dict(env, LD_LIBRARY_PATH=os.path.join(os.path.abspath(a.old_build), "lib"))
        old_mpi = mpi[:1] + ["-x", "LD_LIBRARY_PATH"] + mpi[1:]
        for name, extra in (("data-parallel", []), ("stage 1", ["--stage", "1"]), ("stage 2", ["--stage", "2"]),
                            ("stage 2, bf16 wire", ["--stage", "2", "--wire-bf16"])):
            configs[f"{name} (old)"] = old_mpi + [old_exe] + args + extra
            run_env[f"{name} (old)"] = old_env
    model_name, isa = cpu_header()
    commit = sh("git -C " + os.path.dirname(os.path.abspath(__file__)) + " rev-parse --short HEAD")
    print("flux-cpp sharded training, 2 ranks (bench/distributed_bench.py --stages)")
    print(f"date      {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, commit {commit}")
    print(f"CPU       {model_name}, {os.cpu_count()} cores, {isa}")
    print(f"command   {' '.join(configs['stage 2'])} [--stage 1 | 3 | --wire-bf16 | none: data-parallel [--no-overlap]]")
    if a.old_build:
        print(f"old       {' '.join(configs['stage 2 (old)'])} (LD_LIBRARY_PATH={a.old_build}/lib)")
    print(f"start     {uptime()}")
    sys.stdout.flush()
    results = {k: [] for k in configs}
    order = list(configs)
    for rep in range(a.reps):
        for name in (order if rep % 2 == 0 else order[::-1]):
            with RunQueueSampler() as rq:
                p = subprocess.run(configs[name], env=run_env[name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if p.returncode != 0:
                sys.exit(f"run '{name}' failed (exit {p.returncode}):\n{p.stdout}\n{p.stderr}")
            kv = parse_kv(p.stdout)
            kv["others_running"] = max(0.0, rq.mean() - 2)
            results[name].append(kv)
            print(f"rep {rep + 1} {name:30s}: step {kv['step_ms']:8.1f} ms (update {kv['update_ms']:.1f}, wait "
                  f"{kv.get('wait_ms', float('nan')):.1f}), CPU {kv['cpu_ms_per_step']:.1f} ms/step, state "
                  f"{kv['state_mb_max']:.1f} MiB, storage peak {kv.get('storage_peak_mb_max', float('nan')):.0f} MiB, "
                  f"peak RSS {kv['peak_rss_mb_max']:.0f} MiB; other runnable tasks {kv['others_running']:.1f}")
            sys.stdout.flush()
    mem = {}
    if a.mem_np > 0:
        mem_mpi = mpi[:-2] + ["--oversubscribe", "-np", str(a.mem_np)]  # mpi ends with -np 2
        mem_args = [x for x in args]
        for k in ("--steps", "--warmup"):
            i = mem_args.index(k)
            mem_args[i + 1] = "2" if k == "--steps" else "1"
        for name in ("data-parallel", "stage 1", "stage 2", "stage 2, bf16 wire", "stage 3"):
            extra = configs[name][len(mpi) + 1 + len(args):]
            cmd = mem_mpi + [exe] + mem_args + extra
            p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if p.returncode != 0:
                sys.exit(f"memory run '{name}' at np {a.mem_np} failed (exit {p.returncode}):\n{p.stdout}\n{p.stderr}")
            mem[name] = parse_kv(p.stdout)
            print(f"np {a.mem_np} {name:20s}: storage peak {mem[name]['storage_peak_mb_max']:.0f} MiB, held "
                  f"{mem[name]['storage_held_mb_max']:.0f} MiB, peak RSS {mem[name]['peak_rss_mb_max']:.0f} MiB")
            sys.stdout.flush()
    med = lambda name, key: statistics.median(r[key] for r in results[name]) if key in results[name][0] else float("nan")
    r0 = results["data-parallel"][0]
    print()
    print(f"model {a.model}: {int(r0['params']):,} parameters, batch {int(r0['batch_per_rank'])} per rank, Adam; "
          f"medians of {a.reps} repetitions x {a.steps} steps; 2 ranks, one thread each")
    print("| run | step (ms) | vs data-parallel | rank 0 CPU per step (ms) | vs data-parallel | update (ms) "
          "| wait after backward (ms) | hidden behind backward | optimiser state + masters per rank (MiB) "
          "| storage peak / held per rank (MiB) | peak RSS per rank (MiB) "
          + (f"| np {a.mem_np}: storage peak / held (MiB) | np {a.mem_np}: peak RSS (MiB) |" if mem else "|"))
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if mem else ""))
    for name in order:
        base_name = "data-parallel (old)" if name.endswith("(old)") else "data-parallel"
        base, cpu_base = med(base_name, "step_ms"), med(base_name, "cpu_ms_per_step")
        ref = reference.get(name.replace(" (old)", ""))
        if name.endswith("(old)") and ref:
            ref = ref + " (old)" if ref + " (old)" in results else None
        hidden = "-"
        if ref and "wait_ms" in results[name][0] and "wait_ms" in results[ref][0]:
            hidden = f"{100 * (1 - med(name, 'wait_ms') / med(ref, 'wait_ms')):.0f}%"
        na = lambda v, f: "-" if v != v else format(v, f)
        row = (f"| {name} | {med(name, 'step_ms'):.1f} | {med(name, 'step_ms') / base:.2f}x | "
               f"{med(name, 'cpu_ms_per_step'):.1f} | {med(name, 'cpu_ms_per_step') / cpu_base:.2f}x | "
               f"{med(name, 'update_ms'):.1f} | {na(med(name, 'wait_ms'), '.1f')} | {hidden} | {med(name, 'state_mb_max'):.1f} | "
               f"{na(med(name, 'storage_peak_mb_max'), '.0f')} / {na(med(name, 'storage_held_mb_max'), '.0f')} | "
               f"{med(name, 'peak_rss_mb_max'):.0f} |")
        if mem:
            m = mem.get(name)
            row += (f" {m['storage_peak_mb_max']:.0f} / {m['storage_held_mb_max']:.0f} | {m['peak_rss_mb_max']:.0f} |" if m
                    else " - | - |")
        print(row)
    others = [r["others_running"] for rs in results.values() for r in rs]
    print(f"load: other runnable tasks during the np 2 runs: mean {statistics.mean(others):.2f}, max {max(others):.2f}")
    print(f"end       {uptime()}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"results": results, "memory": mem}, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build-bench", help="build folder holding bin/distributed_bench")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--model", default="wide", choices=["wide", "mnist", "cnn"])
    ap.add_argument("--batch", type=int, default=0, help="per rank (default: wide 256, others 128)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--bucket-mb", type=float, default=0, help="gradient bucket size (default: the library's)")
    ap.add_argument("--wait-quiet", type=float, default=0,
                    help="before each run, wait until the mean number of runnable tasks over 5 s (none of ours "
                         "run then) is below this, e.g. 0.5")
    ap.add_argument("--wait-max", type=float, default=600, help="seconds --wait-quiet waits at most per run")
    ap.add_argument("--json", default="", help="also write the results here")
    ap.add_argument("--stages", action="store_true",
                    help="sharded training instead: 2 ranks data-parallel vs distributed::shard stages 1, 2 "
                         "(and stage 2 with bf16 on the wire) and 3, step time, overlap and per-rank memory")
    ap.add_argument("--mem-np", type=int, default=4,
                    help="with --stages: also run each once at this many ranks (oversubscribed) for the memory "
                         "columns; 0 skips it")
    ap.add_argument("--old-build", default="",
                    help="with --stages: a second build folder (bin/distributed_bench, lib/) whose data-parallel, "
                         "stage 1 and 2 rows run in the same repetitions, e.g. a copy of main's")
    a = ap.parse_args()

    exe = os.path.join(a.build, "bin", "distributed_bench")
    if not os.access(exe, os.X_OK):
        sys.exit(f"distributed_bench.py: {exe} not found; build it: cmake --build {a.build} --target distributed_bench "
                 "(configured with -DFLUX_BENCH=ON), or run bench/distributed_bench.sh")
    mpirun = shutil.which("mpirun")
    if not mpirun:
        sys.exit("distributed_bench.py: mpirun not found (Debian: apt-get install libopenmpi-dev openmpi-bin)")

    env = dict(os.environ, FLUX_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    args = ["--model", a.model, "--steps", str(a.steps), "--warmup", str(a.warmup)]
    if a.batch:
        args += ["--batch", str(a.batch)]
    if a.bucket_mb:
        args += ["--bucket-mb", str(a.bucket_mb)]
    mpi = [mpirun, "--allow-run-as-root", "-x", "FLUX_NUM_THREADS", "-x", "OPENBLAS_NUM_THREADS", "-x",
           "OMP_NUM_THREADS", "-np", "2"]
    if a.stages:
        return run_stages(a, exe, mpi, env, args)
    configs = {
        "1 rank": [exe] + args,
        "2 ranks, overlapped": mpi + [exe] + args,
        "2 ranks, overlapped, no progress thread": mpi + [exe] + args + ["--no-progress-thread"],
        "2 ranks, after backward": mpi + [exe] + args + ["--no-overlap"],
        "2 independent processes": [exe] + args,  # two 1-rank runs at once: the machine's share of the loss
    }
    nranks = {"1 rank": 1, "2 ranks, overlapped": 2, "2 ranks, overlapped, no progress thread": 2,
              "2 ranks, after backward": 2, "2 independent processes": 1}
    copies = {"2 independent processes": 2}

    model_name, isa = cpu_header()
    commit = sh("git -C " + os.path.dirname(os.path.abspath(__file__)) + " rev-parse --short HEAD")
    print("flux-cpp data-parallel scaling (bench/distributed_bench.py)")
    print(f"date      {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, commit {commit}")
    print(f"CPU       {model_name}, {os.cpu_count()} cores, {isa}")
    print(f"MPI       {sh(mpirun + ' --version').splitlines()[0] if sh(mpirun + ' --version') else '?'}")
    print(f"threads   FLUX_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 per rank")
    print(f"commands  1 rank : {' '.join(configs['1 rank'])}")
    print(f"          2 ranks: {' '.join(configs['2 ranks, overlapped'])} [--no-progress-thread | --no-overlap]")
    print(f"start     {uptime()}")
    sys.stdout.flush()

    results = {k: [] for k in configs}
    order = list(configs)
    flux_isa = "?"
    for rep in range(a.reps):
        for name in (order if rep % 2 == 0 else order[::-1]):
            if a.wait_quiet > 0:
                t0 = time.time()
                while time.time() - t0 < a.wait_max:
                    with RunQueueSampler() as rq:
                        time.sleep(5)
                    if rq.mean() < a.wait_quiet:
                        break
                waited = time.time() - t0
                if waited > 6:
                    print(f"  (waited {waited:.0f} s for a quiet machine; runnable tasks before this run: {rq.mean():.2f})")
            up_before = uptime()
            with RunQueueSampler() as rq:
                procs = [subprocess.Popen(configs[name], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True) for _ in range(copies.get(name, 1))]
                outs = [p.communicate() for p in procs]
            kvs = []
            for p, (out, err) in zip(procs, outs):
                if p.returncode != 0:
                    print(f"run '{name}' failed (exit {p.returncode}):\n{out}\n{err}")
                    sys.exit(1)
                kvs.append(parse_kv(out))
                if int(kvs[-1].get("ranks", 0)) != nranks[name]:
                    sys.exit(f"run '{name}' ran {kvs[-1].get('ranks')} rank(s), not {nranks[name]} (flux built without "
                             f"MPI? reconfigure with -DFLUX_MPI=ON):\n{out}\n{err}")
            kv = kvs[0]
            if len(kvs) > 1:  # independent processes: their throughputs add up
                kv["samples_per_s"] = sum(k["samples_per_s"] for k in kvs)
                kv["step_ms"] = statistics.mean(k["step_ms"] for k in kvs)
            flux_isa = kv.get("flux_cpu_isa", flux_isa)
            kv["others_running"] = max(0.0, rq.mean() - nranks[name] * copies.get(name, 1))
            kv["uptime"] = up_before
            results[name].append(kv)
            extra = ""
            if "wait_ms" in kv:
                extra = f", fwd+bwd {kv['fwd_bwd_ms']:.1f} ms, wait {kv['wait_ms']:.1f} ms"
            extra += f"; rank 0 CPU {kv['cpu_ms_per_step']:.1f} ms/step (sys {kv['sys_ms_per_step']:.1f}, {kv['minflt_per_step']:.0f} faults)"
            print(f"rep {rep + 1} {name:24s}: step {kv['step_ms']:8.1f} ms (update {kv['update_ms']:.1f}{extra}), "
                  f"{kv['samples_per_s']:.1f} samples/s; other runnable tasks {kv['others_running']:.2f}; "
                  f"before: {up_before.split('load average:')[-1].strip()}")
            sys.stdout.flush()

    med = lambda name, key: statistics.median(r[key] for r in results[name])
    one, ov, no = "1 rank", "2 ranks, overlapped", "2 ranks, after backward"
    eff = med(ov, "samples_per_s") / (2 * med(one, "samples_per_s"))
    eff_no = med(no, "samples_per_s") / (2 * med(one, "samples_per_s"))
    pair_eff = [r2["samples_per_s"] / (2 * r1["samples_per_s"]) for r1, r2 in zip(results[one], results[ov])]
    hidden = 1 - med(ov, "wait_ms") / med(no, "wait_ms")
    nt = "2 ranks, overlapped, no progress thread"
    hidden_nt = 1 - med(nt, "wait_ms") / med(no, "wait_ms")
    net_nt = (med(no, "step_ms") - med(nt, "step_ms")) / med(no, "wait_ms")
    net = (med(no, "step_ms") - med(ov, "step_ms")) / med(no, "wait_ms")
    r0 = results[ov][0]
    print()
    print(f"model {a.model}: {int(r0['params']):,} parameters ({r0['grad_mb']:.1f} MiB of f32 gradients), batch "
          f"{int(r0['batch_per_rank'])} per rank, {int(r0['buckets'])} buckets of <= {r0['bucket_mb']:g} MiB; "
          f"flux CPU kernels: {flux_isa}; medians of {a.reps} repetitions x {a.steps} steps")
    print("| run | step (ms) | fwd+bwd (ms) | allreduce wait after backward (ms) | Adam update (ms) | samples/s | rank 0 CPU per step (ms) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in order:
        fb = f"{med(name, 'fwd_bwd_ms'):.1f}" if "fwd_bwd_ms" in results[name][0] else f"{med(name, 'withgradient_ms'):.1f}"
        wt = f"{med(name, 'wait_ms'):.1f}" if "wait_ms" in results[name][0] else "-"
        print(f"| {name} | {med(name, 'step_ms'):.1f} | {fb} | {wt} | {med(name, 'update_ms'):.1f} | "
              f"{med(name, 'samples_per_s'):.1f} | {med(name, 'cpu_ms_per_step'):.1f} |")
    print()
    ok = lambda v, t: "MET" if v >= t else "NOT met"
    print(f"scaling efficiency, 2 ranks vs 1 (overlapped): {100 * eff:.1f}%  (target >= {100 * TARGET_EFFICIENCY:.0f}%: "
          f"{ok(eff, TARGET_EFFICIENCY)}); per repetition {', '.join(f'{100 * e:.1f}%' for e in pair_eff)}; "
          f"not overlapped {100 * eff_no:.1f}%")
    print(f"allreduce hidden behind backward (reducer stats): {100 * hidden:.1f}%  (target >= "
          f"{100 * TARGET_HIDDEN:.0f}%: {ok(hidden, TARGET_HIDDEN)}); net step saving / wait: {100 * net:.1f}%; "
          f"progress thread ran in {int(med(ov, 'progress_thread_steps'))} of {a.steps} steps (median)")
    print(f"  without the progress thread: hidden {100 * hidden_nt:.1f}%, net step saving / wait {100 * net_nt:.1f}%")
    indep = "2 independent processes"
    machine = med(indep, "samples_per_s") / (2 * med(one, "samples_per_s"))
    comm_factor = med(ov, "samples_per_s") / med(indep, "samples_per_s")
    print(f"where it goes: 2 independent 1-rank processes at once reach {100 * machine:.1f}% of 2 x 1 rank (the two "
          f"cores sharing memory, caches and clock); 2 ranks reach {100 * comm_factor:.1f}% of those 2 processes "
          f"(communication and waiting); efficiency = product")
    cpu_eff = med(one, "cpu_ms_per_step") / med(ov, "cpu_ms_per_step")
    print(f"CPU-time view (less sensitive to load): rank 0 CPU per step, 1 rank / 2 ranks overlapped = "
          f"{100 * cpu_eff:.1f}% (the efficiency an otherwise idle machine would allow if no rank ever waited)")
    others = [r["others_running"] for rs in results.values() for r in rs]
    print(f"load: other runnable tasks during the runs: mean {statistics.mean(others):.2f}, max {max(others):.2f}")
    print(f"end       {uptime()}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"results": results, "efficiency": eff, "hidden": hidden, "net_hidden": net,
                       "hidden_without_progress_thread": hidden_nt}, f, indent=1)


if __name__ == "__main__":
    main()
