#!/usr/bin/env python3
"""ONNX Runtime as an inference peer: the inference rows of torch_bench.py, exported with torch.onnx.

Usage:
  ort_bench.py export DIR              writes DIR/mnist_mlp.onnx and DIR/resnet18.onnx from the PyTorch
                                       models of torch_bench.py (batch axis dynamic); imports torch
  ort_bench.py CASE THREADS DIR        CASE: infer | resnet | versions; imports onnxruntime only
The session runs sequentially with intra_op_num_threads = THREADS, inter_op_num_threads = 1 and the
default graph optimisations; FLUX_BENCH_ORT_SPINNING=0 turns off the intra-op threads' spin-wait
(session.intra_op.allow_spinning), the analogue of OMP_WAIT_POLICY=PASSIVE for the other peers.
Prints "key value" lines with the keys of flux_bench / torch_bench (infer1_us, infer128_us, resnet*_ms).
"""
import os
import sys
import time

RESNET_SIZE = 112  # bench::kResnetSize


def export(out_dir):
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_bench as tb

    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(1)
    models = {"mnist_mlp": (tb.mlp(784, 512, 512, 10), torch.rand(2, 784)),
              "resnet18": (tb.resnet18().eval(), torch.rand(2, 3, RESNET_SIZE, RESNET_SIZE))}
    for name, (model, x) in models.items():
        path = os.path.join(out_dir, name + ".onnx")
        t0 = time.perf_counter()
        # The TorchScript-based exporter: no onnxscript needed, and a batch axis named as the user would.
        torch.onnx.export(model, (x,), path, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, opset_version=17, dynamo=False)
        print(f"exported {path} in {time.perf_counter() - t0:.1f} s")


def rate(f, seconds):
    """bench::rate: calls per second of wall time."""
    t0 = time.perf_counter()
    calls = 0
    while True:
        f()
        calls += 1
        if time.perf_counter() - t0 >= seconds:
            break
    return calls / (time.perf_counter() - t0)


def session(path, threads):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if os.environ.get("FLUX_BENCH_ORT_SPINNING") == "0":
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def infer_case(threads, model_dir):
    import numpy as np

    sess = session(os.path.join(model_dir, "mnist_mlp.onnx"), threads)
    rng = np.random.default_rng(1)
    for batch in (1, 128):
        x = rng.random((batch, 784), dtype=np.float32)
        run = lambda: sess.run(None, {"x": x})
        for _ in range(20):
            run()
        print(f"infer{batch}_us {1e6 / rate(run, 0.7):.6g}")


def resnet_case(threads, model_dir):
    import numpy as np

    sess = session(os.path.join(model_dir, "resnet18.onnx"), threads)
    rng = np.random.default_rng(1)
    print(f"resnet_hw {RESNET_SIZE}")
    for batch in (1, 32):
        x = rng.random((batch, 3, RESNET_SIZE, RESNET_SIZE), dtype=np.float32)
        run = lambda: sess.run(None, {"x": x})
        for _ in range(5 if batch == 1 else 2):
            run()
        print(f"resnet{batch}_ms {1e3 / rate(run, 1.5 if batch == 1 else 2.5):.6g}")


def main():
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "export":
        export(args[1])
        return 0
    if len(args) == 1 and args[0] == "versions":
        import onnxruntime as ort

        print(f"version onnxruntime {ort.__version__}")
        return 0
    if len(args) == 3 and args[0] in ("infer", "resnet"):
        (infer_case if args[0] == "infer" else resnet_case)(int(args[1]), args[2])
        return 0
    print("usage: ort_bench.py export DIR | ort_bench.py infer|resnet THREADS DIR | ort_bench.py versions",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
