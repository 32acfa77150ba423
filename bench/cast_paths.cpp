// Times float32 -> bf16 and bf16 -> float32 on each conversion path of src/backends/cpu/half_cast.cpp
// the CPU has (alternating, best of 7), on one thread: bench/results/2026-12-06-bf16-zen4-loaded.md.
// Usage: flux_cast_paths [ELEMENTS]   (default 2^20; built with -DFLUX_BENCH=ON)
#include <chrono>
#include <cstdlib>
#include <algorithm>
#include <cstdio>
#include <vector>
#include "src/backends/cpu/cpu_backend.hpp"
using namespace flux;
using cpu_backend::HalfCastPath;
int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : (1 << 20);
  const int reps = int(std::max<int64_t>(10, (int64_t(1) << 24) / n));
  std::vector<float> f(n), back(n);
  std::vector<uint16_t> h(n);
  for (int64_t i = 0; i < n; ++i) f[i] = float(i % 1000) * 0.37f - 100.f;
  HalfCastPath paths[] = {HalfCastPath::scalar, HalfCastPath::avx2, HalfCastPath::avx512, HalfCastPath::avx512_bf16};
  double best_to[4] = {1e9, 1e9, 1e9, 1e9}, best_from[4] = {1e9, 1e9, 1e9, 1e9};
  const int best = int(cpu_backend::half_cast_best_path(DType::bf16));
  for (int rep = 0; rep < 7; ++rep)
    for (int p = 0; p <= best; ++p) {
      cpu_backend::cap_half_cast_path(paths[p]);
      auto t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < reps; ++k) cpu_backend::float_to_half_storage(DType::bf16, f.data(), h.data(), n);
      auto t1 = std::chrono::steady_clock::now();
      for (int k = 0; k < reps; ++k) cpu_backend::half_storage_to_float(DType::bf16, h.data(), back.data(), n);
      auto t2 = std::chrono::steady_clock::now();
      best_to[p] = std::min(best_to[p], std::chrono::duration<double>(t1 - t0).count() / reps);
      best_from[p] = std::min(best_from[p], std::chrono::duration<double>(t2 - t1).count() / reps);
    }
  for (int p = 0; p <= best; ++p)
    std::printf("%-12s f32->bf16 %7.1f us (%5.2f GB/s read)  bf16->f32 %7.1f us\n", cpu_backend::half_cast_path_name(paths[p]),
                best_to[p] * 1e6, 4.0 * n / best_to[p] / 1e9, best_from[p] * 1e6);
}
