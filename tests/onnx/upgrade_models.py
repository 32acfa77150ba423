"""Rewrites ONNX files at a newer opset, the way today's exporters write them, for the importer's
newer-opset tests (tests/onnx.cmake, onnx_import.opset20): each SRC/NAME.onnx (with SRC/NAME.safetensors
holding input.K) is converted by ONNX's version converter to opset OPSET (ReduceX and Split take axes
and sizes as inputs from 18, Resize 18/19, ...), saved with IR version 10 and every initialiser of 1 KiB
or more in DST/NAME.onnx.data (ONNX external data, as PyTorch 2's dynamo exporter writes), and run by
ONNX Runtime for the oracle outputs in DST/NAME.safetensors. Runs in the tests' venv.

    upgrade_models.py SRC DST [OPSET]"""
import os
import sys

import onnx
import onnxruntime as ort
from onnx import version_converter

sys.path.insert(0, os.path.dirname(__file__))
from op_cases_io import load_safetensors, save_safetensors  # noqa: E402

src, dst = sys.argv[1], sys.argv[2]
opset = int(sys.argv[3]) if len(sys.argv) > 3 else 20
os.makedirs(dst, exist_ok=True)
done = 0
for f in sorted(os.listdir(src)):
    if not f.endswith(".onnx") or not os.path.exists(os.path.join(src, f[:-5] + ".safetensors")):
        continue
    name = f[:-5]
    model = version_converter.convert_version(onnx.load(os.path.join(src, f)), opset)
    model.ir_version = 10
    path = os.path.join(dst, f)
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=f + ".data",
                    size_threshold=1024)
    inputs = load_safetensors(os.path.join(src, name + ".safetensors"))
    xs = [inputs[f"input.{i}"] for i in range(len([k for k in inputs if k.startswith("input.")]))]
    if not xs and "x" in inputs:
        xs = [inputs["x"]]
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    ys = sess.run(None, {i.name: x for i, x in zip(sess.get_inputs(), xs)})
    t = {f"input.{i}": x for i, x in enumerate(xs)}
    t.update({f"output.{i}": y for i, y in enumerate(ys[:1])})
    save_safetensors(os.path.join(dst, name + ".safetensors"), t)
    ops = sorted({n.op_type for n in model.graph.node})
    print(f"{name}: opset {opset}, IR 10, external data; ops {' '.join(ops)}")
    done += 1
print(done, "models upgraded")
