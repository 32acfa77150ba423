"""Runs flux-cpp's exported ONNX files in ONNX Runtime and compares with flux's own outputs.

    ort_check.py DIR [NAME...]

For each DIR/NAME.onnx, DIR/NAME.safetensors holds x2, y2 (batch 2) and x3, y3 (batch 3) as flux
computed them, or cases x.B_T with outputs y.B_T, y.B_T.out1, ... (batch B, sequence length T); ORT
must give every output of every case from the one file within 1e-5 of the output's scale (float32).
Runs in the test venv (tests/onnx/ensure_venv.sh: onnxruntime and numpy from PyPI)."""
import json
import os
import struct
import sys

import numpy as np
import onnxruntime as ort

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "U8": np.uint8, "BOOL": np.bool_}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(body[a:b], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def main():
    folder = sys.argv[1]
    names = sys.argv[2:] or sorted(f[:-5] for f in os.listdir(folder) if f.endswith(".onnx"))
    if not names:
        print("no .onnx files in", folder)
        return 1
    failed = 0
    for name in names:
        ref = read_safetensors(os.path.join(folder, name + ".safetensors"))
        sess = ort.InferenceSession(os.path.join(folder, name + ".onnx"), providers=["CPUExecutionProvider"])
        input_name = sess.get_inputs()[0].name
        # Cases: x2/y2 and x3/y3 (batch 2 and 3), or x.B_T with y.B_T, y.B_T.out1, ... (batch B, length T).
        cases = sorted(k[2:] for k in ref if k.startswith("x.")) or ["2", "3"]
        for case in cases:
            x, prefix = (ref["x." + case], "y." + case) if "x." + case in ref else (ref["x" + case], "y" + case)
            ys = sess.run(None, {input_name: x})
            wants = [ref[prefix]] + [ref[f"{prefix}.out{k}"] for k in range(1, len(ys)) if f"{prefix}.out{k}" in ref]
            if len(wants) != len(ys):
                print(f"FAIL {name} case {case}: ORT gives {len(ys)} outputs, flux {len(wants)}")
                failed += 1
                continue
            for k, (y, want) in enumerate(zip(ys, wants)):
                if y.shape != want.shape:
                    print(f"FAIL {name} case {case} output {k}: ORT shape {y.shape}, flux {want.shape}")
                    failed += 1
                    continue
                err = np.abs(y.astype(np.float64) - want.astype(np.float64))
                # Within 1e-5 of the output's scale (its largest magnitude, at least 1), as onnx_compare: float32
                # sums over wide layers (1024 inputs, OpenCL's order) round with the values, not with each element.
                ok = bool(np.all(err <= 1e-5 * max(1.0, float(np.abs(want).max()))))
                print(f"{'ok  ' if ok else 'FAIL'} {name} case {case} output {k}: shape {y.shape}, max |ORT - flux| "
                      f"{err.max():.3g} (max |flux| {np.abs(want).max():.3g})")
                failed += not ok
    print(f"onnxruntime {ort.__version__}: {len(names)} models, {failed} failures")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
