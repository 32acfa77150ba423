#!/usr/bin/env python3
"""ONNX Runtime's time per node for the ResNet-18 inference row, to compare layer by layer with flux.

Usage: ort_profile.py THREADS [BATCH] [RUNS]     (the venv's python: build-bench/venv/bin/python)
Runs DIR/resnet18.onnx (ort_bench.py's export, DIR = build-bench/onnx or $FLUX_BENCH_ONNX_DIR) RUNS
times (default 300) with the session of ort_bench.py plus `enable_profiling`, and prints the mean
kernel time per node, largest first, with the node's op and output shape. flux's side of the same
comparison: `ONEDNN_VERBOSE=1 build-bench/bin/flux_bench resnet --batch=1` (each oneDNN call's time;
sum them by shape). The profile's JSON file is removed afterwards. ONNX Runtime on its AVX2 kernels:
run it with LD_PRELOAD=build-bench/lib/libflux_cpuid_avx2.so (bench/cpuid_avx2.c).
"""
import collections
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    threads = int(sys.argv[1])
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    import numpy as np
    import onnxruntime as ort

    sys.path.insert(0, HERE)
    import ort_bench

    model_dir = os.environ.get("FLUX_BENCH_ONNX_DIR", os.path.join(HERE, "..", "build-bench", "onnx"))
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.enable_profiling = True
    sess = ort.InferenceSession(os.path.join(model_dir, "resnet18.onnx"), so, providers=["CPUExecutionProvider"])
    size = ort_bench.RESNET_SIZE
    x = np.random.default_rng(1).random((batch, 3, size, size), dtype=np.float32)
    for _ in range(runs):
        sess.run(None, {"x": x})
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    nodes = collections.defaultdict(lambda: [0, 0.0, ""])
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            a = e.get("args", {})
            n = nodes[e["name"][: -len("_kernel_time")]]
            n[0] += 1
            n[1] += e["dur"]
            n[2] = f"{a.get('op_name', '')} {a.get('output_type_shape', '')}"
    total = sum(v[1] for v in nodes.values()) / runs
    print(f"ONNX Runtime {ort.__version__}, {threads} thread(s), batch {batch}: {total:.1f} us of kernels per run")
    for name, (count, us, what) in sorted(nodes.items(), key=lambda kv: -kv[1][1]):
        print(f"{us / count:9.1f} us  {name:48s} {what}")


if __name__ == "__main__":
    main()
