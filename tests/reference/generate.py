#!/usr/bin/env python3
"""PyTorch float64 references for flux-cpp's public ops, activations, losses and layers, written as one
JSON file that tests/reference/replay.cpp replays on every device in float64 and float32.

usage: generate.py OUT.json        (run with Debian's /usr/bin/python3 and python3-torch 1.13)

Every case holds its inputs, a cotangent for every floating output, the outputs and the gradient of
sum(output * cotangent) with respect to every differentiable input, all computed here in float64.
Inputs and cotangents are drawn from a generator seeded by the case name and rounded to float32, so
the float32 replay starts from exactly the same numbers and its error is the op's own rounding.
Error cases list input shapes/dtypes and the exact flux::Error message the op must throw.

Conventions (where Flux and PyTorch differ, the reference follows Flux/NNlib; flux-cpp's layout is
PyTorch's, observations on the first axis and classes on the last):
  * losses use Flux's definitions, not torch.nn's: crossentropy = agg(-sum(xlogy(y, yhat + eps))),
    binarycrossentropy = agg(-xlogy(y, yhat + eps) - xlogy(1 - y, 1 - yhat + eps)), kldivergence =
    agg(sum(xlogx(y))) + crossentropy(yhat, y; eps) (0 log 0 = 0, no eps in the entropy term),
    logitbinarycrossentropy = agg((1 - y) x - logsigmoid(x)), huber = 0.5 e^2 where e < delta, else
    delta (e - 0.5 delta). The default eps is Flux's epseltype(yhat): machine epsilon of the
    prediction's dtype (2^-52 for float64, 2^-23 for float32), so those cases have one reference per
    dtype. Per-observation losses sum over the class (last) axis, then agg = mean/sum/none. Targets are
    data (no gradient is checked for them).
  * gelu is NNlib's tanh approximation (torch's gelu(approximate="tanh")), not the erf form.
  * softplus is exact, x + log1p(exp(-x)) for x > 0 and log1p(exp(x)) otherwise, without torch's
    threshold of 20 (softplus'(0) = 1/2).
  * swish is x sigmoid(x) (torch's silu); leakyrelu's default slope is Flux's 0.01; elu's alpha 1.
  * relu'(0) = 0, leakyrelu'(0) = a, elu'(0) = alpha, as NNlib (and torch); abs'(0) is avoided.
  * max/min reductions, maximum/minimum and max pools: inputs have no ties (Flux and torch split
    tied gradients differently).
  * meanpool divides by the full window (padding counts as 0: torch's count_include_pad=True), and
    its stride defaults to the window, as Flux's MeanPool/MaxPool; max pools never pick the padding.
  * conv is cross-correlation with PyTorch's weight layout (Flux's Conv with PyTorch-loaded weights);
    SamePad() puts the odd pixel of total padding dilation (k - 1) on the low side (Flux's calc_padding).
  * batchnorm normalises with the biased batch variance and updates running_var with the unbiased
    one, momentum being the new batch's weight (Flux and torch agree).
  * onehot is Flux's onehotbatch with observations on the first axis; onecold the argmax of the last.
  * layernorm normalises the last axis with the biased variance (torch's layer_norm, Flux's LayerNorm);
    groupnorm/InstanceNorm as torch's group_norm/instance_norm (InstanceNorm: no affine and no running
    statistics by default, which is Flux's and torch's default too).
  * attention masks are Bool with true = attend (NNlib's convention; torch's Bool attn_mask is the
    negation), and causal_mask(tq, tk) lets query i see keys j <= i + (tk - tq) (NNlib's
    make_causal_mask); the scale defaults to 1/sqrt(d). MultiHeadAttention is nn.MultiheadAttention
    (batch_first) written out: in_proj_weight = [Wq; Wk; Wv], PyTorch's bias default (true).
  * recurrent cells are torch's own kernels (rnn_tanh_cell, rnn_relu_cell, lstm_cell, gru_cell): LSTM
    gates i, f, g, o and GRU's r applied to (h W_hn + b_hn), as nn.LSTM/nn.GRU (Flux's GRUv3 differs
    from torch's; flux-cpp follows torch, whose states it loads); sequences are batch-first, stacked
    layers feed each layer's outputs to the next, and final states are (num_layers, N, hidden).
  * Embedding takes 0-based ids (Flux's are 1-based); a one-hot input gives onehot * weight, as Flux.
  * dropout and rand_like draw flux-cpp's own counter-based stream, not torch's: they are excluded
    here and tested statistically and across devices in tests/test_dropout.cpp.
To add a case, see tests/reference/README.md.
"""
import json
import math
import os
import sys
import zlib

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    required = os.environ.get("FLUX_REQUIRE_INTEROP") or os.environ.get("CI")
    print(f"{'FAIL' if required else 'SKIPPED'}: PyTorch is not importable by {sys.executable} ({e}); "
          "install python3-torch (scripts/deps.sh does)")
    sys.exit(1 if required else 77)

torch.set_default_dtype(torch.float64)
EPS = {"f64": 2.0 ** -52, "f32": 2.0 ** -23}
CASES = []
ERRORS = []


# ---------------------------------------------------------------- inputs
class Draw:
    """Inputs for one case, from a generator seeded by the case name, rounded to float32."""

    def __init__(self, name):
        self.g = torch.Generator().manual_seed(zlib.crc32(name.encode()))

    def uniform(self, *shape, lo=-2.0, hi=2.0):
        return (torch.rand(shape, generator=self.g) * (hi - lo) + lo).float().double()

    def normal(self, *shape, scale=1.0):
        return (torch.randn(shape, generator=self.g) * scale).float().double()

    def positive(self, *shape, lo=0.5, hi=2.0):
        return self.uniform(*shape, lo=lo, hi=hi)

    def away_from_zero(self, *shape, lo=0.1, hi=2.0):
        """|x| in [lo, hi) with a random sign (no kinks at 0, no ties)."""
        s = torch.where(torch.rand(shape, generator=self.g) < 0.5, -1.0, 1.0)
        return s * self.uniform(*shape, lo=lo, hi=hi)

    def distinct(self, *shape, scale=1.0):
        """A permutation of well-separated values (no ties for max/min/argmax)."""
        n = math.prod(shape)
        return ((torch.randperm(n, generator=self.g).double() - n / 2) * (scale / max(n, 1))
                + 0.01).float().double().reshape(shape)

    def probabilities(self, *shape):
        return torch.softmax(self.normal(*shape), -1).float().double()

    def onehot(self, n, k):
        labels = torch.randint(0, k, (n,), generator=self.g)
        return F.one_hot(labels, k).double()

    def integers(self, hi, *shape):
        return torch.randint(0, hi, shape, generator=self.g)


def kind_of(t):
    if t.dtype == torch.bool:
        return "bool"
    if t.dtype in (torch.int64, torch.int32):
        return "i64"
    return "float"


def flat(t):
    if t.dtype == torch.bool:
        return [int(v) for v in t.reshape(-1).tolist()]
    return t.reshape(-1).tolist()


def tensor_json(t, **extra):
    values = flat(t)
    if kind_of(t) == "float" and not all(math.isfinite(v) for v in values):
        raise ValueError("references must be finite")
    return {"shape": list(t.shape), "kind": kind_of(t), "data": values, **extra}


# ---------------------------------------------------------------- cases
def case(name, op, inputs, ref, args=None, grad=None, dtypes=("f64", "f32"), tol=None):
    """Registers one case.
    name:   unique, "family/variant"; the replay prints it when it differs.
    op:     the key of the replay's op table (tests/reference/replay.cpp).
    inputs: list of tensors (float64 values, int64 indices or bool masks) in the op's argument order.
    ref:    a function of the inputs (torch tensors) giving the Flux-convention output(s).
    args:   JSON-able options passed to the op (axes, strides, agg, ...).
    grad:   which inputs are differentiated (default: every floating input).
    dtypes: the dtypes the floating inputs are cast to in the replay.
    tol:    per-dtype relative tolerances overriding the replay's defaults, e.g. {"f32": 1e-4}.
    """
    assert not any(c["name"] == name for c in CASES), name
    d = Draw(name + "/cotangent")
    grad = grad if grad is not None else [kind_of(t) == "float" for t in inputs]
    leaves = [t.clone().requires_grad_(g) for t, g in zip(inputs, grad)]
    out = ref(*leaves)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    cots = [d.normal(*o.shape) if kind_of(o) == "float" and o.requires_grad else None for o in outs]
    wanted = [x for x, g in zip(leaves, grad) if g]
    grads = []
    if wanted:
        total = sum((o * c).sum() for o, c in zip(outs, cots) if c is not None)
        found = torch.autograd.grad(total, wanted, allow_unused=True) if torch.is_tensor(total) else [None] * len(wanted)
        it = iter(found)
        for x, g in zip(leaves, grad):
            if g:
                gx = next(it)
                grads.append(tensor_json(gx if gx is not None else torch.zeros_like(x)))
            else:
                grads.append(None)
    else:
        grads = [None] * len(inputs)
    CASES.append({
        "name": name, "op": op, "args": args or {}, "dtypes": list(dtypes), "tol": tol or {},
        "inputs": [tensor_json(t.detach(), grad=bool(g)) for t, g in zip(inputs, grad)],
        "outputs": [tensor_json(o.detach(), cotangent=(flat(c) if c is not None else None)) for o, c in zip(outs, cots)],
        "grads": grads,
    })


def error(name, op, inputs, message, args=None):
    """An error case: inputs are (shape, dtype) pairs with dtype in f64/f32/i64/i32/bool (values are
    zeros, on the device under test); the op must throw flux::Error whose what() is exactly `message`,
    with "{device}" standing for the device's name (CPU, OpenCL:0, ...)."""
    assert not any(c["name"] == name for c in ERRORS), name
    ERRORS.append({"name": name, "op": op, "args": args or {},
                   "inputs": [{"shape": list(s), "dtype": t} for s, t in inputs], "message": message})


# ---------------------------------------------------------------- elementwise
def elementwise_cases():
    binary = {
        "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
        "maximum": torch.maximum, "minimum": torch.minimum,
    }
    shapes = {"same": ((3, 4), (3, 4)), "broadcast": ((3, 1), (1, 4)), "scalar": ((2, 3), ()),
              "rank3": ((2, 3, 4), (4,))}
    for op, fn in binary.items():
        for variant, (sa, sb) in shapes.items():
            name = f"{op}/{variant}"
            d = Draw(name)
            a = d.uniform(*sa)
            b = d.positive(*sb) if op == "div" else d.uniform(*sb)
            if op in ("maximum", "minimum"):  # no ties
                b = b + 0.003
            case(name, op, [a, b], fn)
    d = Draw("pow/tensor")
    case("pow/tensor", "pow", [d.positive(3, 4), d.uniform(3, 4)], torch.pow)
    d = Draw("pow/broadcast")
    case("pow/broadcast", "pow", [d.positive(2, 3), d.uniform(3)], torch.pow)
    for e in (2.0, 3.0, 0.5, -1.5):
        d = Draw(f"pow_scalar/{e}")
        case(f"pow_scalar/{e}", "pow_scalar", [d.positive(3, 4)], lambda x, e=e: x ** e, args={"exponent": e})
    scalar_ops = {
        "add_scalar": lambda x, s: x + s, "sub_scalar": lambda x, s: x - s, "mul_scalar": lambda x, s: x * s,
        "div_scalar": lambda x, s: x / s, "scalar_add": lambda x, s: s + x, "scalar_sub": lambda x, s: s - x,
        "scalar_mul": lambda x, s: s * x, "scalar_div": lambda x, s: s / x,
    }
    for op, fn in scalar_ops.items():
        d = Draw(op)
        x = d.positive(3, 5) if op == "scalar_div" else d.uniform(3, 5)
        case(f"{op}/2.5", op, [x], lambda x, fn=fn: fn(x, 2.5), args={"scalar": 2.5})
    unary = {
        "neg": (torch.neg, "uniform"), "exp": (torch.exp, "uniform"), "log": (torch.log, "positive"),
        "sqrt": (torch.sqrt, "positive"), "abs": (torch.abs, "away"), "sign": (torch.sign, "away"),
        "square": (torch.square, "uniform"), "sin": (torch.sin, "wide"), "cos": (torch.cos, "wide"),
        "log1p": (torch.log1p, "above_minus_one"), "tanh": (torch.tanh, "wide"),
    }
    for op, (fn, dist) in unary.items():
        d = Draw(op)
        x = {"uniform": lambda: d.uniform(4, 5), "positive": lambda: d.positive(4, 5, lo=0.05, hi=5.0),
             "away": lambda: d.away_from_zero(4, 5), "wide": lambda: d.uniform(4, 5, lo=-6, hi=6),
             "above_minus_one": lambda: d.uniform(4, 5, lo=-0.9, hi=3.0)}[dist]()
        case(f"{op}/basic", op, [x], fn)
    d = Draw("clamp")
    x = d.uniform(4, 5, lo=-3, hi=3)
    x = torch.where((x - 1).abs() < 0.01, x + 0.05, x)
    case("clamp/basic", "clamp", [x], lambda x: torch.clamp(x, -1.0, 1.0), args={"lo": -1.0, "hi": 1.0})
    # comparisons give Bool: some equal values on purpose (inputs on a 0.5 grid)
    for op, fn in {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}.items():
        d = Draw(op)
        a = torch.round(d.uniform(3, 4) * 2) / 2
        b = torch.round(d.uniform(1, 4) * 2) / 2
        case(f"{op}/broadcast", op, [a, b], fn)
    d = Draw("where")
    cond = d.uniform(3, 4) > 0
    case("where/broadcast", "where", [cond, d.uniform(3, 4), d.uniform(1, 4)], torch.where)
    case("where/scalar_branch", "where", [cond, d.uniform(3, 4), d.uniform()], torch.where)


# ---------------------------------------------------------------- activations
def activation_cases():
    acts = {
        "sigmoid": torch.sigmoid, "relu": torch.relu, "tanh_act": torch.tanh, "identity": lambda x: x * 1,
        "leakyrelu": lambda x: F.leaky_relu(x, 0.01), "elu": lambda x: F.elu(x, 1.0),
        "gelu": lambda x: F.gelu(x, approximate="tanh"),
        "softplus": lambda x: torch.where(x > 0, x + torch.log1p(torch.exp(-x)), torch.log1p(torch.exp(x))),
        "swish": lambda x: x * torch.sigmoid(x),
    }
    for op, fn in acts.items():
        d = Draw(op)
        case(f"{op}/moderate", op, [d.uniform(4, 6, lo=-4, hi=4)], fn)
        # wide range with saturated tails (the forward and the gradient must stay exact there)
        wide = torch.tensor([-60.0, -35.0, -20.0, -9.5, -1e-3, 0.0, 1e-3, 0.7, 9.5, 20.0, 35.0, 60.0])
        case(f"{op}/tails", op, [wide], fn)
    d = Draw("leakyrelu/slope")
    case("leakyrelu/slope_0.2", "leakyrelu", [d.uniform(4, 5)], lambda x: F.leaky_relu(x, 0.2), args={"a": 0.2})
    d = Draw("elu/alpha")
    case("elu/alpha_0.5", "elu", [d.uniform(4, 5, lo=-5, hi=3)], lambda x: F.elu(x, 0.5), args={"a": 0.5})


# ---------------------------------------------------------------- linear algebra, reductions, softmax
def linalg_reduce_cases():
    mm = [("2d", (3, 4), (4, 5), False, False), ("trans_a", (4, 3), (4, 5), True, False),
          ("trans_b", (3, 4), (5, 4), False, True), ("trans_ab", (4, 3), (5, 4), True, True),
          ("batched", (2, 3, 4), (2, 4, 5), False, False), ("broadcast_batch", (2, 1, 3, 4), (3, 4, 2), False, False),
          ("vector_matrix", (4,), (4, 5), False, False), ("matrix_vector", (3, 4), (4,), False, False),
          ("dot", (4,), (4,), False, False), ("large_k", (3, 64), (64, 2), False, False)]
    for variant, sa, sb, ta, tb in mm:
        name = f"matmul/{variant}"
        d = Draw(name)
        fn = lambda a, b, ta=ta, tb=tb: torch.matmul(a.transpose(-1, -2) if ta else a, b.transpose(-1, -2) if tb else b)
        case(name, "matmul", [d.uniform(*sa), d.uniform(*sb)], fn, args={"trans_a": ta, "trans_b": tb})
    for op, fn in {"sum": torch.sum, "mean": torch.mean}.items():
        d = Draw(op)
        x = d.uniform(2, 3, 4)
        case(f"{op}/all", op, [x], fn)
        case(f"{op}/axis0", op, [x], lambda x, fn=fn: fn(x, 0), args={"axes": [0]})
        case(f"{op}/axis-1_keepdims", op, [x], lambda x, fn=fn: fn(x, -1, keepdim=True), args={"axes": [-1], "keepdims": True})
        if op == "sum":
            case("sum/axes02", op, [x], lambda x: torch.sum(x, (0, 2)), args={"axes": [0, 2]})
    for op, fn in {"max": torch.amax, "min": torch.amin}.items():
        d = Draw(op)
        x = d.distinct(2, 3, 4)
        case(f"{op}/all", op, [x], lambda x, fn=fn: fn(x, (0, 1, 2)))
        case(f"{op}/axis1", op, [x], lambda x, fn=fn: fn(x, 1), args={"axes": [1]})
        case(f"{op}/axis-1_keepdims", op, [x], lambda x, fn=fn: fn(x, -1, keepdim=True), args={"axes": [-1], "keepdims": True})
    for op, fn in {"argmax": torch.argmax, "argmin": torch.argmin}.items():
        d = Draw(op)
        x = d.distinct(3, 5)
        case(f"{op}/axis1", op, [x], lambda x, fn=fn: fn(x, 1), args={"axes": [1]})
        case(f"{op}/axis0_keepdims", op, [x], lambda x, fn=fn: fn(x, 0, keepdim=True), args={"axes": [0], "keepdims": True})
    for op, fn in {"softmax": torch.softmax, "logsoftmax": torch.log_softmax}.items():
        d = Draw(op)
        case(f"{op}/last", op, [d.uniform(3, 5, lo=-5, hi=5)], lambda x, fn=fn: fn(x, -1), args={"axes": [-1]})
        case(f"{op}/axis0", op, [d.uniform(4, 2, 3)], lambda x, fn=fn: fn(x, 0), args={"axes": [0]})
        case(f"{op}/large_logits", op, [d.uniform(2, 4, lo=500, hi=520)], lambda x, fn=fn: fn(x, -1), args={"axes": [-1]})
    d = Draw("logsumexp")
    case("logsumexp/axis1", "logsumexp", [d.uniform(3, 5, lo=-5, hi=5)], lambda x: torch.logsumexp(x, 1), args={"axes": [1]})
    case("logsumexp/keepdims", "logsumexp", [d.uniform(3, 5, lo=300, hi=310)], lambda x: torch.logsumexp(x, -1, keepdim=True),
         args={"axes": [-1], "keepdims": True})


# ---------------------------------------------------------------- shape and indexing
def shape_cases():
    d = Draw("shape")
    x = d.uniform(2, 3, 4)
    case("broadcast_to/basic", "broadcast_to", [d.uniform(3, 1)], lambda a: a.expand(2, 3, 4).clone(), args={"shape": [2, 3, 4]})
    case("sum_to/basic", "sum_to", [x], lambda a: a.sum(0).sum(-1, keepdim=True), args={"shape": [3, 1]})
    case("permute/basic", "permute", [x], lambda a: a.permute(2, 0, 1).clone(), args={"axes": [2, 0, 1]})
    case("reshape/basic", "reshape", [x], lambda a: a.reshape(4, 6).clone(), args={"shape": [4, -1]})
    case("transpose/2d", "transpose", [d.uniform(3, 5)], lambda a: a.t().clone())
    case("flatten/basic", "flatten", [x], lambda a: a.reshape(2, -1).clone())
    case("concat/axis0", "concat", [d.uniform(2, 3), d.uniform(1, 3), d.uniform(3, 3)], lambda *xs: torch.cat(xs, 0), args={"axes": [0]})
    case("concat/axis1", "concat", [d.uniform(2, 3), d.uniform(2, 1)], lambda *xs: torch.cat(xs, 1), args={"axes": [1]})
    case("stack/axis0", "stack", [d.uniform(2, 3), d.uniform(2, 3)], lambda *xs: torch.stack(xs, 0), args={"axes": [0]})
    case("stack/axis-1", "stack", [d.uniform(2, 3), d.uniform(2, 3), d.uniform(2, 3)], lambda *xs: torch.stack(xs, -1), args={"axes": [-1]})
    idx = torch.tensor([2, 0, 2, 1])  # a repeated index: the gradient accumulates
    case("index_select/axis0", "index_select", [d.uniform(3, 4), idx], lambda a, i: a.index_select(0, i), args={"axes": [0]})
    case("index_select/axis1", "index_select", [d.uniform(2, 3, 5), idx], lambda a, i: a.index_select(1, i), args={"axes": [1]})
    case("gather/axis-1", "gather", [d.uniform(3, 4), torch.tensor([3, 3, 0])], lambda a, i: a.index_select(-1, i), args={"axes": [-1]})
    case("slice/axis1", "slice", [d.uniform(3, 6)], lambda a: a[:, 1:4].clone(), args={"axes": [1], "start": 1, "stop": 4})
    case("slice/rows", "slice_rows", [d.uniform(5, 2)], lambda a: a[1:3].clone(), args={"start": 1, "stop": 3})
    case("onehot/basic", "onehot", [torch.tensor([2, 0, 3, 3, 1])], lambda l: F.one_hot(l, 4).double(), args={"nclasses": 4})
    case("onecold/basic", "onecold", [d.distinct(4, 3)], lambda s: s.argmax(-1))


# ---------------------------------------------------------------- convolution and pooling
def torch_pad(x, pads):
    """pads: (lo, hi) per spatial axis in axis order -> F.pad's reversed list."""
    flat_pads = []
    for lo, hi in reversed(pads):
        flat_pads += [lo, hi]
    return F.pad(x, flat_pads)


def same_pad(k, dilation):
    total = dilation * (k - 1)
    return (total - total // 2, total // 2)  # odd pixel on the low side (Flux's calc_padding)


def conv_ref(x, w, b, stride, pads, dilation, groups):
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[x.dim() - 2]
    return fn(torch_pad(x, pads), w, b, stride=stride, dilation=dilation, groups=groups)


def conv_cases():
    specs = [  # name, x shape, w shape, stride, pads (lo, hi) per axis, dilation, groups, bias
        ("2d_basic", (2, 3, 6, 5), (4, 3, 3, 3), [1, 1], [(0, 0), (0, 0)], [1, 1], 1, True),
        ("2d_stride2_pad1", (2, 3, 7, 6), (4, 3, 3, 3), [2, 2], [(1, 1), (1, 1)], [1, 1], 1, True),
        ("2d_asym_pad", (1, 2, 5, 5), (3, 2, 2, 3), [1, 2], [(1, 0), (2, 1)], [1, 1], 1, True),
        ("2d_samepad", (2, 2, 6, 7), (3, 2, 4, 3), [1, 1], [same_pad(4, 1), same_pad(3, 1)], [1, 1], 1, True),
        ("2d_dilation2", (1, 2, 8, 8), (2, 2, 3, 3), [1, 1], [(2, 2), (2, 2)], [2, 2], 1, False),
        ("2d_groups2", (2, 4, 5, 5), (6, 2, 3, 3), [1, 1], [(1, 1), (1, 1)], [1, 1], 2, True),
        ("2d_depthwise", (1, 3, 5, 4), (3, 1, 3, 3), [1, 1], [(1, 1), (1, 1)], [1, 1], 3, True),
        ("1d", (2, 3, 9), (4, 3, 3), [2], [(1, 1)], [1], 1, True),
        ("3d", (1, 2, 4, 4, 3), (3, 2, 2, 2, 2), [1, 1, 1], [(0, 1), (0, 0), (1, 0)], [1, 1, 1], 1, True),
    ]
    for variant, sx, sw, stride, pads, dil, groups, bias in specs:
        name = f"conv/{variant}"
        d = Draw(name)
        x, w = d.uniform(*sx), d.uniform(*sw, lo=-0.5, hi=0.5)
        inputs = [x, w] + ([d.uniform(sw[0])] if bias else [])
        args = {"stride": stride, "pad": [p for lohi in pads for p in lohi], "dilation": dil, "groups": groups}
        case(name, "conv", inputs, lambda x, w, b=None, a=(stride, pads, dil, groups): conv_ref(x, w, b, *a), args=args)
    # Flux's SamePad() resolved inside the op: total dilation (k - 1) per axis, the odd pixel low
    d = Draw("conv/samepad_stride2")
    x, w = d.uniform(1, 2, 7, 6), d.uniform(3, 2, 3, 2, lo=-0.5, hi=0.5)
    pads = [same_pad(3, 1), same_pad(2, 1)]
    case("conv/samepad_stride2", "conv", [x, w], lambda x, w: conv_ref(x, w, None, [2, 2], pads, [1, 1], 1),
         args={"stride": [2, 2], "pad": "same", "dilation": [1, 1], "groups": 1})
    tspecs = [  # name, x, w (in, out/groups, k...), stride, pad, dilation, groups, output_padding, bias
        ("2d_stride2_pad1", (2, 4, 3, 4), (4, 3, 4, 4), [2, 2], [1, 1], [1, 1], 1, [0, 0], True),
        ("2d_outpad", (1, 2, 3, 3), (2, 3, 3, 3), [2, 2], [1, 1], [1, 1], 1, [1, 1], True),
        ("2d_groups2_dilation", (1, 4, 3, 3), (4, 2, 2, 2), [1, 1], [0, 0], [2, 2], 2, [0, 0], False),
        ("1d", (2, 3, 5), (3, 2, 3), [2], [0], [1], 1, [0], True),
    ]
    for variant, sx, sw, stride, pad, dil, groups, outpad, bias in tspecs:
        name = f"conv_transpose/{variant}"
        d = Draw(name)
        x, w = d.uniform(*sx), d.uniform(*sw, lo=-0.5, hi=0.5)
        inputs = [x, w] + ([d.uniform(sw[1] * groups)] if bias else [])
        fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d}[len(sx) - 2]
        case(name, "conv_transpose", inputs,
             lambda x, w, b=None, fn=fn, a=(stride, pad, outpad, groups, dil): fn(x, w, b, *a),
             args={"stride": stride, "pad": pad, "dilation": dil, "groups": groups, "output_padding": outpad})


def pool_cases():
    def maxpool(x, k, s, pads):
        fn = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[x.dim() - 2]
        flat_pads = []
        for lo, hi in reversed(pads):
            flat_pads += [lo, hi]
        return fn(F.pad(x, flat_pads, value=-math.inf), k, s)

    def meanpool(x, k, s, pads):
        fn = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[x.dim() - 2]
        return fn(torch_pad(x, pads), k, s)  # zeros in the padding, full-window divisor

    specs = [  # name, x, window, stride, pads
        ("2d_window2", (2, 3, 6, 4), [2, 2], [2, 2], [(0, 0), (0, 0)]),
        ("2d_k3_s2_pad1", (1, 2, 7, 6), [3, 3], [2, 2], [(1, 1), (1, 1)]),
        ("2d_overlap", (1, 2, 5, 5), [3, 2], [1, 1], [(0, 0), (0, 0)]),
        ("1d", (2, 3, 8), [2], [2], [(0, 0)]),
        ("3d", (1, 2, 4, 4, 4), [2, 2, 2], [2, 2, 2], [(0, 0), (0, 0), (0, 0)]),
    ]
    for op, fn in (("maxpool", maxpool), ("meanpool", meanpool)):
        for variant, sx, k, s, pads in specs:
            name = f"{op}/{variant}"
            d = Draw(name)
            x = d.distinct(*sx, scale=4.0)
            args = {"window": k, "stride": s, "pad": [p for lohi in pads for p in lohi]}
            case(name, op, [x], lambda x, fn=fn, a=(k, s, pads): fn(x, *a), args=args)
    d = Draw("pool/default_stride")
    case("maxpool/default_stride", "maxpool", [d.distinct(1, 2, 6, 6)], lambda x: F.max_pool2d(x, 3), args={"window": [3, 3]})
    case("meanpool/default_stride", "meanpool", [d.uniform(1, 2, 6, 6)], lambda x: F.avg_pool2d(x, 3), args={"window": [3, 3]})
    d = Draw("adaptive")
    x = d.distinct(2, 3, 7, 5)
    case("adaptive_maxpool/2x3", "adaptive_maxpool", [x], lambda x: F.adaptive_max_pool2d(x, (2, 3)), args={"out": [2, 3]})
    case("adaptive_meanpool/2x3", "adaptive_meanpool", [x], lambda x: F.adaptive_avg_pool2d(x, (2, 3)), args={"out": [2, 3]})
    case("adaptive_meanpool/1d", "adaptive_meanpool", [d.uniform(2, 2, 9)], lambda x: F.adaptive_avg_pool1d(x, 4), args={"out": [4]})
    case("global_maxpool/2d", "global_maxpool", [x], lambda x: torch.amax(x, (2, 3), keepdim=True))
    case("global_meanpool/2d", "global_meanpool", [x], lambda x: torch.mean(x, (2, 3), keepdim=True))


def normalisation_cases():
    d = Draw("batchnorm")
    c = lambda t: t.reshape(1, -1, 1, 1)  # (C,) against (N, C, H, W)
    x = d.uniform(4, 3, 2, 3, lo=-1, hi=3)
    case("batchnorm/batch_stats_4d", "batchnorm", [x, d.positive(3), d.uniform(3)],
         lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True, eps=1e-5), args={"eps": 1e-5})
    case("batchnorm/batch_stats_2d_no_affine", "batchnorm", [d.uniform(6, 4, lo=-2, hi=5)],
         lambda x: F.batch_norm(x, None, None, None, None, training=True, eps=1e-3), args={"eps": 1e-3})
    case("batchnorm/given_stats", "batchnorm_stats",
         [x, d.positive(3), d.uniform(3), d.uniform(3), d.positive(3, lo=0.2, hi=3.0)],
         lambda x, w, b, m, v: (x - c(m)) / torch.sqrt(c(v) + 1e-5) * c(w) + c(b), args={"eps": 1e-5})


# ---------------------------------------------------------------- losses (Flux's definitions)
def agg_of(name):
    return {"mean": torch.mean, "sum": torch.sum, "none": lambda l: l}[name]


def loss_cases():
    for agg in ("mean", "sum", "none"):
        a = agg_of(agg)
        d = Draw(f"loss/{agg}")
        yhat, y = d.uniform(5, 3), d.uniform(5, 3)
        nograd = [True, False]
        case(f"mse/{agg}", "mse", [yhat, y], lambda p, t: a((p - t) ** 2), args={"agg": agg}, grad=nograd)
        case(f"mae/{agg}", "mae", [yhat, y + 0.01], lambda p, t: a((p - t).abs()), args={"agg": agg}, grad=nograd)
        e = (yhat - y).abs()
        yh = torch.where((e - 1.0).abs() < 0.01, yhat + 0.05, yhat)
        for delta in (1.0, 0.5):
            case(f"huber/{agg}_delta{delta}", "huber", [yh * 1.5, y],
                 lambda p, t, dl=delta: a(torch.where((p - t).abs() < dl, 0.5 * (p - t) ** 2, dl * ((p - t).abs() - 0.5 * dl))),
                 args={"agg": agg, "delta": delta}, grad=nograd)
        logits = d.uniform(5, 4, lo=-4, hi=4)
        onehot = d.onehot(5, 4)
        soft = d.probabilities(5, 4)
        case(f"logitcrossentropy/{agg}", "logitcrossentropy", [logits, soft],
             lambda x, t: a(-(t * torch.log_softmax(x, -1)).sum(-1)), args={"agg": agg}, grad=nograd)
        bin_t = (d.uniform(5, 3) > 0).double()
        case(f"logitbinarycrossentropy/{agg}", "logitbinarycrossentropy", [logits[:, :3].clone(), bin_t],
             lambda x, t: a((1 - t) * x - F.logsigmoid(x)), args={"agg": agg}, grad=nograd)
        probs = d.probabilities(5, 4)
        bprobs = d.uniform(5, 3, lo=0.02, hi=0.98)
        for dtype in ("f64", "f32"):  # Flux's default eps = epseltype(yhat): one reference per dtype
            eps = EPS[dtype]
            ce = lambda p, t, eps=eps: -torch.xlogy(t, p + eps).sum(-1)
            case(f"crossentropy/{agg}_default_eps[{dtype}]", "crossentropy", [probs, onehot], lambda p, t, ce=ce: a(ce(p, t)),
                 args={"agg": agg}, grad=nograd, dtypes=[dtype])
            case(f"binarycrossentropy/{agg}_default_eps[{dtype}]", "binarycrossentropy", [bprobs, bin_t],
                 lambda p, t, eps=eps: a(-torch.xlogy(t, p + eps) - torch.xlogy(1 - t, 1 - p + eps)),
                 args={"agg": agg}, grad=nograd, dtypes=[dtype])
            case(f"kldivergence/{agg}_default_eps[{dtype}]", "kldivergence", [probs, soft],
                 lambda p, t, ce=ce: a(torch.xlogy(t, t).sum(-1) + ce(p, t)), args={"agg": agg}, grad=nograd, dtypes=[dtype])
        ce0 = lambda p, t, eps: -torch.xlogy(t, p + eps).sum(-1)
        case(f"crossentropy/{agg}_eps0.01", "crossentropy", [probs, soft], lambda p, t: a(ce0(p, t, 0.01)),
             args={"agg": agg, "eps": 0.01}, grad=nograd)
        # one-hot targets with eps = 0: xlogx(0) = 0, finite (Flux's kldivergence)
        case(f"kldivergence/{agg}_onehot_eps0", "kldivergence", [probs, onehot],
             lambda p, t: a(torch.xlogy(t, t).sum(-1) + ce0(p, t, 0.0)), args={"agg": agg, "eps": 0.0}, grad=nograd)
        case(f"binarycrossentropy/{agg}_eps0", "binarycrossentropy", [bprobs, bin_t],
             lambda p, t: a(-torch.xlogy(t, p) - torch.xlogy(1 - t, 1 - p)), args={"agg": agg, "eps": 0.0}, grad=nograd)


# ---------------------------------------------------------------- layers
def layer_cases():
    d = Draw("dense")
    x = d.uniform(5, 4)
    w, b = d.uniform(3, 4, lo=-1, hi=1), d.uniform(3)
    for act, fn in (("identity", lambda z: z), ("relu", torch.relu), ("sigmoid", torch.sigmoid), ("tanh", torch.tanh),
                    ("gelu", lambda z: F.gelu(z, approximate="tanh"))):
        case(f"Dense/{act}", "Dense", [x, w, b], lambda x, w, b, fn=fn: fn(F.linear(x, w, b)), args={"activation": act})
    case("Dense/no_bias", "Dense", [x, w], lambda x, w: F.linear(x, w))
    case("Dense/vector_input", "Dense", [d.uniform(4), w, b], lambda x, w, b: F.linear(x, w, b))
    d = Draw("Conv")
    x = d.uniform(2, 3, 6, 6)
    w, b = d.uniform(4, 3, 3, 3, lo=-0.5, hi=0.5), d.uniform(4)
    case("Conv/relu_stride2_pad1", "Conv", [x, w, b],
         lambda x, w, b: torch.relu(F.conv2d(x, w, b, stride=2, padding=1)),
         args={"activation": "relu", "stride": [2, 2], "pad": [1, 1, 1, 1], "dilation": [1, 1], "groups": 1})
    wt = d.uniform(3, 2, 3, 3, lo=-0.5, hi=0.5)
    case("ConvTranspose/stride2", "ConvTranspose", [x, wt, d.uniform(2)],
         lambda x, w, b: torch.sigmoid(F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1)),
         args={"activation": "sigmoid", "stride": [2, 2], "pad": [1, 1], "dilation": [1, 1], "groups": 1, "output_padding": [1, 1]})
    xd = d.distinct(2, 3, 6, 6)
    case("MaxPool/k3_s2_pad1", "MaxPool", [xd], lambda x: F.max_pool2d(x, 3, 2, 1), args={"window": [3, 3], "stride": [2, 2], "pad": [1]})
    case("MeanPool/2x2", "MeanPool", [xd], lambda x: F.avg_pool2d(x, 2), args={"window": [2, 2]})
    case("AdaptiveMaxPool/2x2", "AdaptiveMaxPool", [xd], lambda x: F.adaptive_max_pool2d(x, 2), args={"out": [2, 2]})
    case("AdaptiveMeanPool/3x1", "AdaptiveMeanPool", [xd], lambda x: F.adaptive_avg_pool2d(x, (3, 1)), args={"out": [3, 1]})
    case("GlobalMaxPool/2d", "GlobalMaxPool", [xd], lambda x: F.adaptive_max_pool2d(x, 1))
    case("GlobalMeanPool/2d", "GlobalMeanPool", [xd], lambda x: F.adaptive_avg_pool2d(x, 1))

    def bn_train(x, w, b, rm, rv):
        rm, rv = rm.detach().clone(), rv.detach().clone()
        y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
        return torch.relu(y), rm, rv

    d = Draw("BatchNorm")
    x = d.uniform(4, 3, 3, 2, lo=-1, hi=3)
    stats = [d.positive(3), d.uniform(3), d.uniform(3), d.positive(3, lo=0.2, hi=3.0)]
    case("BatchNorm/train_relu", "BatchNorm", [x] + stats, bn_train, args={"activation": "relu", "train": True, "momentum": 0.1},
         grad=[True, True, True, False, False])
    case("BatchNorm/test", "BatchNorm", [x] + stats,
         lambda x, w, b, rm, rv: F.batch_norm(x, rm, rv, w, b, training=False, eps=1e-5), args={"train": False},
         grad=[True, True, True, False, False])
    d = Draw("Chain")
    x = d.uniform(6, 4)
    w1, b1, w2, b2 = d.uniform(8, 4, lo=-1, hi=1), d.uniform(8), d.uniform(3, 8, lo=-1, hi=1), d.uniform(3)
    case("Chain/mlp_softmax", "Chain_mlp", [x, w1, b1, w2, b2],
         lambda x, w1, b1, w2, b2: torch.softmax(F.linear(torch.relu(F.linear(x, w1, b1)), w2, b2), -1))
    wsq = d.uniform(4, 4, lo=-1, hi=1)
    case("SkipConnection/dense_plus", "SkipConnection", [x, wsq, b1[:4].clone()],
         lambda x, w, b: torch.tanh(F.linear(x, w, b)) + x)
    w3, b3 = d.uniform(3, 4, lo=-1, hi=1), d.uniform(3)
    case("Parallel/vcat", "Parallel", [x, w1, b1, w3, b3],
         lambda x, w1, b1, w2, b2: torch.cat([F.linear(x, w1, b1), torch.relu(F.linear(x, w2, b2))], 1))


# ---------------------------------------------------------------- sequence layers
def sequence_norm_cases():
    d = Draw("layernorm")
    x = d.uniform(3, 4, 5, lo=-1, hi=3)
    case("layernorm/affine_3d", "layernorm", [x, d.positive(5), d.uniform(5)],
         lambda x, w, b: F.layer_norm(x, (5,), w, b, eps=1e-5), args={"eps": 1e-5})
    case("layernorm/no_affine_eps1e-3", "layernorm", [d.uniform(6, 7, lo=-4, hi=2)],
         lambda x: F.layer_norm(x, (7,), None, None, eps=1e-3), args={"eps": 1e-3})
    case("LayerNorm/relu", "LayerNorm", [x, d.positive(5), d.uniform(5)],
         lambda x, w, b: torch.relu(F.layer_norm(x, (5,), w, b, eps=1e-5)), args={"activation": "relu"})
    d = Draw("groupnorm")
    x = d.uniform(2, 6, 3, 2, lo=-1, hi=3)
    case("groupnorm/3_groups_4d", "groupnorm", [x, d.positive(6), d.uniform(6)],
         lambda x, w, b: F.group_norm(x, 3, w, b, eps=1e-5), args={"groups": 3, "eps": 1e-5})
    case("groupnorm/2d_input_no_affine", "groupnorm", [d.uniform(4, 6, lo=-2, hi=2)],
         lambda x: F.group_norm(x, 2, None, None, eps=1e-5), args={"groups": 2, "eps": 1e-5})
    case("GroupNorm/2_groups_3d", "GroupNorm", [d.uniform(3, 4, 5), d.positive(4), d.uniform(4)],
         lambda x, w, b: F.group_norm(x, 2, w, b, eps=1e-5), args={"groups": 2})
    d = Draw("InstanceNorm")
    xi = d.uniform(2, 3, 4, 4, lo=-1, hi=3)
    # Flux's and PyTorch's InstanceNorm default: no affine, no running statistics (normalise each (n, c))
    case("InstanceNorm/default", "InstanceNorm", [xi], lambda x: F.instance_norm(x, eps=1e-5))
    case("InstanceNorm/affine", "InstanceNorm", [xi, d.positive(3), d.uniform(3)],
         lambda x, w, b: F.instance_norm(x, weight=w, bias=b, eps=1e-5), args={"affine": True})


def embedding_cases():
    d = Draw("embedding")
    w = d.normal(7, 4)
    idx = torch.tensor([[0, 3, 3], [6, 1, 3]])  # repeated rows: the scatter-add accumulates
    case("embedding/2d_indices_repeats", "embedding", [w, idx], lambda w, i: F.embedding(i, w))
    case("embedding/1d_indices", "embedding", [w, torch.tensor([5, 0, 5, 2])], lambda w, i: F.embedding(i, w))
    # Flux accepts a one-hot input: onehot(labels) * weight, the same rows
    oh = F.one_hot(torch.tensor([[2, 0], [6, 6]]), 7).double()
    case("Embedding/onehot_input", "Embedding", [w, oh], lambda w, x: x @ w, grad=[True, False])


def attention_ref(q, k, v, mask=None, scale=None):
    s = q @ k.transpose(-1, -2) * (scale if scale else 1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:  # NNlib: true = attend
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ v


def causal(tq, tk):
    return torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq)


def mha_ref(xq, xk, xv, w_in, b_in, w_out, b_out, nheads, mask=None):
    dim = xq.shape[-1]
    bq, bk, bv = (b_in.chunk(3) if b_in is not None else (None, None, None))
    wq, wk, wv = w_in.chunk(3)
    heads = lambda t: t.reshape(t.shape[0], t.shape[1], nheads, dim // nheads).transpose(1, 2)
    o = attention_ref(heads(F.linear(xq, wq, bq)), heads(F.linear(xk, wk, bk)), heads(F.linear(xv, wv, bv)), mask)
    return F.linear(o.transpose(1, 2).reshape(xq.shape[0], xq.shape[1], dim), w_out, b_out)


def attention_cases():
    d = Draw("dot_product_attention")
    q, k, v = d.uniform(2, 2, 3, 4), d.uniform(2, 2, 5, 4), d.uniform(2, 2, 5, 3)
    case("dot_product_attention/unmasked", "dot_product_attention", [q, k, v], attention_ref)
    mask = d.uniform(2, 1, 3, 5) > -1.0
    mask[..., 0] = True  # every query attends to at least one key
    case("dot_product_attention/mask_broadcast_over_heads", "dot_product_attention", [q, k, v, mask], attention_ref)
    case("dot_product_attention/scale0.3", "dot_product_attention", [q, k, v],
         lambda q, k, v: attention_ref(q, k, v, scale=0.3), args={"scale": 0.3})
    qc = d.uniform(2, 2, 4, 4)
    # causal_mask(tq, tk): query i sees keys j <= i + (tk - tq), NNlib's make_causal_mask
    case("dot_product_attention/causal_tq4_tk5", "dot_product_attention", [qc, k, v],
         lambda q, k, v: attention_ref(q, k, v, causal(4, 5)), args={"causal": True})
    d = Draw("MultiHeadAttention")
    x = d.uniform(2, 5, 8)
    w_in, b_in = d.uniform(24, 8, lo=-0.6, hi=0.6), d.uniform(24, lo=-0.5, hi=0.5)
    w_out, b_out = d.uniform(8, 8, lo=-0.6, hi=0.6), d.uniform(8, lo=-0.5, hi=0.5)
    case("MultiHeadAttention/self_2heads", "MultiHeadAttention", [x, w_in, b_in, w_out, b_out],
         lambda x, wi, bi, wo, bo: mha_ref(x, x, x, wi, bi, wo, bo, 2), args={"nheads": 2},
         tol={"f32": 1e-4})  # dx runs through 6 float32 GEMMs and a softmax: 2.5e-5 measured on OpenCL:0
    case("MultiHeadAttention/self_causal_4heads", "MultiHeadAttention", [x, w_in, b_in, w_out, b_out],
         lambda x, wi, bi, wo, bo: mha_ref(x, x, x, wi, bi, wo, bo, 4, causal(5, 5)), args={"nheads": 4, "causal": True})
    xk, xv = d.uniform(2, 3, 8), d.uniform(2, 3, 8)
    case("MultiHeadAttention/cross_no_bias", "MultiHeadAttention_cross", [x, xk, xv, w_in, w_out],
         lambda q, k, v, wi, wo: mha_ref(q, k, v, wi, None, wo, None, 2), args={"nheads": 2})


# PyTorch's own cell kernels (torch.rnn_tanh_cell, lstm_cell, gru_cell): gate order i, f, g, o (LSTM) and
# r, z, n with r applied to h W_hn + b_hn (GRU), as nn.LSTM / nn.GRU
def run_layers(cell, x, state, weights, nlayers):
    """A stacked batch-first sequence layer from cells: x (N, T, in), state per layer -> (out, final states)."""
    finals = []
    seq = x
    for l in range(nlayers):
        s = state[l]
        ys = []
        for t in range(seq.shape[1]):
            s = cell(seq[:, t], s, *weights[l])
            ys.append(s[0] if isinstance(s, tuple) else s)
        seq = torch.stack(ys, 1)
        finals.append(s)
    return seq, finals


def recurrent_cases():
    d = Draw("cells")
    x, h = d.uniform(3, 4), d.uniform(3, 5, lo=-1, hi=1)
    c = d.uniform(3, 5, lo=-1, hi=1)
    def weights(g, inp, hid, bias=True):
        w = [d.uniform(g * hid, inp, lo=-0.6, hi=0.6), d.uniform(g * hid, hid, lo=-0.6, hi=0.6)]
        return w + ([d.uniform(g * hid, lo=-0.4, hi=0.4), d.uniform(g * hid, lo=-0.4, hi=0.4)] if bias else [])
    case("RNNCell/tanh", "RNNCell", [x, h] + weights(1, 4, 5), lambda x, h, *w: torch.rnn_tanh_cell(x, h, *w))
    case("RNNCell/relu", "RNNCell", [x, h] + weights(1, 4, 5), lambda x, h, *w: torch.rnn_relu_cell(x, h, *w),
         args={"activation": "relu"})
    case("LSTMCell/basic", "LSTMCell", [x, h, c] + weights(4, 4, 5), lambda x, h, c, *w: torch.lstm_cell(x, (h, c), *w))
    case("GRUCell/basic", "GRUCell", [x, h] + weights(3, 4, 5), lambda x, h, *w: torch.gru_cell(x, h, *w))
    case("GRUCell/no_bias", "GRUCell", [x, h] + weights(3, 4, 5, bias=False),
         lambda x, h, *w: torch.gru_cell(x, h, *w, None, None), args={"bias": False})

    d = Draw("sequences")
    n, t, inp, hid, layers = 2, 4, 3, 5, 2
    xs = d.uniform(n, t, inp)
    h0, c0 = d.uniform(layers, n, hid, lo=-1, hi=1), d.uniform(layers, n, hid, lo=-1, hi=1)
    def stack_weights(g, bias=True):
        out = []
        for l in range(layers):
            fan = inp if l == 0 else hid
            out += [d.uniform(g * hid, fan, lo=-0.6, hi=0.6), d.uniform(g * hid, hid, lo=-0.6, hi=0.6)]
            if bias:
                out += [d.uniform(g * hid, lo=-0.4, hi=0.4), d.uniform(g * hid, lo=-0.4, hi=0.4)]
        return out
    def per_layer(ws, k):
        return [ws[i * k:(i + 1) * k] for i in range(layers)]

    def rnn(x, h0, *ws):
        out, finals = run_layers(lambda x, s, *w: torch.rnn_tanh_cell(x, s, *w), x, h0, per_layer(ws, 4), layers)
        return out, torch.stack(finals)
    case("RNN/2_layers_tanh", "RNN", [xs, h0] + stack_weights(1), rnn, args={"num_layers": layers})

    def lstm(x, h0, c0, *ws):
        out, finals = run_layers(lambda x, s, *w: torch.lstm_cell(x, s, *w), x, list(zip(h0, c0)), per_layer(ws, 4), layers)
        return out, torch.stack([f[0] for f in finals]), torch.stack([f[1] for f in finals])
    case("LSTM/2_layers", "LSTM", [xs, h0, c0] + stack_weights(4), lstm, args={"num_layers": layers})

    def gru(x, h0, *ws):
        out, finals = run_layers(lambda x, s, *w: torch.gru_cell(x, s, *w, None, None), x, h0, per_layer(ws, 2), layers)
        return out, torch.stack(finals)
    case("GRU/2_layers_no_bias", "GRU", [xs, h0] + stack_weights(3, bias=False), gru,
         args={"num_layers": layers, "bias": False})


def fusion_cases():
    d = Draw("fusion")
    x = d.uniform(5, 4)
    w1, b1, w2, b2 = d.uniform(6, 4, lo=-1, hi=1), d.uniform(6), d.uniform(6, 4, lo=-1, hi=1), d.uniform(6)
    case("Maxout/two_dense", "Maxout", [x, w1, b1, w2, b2],
         lambda x, w1, b1, w2, b2: torch.maximum(F.linear(x, w1, b1), F.linear(x, w2, b2)))
    z = d.uniform(5, 3)
    wb, bb = d.uniform(2, 4, 3, lo=-1, hi=1), d.uniform(2)
    # nn.Bilinear's (out, in1, in2) weight; Flux's Bilinear((in1, in2) => out) holds the same numbers
    case("Bilinear/tanh", "Bilinear", [x, z, wb, bb], lambda x, z, w, b: torch.tanh(F.bilinear(x, z, w, b)),
         args={"activation": "tanh"})
    wsq = d.uniform(2, 4, 4, lo=-1, hi=1)
    case("Bilinear/single_input_no_bias", "Bilinear_self", [x, wsq], lambda x, w: F.bilinear(x, x, w))


# ---------------------------------------------------------------- errors
def error_cases():
    error("add/shapes", "add", [((3, 4), "f64"), ((5,), "f64")], "[add] shapes (3, 4) and (5,) cannot be broadcast together")
    error("matmul/shapes", "matmul", [((3, 4), "f64"), ((5, 2), "f64")], "[matmul] shapes (3, 4) and (5, 2) do not compose (inner dimensions 4 and 5)")
    error("mse/shapes", "mse", [((3, 2), "f32"), ((2, 3), "f32")], "[mse] prediction shape (3, 2) and target shape (2, 3) differ (the target must have the prediction's shape or broadcast to it, e.g. a number or one row)")
    error("crossentropy/int_predictions", "crossentropy", [((2, 3), "i64"), ((2, 3), "i64")],
          "[crossentropy] needs floating-point predictions, got Int64")
    error("onehot/float_labels", "onehot", [((4,), "f32")], "[onehot] labels must be an integer tensor, got Float32", args={"nclasses": 3})
    error("where/float_condition", "where", [((2,), "f32"), ((2,), "f32"), ((2,), "f32")],
          "[where] the condition must be a Bool tensor, got Float32")
    error("concat/shapes", "concat", [((2, 3), "f32"), ((2, 4), "f32")], "[concat] shapes (2, 3) and (2, 4) differ outside axis 0",
          args={"axes": [0]})
    error("conv/channels", "conv", [((1, 3, 5, 5), "f32"), ((4, 2, 3, 3), "f32")],
          "[conv] input has 3 channels, weight expects 2 (weight (4, 2, 3, 3))",
          args={"stride": [1, 1], "pad": [0, 0, 0, 0], "dilation": [1, 1], "groups": 1})
    error("conv/int_input", "conv", [((1, 2, 5, 5), "i32"), ((4, 2, 3, 3), "i32")],
          "[conv] supports Float32, Float64, Float16 and BFloat16 inputs; got Int32 (cast with .f32())",
          args={"stride": [1, 1], "pad": [0, 0, 0, 0], "dilation": [1, 1], "groups": 1})
    error("maxpool/rank", "maxpool", [((3, 4), "f32")],
          "[maxpool] expected a 4-dimensional (N, C, H, W) input for 2 spatial axes; got 3×4 Tensor{Float32, {device}} of shape (3, 4)",
          args={"window": [2, 2]})
    error("batchnorm/weight_shape", "batchnorm", [((4, 3, 2, 2), "f32"), ((2,), "f32"), ((3,), "f32")],
          "[batchnorm] weight and bias must have shape (3,) for input (4, 3, 2, 2); got (2,)", args={"eps": 1e-5})
    error("Dense/features", "Dense", [((5, 3), "f32"), ((2, 4), "f32"), ((2,), "f32")],
          "[Dense] expected input with last dimension 4 (Dense(4 => 2)); got shape (5, 3). Observations go along the first axis: (N, 4)")
    error("index_select/float_indices", "index_select", [((3, 4), "f32"), ((2,), "f32")],
          "[index_select] indices must be Int32 or Int64, got Float32", args={"axes": [0]})
    error("softmax/axis", "softmax", [((3, 4), "f32")], "[softmax] axis 2 is out of range for a 2-dimensional tensor", args={"axes": [2]})
    error("sum/axis", "sum", [((3, 4), "f32")], "[sum] axis -3 is out of range for a 2-dimensional tensor", args={"axes": [-3]})
    error("huber/delta", "huber", [((3,), "f32"), ((3,), "f32")], "[huber] delta must be positive, got -1", args={"delta": -1.0})
    error("layernorm/weight_shape", "layernorm", [((3, 5), "f32"), ((4,), "f32"), ((4,), "f32")],
          "[layernorm] weight and bias must have shape (5,) (the last axis of input (3, 5)); got (4,)", args={"eps": 1e-5})
    error("groupnorm/groups", "groupnorm", [((2, 6, 3), "f32")],
          "[groupnorm] groups (4) must be positive and divide the channels (6) of input (2, 6, 3)", args={"groups": 4, "eps": 1e-5})
    error("embedding/float_indices", "embedding", [((7, 4), "f32"), ((3,), "f32")],
          "[embedding] indices must be Int32 or Int64 (0-based token ids); got 3-element Tensor{Float32, {device}}. "
          "For one-hot input use the Embedding layer with vocab on the last axis")
    error("dot_product_attention/shapes", "dot_product_attention", [((2, 3, 4), "f32"), ((2, 5, 3), "f32"), ((2, 5, 3), "f32")],
          "[dot_product_attention] shapes do not compose: q (2, 3, 4) (..., Tq, d), k (2, 5, 3) (..., Tk, d), v (2, 5, 3) (..., Tk, dv)")
    error("dot_product_attention/float_mask", "dot_product_attention",
          [((2, 3, 4), "f32"), ((2, 5, 4), "f32"), ((2, 5, 4), "f32"), ((3, 5), "f32")],
          "[dot_product_attention] mask must be Bool (true = attend); got 3×5 Tensor{Float32, {device}}")
    error("dot_product_attention/mask_shape", "dot_product_attention",
          [((2, 3, 4), "f32"), ((2, 5, 4), "f32"), ((2, 5, 4), "f32"), ((3, 4), "bool")],
          "[dot_product_attention] mask of shape (3, 4) does not broadcast to the scores (..., Tq, Tk) = (2, 3, 5) of q (2, 3, 4) "
          "and k (2, 5, 4)")
    error("clamp/bounds", "clamp", [((3,), "f32")], "[clamp] lower bound 2 is above upper bound 1", args={"lo": 2.0, "hi": 1.0})


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    for family in (elementwise_cases, activation_cases, linalg_reduce_cases, shape_cases, conv_cases, pool_cases,
                   normalisation_cases, loss_cases, layer_cases, sequence_norm_cases, embedding_cases, attention_cases,
                   recurrent_cases, fusion_cases, error_cases):
        family()
    os.makedirs(os.path.dirname(os.path.abspath(sys.argv[1])), exist_ok=True)
    with open(sys.argv[1], "w") as f:
        json.dump({"torch": torch.__version__, "cases": CASES, "errors": ERRORS}, f)
    print(f"wrote {len(CASES)} cases and {len(ERRORS)} error cases to {sys.argv[1]} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
