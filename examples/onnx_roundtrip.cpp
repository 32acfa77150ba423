// ONNX both ways: train a small CNN, export it with onnx::save, import the file again with onnx::load
// and check that both give the same outputs; with ONNX Runtime at hand (a python that imports
// onnxruntime: --ort PYTHON or $FLUX_ORT_PYTHON, e.g. build/onnx-venv/bin/python that the tests
// make) it also reports ORT's agreement on the exported file.
//   onnx_roundtrip [--device CPU|OpenCL:0] [--ort PYTHON] [--out DIR]
// The task: 12x12 images holding one bright bar, horizontal (class 0) or vertical (class 1), in noise.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include <flux/flux.hpp>
#include <flux/onnx.hpp>

#include "example_models.hpp"

using namespace flux;

namespace {

/// n images (n, 1, 12, 12) and their labels (n,): a bar of length 6 at a random place, plus noise.
std::pair<Tensor, Tensor> bars(int64_t n) {
  std::vector<float> x(static_cast<size_t>(n * 144));
  std::vector<int64_t> y(static_cast<size_t>(n));
  std::vector<float> r = rand({n, 4}).to_vector<float>(), noise = rand({n, 144}).to_vector<float>();
  for (int64_t i = 0; i < n; ++i) {
    const bool vertical = r[size_t(4 * i)] < 0.5f;
    const int64_t a = int64_t(r[size_t(4 * i + 1)] * 12) % 12, b = int64_t(r[size_t(4 * i + 2)] * 7) % 7;
    for (int64_t k = 0; k < 144; ++k) x[size_t(i * 144 + k)] = 0.3f * noise[size_t(i * 144 + k)];
    for (int64_t k = 0; k < 6; ++k) x[size_t(i * 144 + (vertical ? (b + k) * 12 + a : a * 12 + b + k))] += 1.0f;
    y[size_t(i)] = vertical;
  }
  return {Tensor(x, Shape{n, 1, 12, 12}), Tensor(y, Shape{n})};
}

double max_diff(const Tensor& a, const Tensor& b) {
  std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  double d = 0;
  for (size_t i = 0; i < x.size(); ++i) d = std::max(d, double(std::abs(x[i] - y[i])));
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "CPU", out = ".", ort = std::getenv("FLUX_ORT_PYTHON") ? std::getenv("FLUX_ORT_PYTHON") : "";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--device") device = argv[i + 1];
    else if (a == "--ort") ort = argv[i + 1];
    else if (a == "--out") out = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: onnx_roundtrip [--device CPU|OpenCL:0] [--ort PYTHON] [--out DIR]\n");
      return 2;
    }
  }
  try {
    Device dev = device == "CPU" ? get_device("CPU") : get_device("OpenCL", std::atoi(device.c_str() + device.find(':') + 1));
    seed(7);
    auto model = examples::roundtrip_cnn() | dev;
    auto opt = optimisers::setup(optimisers::Adam(3e-3), model);
    auto [x_train, y_train] = bars(512);
    auto [x_test, y_test] = bars(128);
    Tensor xt = to(x_test, dev);
    for (int step = 0; step < 150; ++step) {
      int64_t at = (step * 32) % 512;
      Tensor x = to(x_train.slice(at, at + 32), dev), y = to(onehot(y_train.slice(at, at + 32), 2), dev);
      auto [loss, grads] = withgradient([&](auto& m) { return logitcrossentropy(m(x), y); }, model);
      optimisers::update(opt, model, grads);
    }
    testmode(model);
    Tensor logits = model(xt);
    double accuracy = mean(eq(onecold(to(logits, Device())), y_test).cast(DType::f32)).item<double>();
    std::printf("trained on %s: test accuracy %.3f\n", to_string(dev).c_str(), accuracy);

    const std::string path = out + "/bars_cnn.onnx";
    onnx::save(path, model, xt);  // traced on dev; the batch axis is dynamic
    auto net = onnx::load(path) | dev;
    std::cout << net << "\n";
    double d = max_diff(to(net(xt), Device()), to(logits, Device()));
    std::printf("imported file vs the flux model: max |difference| %.3g\n", d);
    if (!(d <= 1e-5)) return 1;
    if (accuracy < 0.9) {
      std::printf("accuracy below 0.9\n");
      return 1;
    }
    if (ort.empty()) {
      std::printf("ONNX Runtime: not checked (give --ort PYTHON, a python with onnxruntime)\n");
      return 0;
    }
    // ORT on the same file: inputs and flux's logits as raw float32, compared in Python.
    std::vector<float> xv = x_test.to_vector<float>(), yv = to(logits, Device()).to_vector<float>();
    std::ofstream(out + "/bars_x.f32", std::ios::binary).write(reinterpret_cast<const char*>(xv.data()), std::streamsize(xv.size() * 4));
    std::ofstream(out + "/bars_y.f32", std::ios::binary).write(reinterpret_cast<const char*>(yv.data()), std::streamsize(yv.size() * 4));
    std::string cmd = "'" + ort + "' -c \"import sys, numpy as np, onnxruntime as ort; d = sys.argv[1]; "
                      "x = np.fromfile(d + '/bars_x.f32', np.float32).reshape(128, 1, 12, 12); "
                      "y = np.fromfile(d + '/bars_y.f32', np.float32).reshape(128, 2); "
                      "s = ort.InferenceSession(d + '/bars_cnn.onnx', providers=['CPUExecutionProvider']); "
                      "e = float(np.abs(s.run(None, {'input': x})[0] - y).max()); "
                      "print('ONNX Runtime %s vs flux: max |difference| %.3g' % (ort.__version__, e)); "
                      "sys.exit(0 if e <= 1e-5 else 1)\" '" + out + "'";
    return std::system(cmd.c_str()) == 0 ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
