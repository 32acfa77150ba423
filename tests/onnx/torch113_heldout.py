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
    if name == "squeezenet1_0":
        m = torchvision.models.squeezenet1_0(num_classes=10)
        torch.nn.init.normal_(m.classifier[1].weight, 0.0, 0.3)
        return m, (img(64),)
    if name in ("swin_tiny", "swin_v2_tiny"):  # swin_t's (v2: swin_v2_t's) blocks, 2 stages, 4 x 4 windows, shifted
        from torchvision.models import swin_transformer as st
        v2 = {"block": st.SwinTransformerBlockV2, "downsample_layer": st.PatchMergingV2} if name == "swin_v2_tiny" else {}
        return st.SwinTransformer([4, 4], 16, [2, 2], [1, 2], [4, 4], num_classes=10, **v2), (img(32),)
    if name == "maxvit_tiny":  # maxvit_t's blocks, 2 stages of one layer, 2 x 2 partitions
        from torchvision.models.maxvit import MaxVit
        return MaxVit((32, 32), 16, 2, [16, 32], [1, 1], 8, 0.0, num_classes=10), (img(32),)
    if name == "vit_b_16":  # torchvision's vit_b_16 at 64 x 64 (16 patches: image_size is a parameter)
        return torchvision.models.vit_b_16(num_classes=10, image_size=64), (img(64),)
    if name in IMAGE_SIZE or name in ("mobilenet_v3_small", "shufflenet_v2_x0_5", "efficientnet_b0", "regnet_y_400mf", "mnasnet0_5",
                                      "convnext_tiny", "inception_v3"):
        m = getattr(torchvision.models, name)(num_classes=10, **({"aux_logits": False, "init_weights": True} if name == "inception_v3" else {}))
        return m, (img(IMAGE_SIZE.get(name, 75 if name == "inception_v3" else 64)),)
    if name in ("fcn_resnet50", "deeplabv3_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large"):
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
         "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large", "swin_tiny", "swin_v2_tiny",
         "maxvit_tiny"]
# The rest of torchvision's classification and segmentation families, one member each (the others of a
# family differ only in width and depth). The models in LARGE take minutes to export and run on two cores
# (the first three: the operators of squeezenet1_1, mobilenet_v3_small and regnet_y_400mf, whose CI rows
# cover them): not in the default test run, measured once with FLUX_ONNX_LARGE=1 (tests/onnx.cmake,
# onnx_import.large). CI runs swin, swin_v2 and maxvit as small models of torchvision's own blocks.
# Input sizes: the smallest each architecture allows (alexnet and vgg: 224, where their adaptive pooling
# is the identity the exporters can write; maxvit: 224, its partition size 7 at every stage).
IMAGE_SIZE = {"squeezenet1_0": 64, "mobilenet_v3_large": 64, "efficientnet_v2_s": 64, "regnet_x_400mf": 64, "alexnet": 224,
              "vgg11": 224, "vgg11_bn": 224, "resnet50": 64, "resnext50_32x4d": 64, "wide_resnet50_2": 64, "swin_t": 64,
              "swin_v2_t": 64, "maxvit_t": 224}
LARGE = ["squeezenet1_0", "mobilenet_v3_large", "regnet_x_400mf", "alexnet", "vgg11", "vgg11_bn", "resnet50", "resnext50_32x4d",
         "wide_resnet50_2", "efficientnet_v2_s", "vit_b_16", "swin_t", "swin_v2_t", "maxvit_t", "fcn_resnet50", "deeplabv3_resnet50"]
# torch 1.13 cannot export these (its exporter lacks aten::zero_, which swin_v2's attention mask uses).
TORCH113_CANNOT = {"swin_v2_t", "swin_v2_tiny"}


def names_of(args):
    """The models the command line names; "LARGE" stands for that list."""
    out = []
    for a in args:
        out += LARGE if a == "LARGE" else [a]
    return out


def main():
    folder = sys.argv[1]
    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(48)
    for name in names_of(sys.argv[2:]) or NAMES:
        if name in TORCH113_CANNOT:
            print(f"not exported {name}: torch 1.13 cannot export it")
            continue
        if name in LARGE:  # the same weights whether exported alone or with the others
            torch.manual_seed(0)
            gen = torch.Generator().manual_seed(48)
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
