// The CPU backend's kernel choice (kernel_choice.hpp): forced, tuned, or by the rules below. The
// rules are a small table of conditions on the shape, the active ISA, the level each library runs
// at (dependency_check.hpp) and the thread count, written from the measurements in
// bench/results/2026-12-05-kernel-rules.md; a tuned table (flux-tune) replaces them on the CPU it was
// made on.
#include "src/backends/cpu/kernel_choice.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "src/backends/cpu/conv_query.hpp"
#include "src/backends/cpu/dependency_check.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/backends/cpu/matmul_query.hpp"
#include "src/backends/cpu/tuned_table.hpp"

namespace flux::cpu_backend {

namespace {
constexpr const char* kKernelNames[kKernels] = {"openblas", "onednn", "panels", "winograd", "few_pixel",
                                                "in_place", "packed",  "copied", "strided"};
constexpr const char* kSiteNames[kSites] = {"gemm", "linear", "conv_forward", "linear_weights", "bf16_transposed_a"};

std::atomic<int> g_forced[kSites] = {-1, -1, -1, -1, -1};

// Recording (tuning only): off on the hot path, one relaxed load.
std::atomic<bool> g_recording{false};
std::mutex g_record_mutex;
std::map<Query, Candidates>& recorded() {
  static auto* r = new std::map<Query, Candidates>();  // never destroyed (used at exit by late callers)
  return *r;
}
std::mutex g_timer_mutex;
// Function-local: sites register theirs from other files' static initialisers, which may run first.
Timer* timers() {
  static Timer t[kSites];
  return t;
}

Kernel first_of(Candidates c) {
  for (int k = 0; k < kKernels; ++k)
    if (c & (Candidates(1) << k)) return Kernel(k);
  return Kernel::openblas;
}
bool has(Candidates c, Kernel k) { return (c & bit(k)) != 0; }

// ---- the rules, one function per site ----

// A GEMM piece: OpenBLAS, except thin products (a side of at most 16: the Dense layers' narrow
// outputs and small batches), where oneDNN's matmul ran faster on AVX2 and AVX-512. Both measured
// with each library at the CPU's level: where OpenBLAS runs an older core's kernels (it does not know
// the CPU model), oneDNN; where oneDNN runs below the CPU, OpenBLAS (dependency_check.hpp).
// With AVX-512 (oneDNN 2.6's brgemm matmul), also products with a side of at most 128 (a Dense
// layer's batch) and at least 2^21 multiply-adds: forced onto oneDNN against the rule, on a Zen 4 core
// at 1 and 2 threads, the MNIST MLP trained 10-14% faster, the tiny transformer 5-9%, the char LSTM 2%,
// while the encoder's (2048 x 256 x 768-1024 products) and the wide MLP's stayed level or were faster on
// OpenBLAS and the seed MLP's tiny products 7% slower on oneDNN (bench/results/2026-12-07-quiet-zen4-session4.md).
Kernel gemm_rule(const Query& q, Candidates c) {
  const GemmQuery g = GemmQuery::from(q);
  const int64_t m = g.m, n = g.n, k = g.k;
  if (has(c, Kernel::onednn) && blas_below_cpu()) return Kernel::onednn;
  if (has(c, Kernel::openblas) && onednn_below_cpu()) return Kernel::openblas;
  if (has(c, Kernel::onednn) && std::min({m, n, k}) <= 16) return Kernel::onednn;
  if (has(c, Kernel::onednn) && active_isa() == Isa::avx512 && std::min({m, n, k}) <= 128 && m * n * k >= (int64_t(1) << 21))
    return Kernel::onednn;
  return has(c, Kernel::openblas) ? Kernel::openblas : first_of(c);
}

// A Dense inference: with AVX-512, oneDNN's brgemm matmul on its prepared weights, except 4-7 rows,
// where flux's panels measured faster (MNIST MLP at batch 4-5: 0.87x oneDNN's time; an LSTM(64 =>
// 128) step's W_hh at batch 4-8: 0.85-0.94x; at 2-3 rows the panels were 1.1-1.4x slower); below
// AVX-512 (oneDNN 2.6 has no brgemm there: gemm:jit) the panels, which measured faster on the
// bench's Dense shapes at 1 and 2 threads.
Kernel linear_rule(const Query& q, Candidates c) {
  const int64_t rows = LinearQuery::from(q).n;
  const bool few_rows = rows >= 4 && rows < 8 && has(c, Kernel::panels);
  if (active_isa() == Isa::avx512 && has(c, Kernel::onednn) && !few_rows) return Kernel::onednn;
  if (has(c, Kernel::panels)) return Kernel::panels;
  return first_of(c);
}

// A conv forward: Winograd where it fits and the output has at least 48 pixels over the batch (128
// with AVX-512), then the few-pixel kernel wherever it fits (at most 32 output pixels over the batch:
// weight-bound, see conv_own.cpp); oneDNN otherwise. Measured in ResNet-18 on AVX2 and on AVX-512
// (Zen 4), Winograd beat oneDNN's direct kernels on every 3x3 stride-1 stage from 128 pixels; the 7x7
// stage at batch 1 (49 pixels) streams 16/9 larger transformed weights from memory, which AVX2's
// weaker direct kernel still repays and AVX-512's does not; the 4x4 stage at batch 1 runs faster on
// the few-pixel kernel.
Kernel conv_rule(const Query& q, Candidates c) {
  const ConvQuery conv = ConvQuery::from(q);
  const int64_t pixels = conv.batch * conv.in[0] * conv.in[1] * conv.in[2];  // = out pixels for 3x3 s1 "same"
  const int64_t winograd_from = active_isa() == Isa::avx512 ? 128 : 48;
  if (has(c, Kernel::winograd) && pixels >= winograd_from) return Kernel::winograd;
  if (has(c, Kernel::few_pixel)) return Kernel::few_pixel;
  if (has(c, Kernel::onednn)) return Kernel::onednn;
  return first_of(c);
}

// A Dense piece without prepared weights (training: w changes at every step) whose oneDNN kernel wants
// w packed: up to kInPlaceRows rows of x the kernel reads w as it is (faster than packing plus the
// kernel on the MNIST, encoder and decoder shapes); from 512 rows packing paid again. Measured
// with oneDNN 2.6's AVX512-BF16 brgemm on a Zen 4 only (bench/results/2026-12-07-mnist-bf16-dense-pieces.md):
// AMX's kernels want their own layout of w, where the crossover is unmeasured and a tuned table decides.
constexpr int64_t kInPlaceRows = 256;
Kernel linear_weights_rule(const Query& q, Candidates c) {
  if (has(c, Kernel::in_place) && LinearWeightsQuery::from(q).n <= kInPlaceRows) return Kernel::in_place;
  return has(c, Kernel::packed) ? Kernel::packed : first_of(c);
}

// A bf16 GEMM with A transposed (a weight gradient dY^T x) cut along m: oneDNN 2.6 runs brgemm only on
// dense operands, so a piece's rows are copied row-major first while they take at most kCopyBytes (the
// MNIST MLP's 64 KiB pieces); larger ones (the encoder's 1-2 MiB) copied slower than gemm:jit ran them
// strided. Measured on the same Zen 4 and oneDNN only, as kInPlaceRows.
constexpr int64_t kCopyBytes = int64_t(256) << 10;
Kernel transposed_a_rule(const Query& q, Candidates c) {
  const TransposedAQuery t = TransposedAQuery::from(q);
  if (has(c, Kernel::copied) && t.piece_rows * t.k * 2 <= kCopyBytes) return Kernel::copied;
  return has(c, Kernel::strided) ? Kernel::strided : first_of(c);
}
}  // namespace

bool Query::operator<(const Query& o) const {
  return std::tie(site, threads, dims) < std::tie(o.site, o.threads, o.dims);
}

const char* kernel_name(Kernel k) { return int(k) >= 0 && int(k) < kKernels ? kKernelNames[int(k)] : "?"; }
std::optional<Kernel> kernel_from_name(const std::string& name) {
  for (int k = 0; k < kKernels; ++k)
    if (name == kKernelNames[k]) return Kernel(k);
  return std::nullopt;
}
const char* site_name(Site s) { return int(s) >= 0 && int(s) < kSites ? kSiteNames[int(s)] : "?"; }
std::optional<Site> site_from_name(const std::string& name) {
  for (int s = 0; s < kSites; ++s)
    if (name == kSiteNames[s]) return Site(s);
  return std::nullopt;
}

Kernel rule(const Query& q, Candidates c) {
  switch (q.site) {
    case Site::gemm: return gemm_rule(q, c);
    case Site::linear: return linear_rule(q, c);
    case Site::conv_forward: return conv_rule(q, c);
    case Site::linear_weights: return linear_weights_rule(q, c);
    case Site::bf16_transposed_a: return transposed_a_rule(q, c);
  }
  return first_of(c);
}

Kernel choose(const Query& q, Candidates c) {
  if (g_recording.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(g_record_mutex);
    recorded()[q] |= c;
  }
  const int forced = g_forced[int(q.site)].load(std::memory_order_relaxed);
  if (forced >= 0 && has(c, Kernel(forced))) return Kernel(forced);
  if (std::optional<Kernel> t = tuned_choice(q); t && has(c, *t)) return *t;
  return rule(q, c);
}

std::optional<Kernel> force_kernel(Site site, std::optional<Kernel> k) {
  const int old = g_forced[int(site)].exchange(k ? int(*k) : -1);
  return old < 0 ? std::nullopt : std::optional<Kernel>(Kernel(old));
}

void record_queries(bool on) {
  std::lock_guard<std::mutex> lock(g_record_mutex);
  if (on) recorded().clear();
  g_recording.store(on, std::memory_order_relaxed);
}
std::vector<std::pair<Query, Candidates>> recorded_queries() {
  std::lock_guard<std::mutex> lock(g_record_mutex);
  return {recorded().begin(), recorded().end()};
}

void register_timer(Site site, Timer timer) {
  std::lock_guard<std::mutex> lock(g_timer_mutex);
  timers()[int(site)] = std::move(timer);
}
double best_wall_seconds(int reps, const std::function<void()>& run) {
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < std::max(1, reps); ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

Timer timer_of(Site site) {
  std::lock_guard<std::mutex> lock(g_timer_mutex);
  return timers()[int(site)];
}

}  // namespace flux::cpu_backend
