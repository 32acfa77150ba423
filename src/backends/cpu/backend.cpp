// The CPU backend object: memory (a caching pool), copies, and dispatch to the kernel files.
#include <sys/sysinfo.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "flux/error.hpp"
#include "flux/out_of_memory.hpp"
#include "src/backends/best_fit_pool.hpp"
#include "src/backends/caching_pool.hpp"
#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/dependency_check.hpp"
#include "src/backends/cpu/float_mode.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/backends/cpu/pass_count.hpp"
#include "src/backends/cpu/tuned_table.hpp"
#include "src/environment.hpp"
#include "src/internal.hpp"

#ifndef FLUX_BLAS_NAME
#define FLUX_BLAS_NAME "unknown BLAS"
#endif

namespace flux::cpu_backend {

namespace {

/// A buffer's address, or nullptr for an absent (null-handle) optional buffer.
void* or_null(backend::Buffer b) { return b.handle ? ptr(b) : nullptr; }

/// versioninfo's line for the kernel table that flux-tune writes (tuned_table.hpp).
std::string kernel_table_line() {
  const std::string table = tuned_table_path();
  std::string why;
  const std::optional<TunedEntries> tuned = read_tuned_table(table, why);
  return "CPU kernel table: " +
         (tuned ? std::to_string(tuned->size()) + " tuned shape(s)"
                : why.empty() ? "none (the built-in rules choose)" : "ignored (" + why + ")") +
         " [" + table + "]";
}

/// FLUX_CPU_MEMORY_LIMIT: the most bytes the CPU pool may hold (live tensors plus cached blocks), as
/// a number of bytes with an optional K, M or G (powers of 1024); unset or 0: no limit but the system's.
size_t cpu_memory_limit() { return environment::bytes("FLUX_CPU_MEMORY_LIMIT"); }

// 64-byte aligned host blocks through a caching pool: the best-fit pool with splitting and coalescing
// (best_fit_pool.hpp; its large blocks in a range of address space per arena, its small segments
// from aligned_alloc), or with FLUX_CPU_POOL=size_classes the size-class cache it replaced
// (caching_pool.hpp, kept as the simple reference). A request the system refuses, or one that would take the pool beyond
// FLUX_CPU_MEMORY_LIMIT, empties the cache and is tried once more; then flux::OutOfMemory names the
// size and the figures.
class HostPool {
 public:
  void* allocate(size_t bytes) {
    const size_t limit = limit_once();
    if (best_.limit() != limit) best_.set_limit(limit);
    auto system = [&](size_t r) -> void* {
      if (limit && used() + cached() + r > limit) return nullptr;
      return std::aligned_alloc(64, r);
    };
    void* p = best_fit() ? best_.allocate(bytes, system, std::free) : classes_.allocate(bytes, system, std::free);
    if (!p) {
      struct sysinfo si {};
      sysinfo(&si);
      const size_t total = limit ? limit : size_t(si.totalram) * si.mem_unit;
      const size_t rounded = best_fit() ? best_.round(bytes) : classes_.round(bytes);
      const bool over_limit = limit && used() + cached() + rounded > limit;
      throw OutOfMemory("CPU", bytes, used(), cached(), total,
                        over_limit ? "FLUX_CPU_MEMORY_LIMIT=" + environment::value("FLUX_CPU_MEMORY_LIMIT").value_or("") + " would be exceeded"
                                   : std::string("the system refused the allocation"));
    }
    return p;
  }
  void deallocate(void* p, size_t bytes) {
    if (best_fit()) best_.deallocate(p, bytes, std::free);
    else classes_.deallocate(p, bytes, std::free);
  }
  void release() {
    if (best_fit()) best_.release(std::free);
    else classes_.release(std::free);
  }
  size_t used() { return best_fit() ? best_.used() : classes_.used(); }
  size_t cached() { return best_fit() ? best_.cached() : classes_.cached(); }
  /// The pool's limit (FLUX_CPU_MEMORY_LIMIT, read once), 0 for none.
  size_t limit_once() {
    static const size_t limit = cpu_memory_limit();
    return limit;
  }

 private:
  /// FLUX_CPU_POOL (read once): unset or best_fit, the best-fit pool; size_classes, the size classes.
  static bool best_fit() {
    static const bool yes = environment::choice("FLUX_CPU_POOL") == "best_fit";
    return yes;
  }
  backends::CachingPool<void*> classes_{64};
  // Each arena's range for large blocks: as much address space as the machine has memory, at most 64 GiB.
  static size_t range_bytes() {
    struct sysinfo si {};
    sysinfo(&si);
    return std::min(size_t(si.totalram) * si.mem_unit, size_t(64) << 30);
  }
  backends::BestFitPool best_{size_t(1) << 30, range_bytes()};
};

// Every kernel that does float arithmetic runs under FloatModeScope: flush-to-zero for the dtypes the
// subnormal policy names (flux/denormals.hpp), the caller's own mode restored after it. Copies, fills,
// casts, gathers and selects move values unchanged and keep the caller's mode.
class CpuBackend final : public backend::Backend {
 public:
  const char* name() const override { return "CPU"; }
  int device_count() override { return 1; }
  std::string device_name(int) override { return "CPU (" + std::to_string(num_threads()) + " threads, " FLUX_BLAS_NAME ")"; }
  bool device_is_cpu(int) override { return true; }
  // reduce, softmax, pooling, normalisation and half_elementwise.cpp read bf16/f16 storage themselves.
  bool reads_half_storage(int) override { return true; }
  std::string version_info() override {
    return "  BLAS: " FLUX_BLAS_NAME "; threads: " + std::to_string(num_threads()) + " (FLUX_NUM_THREADS)\n" +
           "  ISA: " + isa_name(active_isa()) + "; bf16/f16 units: " + low_precision_units_text(low_precision_units()) +
           "\n  Libraries: " + dependency_line() + "\n  " + kernel_table_line() + "\n";
  }
  // bf16 runs on AVX512-BF16 or AMX-BF16 through oneDNN; oneDNN 2.6 has no f16 compute on the CPU.
  // Autocast asks per low-list op: the answers for each ISA level are made once (the units at a level
  // are fixed per process) and the active level (force_isa) picks one.
  backend::LowPrecisionSupport low_precision_support(int, DType t) override {
    if (t != DType::bf16 && t != DType::f16) return {false, std::string(dtype_name(t)) + " is not a low-precision dtype"};
    static const auto answers = [] {
      std::array<std::array<backend::LowPrecisionSupport, 2>, 3> a;
      for (int level = 0; level < 3; ++level) {
        const LowPrecisionUnits u = low_precision_units_at(Isa(level));
        a[size_t(level)] = {support_answer(DType::bf16, u), support_answer(DType::f16, u)};
      }
      return a;
    }();
    return answers[size_t(active_isa())][t == DType::f16 ? 1 : 0];
  }
  static backend::LowPrecisionSupport support_answer(DType t, const LowPrecisionUnits& u) {
    const std::string found = low_precision_units_text(u);
    if (t == DType::bf16) {
      const bool units = u.avx512_bf16 || u.amx_bf16;
      if (units && FLUX_HAVE_ONEDNN) return {true, found};
      if (units) return {false, "this build has no oneDNN, whose kernels use the CPU's " + found};
      return {false, "this CPU has no bf16 units (AVX512-BF16 or AMX-BF16; found: " + found + ")"};
    }
    // oneDNN 2.6's CPU ISA list (dnnl_cpu_isa_t in dnnl_types.h) ends at avx512_core_amx and avx2_vnni:
    // it has no avx512_core_fp16 or amx_fp16 level, so no CPU kernel computes in f16 whatever the units.
    if (u.avx512_fp16 || u.amx_fp16)
      return {false, "this CPU has f16 units (" + found +
                         ") but no kernel here uses them: oneDNN 2.6 (Debian 12's) has no f16 CPU kernels, its CPU ISA "
                         "levels end at avx512_core_amx (bf16, int8) with no avx512_core_fp16 or amx_fp16"};
    return {false, "no f16 compute kernels on the CPU (oneDNN 2.6 has none; units found: " + found + ")"};
  }
  backend::MemoryInfo memory(int) override {
    struct sysinfo si {};
    sysinfo(&si);
    const size_t used = pool_.used(), reserved = used + pool_.cached(), limit = pool_.limit_once();
    if (limit) return {used, reserved, limit > reserved ? limit - reserved : 0, limit};
    return {used, reserved, size_t(si.freeram) * si.mem_unit, size_t(si.totalram) * si.mem_unit};
  }
  backend::Buffer allocate(int, size_t bytes) override { return {bytes ? pool_.allocate(bytes) : nullptr, 0}; }
  void deallocate(int, backend::Buffer b, size_t bytes) override {
    if (b.handle) pool_.deallocate(b.handle, bytes);
  }
  void release_cache(int) override { pool_.release(); }
  void copy_from_host(int, backend::Buffer dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(ptr(dst), src, bytes);
  }
  void copy_to_host(int, void* dst, backend::Buffer src, size_t bytes) override {
    if (bytes) std::memcpy(dst, ptr(src), bytes);
  }
  void copy(int, backend::Buffer dst, backend::Buffer src, size_t bytes) override {
    if (bytes) std::memmove(ptr(dst), ptr(src), bytes);
  }
  bool copy_peer(int, backend::Buffer dst, int, backend::Buffer src, size_t bytes) override {
    copy(0, dst, src, bytes);
    return true;
  }
  void synchronize(int) override {}
  void fill(int, DType t, backend::Buffer dst, int64_t n, double v) override {
    pass_count::kernel();
    cpu_backend::fill(t, ptr(dst), n, v);
  }
  void cast(int, DType from, backend::Buffer src, DType to, backend::Buffer dst, int64_t n) override {
    pass_count::cast(from, to, n);
    cpu_backend::cast(from, ptr(src), to, ptr(dst), n);
  }
  void strided_copy(int, DType t, backend::Buffer src, backend::Buffer dst, const backend::StridedCopy& p) override {
    pass_count::kernel();
    cpu_backend::strided_copy(t, ptr(src), ptr(dst), p);
  }
  void unary(int, backend::UnaryOp op, DType t, backend::Buffer src, backend::Buffer dst, int64_t n, double alpha) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    cpu_backend::unary(op, t, ptr(src), ptr(dst), n, alpha);
  }
  void binary(int, backend::BinaryOp op, DType t, backend::Buffer a, backend::Buffer b, backend::Buffer out,
              const backend::Broadcast& p) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    cpu_backend::binary(op, t, ptr(a), ptr(b), ptr(out), p);
  }
  // Half storage, float32 arithmetic under float32's floating-point mode (half_elementwise.cpp).
  bool unary_half(int, backend::UnaryOp op, DType t, backend::Buffer src, backend::Buffer dst, int64_t n,
                  double alpha) override {
    pass_count::kernel();
    FloatModeScope mode(DType::f32);
    return cpu_backend::unary_half(op, t, ptr(src), ptr(dst), n, alpha);
  }
  bool binary_half(int, backend::BinaryOp op, DType t, backend::Buffer a, backend::Buffer b, backend::Buffer out,
                   const backend::Broadcast& p) override {
    pass_count::kernel();
    FloatModeScope mode(DType::f32);
    return cpu_backend::binary_half(op, t, ptr(a), ptr(b), ptr(out), p);
  }
  bool binary_mixed(int, backend::BinaryOp op, DType t, bool half_first, backend::Buffer a, backend::Buffer b,
                    backend::Buffer out, int64_t n) override {
    pass_count::kernel();
    FloatModeScope mode(DType::f32);
    return cpu_backend::binary_mixed(op, t, half_first, ptr(a), ptr(b), static_cast<float*>(ptr(out)), n);
  }
  void where(int, DType t, backend::Buffer c, backend::Buffer a, backend::Buffer b, backend::Buffer out,
             const backend::Broadcast& p) override {
    pass_count::kernel();
    cpu_backend::where(t, ptr(c), ptr(a), ptr(b), ptr(out), p);
  }
  void reduce(int, backend::ReduceOp op, DType t, backend::Buffer src, backend::Buffer dst, int64_t outer,
              int64_t len, int64_t inner) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    cpu_backend::reduce(op, t, ptr(src), ptr(dst), outer, len, inner);
  }
  void matmul(int, DType t, backend::Buffer a, backend::Buffer b, backend::Buffer c, const backend::Gemm& g) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    cpu_backend::matmul(t, ptr(a), ptr(b), ptr(c), g);
  }
  bool matmul_low_precision(int, DType t, backend::Buffer a, backend::Buffer b, backend::Buffer c,
                            const backend::Gemm& g) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    return cpu_backend::matmul_low_precision(t, ptr(a), ptr(b), ptr(c), g);
  }
  bool matmul_low_precision_float32(int, DType t, backend::Buffer a, backend::Buffer b, backend::Buffer c,
                                    const backend::Gemm& g) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    return cpu_backend::matmul_low_precision(t, ptr(a), ptr(b), ptr(c), g, true);
  }
  void softmax(int, DType t, backend::Buffer src, backend::Buffer dst, int64_t outer, int64_t len, int64_t inner,
               bool log) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    cpu_backend::softmax(t, ptr(src), ptr(dst), outer, len, inner, log);
  }
  void gather(int, DType t, backend::Buffer src, backend::Buffer idx, backend::Buffer dst, int64_t outer, int64_t len,
              int64_t inner, int64_t nidx) override {
    pass_count::kernel();
    cpu_backend::gather(t, ptr(src), static_cast<const int64_t*>(ptr(idx)), ptr(dst), outer, len, inner, nidx);
  }
  void scatter_add(int, DType t, backend::Buffer src, backend::Buffer idx, backend::Buffer dst, int64_t outer,
                   int64_t len, int64_t inner, int64_t nidx) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    cpu_backend::scatter_add(t, ptr(src), static_cast<const int64_t*>(ptr(idx)), ptr(dst), outer, len, inner, nidx);
  }
  void adam_step(int, DType t, backend::Buffer x, backend::Buffer g, backend::Buffer m, backend::Buffer v, int64_t n,
                 const backend::AdamStep& s) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    cpu_backend::adam_step(t, ptr(x), ptr(g), ptr(m), ptr(v), n, s);
  }
  bool unscale_and_check(int, DType t, backend::Buffer g, backend::Buffer out, int64_t n, double inv_scale,
                         backend::Buffer found) override {
    pass_count::kernel();
    FloatModeScope mode(is_floating(t) && t != DType::f64 ? DType::f32 : t);
    return cpu_backend::unscale_and_check(t, ptr(g), ptr(out), n, inv_scale, static_cast<float*>(ptr(found)));
  }
  void random_uniform(int, DType t, backend::Buffer dst, int64_t n, uint64_t seed, uint64_t offset) override {
    pass_count::kernel();
    cpu_backend::random_uniform(t, ptr(dst), n, seed, offset);
  }
  bool batchnorm_forward(int, DType t, backend::Buffer x, backend::Buffer w, backend::Buffer b, backend::Buffer y,
                         backend::Buffer mean, backend::Buffer var, int64_t n, int64_t c, int64_t s, double eps) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    return cpu_backend::batchnorm_forward(t, ptr(x), w.handle ? ptr(w) : nullptr, b.handle ? ptr(b) : nullptr, ptr(y), ptr(mean),
                                  ptr(var), n, c, s, eps);
  }
  bool batchnorm_backward(int, DType t, backend::Buffer x, backend::Buffer dy, backend::Buffer w, backend::Buffer mean,
                          backend::Buffer var, backend::Buffer dx, backend::Buffer dw, backend::Buffer db, int64_t n,
                          int64_t c, int64_t s, double eps) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    return cpu_backend::batchnorm_backward(t, ptr(x), ptr(dy), w.handle ? ptr(w) : nullptr, ptr(mean), ptr(var), ptr(dx),
                                   dw.handle ? ptr(dw) : nullptr, db.handle ? ptr(db) : nullptr, n, c, s, eps);
  }
  bool channel_affine(int, DType t, backend::Buffer x, backend::Buffer scale, backend::Buffer shift, backend::Buffer y,
                      int64_t n, int64_t c, int64_t s) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    return cpu_backend::channel_affine(t, ptr(x), ptr(scale), shift.handle ? ptr(shift) : nullptr, ptr(y), n, c, s);
  }
  bool unary_backward(int, backend::UnaryOp op, DType t, backend::Buffer x, backend::Buffer g, backend::Buffer dx,
                      int64_t n) override {
    if (t == DType::bf16 || t == DType::f16) {  // half storage, float32 arithmetic (as unary_half)
      FloatModeScope mode(DType::f32);
      if (!cpu_backend::unary_backward_half(op, t, ptr(x), ptr(g), ptr(dx), n)) return false;
      pass_count::kernel();
      return true;
    }
    pass_count::kernel();
    FloatModeScope mode(t);
    return cpu_backend::unary_backward(op, t, ptr(x), ptr(g), ptr(dx), n);
  }
  bool softmax_backward(int, DType t, backend::Buffer y, backend::Buffer g, backend::Buffer dx, int64_t outer,
                        int64_t len, int64_t inner, bool log) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    return cpu_backend::softmax_backward(t, ptr(y), ptr(g), ptr(dx), outer, len, inner, log);
  }
  bool attention_forward(int, DType t, backend::Buffer q, backend::Buffer k, backend::Buffer v, backend::Buffer mask,
                         backend::Buffer out, backend::Buffer lse, const backend::Attention& a) override {
    FloatModeScope mode(DType::f32);
    return cpu_backend::attention_forward(t, ptr(q), ptr(k), ptr(v), static_cast<const bool*>(or_null(mask)), ptr(out),
                                          static_cast<float*>(ptr(lse)), a);
  }
  bool attention_backward(int, DType t, backend::Buffer q, backend::Buffer k, backend::Buffer v, backend::Buffer mask,
                          backend::Buffer out, backend::Buffer dout, backend::Buffer lse, backend::Buffer dq,
                          backend::Buffer dk, backend::Buffer dv, const backend::Attention& a) override {
    FloatModeScope mode(DType::f32);
    return cpu_backend::attention_backward(t, ptr(q), ptr(k), ptr(v), static_cast<const bool*>(or_null(mask)), ptr(out),
                                           ptr(dout), static_cast<const float*>(ptr(lse)), ptr(dq), ptr(dk), ptr(dv), a);
  }
  bool rownorm_forward(int, DType t, backend::Buffer x, backend::Buffer w, backend::Buffer b, backend::Buffer y,
                       backend::Buffer mean, backend::Buffer rstd, int64_t r, int64_t d, double eps) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    return cpu_backend::rownorm_forward(t, ptr(x), or_null(w), or_null(b), ptr(y), ptr(mean), ptr(rstd), r, d, eps);
  }
  bool rownorm_forward_cast(int, backend::Buffer x, backend::Buffer w, backend::Buffer b, backend::Buffer y, DType low,
                            backend::Buffer y_low, backend::Buffer mean, backend::Buffer rstd, int64_t r, int64_t d,
                            double eps) override {
    pass_count::kernel();
    FloatModeScope mode(DType::f32);
    return cpu_backend::rownorm_forward_cast(ptr(x), or_null(w), or_null(b), ptr(y), low, ptr(y_low), ptr(mean), ptr(rstd),
                                             r, d, eps);
  }
  bool rownorm_backward(int, DType t, backend::Buffer x, backend::Buffer dy, backend::Buffer w, backend::Buffer mean,
                        backend::Buffer rstd, backend::Buffer dx, backend::Buffer dw, backend::Buffer db, int64_t r,
                        int64_t d) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    return cpu_backend::rownorm_backward(t, ptr(x), ptr(dy), or_null(w), ptr(mean), ptr(rstd), ptr(dx), or_null(dw), or_null(db),
                                 r, d);
  }
  bool recurrent_forward(int, backend::RecurrentCell cell, DType t, backend::Buffer xg, backend::Buffer hg,
                         backend::Buffer b_hh, backend::Buffer h_prev, backend::Buffer c_prev, backend::Buffer h,
                         backend::Buffer c, backend::Buffer saved, int64_t n, int64_t hidden) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    return cpu_backend::recurrent_forward(cell, t, ptr(xg), ptr(hg), or_null(b_hh), ptr(h_prev), or_null(c_prev), ptr(h),
                                  or_null(c), or_null(saved), n, hidden);
  }
  bool recurrent_backward(int, backend::RecurrentCell cell, DType t, backend::Buffer dy, backend::Buffer dh_next,
                          backend::Buffer dc, backend::Buffer saved, backend::Buffer c_prev, backend::Buffer c,
                          backend::Buffer h_prev, backend::Buffer h, backend::Buffer dxg, backend::Buffer dhg, int64_t n,
                          int64_t hidden) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    return cpu_backend::recurrent_backward(cell, t, ptr(dy), ptr(dh_next), or_null(dc), or_null(saved), or_null(c_prev),
                                   or_null(c), ptr(h_prev), ptr(h), ptr(dxg), or_null(dhg), n, hidden);
  }
  void im2col(int, DType t, backend::Buffer x, backend::Buffer col, const backend::ConvGeometry& g) override {
    pass_count::kernel();
    cpu_backend::im2col(t, ptr(x), ptr(col), g);
  }
  void col2im(int, DType t, backend::Buffer col, backend::Buffer dx, const backend::ConvGeometry& g) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    cpu_backend::col2im(t, ptr(col), ptr(dx), g);
  }
  bool conv_forward(int, DType t, backend::Buffer x, backend::Buffer w, backend::Buffer bias, backend::Buffer y,
                    const backend::ConvGeometry& g) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    return cpu_backend::conv_forward(t, ptr(x), ptr(w), bias.handle ? ptr(bias) : nullptr, ptr(y), g);
  }
  bool conv_forward_relu(int, DType t, backend::Buffer x, backend::Buffer w, backend::Buffer bias, backend::Buffer y,
                         const backend::ConvGeometry& g) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    return cpu_backend::conv_forward(t, ptr(x), ptr(w), bias.handle ? ptr(bias) : nullptr, ptr(y), g, true);
  }
  bool linear_forward(int, DType t, backend::Buffer x, backend::Buffer w, backend::PreparedCache* w_cache,
                      backend::Buffer bias, backend::Buffer y, int64_t n, int64_t in, int64_t out, bool relu) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    return cpu_backend::linear_forward(t, ptr(x), ptr(w), w_cache, bias.handle ? ptr(bias) : nullptr, ptr(y), n, in,
                                       out, relu);
  }
#if FLUX_HAVE_ONEDNN
  bool has_conv_forward_affine() override { return true; }
#endif
  bool conv_forward_affine(int, DType t, backend::Buffer x, backend::Buffer w, backend::Buffer scale,
                           backend::Buffer shift, backend::Buffer residual, backend::Buffer y,
                           const backend::ConvGeometry& g, bool relu, bool relu_after) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    return cpu_backend::conv_forward_affine(t, ptr(x), ptr(w), ptr(scale), ptr(shift),
                                           residual.handle ? ptr(residual) : nullptr, ptr(y), g, relu, relu_after);
  }
  bool conv_backward_data(int, DType t, backend::Buffer dy, backend::Buffer w, backend::Buffer dx,
                          const backend::ConvGeometry& g) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    return cpu_backend::conv_backward_data(t, ptr(dy), ptr(w), ptr(dx), g);
  }
  bool conv_backward_weight(int, DType t, backend::Buffer x, backend::Buffer dy, backend::Buffer dw,
                            backend::Buffer dbias, const backend::ConvGeometry& g) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    return cpu_backend::conv_backward_weight(t, ptr(x), ptr(dy), ptr(dw), dbias.handle ? ptr(dbias) : nullptr, g);
  }
  bool conv_backward_weight_float32(int, DType t, backend::Buffer x, backend::Buffer dy, backend::Buffer dw,
                                    backend::Buffer dbias, const backend::ConvGeometry& g) override {
    if (t == DType::f32) return false;
    pass_count::kernel();
    FloatModeScope mode(t);
    return cpu_backend::conv_backward_weight(t, ptr(x), ptr(dy), ptr(dw), dbias.handle ? ptr(dbias) : nullptr, g,
                                             true);
  }
  void pool_forward(int, backend::PoolOp op, DType t, backend::Buffer x, backend::Buffer y,
                    const backend::ConvGeometry& g) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    cpu_backend::pool_forward(op, t, ptr(x), ptr(y), g);
  }
  void pool_backward(int, backend::PoolOp op, DType t, backend::Buffer x, backend::Buffer y, backend::Buffer dy,
                     backend::Buffer dx, const backend::ConvGeometry& g) override {
    pass_count::kernel();
    FloatModeScope mode(t);
    cpu_backend::pool_backward(op, t, ptr(x), ptr(y), ptr(dy), ptr(dx), g);
  }

 private:
  HostPool pool_;
};

}  // namespace

backend::Backend& instance() {
  static CpuBackend* b = new CpuBackend();  // never destroyed: tensors may outlive static destruction
  return *b;
}

}  // namespace flux::cpu_backend

namespace flux::detail {
backend::Backend& builtin_cpu_backend() { return cpu_backend::instance(); }

// For bench/flux_bench.cpp (--passes): the CPU backend's pass counts (pass_count.hpp) and their reset.
void cpu_pass_counts(int64_t* conversions, int64_t* conversion_bytes, int64_t* kernels) {
  const cpu_backend::PassCounts c = cpu_backend::pass_counts();
  *conversions = c.conversions, *conversion_bytes = c.conversion_bytes, *kernels = c.kernels;
}
void cpu_reset_pass_counts() { cpu_backend::reset_pass_counts(); }
}  // namespace flux::detail
