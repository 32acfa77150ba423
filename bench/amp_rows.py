"""The mixed-precision rows of bench/run_bench.py (issue 36, `--cases amp`): float32 against bf16, for
flux-cpp and its peers, side by side in one run, and the issue's targets.

Each row is one case run in separate processes per program and dtype, rotating the order between
repetitions as the other rows do; every figure is the best of the repetitions (ms, lower is better).
  flux-cpp        flux_bench CASE [--autocast=bf16]: withgradient(..., {.autocast = BFloat16}) and
                  autocast(BFloat16, model call); on a CPU without bf16 units flux's autocast computes
                  float32 (the column says so), and FLUX_AUTOCAST_EMULATE=1 (bf16 storage, float32
                  arithmetic) runs as an extra column there
  PyTorch 2.x     torch_bench.py CASE THREADS [--autocast=bf16]: torch.autocast("cpu", dtype=torch.bfloat16)
  LibTorch 2.x    torch2/torch_bench CASE THREADS [--bf16]: the model and its inputs cast to bf16
                  (model->to(kBFloat16): LibTorch's C++ API has no autocast)
  LibTorch 1.13   bin/torch_bench CASE THREADS [--bf16]: the same, only where the CPU has bf16 units (on
                  AVX2 its bf16 Linear is emulated: ~100x its float32 step, minutes per row)
  ONNX Runtime    float32 inference of the MLP and ResNet-18 (no bf16 on its CPU provider)
Environments: flux_env / peer_env / torch_env of run_bench.py, ONE wait setting per thread count
(OMP_WAIT_POLICY=PASSIVE and ONNX Runtime without spinning at 2+ threads; LibTorch 1.13 as its "best").
A target applies only where the CPU has bf16 units (flux_bench info, /proc/cpuinfo); elsewhere the
target column says "n/a (no bf16 units)".
"""
import sys

CASES = ["mnist", "infer", "resnet", "resnet_train", "encoder", "decoder"]
# Cases the LibTorch C++ programs (torch_bench.cpp) do not have: flux and PyTorch 2.x only.
PYTHON_ONLY_CASES = ("decoder",)
# Extra flux_bench arguments per case: the inference cases at the rows' batch only.
FLUX_ARGS = {"infer": ["--batch=128"], "resnet": ["--batch=32"]}
ORT_CASES = ("infer", "resnet")
# row key -> (label, case, metric printed by the programs, factor to ms, or None for steps/s -> ms)
ROWS = {
    "mlp_train": ("MNIST MLP 784-512-512-10, batch 128, training step", "mnist", "mnist_steps_per_s", None),
    "mlp_infer": ("MNIST MLP, batch 128, inference", "infer", "infer128_us", 1e-3),
    "resnet_train": ("ResNet-18 112x112, batch 32, training step", "resnet_train", "resnet_train_ms", 1.0),
    "resnet_infer": ("ResNet-18 112x112, batch 32, inference", "resnet", "resnet32_ms", 1.0),
    "enc_train": ("transformer encoder D 256, T 128, 4 layers, batch 16, training step", "encoder", "encoder_train_ms", 1.0),
    "enc_infer": ("transformer encoder, batch 16, inference", "encoder", "encoder_infer_ms", 1.0),
    "dec_train": ("GPT-style causal decoder D 768, 12 heads, T 512, 4 layers, batch 4, training step", "decoder",
                  "decoder_train_ms", 1.0),
    "dec_infer": ("GPT-style causal decoder, batch 4, inference", "decoder", "decoder_infer_ms", 1.0),
}
RSS = ("resnet_train_peak_rss_mb", "resnet_train_rss_before_mb")
# column key -> heading; "{units}" is filled with what flux's bf16 column computes on this CPU.
COLUMNS = {"flux": "flux f32", "flux_bf16": "flux bf16 autocast{units}", "flux_emu": "flux bf16 emulated (FLUX_AUTOCAST_EMULATE=1)",
           "py2": "PyTorch {py2} f32", "py2_bf16": "PyTorch {py2} bf16 autocast",
           "lt2": "LibTorch {lt2} C++ f32", "lt2_bf16": "LibTorch {lt2} C++ bf16 (model cast)",
           "lt113": "LibTorch {lt113} f32", "lt113_bf16": "LibTorch {lt113} bf16 (model cast)", "ort": "ONNX Runtime {ort} f32"}


def units(rb, flux):
    """(flux's 'ISA: ...; bf16/f16 units: ...' line, whether bf16 units are there, whether AMX-BF16 is)."""
    line = dict(rb.run_text([flux, "info"], rb.flux_env(1))).get("units", "").strip()
    found = line.split("bf16/f16 units:", 1)[1].strip() if "bf16/f16 units:" in line else ""
    bf16 = "BF16" in found
    return line or "flux_bench info printed no units line", bf16, "AMX-BF16" in found


def header(rb, flux):
    """Header lines: flux's units line and the CPU's bf16/f16 flags."""
    line, _, _ = units(rb, flux)
    flags = rb.cpu_flags()
    have = [f for f in ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16") if f in flags]
    return [f"- bf16/f16 units, flux-cpp's CPU backend (versioninfo): {line}",
            f"- bf16/f16 flags in /proc/cpuinfo: {', '.join(have) if have else 'none of avx512_bf16, amx_bf16, avx512_fp16, amx_fp16'}"]


def jobs_for(rb, peers, flux, case, t, has_units):
    """(column, command, environment) for every program and dtype of one case at t threads."""
    quiet = t > 1
    extra = FLUX_ARGS.get(case, [])
    jobs = [("flux", [flux, case] + extra, rb.flux_env(t)),
            ("flux_bf16", [flux, case] + extra + ["--autocast=bf16"], rb.flux_env(t))]
    if not has_units:
        e = rb.flux_env(t)
        e["FLUX_AUTOCAST_EMULATE"] = "1"
        jobs.append(("flux_emu", [flux, case] + extra + ["--autocast=bf16"], e))
    if "py2" in peers.present:
        cmd = peers.command("py2", case, t)
        jobs += [("py2", cmd, rb.peer_env(t, quiet)), ("py2_bf16", cmd + ["--autocast=bf16"], rb.peer_env(t, quiet))]
    if "lt2" in peers.present and case not in PYTHON_ONLY_CASES:
        cmd = peers.command("lt2", case, t)
        jobs += [("lt2", cmd, rb.peer_env(t, quiet)), ("lt2_bf16", cmd + ["--bf16"], rb.peer_env(t, quiet))]
    if "lt113" in peers.present and case not in PYTHON_ONLY_CASES:
        cmd = peers.command("lt113", case, t)
        jobs.append(("lt113", cmd, rb.torch_env(t, True)))
        if has_units:
            jobs.append(("lt113_bf16", cmd + ["--bf16"], rb.torch_env(t, True)))
    if "ort" in peers.present and case in ORT_CASES:
        jobs.append(("ort", peers.command("ort", case, t), rb.ort_env(t, quiet)))
    return jobs


def to_ms(row, v):
    if v is None or v <= 0:
        return None
    factor = ROWS[row][3]
    return 1e3 / v if factor is None else v * factor


def run(rb, args, peers, info, flux, threads):
    """Runs the rows and prints their table (markdown) and notes."""
    line, has_units, amx = units(rb, flux)
    results = {}  # (column, threads) -> metric -> best value
    cases = CASES
    if getattr(args, "amp_cases", None):
        cases = [c for c in args.amp_cases.split(",") if c]
        unknown = [c for c in cases if c not in CASES]
        if unknown:
            sys.exit(f"--amp-cases: unknown case(s) {', '.join(unknown)}; the cases are {', '.join(CASES)}")
    for t in threads:
        for case in cases:
            for rep in range(args.reps):
                jobs = jobs_for(rb, peers, flux, case, t, has_units)
                k = rep % len(jobs)
                for col, cmd, env in jobs[k:] + jobs[:k]:
                    res = rb.run(cmd, env, timeout=900)
                    store = results.setdefault((col, t), {})
                    for m, v in res.items():
                        if m in RSS:  # the run with the fastest step keeps its memory figures
                            continue
                        higher = m.endswith("_per_s")
                        old = store.get(m)
                        if old is None or (v > old if higher else v < old):
                            store[m] = v
                            if m == "resnet_train_ms":
                                for r in RSS:
                                    if r in res:
                                        store[r] = res[r]

    def ms(col, t, row):
        return to_ms(row, results.get((col, t), {}).get(ROWS[row][2]))

    cols = [c for c in COLUMNS if c in ("flux", "flux_bf16") or any(results.get((c, t)) for t in threads)]
    names = {"py2": "?", "lt2": "?", "lt113": "?", "ort": "?"}
    names.update({p: v[0] for p, v in info.items()})
    unit_note = "" if has_units else " (no bf16 units: float32)"
    heads = [COLUMNS[c].format(units=unit_note, **names) for c in cols]
    out = ["| row (ms) | threads | " + " | ".join(heads) +
           " | flux bf16 / f32 | PyTorch bf16 / f32 | flux bf16 vs PyTorch bf16 | target | met |",
           "| --- | --: | " + " | ".join("--:" for _ in cols) + " | --: | --: | --: | --- | --- |"]

    def x(a, b):  # how many times faster a is than b (times in ms)
        return None if a is None or b is None else b / a

    def xt(v):
        return "—" if v is None else f"{v:.2f}×"

    for row, (label, case, metric, _) in ROWS.items():
        if case not in cases:
            continue
        for t in threads:
            f32, bf, p32, pbf = ms("flux", t, row), ms("flux_bf16", t, row), ms("py2", t, row), ms("py2_bf16", t, row)
            own, vs_py = x(bf, f32), x(bf, pbf)
            needs = []  # (text, ratio, required)
            if row in ("resnet_train", "enc_train"):
                needs = [("≥ 1.5× flux f32", own, 1.5), ("≥ 1.2× PyTorch bf16", vs_py, 1.2)]
            elif row in ("dec_train", "dec_infer", "enc_infer"):
                needs = [("≥ 1.2× PyTorch bf16", vs_py, 1.2)]
            elif row == "mlp_train":
                needs = [("≥ 1.2× flux f32 (never slower)", own, 1.2)]
            elif row == "resnet_infer":
                needs = [("≥ 2× flux f32 (AMX)", own, 2.0)] if amx else [("≥ 1.3× flux f32 (AVX512-BF16)", own, 1.3)]
                needs.append(("≥ 1.2× PyTorch bf16", vs_py, 1.2))
                if not has_units:
                    needs = [("≥ 2× flux f32 with AMX, ≥ 1.3× with AVX512-BF16", own, 0)]
            if not needs:
                target, met = "info", ""
            elif not has_units:
                target, met = "; ".join(n[0] for n in needs), "n/a (no bf16 units)"
            else:
                target = "; ".join(n[0] for n in needs)
                oks = [None if r is None else r >= need for _, r, need in needs]
                met = "not all measured" if None in oks else ("yes" if all(oks) else "**no**")
            out.append(f"| {label} | {t} | " + " | ".join(rb.fmt(ms(c, t, row)) for c in cols) +
                       f" | {xt(own)} | {xt(x(pbf, p32))} | {xt(vs_py)} | {target} | {met} |")
    # Peak RSS of the ResNet-18 training processes (flux has no device high-water mark on the CPU).
    for t in threads:
        def rss(col):
            return results.get((col, t), {}).get(RSS[0])
        f32, bf, emu = rss("flux"), rss("flux_bf16"), rss("flux_emu")
        ratio = None if not f32 or not bf else bf / f32
        if has_units:
            target, met = "≤ 0.8× flux f32", ("—" if ratio is None else "yes" if ratio <= 0.8 else "**no**")
        else:
            target = "≤ 0.8× flux f32"
            met = "n/a (no bf16 units)" + ("" if not emu or not f32 else f"; emulated: {emu / f32:.2f}×")
        out.append(f"| peak RSS of the ResNet-18 training process (MB) | {t} | " +
                   " | ".join(rb.fmt(rss(c)) for c in cols) +
                   f" | {'—' if ratio is None else f'{ratio:.2f}× RSS'} | — | — | {target} | {met} |")
    print("\n".join(out))
    before = ", ".join(f"{COLUMNS[c].format(units='', **names)} {rb.fmt(v)}" for c in cols
                       for v in [next((results[(c, t)][RSS[1]] for t in threads if RSS[1] in results.get((c, t), {})), None)]
                       if v)
    print(f"\nMixed-precision rows: {line}. Speed-ups are float32 time / bf16 time (above 1: bf16 faster). "
          "One wait setting per thread count (PASSIVE at 2+). " +
          ("" if has_units else "On this CPU flux's autocast warns once and computes float32 (its bf16 column is a "
           "float32 figure); FLUX_AUTOCAST_EMULATE=1 keeps bf16 storage with float32 arithmetic; the peers' bf16 is "
           "emulated in software; LibTorch 1.13's bf16 is not run (its bf16 Linear is ~100x its float32 here). ") +
          f"RSS of the ResNet-18 training processes before training (MB): {before or '—'}.")
    missing = [c for c in ("flux_bf16",) if not any(results.get((c, t)) for t in threads)]
    if missing:
        print("flux bf16 autocast: not measured (flux_bench was built without flux/autocast.hpp).")
