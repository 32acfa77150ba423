"""Runs flux-cpp's exported ONNX files in ONNX Runtime and compares with flux's own outputs.

    ort_check.py DIR [NAME...]

For each DIR/NAME.onnx, DIR/NAME.safetensors holds x2, y2 (batch 2) and x3, y3 (batch 3) as flux
computed them; ORT must give y2 and y3 from the one file within 1e-5 (absolute + relative, float32).
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
        for batch in ("2", "3"):
            (y,) = sess.run(None, {input_name: ref["x" + batch]})
            want = ref["y" + batch]
            if y.shape != want.shape:
                print(f"FAIL {name} batch {batch}: ORT shape {y.shape}, flux {want.shape}")
                failed += 1
                continue
            err = np.abs(y.astype(np.float64) - want.astype(np.float64))
            tol = 1e-5 + 1e-5 * np.abs(want.astype(np.float64))
            ok = bool(np.all(err <= tol))
            print(f"{'ok  ' if ok else 'FAIL'} {name} batch {batch}: shape {y.shape}, max |ORT - flux| {err.max():.3g}"
                  f" (max |flux| {np.abs(want).max():.3g})")
            failed += not ok
    print(f"onnxruntime {ort.__version__}: {len(names)} models, {failed} failures")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
