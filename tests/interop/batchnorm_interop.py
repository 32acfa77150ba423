#!/usr/bin/env python3
"""PyTorch's nn.BatchNorm2d/1d as the oracle for flux's BatchNorm in training and inference (a ctest
entry; see tests/batchnorm_interop.cmake). PyTorch runs two training steps and one eval step and
takes one training-mode gradient; the results go to a safetensors file (written with struct + json,
Debian has no `safetensors` package) that the C++ helper loads and compares with flux's.

usage: batchnorm_interop.py HELPER WORKDIR   (HELPER: the batchnorm_interop executable)
The helper also loads BatchNorm2d's state_dict file into a flux BatchNorm with load().
Exits 77 (skipped) when torch is missing, unless CI or FLUX_REQUIRE_INTEROP is set.
"""
import json
import os
import struct
import subprocess
import sys

try:
    import torch
except ImportError as e:
    required = os.environ.get("FLUX_REQUIRE_INTEROP") or os.environ.get("CI")
    print(f"{'FAIL' if required else 'SKIPPED'}: PyTorch is not importable by {sys.executable} ({e}); "
          "install python3-torch (scripts/deps.sh does)")
    sys.exit(1 if required else 77)


def save_safetensors(path, tensors):
    codes = {torch.float32: "F32", torch.int64: "I64"}
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        data = t.numpy().tobytes()
        header[name] = {"dtype": codes[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def case(name, bn, shapes):
    """Two training steps, an eval step and a training-mode gradient of sum(y * r)."""
    g = torch.Generator().manual_seed(len(name))
    c = bn.num_features
    with torch.no_grad():
        bn.weight.copy_(torch.rand(c, generator=g) + 0.5)
        bn.bias.copy_(torch.rand(c, generator=g) - 0.5)
    out = {"weight": bn.weight.detach().clone(), "bias": bn.bias.detach().clone()}
    x1 = torch.randn(*shapes[0], generator=g) * 2 + 1
    x2 = torch.randn(*shapes[1], generator=g) * 0.5 - 1
    x3 = torch.randn(*shapes[2], generator=g)
    r = torch.randn(*shapes[0], generator=g)
    fresh = type(bn)(c, momentum=bn.momentum, eps=bn.eps)
    fresh.load_state_dict(bn.state_dict())
    bn.train()
    out["y1"] = bn(x1).detach()
    out["y2"] = bn(x2).detach()
    bn.eval()
    out["y3"] = bn(x3).detach()
    out.update(running_mean=bn.running_mean, running_var=bn.running_var, num_batches_tracked=bn.num_batches_tracked)
    case.states[name] = {k: v.clone() for k, v in bn.state_dict().items()}
    fresh.train()
    xg = x1.clone().requires_grad_(True)
    (fresh(xg) * r).sum().backward()
    out.update(x1=x1, x2=x2, x3=x3, r=r, dx=xg.grad, dweight=fresh.weight.grad, dbias=fresh.bias.grad)
    return {f"{name}.{k}": v for k, v in out.items()}


case.states = {}


def main():
    helper, workdir = sys.argv[1], sys.argv[2]
    os.makedirs(workdir, exist_ok=True)
    tensors = {}
    tensors.update(case("bn2d", torch.nn.BatchNorm2d(3), [(4, 3, 5, 5), (2, 3, 3, 3), (2, 3, 4, 4)]))
    tensors.update(case("bn1d", torch.nn.BatchNorm1d(6, momentum=0.3, eps=1e-3), [(8, 6), (5, 6), (3, 6)]))
    path = os.path.join(workdir, "batchnorm_torch.safetensors")
    save_safetensors(path, tensors)
    # bn2d's state_dict as PyTorch names it (weight, bias, running_mean, running_var, num_batches_tracked)
    state_path = os.path.join(workdir, "batchnorm2d_state.safetensors")
    save_safetensors(state_path, case.states["bn2d"])
    print(f"PyTorch {torch.__version__} wrote {path} and {state_path}")
    sys.exit(subprocess.run([helper, path, state_path]).returncode)


if __name__ == "__main__":
    main()
