"""Writes the seed corpus of fuzz_onnx_load (tests/fuzz/corpus/onnx_load/): small valid ONNX models
covering the importer's operator families, built with Debian's python3-onnx helpers. Rerun after
changing the importer's operator set:  /usr/bin/python3 tests/fuzz/make_onnx_seeds.py tests/fuzz/corpus/onnx_load"""
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

out = sys.argv[1]
rng = np.random.default_rng(38)


def init(name, shape, dtype=np.float32):
    return numpy_helper.from_array((rng.random(shape) - 0.5).astype(dtype), name)


def save(name, nodes, inputs, outputs, inits, opset=17):
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="flux-seeds")
    model.ir_version = 10 if opset >= 21 else 9 if opset >= 19 else 8
    with open(os.path.join(out, name + ".onnx"), "wb") as f:
        f.write(model.SerializeToString())


def vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


save("mlp", [helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["y"])],
     [vi("x", ["batch", 4])], [vi("y", ["batch", 3])], [init("w", (3, 4)), init("b", (3,))])
save("cnn", [helper.make_node("Conv", ["x", "cw", "cb"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "o", "m", "v"], ["n"], epsilon=1e-5),
             helper.make_node("Clip", ["n", "lo", "hi"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["p"], ["g"]), helper.make_node("Flatten", ["g"], ["y"], axis=1)],
     [vi("x", ["batch", 1, 4, 4])], [vi("y", ["batch", 2])],
     [init("cw", (2, 1, 3, 3)), init("cb", (2,)), init("s", (2,)), init("o", (2,)), init("m", (2,)),
      numpy_helper.from_array(np.array([0.5, 1.5], np.float32), "v"), numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
      numpy_helper.from_array(np.array(6.0, np.float32), "hi")])
save("shapes", [helper.make_node("Shape", ["x"], ["s"]),
                helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
                helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
                helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
                helper.make_node("Reshape", ["x", "shape"], ["r"]),
                helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),
                helper.make_node("Softmax", ["t"], ["y"], axis=-1)],
     [vi("x", ["batch", 2, 3])], [vi("y", [6, "batch"])],
     [numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array([0], np.int64), "axes"),
      numpy_helper.from_array(np.array([-1], np.int64), "minus1")])
save("lstm", [helper.make_node("LSTM", ["x", "w", "r", "b"], ["y", "yh", "yc"], hidden_size=2),
              helper.make_node("Squeeze", ["y", "one"], ["s"]),
              helper.make_node("LayerNormalization", ["s", "g"], ["out"], axis=-1, epsilon=1e-5)],
     [vi("x", [3, "batch", 2])], [vi("out", [3, "batch", 2])],
     [init("w", (1, 8, 2)), init("r", (1, 8, 2)), init("b", (1, 16)), numpy_helper.from_array(np.array([1], np.int64), "one"),
      init("g", (2,))])
# One small model per operator the importer gained with opsets 18 to 21 (each at the opset whose form
# it uses), so mutations start from every runner's attributes and inputs.
i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)
f32 = lambda name, v: numpy_helper.from_array(np.array(v, np.float32), name)
x4 = [vi("x", ["batch", 2, 5, 5])]
y = [vi("y", None)]
N = helper.make_node
save("pool_ceil", [N("MaxPool", ["x"], ["m"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
                   N("AveragePool", ["m"], ["y"], kernel_shape=[2, 2], pads=[1, 1, 0, 0], ceil_mode=1, count_include_pad=0)], x4, y, [])
save("pad_resize", [N("Pad", ["x", "p", "", "a"], ["q"], mode="reflect"),
                    N("Resize", ["q", "", "s"], ["y"], mode="linear", coordinate_transformation_mode="half_pixel_symmetric", axes=[2, 3])],
     x4, y, [i64("p", [1, 2, 1, 0]), i64("a", [2, 3]), f32("s", [2.0, 1.5])], opset=19)
save("convtranspose", [N("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])],
     x4, y, [init("w", (2, 3, 3, 3)), init("b", (3,))])
save("gru_bidirectional", [N("GRU", ["x", "w", "r", "b"], ["y", "yh"], hidden_size=2, direction="bidirectional", linear_before_reset=1)],
     [vi("x", [3, "batch", 2])], y, [init("w", (2, 6, 2)), init("r", (2, 6, 2)), init("b", (2, 12))])
save("trilu_where_range", [N("Shape", ["x"], ["s"]), N("Gather", ["s", "i"], ["n"]), N("Range", ["z", "n", "one"], ["r"]),
                           N("Trilu", ["x", "k"], ["t"], upper=0), N("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
                           N("Less", ["t", "rf"], ["c"]), N("Not", ["c"], ["nc"]), N("And", ["c", "nc"], ["a"]), N("Or", ["a", "c"], ["o"]),
                           N("Where", ["o", "t", "rf"], ["y"])],
     [vi("x", [4, 4])], y, [i64("i", 1), i64("z", 0), i64("one", 1), i64("k", 0)])
save("gelu_hard", [N("Gelu", ["x"], ["g"], approximate="tanh"), N("HardSwish", ["g"], ["h"]), N("HardSigmoid", ["h"], ["y"], alpha=0.3)],
     [vi("x", [2, 3])], y, [], opset=20)
save("split_reduce", [N("Split", ["x"], ["a", "b"], axis=1, num_outputs=2), N("ReduceMax", ["a", "ax"], ["m"], keepdims=1),
                      N("ReduceMin", ["b", "ax"], ["n"], keepdims=1), N("Mod", ["m", "n"], ["y"], fmod=1)],
     [vi("x", [2, 4])], y, [i64("ax", [1])], opset=18)
save("expand_tile_slice", [N("Expand", ["x", "s"], ["e"]), N("Tile", ["e", "r"], ["t"]),
                           N("Slice", ["t", "st", "en", "ax", "sp"], ["y"])],
     [vi("x", [1, 3])], y, [i64("s", [2, 3]), i64("r", [1, 2]), i64("st", [-1]), i64("en", [-100]), i64("ax", [1]), i64("sp", [-2])])
save("groupnorm_einsum", [N("GroupNormalization", ["x", "g", "b"], ["n"], num_groups=1),
                          N("Einsum", ["n", "n"], ["y"], equation="bcij,bckj->bcik")],
     x4, y, [init("g", (2,)), init("b", (2,))], opset=21)
save("gathernd_scatternd", [N("GatherND", ["x", "gi"], ["g"], batch_dims=1), N("ScatterND", ["x", "si", "g"], ["y"], reduction="none")],
     x4, y, [i64("gi", [[1], [0]]), i64("si", [[0, 1], [1, 0]])], opset=18)
save("dropout_training", [N("Dropout", ["x", "r", "t"], ["y", "m"])], x4, y,
     [f32("r", 0.0), numpy_helper.from_array(np.array(True), "t")])
print("wrote", sorted(os.listdir(out)))
