// The CPU backend's low-precision kernels, timed (issue 36; results in bench/results/):
//   casts: float32 -> bf16/f16 and back, the vector kernels (half_cast.cpp) against the scalar
//          reference and against the cast's former path (element by element through double);
//   one-pass elementwise (half_elementwise.cpp) against the three passes it replaces;
//   reductions and (log)softmax on bf16/f16 tensors through the public ops (sum, max, softmax,
//          logsoftmax, with and without autocast, whose output is then Float32);
//   the CPU backend's low_precision_support answer (asked by autocast per low-list op);
//   GradScaler's unscale (Backend::unscale_and_check) on 16M bf16/f16 gradients;
//   bf16 library kernels (where the CPU has AVX512-BF16 or AMX-BF16): oneDNN's bf16 matmul and conv
//          forward against the float32 calls of the same backend on the same shapes.
// Usage: low_precision_bench [reps]   (FLUX_NUM_THREADS sets the pool)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "flux/autocast.hpp"
#include "flux/backend.hpp"
#include "flux/ops.hpp"
#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/half_bits.hpp"
#include "src/internal.hpp"

using namespace flux;

namespace {

double best_seconds(int reps, const std::function<void()>& run) {
  run();  // warm: pages touched, primitives made
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void casts(int reps) {
  std::printf("| cast | elements | through double (ms) | reference (ms) | vector (ms) | vector vs reference | vector GB/s (read + write) |\n");
  std::printf("| --- | --: | --: | --: | --: | --: | --: |\n");
  for (int64_t n : {int64_t(1) << 16, int64_t(1) << 22}) {
    std::vector<float> f(static_cast<size_t>(n)), back(static_cast<size_t>(n));
    std::vector<uint16_t> h(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) f[size_t(i)] = float(i % 1000) * 0.37f - 100.f;
    for (DType t : {DType::bf16, DType::f16}) {
      const double bytes = double(n) * 6;
      // The cast's former path: element by element through double (src/internal.hpp), on one thread.
      const double old_to = best_seconds(reps, [&] {
        for (int64_t i = 0; i < n; ++i) detail::store_from_double(h.data(), t, i, detail::load_as_double(f.data(), DType::f32, i));
      });
      const double old_from = best_seconds(reps, [&] {
        for (int64_t i = 0; i < n; ++i) detail::store_from_double(back.data(), DType::f32, i, detail::load_as_double(h.data(), t, i));
      });
      const double ref_to = best_seconds(reps, [&] { cpu_backend::float_to_half_storage_reference(t, f.data(), h.data(), n); });
      const double vec_to = best_seconds(reps, [&] { cpu_backend::float_to_half_storage(t, f.data(), h.data(), n); });
      const double ref_from = best_seconds(reps, [&] { cpu_backend::half_storage_to_float_reference(t, h.data(), back.data(), n); });
      const double vec_from = best_seconds(reps, [&] { cpu_backend::half_storage_to_float(t, h.data(), back.data(), n); });
      std::printf("| f32 -> %s | %lld | %.3f | %.3f | %.3f | %.1fx | %.1f |\n", dtype_name(t), (long long)n, old_to * 1e3,
                  ref_to * 1e3, vec_to * 1e3, ref_to / vec_to, bytes / vec_to * 1e-9);
      std::printf("| %s -> f32 | %lld | %.3f | %.3f | %.3f | %.1fx | %.1f |\n", dtype_name(t), (long long)n, old_from * 1e3,
                  ref_from * 1e3, vec_from * 1e3, ref_from / vec_from, bytes / vec_from * 1e-9);
    }
  }
}

void one_pass(int reps) {
  const int64_t n = int64_t(1) << 22;
  std::printf("\n| op on %lld elements | three passes (ms) | one pass (ms) | speed-up |\n| --- | --: | --: | --: |\n",
              (long long)n);
  std::vector<float> f(static_cast<size_t>(n)), up(static_cast<size_t>(n)), up2(static_cast<size_t>(n)), r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) f[size_t(i)] = float(i % 1000) * 0.01f - 5.f;
  for (DType t : {DType::bf16, DType::f16}) {
    std::vector<uint16_t> a(f.size()), b(f.size()), out(f.size());
    cpu_backend::float_to_half_storage(t, f.data(), a.data(), n);
    cpu_backend::float_to_half_storage(t, f.data(), b.data(), n);
    const double three_u = best_seconds(reps, [&] {
      cpu_backend::half_storage_to_float(t, a.data(), up.data(), n);
      cpu_backend::unary(backend::UnaryOp::gelu, DType::f32, up.data(), r.data(), n, 0);
      cpu_backend::float_to_half_storage(t, r.data(), out.data(), n);
    });
    const double one_u = best_seconds(reps, [&] { cpu_backend::unary_half(backend::UnaryOp::gelu, t, a.data(), out.data(), n, 0); });
    std::printf("| gelu %s | %.3f | %.3f | %.2fx |\n", dtype_name(t), three_u * 1e3, one_u * 1e3, three_u / one_u);
    backend::Broadcast p;
    p.ndim = 1, p.shape[0] = n, p.contiguous = true;
    p.stride[0][0] = p.stride[1][0] = p.stride[2][0] = 1;
    const double three_b = best_seconds(reps, [&] {
      cpu_backend::half_storage_to_float(t, a.data(), up.data(), n);
      cpu_backend::half_storage_to_float(t, b.data(), up2.data(), n);
      cpu_backend::binary(backend::BinaryOp::add, DType::f32, up.data(), up2.data(), r.data(), p);
      cpu_backend::float_to_half_storage(t, r.data(), out.data(), n);
    });
    const double one_b = best_seconds(reps, [&] { cpu_backend::binary_half(backend::BinaryOp::add, t, a.data(), b.data(), out.data(), p); });
    std::printf("| add %s | %.3f | %.3f | %.2fx |\n", dtype_name(t), three_b * 1e3, one_b * 1e3, three_b / one_b);
  }
}

// The public ops on a (rows, cols) bf16/f16 tensor: what a model's reductions and softmax cost.
void reductions(int reps) {
  const int64_t rows = 4096, cols = 1024;
  std::printf("\n| op on a %lldx%lld tensor | bf16 (ms) | f16 (ms) | f32 (ms) |\n| --- | --: | --: | --: |\n",
              (long long)rows, (long long)cols);
  std::vector<float> f(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < f.size(); ++i) f[i] = float(int64_t(i) % 1000) * 0.01f - 5.f;
  const Tensor x32(f, Shape{rows, cols});
  const Tensor xb = x32.cast(DType::bf16), xh = x32.cast(DType::f16);
  struct Row {
    const char* name;
    std::function<Tensor(const Tensor&)> op;
    bool autocast;
  };
  const Row table[] = {
      {"sum(x, 1)", [](const Tensor& x) { return sum(x, 1); }, false},
      {"sum(x, 0)", [](const Tensor& x) { return sum(x, 0); }, false},
      {"max(x, 1)", [](const Tensor& x) { return max(x, 1); }, false},
      {"softmax(x, 1)", [](const Tensor& x) { return detail::softmax_op(x, 1); }, false},
      {"logsoftmax(x, 1)", [](const Tensor& x) { return detail::logsoftmax_op(x, 1); }, false},
      {"softmax(x, 0)", [](const Tensor& x) { return detail::softmax_op(x, 0); }, false},
      {"autocast sum(x, 1)", [](const Tensor& x) { return sum(x, 1); }, true},
      {"autocast softmax(x, 1)", [](const Tensor& x) { return detail::softmax_op(x, 1); }, true},
  };
  for (const Row& r : table) {
    double ms[3];
    const Tensor* xs[3] = {&xb, &xh, &x32};
    for (int k = 0; k < 3; ++k)
      ms[k] = 1e3 * best_seconds(reps, [&] {
                if (r.autocast) autocast(DType::bf16, [&] { return r.op(*xs[k]); });
                else r.op(*xs[k]);
              });
    std::printf("| %s | %.3f | %.3f | %.3f |\n", r.name, ms[0], ms[1], ms[2]);
  }
}

// GradScaler's unscale on a model's worth of half gradients, in place (what GradScaler::unscale runs).
void unscale(int reps) {
  const int64_t n = int64_t(1) << 24;
  std::printf("\n| unscale_and_check, %lld elements | bf16 (ms) | f16 (ms) | f32 (ms) |\n| --- | --: | --: | --: |\n",
              (long long)n);
  std::vector<float> f(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) f[size_t(i)] = float(i % 1000) * 0.01f - 5.f;
  double ms[3];
  int k = 0;
  for (DType t : {DType::bf16, DType::f16}) {
    std::vector<uint16_t> g(f.size());
    cpu_backend::float_to_half_storage(t, f.data(), g.data(), n);
    float found = 0;
    ms[k++] = 1e3 * best_seconds(reps, [&] { cpu_backend::unscale_and_check(t, g.data(), g.data(), n, 1.0, &found); });
  }
  float found = 0;
  ms[2] = 1e3 * best_seconds(reps, [&] { cpu_backend::unscale_and_check(DType::f32, f.data(), f.data(), n, 1.0, &found); });
  std::printf("| in place, scale 1 | %.3f | %.3f | %.3f |\n", ms[0], ms[1], ms[2]);
}

void library_kernels(int reps) {
  backend::Backend& b = cpu_backend::instance();
  if (!cpu_backend::bf16_kernels_enabled()) {
    std::printf("\nbf16 library kernels: not run (%s)\n", b.low_precision_support(0, DType::bf16).detail.c_str());
    return;
  }
  std::printf("\n| kernel | shape | f32 (ms) | bf16 (ms) | f32 / bf16 |\n| --- | --- | --: | --: | --: |\n");
  for (int64_t s : {256, 1024}) {
    backend::Gemm g;
    g.m = g.n = g.k = s;
    std::vector<float> a(size_t(s * s), 0.5f), c(size_t(s * s));
    std::vector<uint16_t> ah(size_t(s * s), half_bits::bfloat16_from_float(0.5f)), ch(size_t(s * s));
    const double f = best_seconds(reps, [&] { b.matmul(0, DType::f32, {a.data(), 0}, {a.data(), 0}, {c.data(), 0}, g); });
    const double h = best_seconds(reps, [&] {
      if (!b.matmul_low_precision(0, DType::bf16, {ah.data(), 0}, {ah.data(), 0}, {ch.data(), 0}, g)) std::abort();
    });
    std::printf("| matmul | %lld^3 | %.3f | %.3f | %.2fx |\n", (long long)s, f * 1e3, h * 1e3, f / h);
  }
  // ResNet-18's 3x3 convs at 112x112 input, batch 32 (its 28x28x64 and 7x7x256 stages).
  for (auto [c, hw] : {std::pair<int64_t, int64_t>{64, 28}, {256, 7}}) {
    backend::ConvGeometry g;
    g.spatial = 2, g.batch = 32, g.in_channels = g.out_channels = c;
    for (int i = 0; i < 2; ++i) g.in[i] = g.out[i] = hw, g.kernel[i] = 3, g.pad_lo[i] = g.pad_hi[i] = 1;
    const size_t xs = size_t(32 * c * hw * hw), ws = size_t(c * c * 9);
    std::vector<float> x(xs, 0.5f), w(ws, 0.01f), y(xs);
    std::vector<uint16_t> xh(xs, half_bits::bfloat16_from_float(0.5f)), wh(ws, half_bits::bfloat16_from_float(0.01f)), yh(xs);
    const double f = best_seconds(reps, [&] {
      b.conv_forward(0, DType::f32, {x.data(), 0}, {w.data(), 0}, {}, {y.data(), 0}, g);
    });
    const double h = best_seconds(reps, [&] {
      if (!b.conv_forward(0, DType::bf16, {xh.data(), 0}, {wh.data(), 0}, {}, {yh.data(), 0}, g)) std::abort();
    });
    std::printf("| conv forward 3x3 | b32 %lldx%lldx%lld | %.3f | %.3f | %.2fx |\n", (long long)c, (long long)hw,
                (long long)hw, f * 1e3, h * 1e3, f / h);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  std::printf("ISA: %s; bf16/f16 units: %s; threads: %d; vector casts: bf16 %s, f16 %s\n\n",
              cpu_backend::isa_name(cpu_backend::active_isa()),
              cpu_backend::low_precision_units_text(cpu_backend::low_precision_units()).c_str(), cpu_backend::num_threads(),
              cpu_backend::half_cast_vectorised(DType::bf16) ? "yes" : "no",
              cpu_backend::half_cast_vectorised(DType::f16) ? "yes" : "no");
  {
    backend::Backend& b = cpu_backend::instance();
    const int calls = 1000000;
    int units = 0;
    const double s = best_seconds(reps, [&] {
      for (int i = 0; i < calls; ++i) units += b.low_precision_support(0, i % 2 ? DType::bf16 : DType::f16).units;
    });
    std::printf("low_precision_support: %.1f ns per call (%d)\n\n", s / calls * 1e9, units);
  }
  casts(reps);
  one_pass(reps);
  reductions(reps);
  unscale(reps);
  library_kernels(reps);
}
