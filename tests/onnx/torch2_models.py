"""Exports the README's coverage models with today's PyTorch (2.x, PyPI; tests/onnx/ensure_torch2_venv.sh)
by both of its exporters, for onnx_compare (tests/onnx.cmake, onnx_import.torch2):
DIR/dynamo/NAME.onnx (torch.onnx.export(..., dynamo=True), onnxscript; opset 18+, IR 10, large weights in
NAME.onnx.data) and DIR/torchscript/NAME.onnx (dynamo=False, the TorchScript exporter), each beside a
NAME.safetensors holding input.K, PyTorch's output.K, seed_grad and output_after_step.0 (the output after
one SGD step, lr 0.01, on sum(output * seed_grad)), as tests/onnx/torch113_heldout.py writes them.
ONNX Runtime runs every file too; its largest difference from PyTorch is printed beside the export.

    torch2_models.py DIR [NAME...]

Files already in DIR that were written by the same scripts and torch version are kept (NAME.key):
exporting all models by both exporters takes minutes on two cores."""
import hashlib
import os
import sys
import warnings

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import torch113_heldout as heldout  # noqa: E402
from torch_models import randomise_batchnorm, save_safetensors  # noqa: E402


class MLP(torch.nn.Module):
    """Linear, GELU (exact or tanh), Linear: the Gelu node of opset 20."""

    def __init__(self, approximate):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(approximate=approximate), torch.nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


class AudioClassifier(torch.nn.Module):
    """Conv1d stack on a (N, 1, samples) waveform, global average, linear head."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Conv1d(1, 8, 9, stride=4, padding=4), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                                       torch.nn.Conv1d(8, 16, 5, stride=2, padding=2), torch.nn.ReLU(),
                                       torch.nn.AdaptiveAvgPool1d(1), torch.nn.Flatten(), torch.nn.Linear(16, 5))

    def forward(self, x):
        return self.net(x)


class SDPABlock(torch.nn.Module):
    """A GPT block with F.scaled_dot_product_attention(is_causal=True) and tanh GELU."""

    def __init__(self, d=16, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(4 * d, d))

    def forward(self, x):
        n, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(n, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(n, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class LSTMTagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 8)
        self.rnn = torch.nn.LSTM(8, 12, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(12, 5)

    def forward(self, tokens):
        return self.head(self.rnn(self.emb(tokens))[0])


class Seq2Seq(heldout.Seq2Seq):
    """torch113_heldout's nn.Transformer, saying that its mask is causal (tgt_is_causal, from torch 2.0):
    without it nn.Transformer compares the mask with a causal one, which torch.export cannot trace.
    The same for nn.TransformerDecoder below."""

    def forward(self, src, tgt):
        mask = self.t.generate_square_subsequent_mask(tgt.size(1))
        return self.t(src, tgt, tgt_mask=mask, tgt_is_causal=True)


class Decoder(heldout.Decoder):
    def forward(self, tgt, memory):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(tgt.size(1))
        return self.dec(tgt, memory, tgt_mask=mask, tgt_is_causal=True)


def build(name, gen):
    img = lambda s: torch.rand(2, 3, s, s, generator=gen)
    if name in ("resnet18", "mobilenet_v2"):
        import torchvision
        return getattr(torchvision.models, name)(num_classes=10), (img(64),)
    if name == "transformer_encoder_prenorm":
        layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=True)
        return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), (torch.rand(2, 5, 16, generator=gen),)
    if name == "gpt_sdpa":
        return SDPABlock(), (torch.rand(2, 6, 16, generator=gen),)
    if name == "lstm_tagger":
        return LSTMTagger(), (torch.randint(0, 20, (2, 7), generator=gen),)
    if name in ("mlp_gelu", "mlp_gelu_tanh"):
        return MLP("none" if name == "mlp_gelu" else "tanh"), (torch.rand(3, 12, generator=gen),)
    if name == "audio_conv1d":
        m = AudioClassifier()
        bn = m.net[1]
        with torch.no_grad():  # random statistics, as randomise_batchnorm gives the 2-d ones
            bn.running_mean.copy_(torch.rand(8, generator=gen) * 0.2 - 0.1)
            bn.running_var.copy_(torch.rand(8, generator=gen) + 0.5)
        return m, (torch.rand(2, 1, 400, generator=gen),)
    if name in ("transformer", "transformer_decoder"):
        m, xs = heldout.build(name, gen)
        causal = Seq2Seq() if name == "transformer" else Decoder()
        causal.load_state_dict(m.state_dict())
        return causal, xs
    return heldout.build(name, gen)


NAMES = ["resnet18", "mobilenet_v2", "transformer_encoder_prenorm", "gpt_sdpa", "lstm_tagger", "mlp_gelu", "mlp_gelu_tanh",
         "audio_conv1d"] + heldout.NAMES
EXPORTERS = ("dynamo", "torchscript")


def key_of(name):
    """What the exported files depend on: these scripts, the model's name and torch's version."""
    h = hashlib.sha256(f"{name} {torch.__version__}".encode())
    here = os.path.dirname(os.path.abspath(__file__))
    for f in ("torch2_models.py", "torch113_heldout.py", "torch_models.py"):
        with open(os.path.join(here, f), "rb") as src:
            h.update(src.read())
    return h.hexdigest()


def export(model, xs, path, exporter):
    names = [f"input_{i}" for i in range(len(xs))]
    for p in (path, path + ".data"):
        if os.path.exists(p):
            os.remove(p)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            batch = torch.export.Dim("batch", min=1, max=1024)
            program = torch.onnx.export(model, xs, dynamo=True, input_names=names, output_names=["output"],
                                        dynamic_shapes=tuple({0: batch} for _ in xs), verbose=False)
            program.save(path, external_data=True)
        else:
            torch.onnx.export(model, xs, path, dynamo=False, input_names=names, output_names=["output"],
                              dynamic_axes={n: {0: "batch"} for n in names + ["output"]})


def export_all(folder, name):
    """Both exporters' files of one model (those not already there); returns the lines to print and
    whether every export succeeded."""
    import onnx
    import onnxruntime as ort
    torch.set_num_threads(1)  # one model per core
    key = key_of(name)
    todo = [e for e in EXPORTERS if not os.path.exists(os.path.join(folder, e, name + ".key"))
            or open(os.path.join(folder, e, name + ".key")).read() != key]
    if not todo:
        return [f"{name}: kept from an earlier run"], True
    # The same model, weights and inputs for both exporters (seeded by the name).
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(int(hashlib.sha256(name.encode()).hexdigest()[:8], 16))
    model, xs = build(name, gen)
    with torch.no_grad():  # as torch113_heldout.py: no two weights equal; random BatchNorm statistics
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    randomise_batchnorm(model, gen)
    model.eval()
    with torch.no_grad():
        y = model(*xs)
    tensors_of = lambda: list(model.parameters()) + list(model.buffers())
    saved = [t.detach().clone() for t in tensors_of()]  # (load_state_dict needs torchvision's metadata)
    tensors = {f"input.{i}": x for i, x in enumerate(xs)}
    tensors["output.0"] = y
    # The seed gradient is scaled by the output's size so that the step stays small where random
    # BatchNorm statistics make outputs large (resnet18: ~5e3, which lr 0.01 would blow up).
    w = torch.rand(y.shape, generator=gen) / max(1.0, float(y.abs().max())) ** 2
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    opt.zero_grad()
    (model(*xs) * w).sum().backward()
    opt.step()
    with torch.no_grad():
        tensors["seed_grad"], tensors["output_after_step.0"] = w, model(*xs)
    with torch.no_grad():
        for t, v in zip(tensors_of(), saved):
            t.copy_(v)
    lines, ok = [], True
    for exporter in todo:
        out = os.path.join(folder, exporter)
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, name + ".onnx")
        try:
            export(model, xs, path, exporter)
        except Exception as e:  # noqa: BLE001  (reported, and the run fails)
            lines.append(f"EXPORT FAILED {exporter} {name}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            ok = False
            continue
        save_safetensors(os.path.join(out, name + ".safetensors"), tensors)
        m = onnx.load(path, load_external_data=False)
        opset = max(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
        ops = sorted({n.op_type for n in m.graph.node})
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        got = sess.run(None, {i.name: x.numpy() for i, x in zip(sess.get_inputs(), xs)})[0]
        err = float(np.abs(got - y.numpy()).max())
        lines.append(f"{exporter} {name}: opset {opset}, IR {m.ir_version}, output {tuple(y.shape)}, ONNX Runtime vs "
                     f"PyTorch {err:.2g}; ops {' '.join(ops)}")
        with open(os.path.join(out, name + ".key"), "w") as f:
            f.write(key)
    return lines, ok


def main():
    folder = sys.argv[1]
    names = heldout.names_of(sys.argv[2:]) or NAMES
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    import onnx
    import onnxruntime as ort
    print(f"torch {torch.__version__}, onnx {onnx.__version__}, onnxruntime {ort.__version__}", flush=True)
    # Exporting is mostly single-threaded Python: one process per core (two on CI's machines).
    workers = max(1, min(len(names), os.cpu_count() or 1, 4))
    ok = True
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for lines, done in pool.map(export_all, [folder] * len(names), names):
            print("\n".join(lines), flush=True)
            ok = ok and done
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
