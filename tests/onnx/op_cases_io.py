"""safetensors read/write with numpy alone, for the ONNX tests' venv scripts."""
import json
import struct

import numpy as np

DTYPES = {"F32": np.float32, "I64": np.int64, "BOOL": np.bool_, "F64": np.float64, "I32": np.int32}
NAMES = {np.dtype(v): k for k, v in DTYPES.items()}


def save_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        b = a.tobytes()
        header[name] = {"dtype": NAMES[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + a:8 + n + b], dtype=DTYPES[v["dtype"]]).reshape(v["shape"])
    return out
