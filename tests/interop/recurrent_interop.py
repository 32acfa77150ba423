#!/usr/bin/env python3
"""PyTorch's nn.LSTM / nn.GRU / nn.RNN (batch_first=True) and nn.LSTMCell / nn.GRUCell as the oracle for
flux's recurrent layers (a ctest entry; see tests/recurrent_interop.cmake). Each module's state_dict is
written as its own safetensors file (struct + json: Debian has no `safetensors` package); inputs,
initial states, outputs, final states and the gradients of sum(output * r) go to a results file. The
C++ helper loads every state file into the matching flux layer with load() (names unchanged) and
compares on every device.

usage: recurrent_interop.py HELPER WORKDIR   (HELPER: the recurrent_interop executable)
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
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().float()
        data = t.numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def layer_case(name, module, n, t, workdir, results):
    g = torch.Generator().manual_seed(len(name) * 7 + 1)
    with torch.no_grad():  # non-zero biases so that every bias path counts
        for p in module.parameters():
            p.copy_(torch.rand(p.shape, generator=g) * 0.8 - 0.4)
    save_safetensors(os.path.join(workdir, f"{name}_state.safetensors"), module.state_dict())
    layers, hidden = module.num_layers, module.hidden_size
    x = torch.randn(n, t, module.input_size, generator=g).requires_grad_(True)
    h0 = (torch.randn(layers, n, hidden, generator=g) * 0.5).requires_grad_(True)
    out = {"x": x, "h0": h0}
    if isinstance(module, torch.nn.LSTM):
        c0 = (torch.randn(layers, n, hidden, generator=g) * 0.5).requires_grad_(True)
        y, (h_n, c_n) = module(x, (h0, c0))
        out.update(c0=c0, c_n=c_n)
    else:
        y, h_n = module(x, h0)
    r = torch.randn(y.shape, generator=g)
    (y * r).sum().backward()
    out.update(y=y, h_n=h_n, r=r, dx=x.grad, dh0=h0.grad, dweight_hh_l0=module.weight_hh_l0.grad,
               dbias_hh_l0=module.bias_hh_l0.grad, dweight_ih_l0=module.weight_ih_l0.grad)
    if isinstance(module, torch.nn.LSTM):
        out["dc0"] = c0.grad
    results.update({f"{name}.{k}": v for k, v in out.items()})


def cell_case(name, cell, n, workdir, results):
    g = torch.Generator().manual_seed(len(name) * 11 + 3)
    with torch.no_grad():
        for p in cell.parameters():
            p.copy_(torch.rand(p.shape, generator=g) * 0.8 - 0.4)
    save_safetensors(os.path.join(workdir, f"{name}_state.safetensors"), cell.state_dict())
    x = torch.randn(n, cell.input_size, generator=g)
    h = torch.randn(n, cell.hidden_size, generator=g)
    out = {"x": x, "h": h}
    if isinstance(cell, torch.nn.LSTMCell):
        c = torch.randn(n, cell.hidden_size, generator=g)
        h1, c1 = cell(x, (h, c))
        out.update(c=c, h1=h1, c1=c1)
    else:
        out["h1"] = cell(x, h)
    results.update({f"{name}.{k}": v for k, v in out.items()})


def main():
    helper, workdir = sys.argv[1], sys.argv[2]
    os.makedirs(workdir, exist_ok=True)
    results = {}
    layer_case("lstm", torch.nn.LSTM(5, 7, num_layers=2, batch_first=True), 3, 6, workdir, results)
    layer_case("gru", torch.nn.GRU(5, 7, num_layers=2, batch_first=True), 3, 6, workdir, results)
    layer_case("rnn_tanh", torch.nn.RNN(5, 7, num_layers=2, batch_first=True), 3, 6, workdir, results)
    layer_case("rnn_relu", torch.nn.RNN(5, 7, nonlinearity="relu", batch_first=True), 3, 6, workdir, results)
    cell_case("lstm_cell", torch.nn.LSTMCell(4, 6), 3, workdir, results)
    cell_case("gru_cell", torch.nn.GRUCell(4, 6), 3, workdir, results)
    cell_case("rnn_cell", torch.nn.RNNCell(4, 6), 3, workdir, results)
    path = os.path.join(workdir, "recurrent_torch.safetensors")
    save_safetensors(path, results)
    print(f"PyTorch {torch.__version__} wrote {path} and the state files")
    sys.exit(subprocess.run([helper, path, workdir]).returncode)


if __name__ == "__main__":
    main()
