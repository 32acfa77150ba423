#!/usr/bin/env python3
"""The cases of torch_bench.cpp, written as a PyTorch 2.x (eager, Python) user writes them.

Usage: torch_bench.py CASE [THREADS] [--autocast=bf16|f16]
  CASE: seed | mnist | mnist_converged | wide | overhead | infer | lenet | fmnist | resnet | resnet_train |
        lstm | lstm_converged | transformer | encoder | decoder | versions
--autocast: mnist, infer, resnet, resnet_train, encoder and decoder run under torch.autocast("cpu", dtype) (training:
forward and loss inside it, backward and the Adam step outside, as PyTorch's recipe; inference: the forward).
The *_converged cases time the same steps after bench_common.hpp's k*ConvergeSteps steps of training.
Prints "key value" lines for bench/run_bench.py, the same keys as flux_bench and torch_bench. Runs in
the virtual environment that scripts/bench makes (PyPI's torch), never in the system Python.
Shapes, batch sizes, optimiser, warm-up and timed seconds are those of torch_bench.cpp and
bench_common.hpp; timing follows bench::rate (wall clock) and bench::rate_cpu (thread CPU time).
"""
import contextlib
import resource
import sys
import time

import torch
from torch import nn
import torch.nn.functional as F

CNN_BATCH = 128  # bench::kCnnBatch
RESNET_SIZE = 112  # bench::kResnetSize
# bench_common.hpp's sequence cases: batch, window, vocabulary, LSTM hidden, model dim, heads, parameters.
SEQ_BATCH, SEQ_LEN, VOCAB, LSTM_HIDDEN, MODEL_DIM, HEADS = 32, 64, 62, 256, 64, 4
LSTM_PARAMETERS, TRANSFORMER_PARAMETERS = 343_614, 112_190
# bench_common.hpp's mixed-precision rows: ResNet-18 training batch; the encoder's batch, length, dim,
# layers, heads, FFN width and parameter count.
RESNET_TRAIN_BATCH = 32
ENC_BATCH, ENC_LEN, ENC_DIM, ENC_LAYERS, ENC_HEADS, ENC_FFN = 16, 128, 256, 4, 4, 1024
ENC_PARAMETERS = ENC_LAYERS * (4 * ENC_DIM * ENC_DIM + 8 * ENC_DIM + 2 * ENC_DIM * ENC_FFN + ENC_FFN + ENC_DIM) + 2 * ENC_DIM
# bench_common.hpp's decoder row: batch, length, dim, layers, heads, FFN width and parameter count.
DEC_BATCH, DEC_LEN, DEC_DIM, DEC_LAYERS, DEC_HEADS, DEC_FFN = 4, 512, 768, 4, 12, 3072
DEC_PARAMETERS = DEC_LAYERS * (4 * DEC_DIM * DEC_DIM + 8 * DEC_DIM + 2 * DEC_DIM * DEC_FFN + DEC_FFN + DEC_DIM) + 2 * DEC_DIM
AUTOCAST = None  # --autocast=bf16|f16: the low dtype of torch.autocast("cpu", ...); None: float32


def amp():
    """torch.autocast("cpu", AUTOCAST) when --autocast is given, else nothing."""
    return torch.autocast("cpu", dtype=AUTOCAST) if AUTOCAST is not None else contextlib.nullcontext()


# bench::kMnistConvergeSteps, bench::kLstmConvergeSteps: training steps before the converged rows' timing.
MNIST_CONVERGE_STEPS, LSTM_CONVERGE_STEPS = 1000, 300


def rate(f, seconds, batch=1):
    """Calls f in batches until `seconds` of wall time have passed; calls per second (bench::rate)."""
    sink = 0.0
    t0 = time.perf_counter()
    calls = 0
    while True:
        for _ in range(batch):
            sink += float(f())
        calls += batch
        if time.perf_counter() - t0 >= seconds:
            break
    return calls / (time.perf_counter() - t0)


def rate_cpu(f, seconds, batch=1):
    """The same, counting this thread's CPU time (bench::rate_cpu)."""
    t0 = time.thread_time()
    calls = 0
    while True:
        for _ in range(batch):
            f()
        calls += batch
        if time.thread_time() - t0 >= seconds:
            break
    return calls / (time.thread_time() - t0)


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def train_steps_per_s(model, x, y, loss, warmup, seconds):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)  # PyTorch's default implementation choice

    def step():
        opt.zero_grad()
        with amp():
            l = loss(model(x), y)
        l.backward()
        opt.step()
        return l.item()

    for _ in range(warmup):
        step()
    # Also the process's CPU time per step (all threads), as flux_bench's train_cpu_ms_per_step.
    c0, t0 = time.process_time(), time.perf_counter()
    r = rate(step, seconds)
    print(f"train_cpu_ms_per_step {1e3 * (time.process_time() - c0) / (r * (time.perf_counter() - t0)):.6g}")
    return r


def class_targets(batch):
    return (torch.arange(batch, dtype=torch.long) * 7) % 10  # class i*7 % 10, as flux's one-hot


def mlp(*dims):
    layers = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i + 2 < len(dims):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def wide_step_flops():
    """bench::wide_step_flops: 3 forward, 3 weight-gradient and 2 input-gradient GEMMs, batch 256."""
    b, dims, f = 256, [1024, 4096, 4096, 1024], 0.0
    for l in range(3):
        f += 2.0 * b * dims[l] * dims[l + 1] * (3 if l > 0 else 2)
    return f


def seed_case():
    model = mlp(10, 64, 1)
    x, y = torch.rand(64, 10), torch.rand(64, 1)
    print(f"seed_steps_per_s {train_steps_per_s(model, x, y, F.mse_loss, 50, 1.0):.6g}")


def mnist_case(pretrain=0):
    model = mlp(784, 512, 512, 10)
    x, y = torch.rand(128, 784), class_targets(128)
    key = "mnist_converged_steps_per_s" if pretrain else "mnist_steps_per_s"
    print(f"{key} {train_steps_per_s(model, x, y, F.cross_entropy, pretrain or 5, 1.5):.6g}")


def wide_case():
    model = mlp(1024, 4096, 4096, 1024)
    x, y = torch.rand(256, 1024), torch.rand(256, 1024)
    r = train_steps_per_s(model, x, y, F.mse_loss, 1, 2.5)
    print(f"wide_steps_per_s {r:.6g}\nwide_gflops {r * wide_step_flops() * 1e-9:.6g}")
    print(f"peak_rss_mb {peak_rss_mb():.6g}")


def overhead_case():
    a, b = torch.rand(16), torch.rand(16)
    print(f"add16_us {1e6 / rate_cpu(lambda: torch.add(a, b), 0.5, 1000):.6g}")
    d = nn.Linear(16, 16)
    x = torch.rand(16, 16)

    def fwd_bwd():
        d(x).sum().backward()

    for _ in range(100):
        fwd_bwd()
    print(f"dense16_us {1e6 / rate_cpu(fwd_bwd, 0.5, 100):.6g}")


def infer_case():
    model = mlp(784, 512, 512, 10)
    with torch.no_grad(), amp():
        for batch in (1, 128):
            x = torch.rand(batch, 784)

            def run():
                model(x)
                return 0.0

            for _ in range(20):
                run()
            print(f"infer{batch}_us {1e6 / rate(run, 0.7):.6g}")


def lenet():
    return nn.Sequential(nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(256, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                         nn.Linear(84, 10))


def lenet_case():
    x, y = torch.rand(CNN_BATCH, 1, 28, 28), class_targets(CNN_BATCH)
    print(f"lenet_steps_per_s {train_steps_per_s(lenet(), x, y, F.cross_entropy, 5, 2.0):.6g}")


def fmnist_case():
    model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Dropout(0.25), nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
    model.train()
    x, y = torch.rand(CNN_BATCH, 1, 28, 28), class_targets(CNN_BATCH)
    print(f"fmnist_steps_per_s {train_steps_per_s(model, x, y, F.cross_entropy, 3, 2.5):.6g}")


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock, as torch_bench.cpp writes it (torchvision is not installed)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (self.downsample(x) if self.downsample is not None else x))


def resnet18(classes=1000):
    layers = [nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
              nn.MaxPool2d(3, stride=2, padding=1)]
    cin = 64
    for cout in (64, 128, 256, 512):
        layers += [BasicBlock(cin, cout, 1 if cout == 64 else 2), BasicBlock(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


def resnet_case():
    model = resnet18().eval()
    print(f"resnet_hw {RESNET_SIZE}")
    with torch.inference_mode(), amp():
        for batch in (1, 32):
            x = torch.rand(batch, 3, RESNET_SIZE, RESNET_SIZE)

            def run():
                return float(model(x)[0, 0])

            for _ in range(5 if batch == 1 else 2):
                run()
            print(f"resnet{batch}_ms {1e3 / rate(run, 1.5 if batch == 1 else 2.5):.6g}")


def resnet_train_case():
    """ResNet-18 training step (BatchNorm training), batch RESNET_TRAIN_BATCH; peak RSS after the timed steps."""
    model = resnet18().train()
    n = RESNET_TRAIN_BATCH
    x, y = torch.rand(n, 3, RESNET_SIZE, RESNET_SIZE), (torch.arange(n, dtype=torch.long) * 7) % 1000
    print(f"resnet_hw {RESNET_SIZE}\nresnet_train_rss_before_mb {peak_rss_mb():.6g}")
    r = train_steps_per_s(model, x, y, F.cross_entropy, 1, 3.0)
    print(f"resnet_train_ms {1e3 / r:.6g}\nresnet_train_peak_rss_mb {peak_rss_mb():.6g}")


def encoder_case():
    """bench_common.hpp's pre-norm encoder: 4 x TransformerEncoderLayer(norm_first, dropout 0, relu) + LayerNorm on
    x (N, T, D); inference (the forward) and a training step (mse against a target of x's shape, Adam)."""
    layers = [nn.TransformerEncoderLayer(ENC_DIM, ENC_HEADS, ENC_FFN, dropout=0.0, batch_first=True, norm_first=True)
              for _ in range(ENC_LAYERS)]
    model = nn.Sequential(*layers, nn.LayerNorm(ENC_DIM))
    check_parameters("encoder", model, ENC_PARAMETERS)
    x, y = torch.rand(ENC_BATCH, ENC_LEN, ENC_DIM), torch.rand(ENC_BATCH, ENC_LEN, ENC_DIM)
    model.eval()
    try:
        with torch.inference_mode(), amp():
            def run():
                model(x)
                return 0.0

            for _ in range(2):
                run()
            c0, t0 = time.process_time(), time.perf_counter()
            r = rate(run, 2.0)
            calls = r * (time.perf_counter() - t0)
            print(f"encoder_infer_ms {1e3 / r:.6g}\nencoder_infer_cpu_ms {1e3 * (time.process_time() - c0) / calls:.6g}")
    except RuntimeError as e:  # PyTorch 1.13's fused encoder-layer inference rejects autocast's bf16
        print(f"skipped encoder inference: {str(e).splitlines()[0]}", file=sys.stderr)
    model.train()
    print(f"encoder_train_ms {1e3 / train_steps_per_s(model, x, y, F.mse_loss, 1, 3.0):.6g}")


class DecoderBlock(nn.Module):
    """bench_common.hpp's GPT-style pre-norm block: x + proj(sdpa(qkv(LayerNorm(x)), causal)), then
    x + fc2(relu(fc1(LayerNorm(x))))."""

    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DEC_DIM), nn.LayerNorm(DEC_DIM)
        self.qkv, self.proj = nn.Linear(DEC_DIM, 3 * DEC_DIM), nn.Linear(DEC_DIM, DEC_DIM)
        self.fc1, self.fc2 = nn.Linear(DEC_DIM, DEC_FFN), nn.Linear(DEC_FFN, DEC_DIM)

    def forward(self, x):
        n, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(n, t, 3, DEC_HEADS, d // DEC_HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(n, t, d))
        return x + self.fc2(F.relu(self.fc1(self.ln2(x))))


def decoder_case():
    """bench_common.hpp's decoder: 4 causal pre-norm blocks + LayerNorm on x (N, T, D); inference and a
    training step (mse against a target of x's shape, Adam), as the encoder's."""
    model = nn.Sequential(*[DecoderBlock() for _ in range(DEC_LAYERS)], nn.LayerNorm(DEC_DIM))
    check_parameters("decoder", model, DEC_PARAMETERS)
    x, y = torch.rand(DEC_BATCH, DEC_LEN, DEC_DIM), torch.rand(DEC_BATCH, DEC_LEN, DEC_DIM)
    model.eval()
    with torch.inference_mode(), amp():
        def run():
            model(x)
            return 0.0

        run()
        c0, t0 = time.process_time(), time.perf_counter()
        r = rate(run, 3.0)
        calls = r * (time.perf_counter() - t0)
        print(f"decoder_infer_ms {1e3 / r:.6g}\ndecoder_infer_cpu_ms {1e3 * (time.process_time() - c0) / calls:.6g}")
    model.train()
    print(f"decoder_train_ms {1e3 / train_steps_per_s(model, x, y, F.mse_loss, 1, 6.0):.6g}")
    print(f"decoder_peak_rss_mb {peak_rss_mb():.6g}")


def seq_ids(shift):
    """bench::seq_ids: (SEQ_BATCH, SEQ_LEN) symbol ids."""
    i = torch.arange(SEQ_BATCH * SEQ_LEN, dtype=torch.long) + shift
    return ((i * 7 + i // 11) % VOCAB).view(SEQ_BATCH, SEQ_LEN)


def check_parameters(which, model, expected):
    n = sum(p.numel() for p in model.parameters())
    print(f"{which}_parameters {n}")
    if n != expected:
        sys.exit(f"torch_bench.py: the {which} model has {n} parameters, bench_common.hpp says {expected}")


class CharLSTM(nn.Module):
    """One-hot (N, T, V) -> LSTM(V => H, batch_first) -> (N T, H) -> Linear(H => V)."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(VOCAB, LSTM_HIDDEN, batch_first=True)
        self.head = nn.Linear(LSTM_HIDDEN, VOCAB)

    def forward(self, x):
        return self.head(self.lstm(x)[0].reshape(-1, LSTM_HIDDEN))


def lstm_case(pretrain=0):
    model = CharLSTM()
    check_parameters("lstm", model, LSTM_PARAMETERS)
    x = F.one_hot(seq_ids(0), VOCAB).float()
    y = seq_ids(1).reshape(-1)
    key = "lstm_converged_steps_per_s" if pretrain else "lstm_steps_per_s"
    print(f"{key} {train_steps_per_s(model, x, y, F.cross_entropy, pretrain or 3, 2.0):.6g}")


class Block(nn.Module):
    """Pre-norm block, batch-first: x + MHA(LN(x)) causal, then x + Linear(4D => D)(gelu_tanh(Linear(D => 4D)(LN(x))))."""

    def __init__(self, d):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, HEADS, batch_first=True)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, mask):
        a = self.ln1(x)
        x = x + self.attn(a, a, a, need_weights=False, attn_mask=mask)[0]
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class TinyTransformer(nn.Module):
    """ids (N, T) -> token + positional embedding -> 2 blocks -> LayerNorm -> Linear(D => V): (N T, V)."""

    def __init__(self):
        super().__init__()
        d = MODEL_DIM
        self.token, self.position = nn.Embedding(VOCAB, d), nn.Embedding(SEQ_LEN, d)
        self.blocks = nn.ModuleList([Block(d), Block(d)])
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, VOCAB)
        self.register_buffer("mask", torch.full((SEQ_LEN, SEQ_LEN), float("-inf")).triu(1))

    def forward(self, ids):
        h = self.token(ids) + self.position(torch.arange(ids.shape[1]))
        for b in self.blocks:
            h = b(h, self.mask)
        return self.head(self.norm(h)).reshape(-1, VOCAB)


def transformer_case():
    model = TinyTransformer()
    check_parameters("transformer", model, TRANSFORMER_PARAMETERS)
    x, y = seq_ids(0), seq_ids(1).reshape(-1)
    print(f"transformer_steps_per_s {train_steps_per_s(model, x, y, F.cross_entropy, 3, 2.0):.6g}")


def versions_case():
    """Text lines for the table's header: torch's version and the libraries it was built with."""
    print(f"version torch {torch.__version__}")
    for line in torch.__config__.show().splitlines():
        s = line.strip().lstrip("- ")
        if s.startswith(("Intel(R) oneAPI Math Kernel Library", "Intel(R) Math Kernel Library", "Intel(R) MKL-DNN",
                         "OpenMP", "CPU capability usage")):
            print(f"config {s}")
        if "BLAS_INFO=" in s:
            print("config " + s[s.index("BLAS_INFO="):].split(",")[0])
    print(f"config cxx11_abi={torch.compiled_with_cxx11_abi()}")
    print(f"config cmake_prefix_path={torch.utils.cmake_prefix_path}")


CASES = {"seed": seed_case, "mnist": mnist_case, "mnist_converged": lambda: mnist_case(MNIST_CONVERGE_STEPS),
         "wide": wide_case, "overhead": overhead_case, "infer": infer_case,
         "lenet": lenet_case, "fmnist": fmnist_case, "resnet": resnet_case, "resnet_train": resnet_train_case,
         "encoder": encoder_case, "decoder": decoder_case, "lstm": lstm_case,
         "lstm_converged": lambda: lstm_case(LSTM_CONVERGE_STEPS),
         "transformer": transformer_case, "versions": versions_case}


def main():
    global AUTOCAST
    args = [a for a in sys.argv[1:] if not a.startswith("--autocast=")]
    for a in sys.argv[1:]:
        if a.startswith("--autocast="):
            v = a.split("=", 1)[1]
            if v not in ("bf16", "f16"):
                print(f"torch_bench.py: --autocast takes bf16 or f16, got {v}", file=sys.stderr)
                return 2
            AUTOCAST = torch.bfloat16 if v == "bf16" else torch.float16
    if not args or args[0] not in CASES:
        print(f"usage: torch_bench.py {'|'.join(CASES)} [threads] [--autocast=bf16|f16]", file=sys.stderr)
        return 2
    sys.argv[1:] = args
    if len(sys.argv) > 2:
        torch.set_num_threads(int(sys.argv[2]))
    torch.manual_seed(1)
    if sys.argv[1] != "versions":
        print(f"torch_threads {torch.get_num_threads()}")
    CASES[sys.argv[1]]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
