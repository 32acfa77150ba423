// oneDNN's matmul in the CPU backend: a float32 GEMM engine for one piece on the calling thread (the
// seam's other engine beside OpenBLAS, matmul.cpp), and Dense inference (linear_forward) on weights
// reordered once into its kernels' blocked layouts, bias and relu as its epilogue. Primitives are
// created once per piece shape and then only read (read_mostly.hpp): any number of threads run one
// at once, each with its own scratchpad (onednn.hpp).
#include "src/backends/cpu/matmul_kernels.hpp"

#if FLUX_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "src/backends/cpu/isa.hpp"
#include "src/backends/cpu/matmul_query.hpp"
#include "src/backends/cpu/onednn.hpp"
#include "src/backends/cpu/prepared.hpp"
#include "src/backends/cpu/read_mostly.hpp"

namespace flux::cpu_backend {

/// One piece shape's primitive: immutable once made.
struct OnednnMatmul {
  dnnl::matmul primitive;
  dnnl::memory::desc a, b, c, scratch_desc;
  size_t scratch = 0;
};

namespace {
// The piece's shape, alpha, beta and data types (2 x dtype + float32_c: f32, or bf16 for
// matmul_low_precision, its C bf16 or Float32).
using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, int64_t, int64_t, int64_t, float, float, int>;

// oneDNN as a GEMM engine: its scratchpad at most 4 MiB (on larger pieces its buffers raised the
// peak RSS and OpenBLAS was as fast or faster), except where OpenBLAS runs below the CPU
// (blas_below_cpu; figures in bench/results/2026-12-06-blas-below-cpu.md).
constexpr size_t kMaxOnednnScratch = size_t(4) << 20;

dnnl::memory::data_type onednn_type(DType t) {
  return t == DType::bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}
/// Primitives by piece shape (null: oneDNN has no kernel for the shape).
ReadMostly<Key, OnednnMatmul>& matmuls() {
  static auto* d = new ReadMostly<Key, OnednnMatmul>(1024);  // never destroyed, as the backend
  return *d;
}

// A matmul entry (OnednnMatmul, Linear below) takes its primitive and scratchpad size from `pd`.
template <class Entry> void set_primitive(Entry& e, const dnnl::matmul::primitive_desc& pd) {
  e.scratch_desc = pd.scratchpad_desc();
  e.scratch = e.scratch_desc.get_size();
  e.primitive = dnnl::matmul(pd);
}
}  // namespace

const OnednnMatmul* onednn_matmul(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, int64_t lda,
                                  int64_t ldb, float beta, int64_t ldc, DType t, bool float32_c) {
  const int types = int(t) * 2 + int(float32_c);
  return matmuls().get(Key{m, n, k, ta, tb, lda, ldb, ldc, alpha, beta, types}, [&]() -> std::unique_ptr<const OnednnMatmul> {
                  onednn::set_team(1);  // sizes the primitive's team: one pool thread runs it
                  try {
                    using dims = dnnl::memory::dims;
                    auto f32 = onednn_type(t);
                    auto e = std::make_unique<OnednnMatmul>();
                    e->a = dnnl::memory::desc(dims{m, k}, f32, ta ? dims{1, lda} : dims{lda, 1});
                    e->b = dnnl::memory::desc(dims{k, n}, f32, tb ? dims{1, ldb} : dims{ldb, 1});
                    e->c = dnnl::memory::desc(dims{m, n}, float32_c ? dnnl::memory::data_type::f32 : f32, dims{ldc, 1});
                    dnnl::primitive_attr attr = onednn::user_scratchpad();
                    if (alpha != 1.f) attr.set_output_scales(0, {alpha});
                    if (beta != 0.f) {
                      dnnl::post_ops po;
                      po.append_sum(beta);
                      attr.set_post_ops(po);
                    }
                    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(e->a, e->b, e->c), attr, onednn::engine());
                    if (t != DType::f32 && std::string(pd.impl_info_str()).rfind("ref", 0) == 0) return nullptr;
                    set_primitive(*e, pd);
                    return e;
                  } catch (const dnnl::error&) {
                    return nullptr;
                  }
                });
}

void onednn_matmul_run(const OnednnMatmul& e, const void* a, const void* b, void* c) {
  const dnnl::engine& engine = onednn::engine();
  onednn::set_team(1);  // this pool thread's team: itself alone
  dnnl::memory am(e.a, engine, const_cast<void*>(a)), bm(e.b, engine, const_cast<void*>(b)), cm(e.c, engine, c);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
  onednn::CallScratch scratch;
  if (e.scratch)
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(e.scratch_desc, engine, scratch.get(onednn::Scratch::scratchpad, e.scratch)));
  e.primitive.execute(onednn::stream(), args);
  onednn::stream().wait();
}

bool onednn_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float beta, float* c, int64_t ldc, bool any_size) {
  const OnednnMatmul* e = onednn_matmul(ta, tb, m, n, k, alpha, lda, ldb, beta, ldc, DType::f32);
  if (!e || (!any_size && e->scratch > kMaxOnednnScratch)) return false;
  count_call(Kernel::onednn);
  onednn_matmul_run(*e, a, b, c);
  return true;
}

bool onednn_gemm_takes(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc,
                       float beta) {
  const OnednnMatmul* e = onednn_matmul(ta, tb, m, n, k, 1.f, lda, ldb, beta, ldc, DType::f32);
  return e && e->scratch <= kMaxOnednnScratch;
}

// ---- Dense forward with its weights prepared (Backend::linear_forward) ----
// OpenBLAS packs both operands on every call. At inference the weights do not change between calls: they are reordered
// once into the layout of oneDNN's kernel (weights format `any`) and kept in the weight tensor's
// cache (prepared.hpp), which the core empties on any write. Each piece is its own rows of w. Called
// without a cache (training), the kernel-choice seam (Site::linear_weights) says whether a piece's kernel
// reads w as it is (Linear::in_place) or packs it into the call's scratch first.
namespace {
using LinearKey = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, int>;  // n in cols ldy bias relu dtype
/// One piece shape's primitive: immutable once made (run by any number of threads at once).
struct Linear {
  dnnl::matmul primitive;
  dnnl::memory::desc src, plain, packed, bias, dst, scratch_desc;
  dnnl::reorder pack;
  bool packs = false;       // false: the kernel reads w as it is (nothing prepared)
  size_t scratch = 0;
  int64_t ldy = 0;          // y's row stride: > the piece's columns when it is one piece of y's columns
  bool own_output = false;  // the kernel writes a dense output of the piece's own, copied into y's rows
  // Where the kernel reads packed weights: the kernel reading w as it is, for calls without a cache
  // (training: w changes at every step) where packing at every call costs more than it saves; null
  // where oneDNN offers only its reference kernel for that.
  std::unique_ptr<const Linear> in_place;
};

ReadMostly<LinearKey, Linear>& linears() {
  static auto* l = new ReadMostly<LinearKey, Linear>(256);  // never destroyed, as the backend
  return *l;
}

// The entry for one piece shape of dtype t (f32, or bf16: x, w, bias, y all bf16, float32 accumulation),
// created on first use; null when oneDNN offers only its reference kernel or refuses.
const Linear* linear_entry(int64_t n, int64_t in, int64_t cols, int64_t ldy, bool bias, bool relu, DType t) {
  return linears().get(LinearKey{n, in, cols, ldy, bias, relu, int(t)}, [&]() -> std::unique_ptr<const Linear> {
    onednn::set_team(1);  // the primitive's team: one pool thread runs each piece
    try {
      using dims = dnnl::memory::dims;
      const auto f32 = onednn_type(t);
      const dnnl::engine& engine = onednn::engine();
      auto e = std::make_unique<Linear>();
      e->src = dnnl::memory::desc(dims{n, in}, f32, dims{in, 1});
      e->plain = dnnl::memory::desc(dims{in, cols}, f32, dims{1, in});  // rows of w (cols, in) as B (in, cols)
      if (bias) e->bias = dnnl::memory::desc(dims{1, cols}, f32, dims{cols, 1});
      dnnl::memory::desc any(dims{in, cols}, f32, dnnl::memory::format_tag::any);
      dnnl::primitive_attr attr = onednn::user_scratchpad();  // relu: after the kernel (linear_piece)
      auto make = [&](int64_t stride, const dnnl::memory::desc& weights) {
        dnnl::memory::desc dst(dims{n, cols}, f32, dims{stride, 1});
        auto desc = bias ? dnnl::matmul::desc(e->src, weights, e->bias, dst) : dnnl::matmul::desc(e->src, weights, dst);
        return dnnl::matmul::primitive_desc(desc, attr, engine);
      };
      auto starts = [](const dnnl::matmul::primitive_desc& p, const char* prefix) {
        return std::string(p.impl_info_str()).rfind(prefix, 0) == 0;
      };
      // One piece of y's columns writes into y's rows (stride ldy) where oneDNN's brgemm kernel takes
      // that; where only its gemm:jit kernel does (it repacks the weights on every call), into a dense
      // output of its own that brgemm takes, copied into y's rows after.
      dnnl::matmul::primitive_desc pd = make(ldy, any);
      if (ldy != cols && !starts(pd, "brg")) {
        dnnl::matmul::primitive_desc dense = make(cols, any);
        if (starts(dense, "brg")) pd = dense, e->own_output = true;
      }
      if (starts(pd, "ref")) return nullptr;
      // Without brgemm (oneDNN 2.6 below AVX-512) `any` gets gemm:jit on a transposed copy of w, which
      // is no kernel's packed layout and was slower than w read as it is on the Dense shapes measured:
      // there the kernel reads w in place and nothing is prepared.
      if (pd.weights_desc() != e->plain && !starts(pd, "brg")) {
        dnnl::matmul::primitive_desc direct = make(e->own_output ? cols : ldy, e->plain);
        if (!starts(direct, "ref")) pd = direct;
      }
      e->dst = pd.dst_desc();
      e->ldy = ldy;
      e->packed = pd.weights_desc();
      e->packs = e->packed != e->plain;
      if (e->packs) {
        e->pack = dnnl::reorder(dnnl::reorder::primitive_desc(engine, e->plain, engine, e->packed));
        dnnl::matmul::primitive_desc direct = make(e->own_output ? cols : ldy, e->plain);
        if (!starts(direct, "ref")) {
          auto in_place = std::make_unique<Linear>();
          in_place->src = e->src, in_place->plain = in_place->packed = e->plain, in_place->bias = e->bias;
          in_place->dst = direct.dst_desc();
          in_place->ldy = ldy;
          in_place->own_output = e->own_output;
          set_primitive(*in_place, direct);
          e->in_place = std::move(in_place);
        }
      }
      set_primitive(*e, pd);
      return e;
    } catch (const dnnl::error&) {
      return nullptr;
    }
  });
}

/// The pieces' weights in their kernels' layouts (null memory for a piece that reads w in place).
struct LinearWeights final : backend::Prepared {
  std::vector<dnnl::memory> pieces;
};

/// One piece on the calling thread, its weights `wm` (prepared or plain); elements of dtype t; relu on
/// the piece's output while it is in cache (onednn_relu.hpp: why not as a post-op).
void linear_piece(const Linear& e, const void* x, const dnnl::memory& wm, const void* bias, void* y, DType t, bool relu) {
  const size_t size = dtype_size(t);
  const dnnl::engine& engine = onednn::engine();
  onednn::set_team(1);  // this pool thread's team: itself alone
  const dnnl::memory::dims dims = e.dst.dims();
  const int64_t rows = dims[0], cols = dims[1];
  onednn::CallScratch scratch;
  void* out = e.own_output ? scratch.get(onednn::Scratch::output, size_t(rows * cols) * size) : y;
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, dnnl::memory(e.src, engine, const_cast<void*>(x))},
                                             {DNNL_ARG_WEIGHTS, wm},
                                             {DNNL_ARG_DST, dnnl::memory(e.dst, engine, out)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(e.bias, engine, const_cast<void*>(bias)));
  if (e.scratch)
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(e.scratch_desc, engine, scratch.get(onednn::Scratch::scratchpad, e.scratch)));
  e.primitive.execute(onednn::stream(), args);
  onednn::stream().wait();
  if (relu) relu_rows(t, out, rows, cols, out == y ? e.ldy : cols);
  if (out != y)
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(y) + size_t(r * e.ldy) * size, static_cast<const char*>(out) + size_t(r * cols) * size,
                  size_t(cols) * size);
}
}  // namespace

bool linear_onednn(DType t, const void* x, const void* w, backend::PreparedCache* cache, const void* bias, void* y,
                   int64_t n, int64_t in, int64_t out, bool relu, const Pieces& cut, Kernel forced) {
  const int64_t parts = cut.parts;
  const size_t size = dtype_size(t);
  auto at = [size](const void* p, int64_t elements) {
    return p ? static_cast<const char*>(p) + size_t(elements) * size : nullptr;
  };
  std::vector<const Linear*> entries(size_t(parts), nullptr);
  for (int64_t p = 0; p < parts; ++p) {
    if (cut.lo(p) >= cut.hi(p)) continue;
    entries[size_t(p)] = linear_entry(n, in, cut.hi(p) - cut.lo(p), out, bias != nullptr, relu, t);
    if (!entries[size_t(p)]) return false;
  }
  // Prepared only where a piece's kernel reads w in its own layout (brgemm); else w in place.
  bool packs = false;
  for (const Linear* e : entries) packs = packs || (e && e->packs);
  // Without a cache (training) a piece either runs its in-place kernel or packs its weights on the
  // thread that runs it, into the call's scratch (oneDNN-allocated memory came from malloc on the
  // calling thread, whose heap grew and shrank again at every step: page faults), as the seam says
  // (`forced` where it is a candidate: the tuner's timer).
  if (!cache)
    for (int64_t p = 0; p < parts; ++p) {
      const Linear*& e = entries[size_t(p)];
      if (!e || !e->packs) continue;
      const Candidates candidates = bit(Kernel::packed) | (e->in_place ? bit(Kernel::in_place) : 0);
      const Query q =
          LinearWeightsQuery{n, in, cut.hi(p) - cut.lo(p), bias != nullptr, relu, int64_t(t)}.query(num_threads());
      const Kernel use = int(forced) >= 0 && (candidates & bit(forced)) ? forced : choose(q, candidates);
      if (use == Kernel::in_place) e = e->in_place.get();
    }
  std::shared_ptr<const LinearWeights> weights;
  if (packs && cache) {
    const PreparedKind kind = t == DType::bf16 ? PreparedKind::onednn_linear_bf16 : PreparedKind::onednn_linear;
    const auto key = prepared_key(kind, reinterpret_cast<intptr_t>(w), n, in, out, parts, bias != nullptr, relu);
    weights = prepared<LinearWeights>(cache, key, [&] {
      auto lw = std::make_shared<LinearWeights>();
      lw->pieces.resize(size_t(parts));
      onednn::set_team(1);
      for (int64_t p = 0; p < parts; ++p) {
        const Linear* e = entries[size_t(p)];
        if (!e || !e->packs) continue;
        dnnl::memory plain(e->plain, onednn::engine(), const_cast<char*>(at(w, cut.lo(p) * in)));
        lw->pieces[size_t(p)] = dnnl::memory(e->packed, onednn::engine());
        e->pack.execute(onednn::stream(), plain, lw->pieces[size_t(p)]);
      }
      onednn::stream().wait();
      return lw;
    });
  }
  each_piece(parts, [&](int64_t p) {
    const Linear* e = entries[size_t(p)];
    if (!e) return;
    dnnl::memory plain(e->plain, onednn::engine(), const_cast<char*>(at(w, cut.lo(p) * in)));
    onednn::CallScratch scratch;
    dnnl::memory wm = plain;
    if (e->packs && weights) {
      wm = weights->pieces[size_t(p)];
    } else if (e->packs) {
      wm = dnnl::memory(e->packed, onednn::engine(), scratch.get(onednn::Scratch::weights, e->packed.get_size()));
      onednn::set_team(1);
      e->pack.execute(onednn::stream(), plain, wm);
      onednn::stream().wait();
    }
    linear_piece(*e, x, wm, at(bias, cut.lo(p)), const_cast<char*>(at(y, cut.lo(p))), t, relu);
  });
  return true;
}

namespace {
/// The tuner's timer for Site::linear_weights: one piece of the query's shape without a cache, its
/// weights read in place or packed at every call (wall time, best of reps); +infinity where the kernel
/// cannot run it (no packed layout, no in-place kernel, no bf16 kernels on this CPU).
double time_linear_weights(const Query& q, Kernel kernel, int reps) {
  const LinearWeightsQuery l = LinearWeightsQuery::from(q);
  const DType t = DType(l.dtype);
  constexpr double kCannot = std::numeric_limits<double>::infinity();
  if ((t != DType::f32 && t != DType::bf16) || (t == DType::bf16 && !bf16_kernels_enabled())) return kCannot;
  const Linear* e = linear_entry(l.n, l.in, l.cols, l.cols, l.bias, l.relu, t);
  if (!e || !e->packs || (kernel == Kernel::in_place && !e->in_place)) return kCannot;
  // 0.5, 0.25 and 0.125 in the dtype's bits (bf16: a float32's upper half).
  auto filled = [t](int64_t count, float v) {
    std::vector<uint32_t> words(static_cast<size_t>(count));
    uint32_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    if (t == DType::bf16) {
      auto* half = reinterpret_cast<uint16_t*>(words.data());
      std::fill(half, half + count, uint16_t(bits >> 16));
    } else {
      std::fill(words.begin(), words.end(), bits);
    }
    return words;
  };
  std::vector<uint32_t> x = filled(l.n * l.in, 0.5f), w = filled(l.cols * l.in, 0.25f), b = filled(l.cols, 0.125f),
                        y = filled(l.n * l.cols, 0.f);
  const Pieces one(l.cols, 0.0, 1.0);
  auto run = [&] {
    return linear_onednn(t, x.data(), w.data(), nullptr, l.bias ? b.data() : nullptr, y.data(), l.n, l.in, l.cols,
                         l.relu, one, kernel);
  };
  if (!run()) return kCannot;
  return best_wall_seconds(reps, [&] { run(); });
}
[[maybe_unused]] const bool linear_weights_timer_registered =
    (register_timer(Site::linear_weights, time_linear_weights), true);
}  // namespace

}  // namespace flux::cpu_backend

#else  // built without oneDNN (FLUX_ONEDNN=OFF or libdnnl-dev missing): OpenBLAS and the panels alone

namespace flux::cpu_backend {
bool onednn_gemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t, float,
                 float*, int64_t, bool) {
  return false;
}
bool onednn_gemm_takes(bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float) { return false; }
bool linear_onednn(DType, const void*, const void*, backend::PreparedCache*, const void*, void*, int64_t, int64_t,
                   int64_t, bool, const Pieces&, Kernel) {
  return false;
}
}  // namespace flux::cpu_backend

#endif  // FLUX_HAVE_ONEDNN
