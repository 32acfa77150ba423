"""Exports PyTorch models to ONNX (opset 17) for flux-cpp's importer (tests/onnx.cmake, onnx_import.*).

    torch_models.py DIR [NAME...]

Runs under Debian's python3-torch / python3-torchvision (system Python). For each model: DIR/NAME.onnx
(torch.onnx.export, eval mode, dynamic batch axis) and DIR/NAME.safetensors with the input x, PyTorch's
output y and, for resnet18, the parameters after one SGD step (lr 0.1) on the loss sum(y * w) where
w = the tensor "seed_grad" (so the importer can check its fine-tuning step). Models: torchvision
resnet18 and mobilenet_v2 (random init; BatchNorm statistics randomised), a 2-layer LSTM, a GRU, and a
2-layer TransformerEncoder (batch_first, dropout 0), and the same with activation="gelu" (PyTorch's exact
GELU: torch 1.13 writes Div/Erf/Add/Mul/Mul)."""
import json
import os
import struct
import sys

try:
    import numpy as np
    import torch
    import torchvision
except ImportError as e:
    print(f"SKIPPED: {e} (scripts/deps.sh interop: python3-torch python3-torchvision)")
    sys.exit(77)

NAMES = {np.dtype("float32"): "F32", np.dtype("int64"): "I64"}


def save_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        a = np.ascontiguousarray(t.detach().cpu().numpy() if torch.is_tensor(t) else t)
        b = a.tobytes()
        header[name] = {"dtype": NAMES[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def randomise_batchnorm(model, gen):
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=gen) * 0.2 - 0.1)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)
            m.weight.data.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
            m.bias.data.copy_(torch.rand(m.bias.shape, generator=gen) * 0.2 - 0.1)


class SeqModel(torch.nn.Module):
    """A recurrent layer (batch_first) then a linear head on every step: (N, T, I) -> (N, T, 4)."""

    def __init__(self, rnn, hidden):
        super().__init__()
        self.rnn = rnn
        self.head = torch.nn.Linear(hidden, 4)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.head(y)


def build(name, gen):
    if name == "resnet18":
        m = torchvision.models.resnet18(num_classes=10)
        randomise_batchnorm(m, gen)
        return m, torch.rand(2, 3, 64, 64, generator=gen)
    if name == "mobilenet_v2":
        m = torchvision.models.mobilenet_v2(num_classes=10)
        randomise_batchnorm(m, gen)
        return m, torch.rand(2, 3, 64, 64, generator=gen)
    if name == "lstm":
        return SeqModel(torch.nn.LSTM(6, 16, num_layers=2, batch_first=True), 16), torch.rand(2, 5, 6, generator=gen)
    if name == "gru":
        return SeqModel(torch.nn.GRU(6, 16, batch_first=True), 16), torch.rand(2, 5, 6, generator=gen)
    if name == "transformer":
        layer = torch.nn.TransformerEncoderLayer(d_model=16, nhead=4, dim_feedforward=32, dropout=0.0, batch_first=True)
        return torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False), torch.rand(2, 5, 16, generator=gen)
    if name == "transformer_gelu":
        layer = torch.nn.TransformerEncoderLayer(d_model=16, nhead=4, dim_feedforward=32, dropout=0.0, batch_first=True,
                                                 activation="gelu")
        return torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False), torch.rand(2, 5, 16, generator=gen)
    raise SystemExit(f"unknown model {name}")


def main():
    folder = sys.argv[1]
    names = sys.argv[2:] or ["resnet18", "mobilenet_v2", "lstm", "gru", "transformer", "transformer_gelu"]
    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(38)
    for name in names:
        model, x = build(name, gen)
        model.eval()
        with torch.no_grad():
            y = model(x)
        path = os.path.join(folder, name + ".onnx")
        # resnet18 keeps its BatchNorms and torch's parameter names (TrainingMode.PRESERVE of an eval model),
        # so that the fine-tuning step can be compared by name; the others take the default export
        # (eval: BatchNorm folded into the convolutions, initialisers named "onnx::Conv_...").
        mode = torch.onnx.TrainingMode.PRESERVE if name == "resnet18" else torch.onnx.TrainingMode.EVAL
        torch.onnx.export(model, (x,), path, opset_version=17, input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}}, training=mode)
        tensors = {"x": x, "y": y}
        if name == "resnet18":
            # One SGD step in eval mode (BatchNorm statistics fixed, as flux's imported model runs them).
            w = torch.rand(y.shape, generator=gen)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            opt.zero_grad()
            (model(x) * w).sum().backward()
            opt.step()
            tensors["seed_grad"] = w
            for pname, p in model.named_parameters():
                tensors["after." + pname] = p
        save_safetensors(os.path.join(folder, name + ".safetensors"), tensors)
        import onnx
        ops = sorted({n.op_type for n in onnx.load(path).graph.node})
        print(f"exported {name}: output {tuple(y.shape)}, ops {' '.join(ops)}")


if __name__ == "__main__":
    main()
