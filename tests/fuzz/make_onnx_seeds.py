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
print("wrote", sorted(os.listdir(out)))
