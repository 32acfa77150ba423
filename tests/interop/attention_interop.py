#!/usr/bin/env python3
"""PyTorch's nn.MultiheadAttention(batch_first=True) and nn.LayerNorm as the oracles for flux's
MultiHeadAttention and LayerNorm (a ctest entry; see tests/attention_interop.cmake). PyTorch writes
its state_dicts unchanged (in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias; weight,
bias) and the outputs of self-attention (no mask, causal), cross-attention with a key mask, and
LayerNorm, plus the input gradient of sum(y * r) for the causal case; with kdim/vdim (q_proj_weight,
k_proj_weight, v_proj_weight) and with bias=False, the outputs and per-head attention weights (Flux's
α, average_attn_weights=False); the C++ helper loads the
states with load() and compares on every test device (<= 1e-5 relative).

usage: attention_interop.py HELPER WORKDIR   (HELPER: the attention_interop executable)
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
    codes = {torch.float32: "F32", torch.int64: "I64", torch.bool: "BOOL"}
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


def main():
    helper, workdir = sys.argv[1], sys.argv[2]
    os.makedirs(workdir, exist_ok=True)
    torch.manual_seed(12)
    dim, heads, n, t, tk = 16, 4, 3, 7, 5
    mha = torch.nn.MultiheadAttention(dim, heads, batch_first=True)
    ln = torch.nn.LayerNorm(dim)
    with torch.no_grad():  # non-trivial biases and affine parameters
        mha.in_proj_bias.uniform_(-0.5, 0.5)
        mha.out_proj.bias.uniform_(-0.5, 0.5)
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-0.5, 0.5)
    mha.eval()
    x = torch.randn(n, t, dim)
    kv = torch.randn(n, tk, dim)
    r = torch.randn(n, t, dim)
    # PyTorch's Bool masks: True = NOT allowed (the negation of flux's)
    causal = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    key_padding = torch.zeros(n, tk, dtype=torch.bool)
    key_padding[0, 3:] = True
    key_padding[2, 0] = True
    out = {"x": x, "kv": kv, "r": r, "key_padding": key_padding}
    out["y_self"] = mha(x, x, x, need_weights=False)[0]
    xg = x.clone().requires_grad_(True)
    y_causal = mha(xg, xg, xg, attn_mask=causal, need_weights=False)[0]
    (y_causal * r).sum().backward()
    out["y_causal"], out["dx_causal"] = y_causal, xg.grad
    out["y_cross"] = mha(x, kv, kv, key_padding_mask=key_padding, need_weights=False)[0]
    out["y_layernorm"] = ln(x)
    # kdim/vdim (separate q/k/v_proj_weight) cross-attention, and bias=False; per-head weights (α).
    kdim, vdim = 6, 10
    mha_kv = torch.nn.MultiheadAttention(dim, heads, batch_first=True, kdim=kdim, vdim=vdim)
    mha_nobias = torch.nn.MultiheadAttention(dim, heads, batch_first=True, bias=False)
    with torch.no_grad():
        mha_kv.in_proj_bias.uniform_(-0.5, 0.5)
        mha_kv.out_proj.bias.uniform_(-0.5, 0.5)
    mha_kv.eval()
    mha_nobias.eval()
    keys, values = torch.randn(n, tk, kdim), torch.randn(n, tk, vdim)
    out["keys"], out["values"] = keys, values
    out["y_kdim"], out["scores_kdim"] = mha_kv(x, keys, values, key_padding_mask=key_padding, average_attn_weights=False)
    out["y_nobias"], out["scores_nobias"] = mha_nobias(x, x, x, attn_mask=causal, average_attn_weights=False)
    save_safetensors(os.path.join(workdir, "attention_io.safetensors"), out)
    save_safetensors(os.path.join(workdir, "mha_state.safetensors"), dict(mha.state_dict()))
    save_safetensors(os.path.join(workdir, "layernorm_state.safetensors"), dict(ln.state_dict()))
    save_safetensors(os.path.join(workdir, "mha_kdim_state.safetensors"), dict(mha_kv.state_dict()))
    save_safetensors(os.path.join(workdir, "mha_nobias_state.safetensors"), dict(mha_nobias.state_dict()))
    print(f"kdim={kdim}, vdim={vdim} state {sorted(mha_kv.state_dict())}; bias=False state {sorted(mha_nobias.state_dict())}")
    print(f"PyTorch {torch.__version__}: MultiheadAttention({dim}, {heads}, batch_first=True) state "
          f"{sorted(mha.state_dict())}, LayerNorm({dim}) state {sorted(ln.state_dict())}")
    sys.exit(subprocess.run([helper, workdir]).returncode)


if __name__ == "__main__":
    main()
