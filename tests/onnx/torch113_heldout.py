"""Exports held-out models with Debian's torch 1.13 at opset 17 (weights random, nothing downloaded)
for onnx_compare (tests/onnx.cmake, onnx_import.torch113): DIR/NAME.onnx and DIR/NAME.safetensors
holding input.K and PyTorch's output.K, and output_after_step.0: the output after one SGD step (lr 0.01) on
sum(output * seed_grad).

    torch113_heldout.py DIR [NAME...]

torchvision squeezenet1_1 and googlenet (MaxPool ceil_mode), densenet121 (Pad + AveragePool), a
convolutional autoencoder (ConvTranspose), a U-Net with nn.Upsample nearest and F.interpolate bilinear
(Resize), a bidirectional GRU tagger, nn.Transformer with a causal mask from the target's length (Trilu),
and a bidirectional 2-layer LSTM."""
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    import torchvision
except ImportError as e:
    print(f"SKIPPED: {e} (scripts/deps.sh interop: python3-torch python3-torchvision)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
from torch_models import randomise_batchnorm, save_safetensors  # noqa: E402


class AutoEncoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU(),
                                       torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), torch.nn.ReLU())
        self.dec = torch.nn.Sequential(torch.nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1), torch.nn.ReLU(),
                                       torch.nn.ConvTranspose2d(8, 3, 4, stride=2, padding=1), torch.nn.Sigmoid())

    def forward(self, x):
        return self.dec(self.enc(x))


class UNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        block = lambda i, o: torch.nn.Sequential(torch.nn.Conv2d(i, o, 3, padding=1), torch.nn.BatchNorm2d(o), torch.nn.ReLU())
        self.d1, self.d2, self.d3 = block(3, 8), block(8, 16), block(16, 32)
        self.up = torch.nn.Upsample(scale_factor=2, mode="nearest")
        self.u2, self.u1 = block(32 + 16, 16), block(16 + 8, 8)
        self.head = torch.nn.Conv2d(8, 2, 1)

    def forward(self, x):
        a = self.d1(x)
        b = self.d2(F.max_pool2d(a, 2))
        c = self.d3(F.max_pool2d(b, 2))
        b = self.u2(torch.cat([self.up(c), b], 1))
        a = self.u1(torch.cat([F.interpolate(b, scale_factor=2, mode="bilinear", align_corners=False), a], 1))
        return self.head(a)


class Tagger(torch.nn.Module):
    def __init__(self, rnn, hidden):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 8)
        self.rnn = rnn
        self.head = torch.nn.Linear(2 * hidden, 5)

    def forward(self, tokens):
        y, _ = self.rnn(self.emb(tokens))
        return self.head(y)


class Seq2Seq(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.t = torch.nn.Transformer(d_model=16, nhead=4, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=32,
                                      dropout=0.0, batch_first=True)

    def forward(self, src, tgt):
        mask = self.t.generate_square_subsequent_mask(tgt.size(1))
        return self.t(src, tgt, tgt_mask=mask)


def build(name, gen):
    img = lambda s: torch.rand(2, 3, s, s, generator=gen)
    if name == "squeezenet1_1":
        m = torchvision.models.squeezenet1_1(num_classes=10)
        torch.nn.init.normal_(m.classifier[1].weight, 0.0, 0.3)  # torchvision's 0.01 leaves every output 0 after ReLU
        return m, (img(64),)
    if name == "googlenet":
        return torchvision.models.googlenet(num_classes=10, aux_logits=False, init_weights=True), (img(64),)
    if name == "densenet121":
        return torchvision.models.densenet121(num_classes=10), (img(64),)
    if name == "autoencoder":
        return AutoEncoder(), (img(32),)
    if name == "unet":
        return UNet(), (img(32),)
    if name == "gru_tagger":
        return Tagger(torch.nn.GRU(8, 12, batch_first=True, bidirectional=True), 12), (torch.randint(0, 20, (2, 7), generator=gen),)
    if name == "lstm_bidirectional":
        return Tagger(torch.nn.LSTM(8, 12, num_layers=2, batch_first=True, bidirectional=True), 12), (torch.randint(0, 20, (2, 7), generator=gen),)
    if name == "transformer":
        return Seq2Seq(), (torch.rand(2, 6, 16, generator=gen), torch.rand(2, 5, 16, generator=gen))
    raise SystemExit(f"unknown model {name}")


NAMES = ["squeezenet1_1", "googlenet", "densenet121", "autoencoder", "unet", "gru_tagger", "lstm_bidirectional", "transformer"]


def main():
    folder = sys.argv[1]
    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(48)
    for name in sys.argv[2:] or NAMES:
        model, xs = build(name, gen)
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                randomise_batchnorm(torch.nn.Sequential(m), gen)
        # Trained weights are never equal; fresh ones are (LayerNorm ones, zero biases), and the exporter
        # would merge equal initialisers into one tensor, which trains differently.
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
        model.eval()
        with torch.no_grad():
            y = model(*xs)
        path = os.path.join(folder, name + ".onnx")
        names = [f"input_{i}" for i in range(len(xs))]
        torch.onnx.export(model, xs, path, opset_version=17, input_names=names, output_names=["output"],
                          dynamic_axes={n: {0: "batch"} for n in names + ["output"]})
        tensors = {f"input.{i}": x for i, x in enumerate(xs)}
        tensors["output.0"] = y
        # One SGD step (lr 0.01, eval mode) on sum(y * seed_grad): the output after it, for the
        # importer's fine-tuning check (names need not match: the exporter renames and folds).
        w = torch.rand(y.shape, generator=gen)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        opt.zero_grad()
        (model(*xs) * w).sum().backward()
        opt.step()
        with torch.no_grad():
            tensors["seed_grad"], tensors["output_after_step.0"] = w, model(*xs)
        save_safetensors(os.path.join(folder, name + ".safetensors"), tensors)
        import onnx
        ops = sorted({n.op_type for n in onnx.load(path).graph.node})
        print(f"exported {name}: output {tuple(y.shape)}, ops {' '.join(ops)}")


if __name__ == "__main__":
    main()
