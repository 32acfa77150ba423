#!/usr/bin/env python3
"""PyTorch <-> flux-cpp safetensors interoperability (a ctest entry; see tests/safetensors.cmake).

Debian ships python3-torch (1.13) but not the `safetensors` package, so this file writes and reads
the format itself with struct + json + torch, following the specification: u64 little-endian header
length, JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}} padded with spaces to
a multiple of 8, then the raw little-endian data, tensors sorted by alignment then name.

usage: torch_interop.py HELPER WORKDIR   (HELPER: the safetensors_interop executable)
Exits 77 (skipped) when torch is missing, unless CI or FLUX_REQUIRE_INTEROP is set.
"""
import copy
import json
import os
import struct
import subprocess
import sys

try:
    import torch
    from torch import nn
except ImportError as e:
    required = os.environ.get("FLUX_REQUIRE_INTEROP") or os.environ.get("CI")
    print(f"{'FAIL' if required else 'SKIPPED'}: PyTorch is not importable by {sys.executable} ({e}); "
          "install python3-torch (scripts/deps.sh does)")
    sys.exit(1 if required else 77)

DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int32: "I32", torch.int64: "I64", torch.uint8: "U8", torch.bool: "BOOL"}
CODES = {v: k for k, v in DTYPES.items()}
LOW = ((torch.bfloat16, "bf16"), (torch.float16, "f16"))


def raw_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: take the bits
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def save_safetensors(path, tensors, metadata=None):
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name in order:
        data = raw_bytes(tensors[name])
        header[name] = {"dtype": DTYPES[tensors[name].dtype], "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def load_safetensors(path):
    """Reads and strictly checks a file; returns (tensors, metadata)."""
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert n % 8 == 0, f"{path}: header length {n} is not a multiple of 8"
    text = blob[8:8 + n]
    assert text.startswith(b"{") and text.rstrip(b" ").endswith(b"}"), f"{path}: header not padded with spaces"
    header = json.loads(text)
    metadata = header.pop("__metadata__", {})
    data = blob[8 + n:]
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"])
    expected, sizes = 0, []
    tensors = {}
    for name, info in entries:
        begin, end = info["data_offsets"]
        assert begin == expected, f"{path}: tensor {name} begins at {begin}, expected {expected}"
        dtype = CODES[info["dtype"]]
        numel = 1
        for d in info["shape"]:
            numel *= d
        itemsize = torch.empty(0, dtype=dtype).element_size()
        assert end - begin == numel * itemsize, f"{path}: tensor {name} has the wrong byte count"
        assert begin % itemsize == 0, f"{path}: tensor {name} is not aligned"
        sizes.append((-itemsize, name))
        chunk = bytearray(data[begin:end])
        t = torch.frombuffer(chunk, dtype=dtype) if numel else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(info["shape"]).clone()
        expected = end
    assert expected == len(data), f"{path}: {len(data) - expected} trailing bytes"
    assert sizes == sorted(sizes), f"{path}: tensors not sorted by alignment then name"
    return tensors, metadata


def sequential():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def main():
    helper, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    torch.manual_seed(0)

    # PyTorch -> flux: a state dict and the outputs flux must reproduce.
    model = sequential()
    x = torch.randn(5, 4)
    with torch.no_grad():
        y = model(x)
    save_safetensors(f"{work}/torch_model.safetensors", model.state_dict(), {"format": "pt"})
    save_safetensors(f"{work}/torch_io.safetensors", {"x": x, "y": y})
    dtypes = {
        "f32": torch.randn(3, 2), "f64": torch.randn(4, dtype=torch.float64),
        "f16": torch.randn(2, 3).half(), "bf16": torch.randn(5).bfloat16(),
        "i32": torch.tensor([-3, 7, 2**31 - 1], dtype=torch.int32),
        "i64": torch.tensor([[2**62, -1]], dtype=torch.int64),
        "u8": torch.tensor([0, 128, 255], dtype=torch.uint8), "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5), "empty": torch.empty(0, 2),
    }
    save_safetensors(f"{work}/torch_dtypes.safetensors", dtypes, {"origin": "torch"})
    # The same model as PyTorch's bf16 and f16 state dicts (model.to(dtype): round to nearest even),
    # with the bf16 model's own outputs (PyTorch 1.13 has no Float16 Linear on the CPU).
    for dtype, tag in LOW:
        low = copy.deepcopy(model).to(dtype)
        save_safetensors(f"{work}/torch_model_{tag}.safetensors", low.state_dict())
    with torch.no_grad():
        y_bf16 = copy.deepcopy(model).to(torch.bfloat16)(x.bfloat16())
    save_safetensors(f"{work}/torch_io_bf16.safetensors", {"x": x.bfloat16(), "y": y_bf16})

    run = subprocess.run([helper, work], capture_output=True, text=True)
    print(run.stdout, end="")
    if run.returncode != 0:
        print(run.stderr, end="")
        print(f"FAIL: {helper} exited with {run.returncode}")
        return 1

    # flux -> PyTorch: flux's own model loads strictly into nn.Sequential and gives flux's outputs.
    state, meta = load_safetensors(f"{work}/flux_model.safetensors")
    assert meta.get("written_by") == "flux-cpp", meta
    assert sorted(state) == ["0.bias", "0.weight", "2.bias", "2.weight"], sorted(state)
    theirs = sequential()
    theirs.load_state_dict(state, strict=True)
    io, _ = load_safetensors(f"{work}/flux_io.safetensors")
    with torch.no_grad():
        err_back = (theirs(io["x"]) - io["y"]).abs().max().item()
    print(f"flux -> torch: max |torch - flux| = {err_back:.3g}")
    if not err_back <= 1e-5:
        print("FAIL: PyTorch's outputs for flux's model differ by more than 1e-5")
        return 1

    # Every dtype survives torch -> flux -> torch bit for bit.
    back, meta = load_safetensors(f"{work}/flux_dtypes.safetensors")
    assert meta == {"origin": "torch"}, meta
    for name, t in dtypes.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape, name
        assert raw_bytes(back[name]) == raw_bytes(t), f"{name} changed on the way through flux"
    print(f"dtypes round trip through flux: {', '.join(DTYPES[t.dtype] for t in dtypes.values())} identical")

    # Low precision both ways. PyTorch's bf16/f16 state dicts went through flux's bf16/f16 models (load,
    # then save) unchanged, bit for bit.
    for dtype, tag in LOW:
        mine, _ = load_safetensors(f"{work}/torch_model_{tag}.safetensors")
        back, _ = load_safetensors(f"{work}/flux_from_torch_{tag}.safetensors")
        assert sorted(back) == sorted(mine), sorted(back)
        for name in mine:
            assert back[name].dtype == dtype, (tag, name, back[name].dtype)
            assert raw_bytes(back[name]) == raw_bytes(mine[name]), f"{tag} {name} changed on the way through flux"
    # flux's own model saved as bf16/f16 loads strictly into PyTorch's model of that dtype, and equals
    # PyTorch's rounding of flux's float32 weights bit for bit.
    flux32, _ = load_safetensors(f"{work}/flux_model.safetensors")
    for dtype, tag in LOW:
        low_state, meta = load_safetensors(f"{work}/flux_model_{tag}.safetensors")
        assert meta.get("written_by") == "flux-cpp", meta
        theirs = sequential().to(dtype)
        theirs.load_state_dict(low_state, strict=True)
        for name, t in theirs.state_dict().items():
            assert t.dtype == dtype, (tag, name, t.dtype)
            assert raw_bytes(t) == raw_bytes(flux32[name].to(dtype)), f"{tag} {name}: flux's rounding differs from PyTorch's"
    # ... and computes what flux's bf16 model computed (both round each layer's output to bf16).
    io16, _ = load_safetensors(f"{work}/flux_io_bf16.safetensors")
    theirs = sequential().to(torch.bfloat16)
    theirs.load_state_dict(load_safetensors(f"{work}/flux_model_bf16.safetensors")[0], strict=True)
    with torch.no_grad():
        err16 = (theirs(io16["x"]).float() - io16["y"].float()).abs().max().item()
    print(f"flux bf16 -> torch bf16: max |torch - flux| = {err16:.3g}")
    if not err16 <= 0.05:
        print("FAIL: PyTorch's bf16 outputs for flux's bf16 model differ by more than 0.05")
        return 1
    print("bf16/f16 state dicts identical both ways")
    print(f"interop OK (torch {torch.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
