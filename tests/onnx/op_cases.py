"""Writes one small ONNX model per importer operator case, with ONNX Runtime's outputs as the oracle
(tests/onnx.cmake, onnx_import.ops): DIR/NAME.onnx and DIR/NAME.safetensors holding input.K and
output.K. Runs in the tests' venv (onnx, onnxruntime, numpy from PyPI).

    op_cases.py DIR

Each case names the opset whose form it tests (ReduceMean's axes attribute at 17, input at 18, ...)."""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(__file__))
from op_cases_io import save_safetensors  # noqa: E402

out = sys.argv[1]
rng = np.random.default_rng(48)
TYPES = {np.dtype("float32"): TensorProto.FLOAT, np.dtype("int64"): TensorProto.INT64, np.dtype("bool"): TensorProto.BOOL}


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def case(name, nodes, inputs, inits=(), opset=17, outputs=("y",), otype=TensorProto.FLOAT):
    """inputs: {name: array}; inits: initialiser TensorProtos; every output is compared."""
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info(k, TYPES[v.dtype], list(v.shape)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, otype, None) for o in outputs], list(inits))
    ir = 10 if opset >= 21 else 9 if opset >= 19 else 8
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)
    data = model.SerializeToString()
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    ys = sess.run(None, inputs)
    with open(os.path.join(out, name + ".onnx"), "wb") as f:
        f.write(data)
    t = {f"input.{i}": v for i, v in enumerate(inputs.values())}
    t.update({f"output.{i}": y for i, y in enumerate(ys)})
    save_safetensors(os.path.join(out, name + ".safetensors"), t)


N = helper.make_node
x4 = randn(2, 3, 7, 9)
# Pooling: ceil_mode, count_include_pad, pads.
for ceil in (0, 1):
    for pads in ([0, 0, 0, 0], [1, 1, 1, 1]):
        p = "pad" if pads[0] else "nopad"
        case(f"maxpool_ceil{ceil}_{p}", [N("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=pads, ceil_mode=ceil)], {"x": x4})
        for cip in (0, 1):
            case(f"avgpool_ceil{ceil}_{p}_cip{cip}", [N("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=pads,
                                                         ceil_mode=ceil, count_include_pad=cip)], {"x": x4})
# Pad: modes, negative pads, axes (18).
for mode in ("constant", "reflect", "edge"):
    case(f"pad_{mode}", [N("Pad", ["x", "p", "v"], ["y"], mode=mode)], {"x": x4},
         [const("p", np.array([0, 0, 1, 2, 0, 1, 2, 0], np.int64)), const("v", np.array(0.5, np.float32))])
case("pad_negative", [N("Pad", ["x", "p"], ["y"])], {"x": x4}, [const("p", np.array([0, 0, -1, 2, 0, 0, 1, -3], np.int64))])
case("pad_axes_opset18", [N("Pad", ["x", "p", "", "a"], ["y"], mode="reflect")], {"x": x4},
     [const("p", np.array([2, 1, 1, 3], np.int64)), const("a", np.array([-1, 2], np.int64))], opset=18)
case("pad_wrap_opset19", [N("Pad", ["x", "p"], ["y"], mode="wrap")], {"x": x4}, [const("p", np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64))], opset=19)
# ConvTranspose: stride, pads, output_padding, groups, dilation.
case("convtranspose", [N("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 0, 1, 0], output_padding=[1, 1])],
     {"x": x4}, [const("w", randn(3, 4, 3, 3)), const("b", randn(4))])
case("convtranspose_groups", [N("ConvTranspose", ["x", "w"], ["y"], strides=[2, 1], group=3, dilations=[1, 2])],
     {"x": randn(2, 6, 5, 4)}, [const("w", randn(6, 2, 2, 3))])
# Resize: nearest (rounding modes) and linear (coordinate modes), scales and sizes, opsets 13, 18, 19.
xr = randn(1, 2, 5, 6)
for nm in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
    for ctm in ("asymmetric", "half_pixel"):
        case(f"resize_nearest_{nm}_{ctm}", [N("Resize", ["x", "", "s"], ["y"], mode="nearest", nearest_mode=nm, coordinate_transformation_mode=ctm)],
             {"x": xr}, [const("s", np.array([1, 1, 2.5, 1.5], np.float32))], opset=13)
for ctm in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"):
    case(f"resize_linear_{ctm}", [N("Resize", ["x", "", "", "sz"], ["y"], mode="linear", coordinate_transformation_mode=ctm)],
         {"x": xr}, [const("sz", np.array([1, 2, 11, 4], np.int64))], opset=13)
case("resize_linear_down_scales", [N("Resize", ["x", "", "s"], ["y"], mode="linear")], {"x": xr},
     [const("s", np.array([1, 1, 0.6, 0.5], np.float32))], opset=13)
case("resize_axes_opset18", [N("Resize", ["x", "", "s"], ["y"], mode="linear", axes=[2, 3])], {"x": xr},
     [const("s", np.array([2.0, 2.0], np.float32))], opset=18)
case("resize_half_pixel_symmetric_opset19", [N("Resize", ["x", "", "", "sz"], ["y"], mode="linear", coordinate_transformation_mode="half_pixel_symmetric")],
     {"x": xr}, [const("sz", np.array([1, 2, 8, 9], np.int64))], opset=19)
# Recurrent: bidirectional and reverse.
T, B, I, H = 5, 2, 3, 4
xs = randn(T, B, I)
for op, g in (("LSTM", 4), ("GRU", 3), ("RNN", 1)):
    extra = {"linear_before_reset": 1} if op == "GRU" else {}
    for d in ("bidirectional", "reverse"):
        nd = 2 if d == "bidirectional" else 1
        outs = ["y", "yh", "yc"] if op == "LSTM" else ["y", "yh"]
        case(f"{op.lower()}_{d}", [N(op, ["x", "w", "r", "b", "", "h0"], outs, hidden_size=H, direction=d, **extra)], {"x": xs},
             [const("w", randn(nd, g * H, I) * 0.5), const("r", randn(nd, g * H, H) * 0.5), const("b", randn(nd, 2 * g * H) * 0.5),
              const("h0", randn(nd, B, H) * 0.5)], outputs=outs)
# Elementwise and shapes.
xa = randn(3, 4, 5)
case("trilu_upper", [N("Trilu", ["x", "k"], ["y"])], {"x": xa}, [const("k", np.array(1, np.int64))])
case("trilu_lower", [N("Trilu", ["x", "k"], ["y"], upper=0)], {"x": xa}, [const("k", np.array(-1, np.int64))])
case("gelu_none_opset20", [N("Gelu", ["x"], ["y"])], {"x": xa * 3}, opset=20)
case("gelu_tanh_opset20", [N("Gelu", ["x"], ["y"], approximate="tanh")], {"x": xa * 3}, opset=20)
case("hardswish", [N("HardSwish", ["x"], ["y"])], {"x": xa * 4})
case("hardsigmoid", [N("HardSigmoid", ["x"], ["y"], alpha=0.3, beta=0.4)], {"x": xa * 4})
case("elu", [N("Elu", ["x"], ["y"], alpha=0.5)], {"x": xa * 3})
case("expand", [N("Expand", ["x", "s"], ["y"])], {"x": randn(3, 1, 5)}, [const("s", np.array([2, 1, 4, 1], np.int64))])
case("tile", [N("Tile", ["x", "r"], ["y"])], {"x": xa}, [const("r", np.array([2, 1, 3], np.int64))])
case("range_where", [N("Shape", ["x"], ["s"]), N("Gather", ["s", "i"], ["n"]), N("Range", ["z", "n", "one"], ["r"]),
                     N("Cast", ["r"], ["rf"], to=TensorProto.FLOAT), N("Less", ["rf", "x"], ["c"]), N("Where", ["c", "x", "rf"], ["y"])],
     {"x": xa * 3}, [const("i", np.array(2, np.int64)), const("z", np.array(0, np.int64)), const("one", np.array(1, np.int64))])
case("split_opset13", [N("Split", ["x", "s"], ["a", "b"], axis=1)], {"x": xa}, [const("s", np.array([1, 3], np.int64))], outputs=("a", "b"))
case("split_opset11_attr", [N("Split", ["x"], ["a", "b"], axis=2, split=[2, 3])], {"x": xa}, opset=11, outputs=("a", "b"))
case("split_num_outputs_opset18", [N("Split", ["x"], ["a", "b", "c"], axis=2, num_outputs=3)], {"x": xa}, opset=18, outputs=("a", "b", "c"))
xi = rng.integers(-20, 20, (4, 5)).astype(np.int64)
yi = rng.integers(1, 7, (4, 5)).astype(np.int64) * np.where(rng.random((4, 5)) < 0.5, -1, 1)
case("mod_int", [N("Mod", ["a", "b"], ["y"])], {"a": xi, "b": yi}, otype=TensorProto.INT64)
case("mod_fmod_int", [N("Mod", ["a", "b"], ["y"], fmod=1)], {"a": xi, "b": yi}, otype=TensorProto.INT64)
case("mod_fmod_float", [N("Mod", ["a", "b"], ["y"], fmod=1)], {"a": xa * 5, "b": np.full((3, 4, 5), 1.7, np.float32)})
for op in ("ReduceMax", "ReduceMin", "ReduceMean", "ReduceSumSquare", "ReduceL2"):
    case(f"{op.lower()}_opset17", [N(op, ["x"], ["y"], axes=[0, -1], keepdims=0)], {"x": xa})
    case(f"{op.lower()}_opset18", [N(op, ["x", "a"], ["y"], keepdims=1)], {"x": xa}, [const("a", np.array([1], np.int64))], opset=18)
case("reducesum_opset13", [N("ReduceSum", ["x", "a"], ["y"], keepdims=0)], {"x": xa}, [const("a", np.array([-2], np.int64))], opset=13)
case("slice_steps", [N("Slice", ["x", "st", "en", "ax", "sp"], ["y"])], {"x": xa},
     [const("st", np.array([-1, 0, 4], np.int64)), const("en", np.array([-100, 4, 0], np.int64)),
      const("ax", np.array([0, 1, 2], np.int64)), const("sp", np.array([-1, 2, -2], np.int64))])
ba, bb = rng.random((3, 4)) < 0.5, rng.random((3, 4)) < 0.5
case("not_and_or_xor", [N("Not", ["a"], ["n"]), N("And", ["n", "b"], ["c"]), N("Or", ["c", "a"], ["d"]), N("Xor", ["d", "b"], ["y"])],
     {"a": ba, "b": bb}, otype=TensorProto.BOOL)
case("squeeze_unsqueeze_opset11", [N("Unsqueeze", ["x"], ["u"], axes=[0, 4]), N("Squeeze", ["u"], ["y"], axes=[0])], {"x": xa}, opset=11)
case("reshape_allowzero_opset14", [N("Reshape", ["x", "s"], ["y"], allowzero=1)], {"x": randn(0, 4)}, [const("s", np.array([4, 0], np.int64))], opset=14)
case("softmax_opset11", [N("Softmax", ["x"], ["y"])], {"x": xa}, opset=11)
case("groupnorm_opset18", [N("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)], {"x": randn(2, 4, 3, 3)},
     [const("s", randn(2)), const("b", randn(2))], opset=18)
case("groupnorm_opset21", [N("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)], {"x": randn(2, 4, 3, 3)},
     [const("s", randn(4)), const("b", randn(4))], opset=21)
case("einsum_attention", [N("Einsum", ["q", "k"], ["s"], equation="bhid,bhjd->bhij"), N("Softmax", ["s"], ["p"]),
                          N("Einsum", ["p", "v"], ["y"], equation="bhij,bhjd->bhid")],
     {"q": randn(2, 2, 5, 4), "k": randn(2, 2, 6, 4), "v": randn(2, 2, 6, 3)})
case("layernorm_opset17", [N("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1)], {"x": xa}, [const("s", randn(5)), const("b", randn(5))])
# GatherND (batch_dims 0 and 1, negative indices) and ScatterND (reduction none, written out as opset 18
# writes it): swin_v2's relative position table and swin's shifted-window mask.
case("gathernd", [N("GatherND", ["x", "i"], ["y"])], {"x": xa}, [const("i", np.array([[[1, -1]], [[0, 2]]], np.int64))])
case("gathernd_batch1", [N("GatherND", ["x", "i"], ["y"], batch_dims=1)], {"x": xa},
     [const("i", np.array([[[0], [3]], [[1], [1]], [[2], [-4]]], np.int64))])
case("scatternd", [N("ScatterND", ["x", "i", "u"], ["y"])], {"x": xa, "u": randn(2, 5)}, [const("i", np.array([[2, 1], [0, -1]], np.int64))])
case("scatternd_none_opset18", [N("ScatterND", ["x", "i", "u"], ["y"], reduction="none")], {"x": xa, "u": randn(1, 3, 4, 5)},
     [const("i", np.array([[[2], [0], [-2]]], np.int64))], opset=18)
# Dropout with training_mode true and ratio 0 (torchvision's swin: F.dropout(p=0.0), written by torch 1.13)
# is the identity; its mask output is read by nothing.
case("dropout_training_ratio0", [N("Dropout", ["x", "r", "t"], ["y", "m"])], {"x": xa},
     [const("r", np.array(0.0, np.float32)), const("t", np.array(True))])
print(len([f for f in os.listdir(out) if f.endswith(".onnx")]), "cases written")
