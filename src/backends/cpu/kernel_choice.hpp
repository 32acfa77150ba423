// The one place where the CPU backend decides which kernel runs a shape (OpenBLAS or oneDNN for a
// GEMM piece; oneDNN or flux's panels for a Dense inference; oneDNN, Winograd or the few-pixel kernel
// for a conv forward; how a training Dense's weights and a bf16 weight gradient's transposed operand
// reach oneDNN's kernels). The decision is a pure function of the shape, the thread count and the CPU
// (its ISA, and the level each library runs at there: dependency_check.hpp):
// a forced choice (tests, benchmarks), else a tuned table made by flux-tune for this CPU model
// (tuned_table.hpp), else the rules in kernel_choice.cpp. Nothing is timed on a first call, so the
// same program gives the same bits in every run.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace flux::cpu_backend {

/// Where a choice is made. Each site's dims are a struct of named fields (matmul_query.hpp, conv_query.hpp).
enum class Site : int8_t {
  gemm = 0,          // one f32 GEMM piece (GemmQuery)
  linear = 1,        // a Dense inference y = x w^T (+ b, relu) (LinearQuery)
  conv_forward = 2,  // a conv forward (ConvQuery)
  linear_weights = 3,     // a Dense piece without prepared weights (training) (LinearWeightsQuery)
  bf16_transposed_a = 4,  // a bf16 GEMM with A transposed, cut along m over the pool (TransposedAQuery)
};
constexpr int kSites = 5;

enum class Kernel : int8_t {
  openblas = 0,   // gemm: OpenBLAS sgemm on the calling thread
  onednn = 1,     // gemm: oneDNN matmul; linear: oneDNN matmul on prepared (reordered) weights; conv: oneDNN
  panels = 2,     // linear: flux's 16-output panels (matmul_own.cpp)
  winograd = 3,   // conv forward: flux's Winograd F(2x2, 3x3) (winograd.cpp)
  few_pixel = 4,  // conv forward: flux's few-output-pixel kernel (conv_own.cpp)
  in_place = 5,   // linear_weights: oneDNN's kernel reads w as it is
  packed = 6,     // linear_weights: w packed into the kernel's layout in the call's scratch, then the kernel
  copied = 7,     // bf16_transposed_a: each piece's rows of op(A) copied row-major first (brgemm)
  strided = 8,    // bf16_transposed_a: pieces read A strided (oneDNN's gemm:jit packs them)
};
constexpr int kKernels = 9;
/// "openblas", "onednn", ... (the tuned table's spelling); nullopt for an unknown name.
const char* kernel_name(Kernel k);
std::optional<Kernel> kernel_from_name(const std::string& name);
const char* site_name(Site s);
std::optional<Site> site_from_name(const std::string& name);

/// A set of kernels (bit i: Kernel i).
using Candidates = uint32_t;
constexpr Candidates bit(Kernel k) { return Candidates(1) << int(k); }

/// One shape to decide: the site, its dims (site-specific, see Site; unused ones 0) and the pool's
/// thread count.
struct Query {
  Site site = Site::gemm;
  int threads = 1;
  std::array<int64_t, 18> dims{};
  bool operator==(const Query& o) const { return site == o.site && threads == o.threads && dims == o.dims; }
  bool operator<(const Query& o) const;
};

/// The kernel for q among `candidates` (never empty): forced, else tuned, else rules.
Kernel choose(const Query& q, Candidates candidates);
/// The rules alone (the fallback; what a tuned table is compared against).
Kernel rule(const Query& q, Candidates candidates);

/// Tests and benchmarks: every later choice at `site` takes `k` where it is a candidate (nullopt:
/// choose as usual). Returns the previous setting.
std::optional<Kernel> force_kernel(Site site, std::optional<Kernel> k);

/// Tuning (tune.cpp): while recording, every distinct query asked with its candidates is kept.
void record_queries(bool on);
std::vector<std::pair<Query, Candidates>> recorded_queries();
/// Each site registers how to time one query with one kernel on synthetic operands (seconds, best of
/// `reps`; +infinity where that kernel cannot run the query); the tuner calls it. Null for a site
/// that registered none.
using Timer = std::function<double(const Query&, Kernel, int reps)>;
void register_timer(Site site, Timer timer);
/// For timers: the best wall time of `reps` (at least 1) calls of run().
double best_wall_seconds(int reps, const std::function<void()>& run);
Timer timer_of(Site site);

}  // namespace flux::cpu_backend
