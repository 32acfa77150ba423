"""Exports held-out models with Debian's torch 1.13 at opset 17 (weights random, nothing downloaded)
for onnx_compare (tests/onnx.cmake, onnx_import.torch113): DIR/NAME.onnx and DIR/NAME.safetensors
holding input.K and PyTorch's output.K, and output_after_step.0: the output after one SGD step (lr 0.01) on
sum(output * seed_grad).

    torch113_heldout.py DIR [NAME...]

torchvision squeezenet1_1 and googlenet (MaxPool ceil_mode), densenet121 (Pad + AveragePool), a
convolutional autoencoder (ConvTranspose), a U-Net with nn.Upsample nearest and F.interpolate bilinear
(Resize), a bidirectional GRU tagger, nn.Transformer with a causal mask from the target's length (Trilu),
a bidirectional 2-layer LSTM, GPT- and BERT-style blocks and nn.TransformerDecoder written in torch.nn, a
small VisionTransformer, and more of torchvision's classification and segmentation architectures."""
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


class GPTBlock(torch.nn.Module):
    """A pre-norm decoder-only block written in torch.nn: causal self-attention from the input's length."""

    def __init__(self, d=16, heads=4):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x):
        t = x.size(1)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)  # True = masked (PyTorch's)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class BERTBlock(torch.nn.Module):
    """Token and position embeddings, a post-norm TransformerEncoder with GELU, a pooled classifier."""

    def __init__(self, vocab=30, d=16):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(64, d)
        layer = torch.nn.TransformerEncoderLayer(d, 4, 32, dropout=0.0, activation="gelu", batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d, 3)

    def forward(self, tokens):
        pos = torch.arange(tokens.size(1)).unsqueeze(0)
        return self.head(torch.tanh(self.enc(self.tok(tokens) + self.pos(pos))[:, 0]))


class Decoder(torch.nn.Module):
    def __init__(self, d=16):
        super().__init__()
        layer = torch.nn.TransformerDecoderLayer(d, 4, 32, dropout=0.0, batch_first=True)
        self.dec = torch.nn.TransformerDecoder(layer, 2)

    def forward(self, tgt, memory):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(tgt.size(1))
        return self.dec(tgt, memory, tgt_mask=mask)


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
    if name == "gpt_block":
        return GPTBlock(), (torch.rand(2, 6, 16, generator=gen),)
    if name == "bert_block":
        return BERTBlock(), (torch.randint(0, 30, (2, 7), generator=gen),)
    if name == "transformer_decoder":
        return Decoder(), (torch.rand(2, 5, 16, generator=gen), torch.rand(2, 6, 16, generator=gen))
    if name == "vit_small":
        return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
                                                    mlp_dim=64, num_classes=10), (img(32),)
    if name in ("mobilenet_v3_small", "shufflenet_v2_x0_5", "efficientnet_b0", "regnet_y_400mf", "mnasnet0_5", "convnext_tiny",
                "resnext50_32x4d", "wide_resnet50_2", "inception_v3"):
        m = getattr(torchvision.models, name)(num_classes=10, **({"aux_logits": False, "init_weights": True} if name == "inception_v3" else {}))
        return m, (img(75 if name == "inception_v3" else 64),)
    if name in ("fcn_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large"):
        m = getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None, num_classes=3, aux_loss=False)
        return SegOut(m), (img(64),)
    raise SystemExit(f"unknown model {name}")


class SegOut(torch.nn.Module):
    """torchvision's segmentation models return a dict; the "out" map."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x)["out"]


NAMES = ["squeezenet1_1", "googlenet", "densenet121", "autoencoder", "unet", "gru_tagger", "lstm_bidirectional", "transformer",
         "gpt_block", "bert_block", "transformer_decoder", "vit_small", "mobilenet_v3_small", "shufflenet_v2_x0_5",
         "efficientnet_b0", "regnet_y_400mf", "mnasnet0_5", "convnext_tiny", "inception_v3",
         "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large"]
# Measured once, not in CI (the operators of resnet18 and the U-Net, many times the time): resnext50_32x4d,
# wide_resnet50_2, fcn_resnet50.


def main():
    folder = sys.argv[1]
    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(48)
    for name in sys.argv[2:] or NAMES:
        model, xs = build(name, gen)
        # Trained weights are never equal; fresh ones are (LayerNorm ones, zero biases), and the exporter
        # would merge equal initialisers into one tensor, which trains differently.
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
        # Random BatchNorm statistics (as tests/onnx/torch_models.py): statistics measured on data make the
        # exporter's folded convolutions ill-conditioned in float32 (ONNX Runtime then differs from
        # PyTorch by ~1e-4 of the output on googlenet and inception_v3, as flux does).
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                randomise_batchnorm(torch.nn.Sequential(m), gen)
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
