"""onnx.checker.check_model(full_check=True) on every DIR/*.onnx (Debian's python3-onnx, system Python)."""
import os
import sys

try:
    import onnx
except ImportError:
    print("SKIPPED: python3-onnx is not installed (scripts/deps.sh onnx)")
    sys.exit(77)

folder = sys.argv[1]
names = sorted(f for f in os.listdir(folder) if f.endswith(".onnx"))
if not names:
    print("no .onnx files in", folder)
    sys.exit(1)
for f in names:
    model = onnx.load(os.path.join(folder, f))
    if model.opset_import[0].version > onnx.defs.onnx_opset_version():
        print(f"skip {f}: opset {model.opset_import[0].version} is newer than onnx {onnx.__version__}'s checker (ONNX Runtime checks it)")
        continue
    onnx.checker.check_model(model, full_check=True)
    print(f"ok   {f}: opset {model.opset_import[0].version}, {len(model.graph.node)} nodes, onnx {onnx.__version__} checker (full)")
