// Convolution on the CPU: the im2col / col2im reference loops (f32, f64) of the portable path, and
// the oneDNN fast path for float32 (forward with fused bias, data gradient, weight + bias gradient).
//   x (N, C, in...), w (O, C / G, k...) = (G, O / G, C / G, k...), y (N, O, out...), all plain
//   row-major (oneDNN's ncw/nchw/ncdhw and (g)oi(h)(w)); up to 3 spatial axes, unused ones 1.
// oneDNN primitives are created once per geometry and cached (creation costs more than a small conv).
// Layout: with plain memory descriptors oneDNN 2.6 picks its gemm kernel; with format_tag::any it
// picks blocked direct kernels and we reorder the operands into and out of its layout on every call.
// Measured (LeNet, batch 128, 1 thread, AVX2): 6 -> 16 channels 5x5 fwd+bwd 6.6 ms plain, 3.9 ms any;
// 1 -> 6 channels 5x5 16 ms plain, 24 ms any (the 128x6x24x24 output reorder alone ~7 ms). So "auto"
// (default) asks for any when C / G * prod(kernel) >= 64, and for a dense conv on 1-3 channels keeps
// the source plain and lets oneDNN choose dst/weights (LibTorch's choice: LeNet's 1 -> 6 conv fwd +
// weight grad 12.8 ms with gemm:jit -> 1.4 ms + 0.9 ms of output reorders, AVX-512, 1 thread, loaded
// machine). FLUX_ONEDNN_LAYOUT=plain|any|plain-src forces one.
// Threads: Debian's oneDNN runs on libgomp, whose idle team threads spin (OMP_WAIT_POLICY unset) and
// burn the cores that cpu_backend::parallel_for and OpenBLAS need: on 2 loaded cores (load average ~8) the
// LeNet conv pair fwd+bwd took ~460-1050 ms per step on a 2-thread team against ~26 ms split over
// our pool (on quiet cores the two are close, 6.5-8.5 ms). So each call splits its batch over our
// pool, one oneDNN call per thread on a one-thread OpenMP team, which starts no OpenMP threads.
// Kept between calls (forwards only, under content stamps the core passes): the weights reordered
// into the kernel's layout (KeptWeights) and the last outputs in the blocked layout
// (BlockedActivations), which the next conv reads instead of reordering its plain input. ResNet-18
// at 112x112, main at 601bdb1 -> with the kept outputs, medians of paired runs (5 at batch 1, 3 at
// batch 32), AVX-512, quiet: batch 1 11.40 -> 11.24 ms (1 thread), 6.42 -> 6.27 ms (2 threads);
// batch 32 at 2 threads 136.2 -> 133.9 ms, and on the AVX2 paths (--max-isa avx2's settings) 165.7 ->
// 161.8 ms.
// Three paths of our own sit beside oneDNN's: forwards with at most 32 output pixels over the batch
// (few_pixel_forward: ResNet-18's last stage at batch 1, weight-bound), Winograd F(2x2, 3x3) for 3x3
// stride-1 forwards at inference where it times faster (winograd.cpp, winograd_race) and max pooling
// at inference on a kept blocked copy (onednn_pool_forward), each described where it is defined.
#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <array>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#if FLUX_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

#include "flux/error.hpp"
#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/onednn_relu.hpp"
#include "src/backends/cpu/broadcast_rows.hpp"
#include "src/backends/cpu/isa.hpp"
#if FLUX_HAVE_ONEDNN
#include "src/backends/cpu/kept_weights.hpp"
#endif

namespace flux::cpu_backend {

namespace {

/// The geometry over exactly three spatial axes (unused trailing axes: size 1, kernel 1, no padding).
struct Axes {
  int64_t in[3], out[3], kernel[3], stride[3], pad[3], dilation[3];
  explicit Axes(const backend::ConvGeometry& g) {
    for (int i = 0; i < 3; ++i) {
      bool used = i < g.spatial;
      in[i] = used ? g.in[i] : 1;
      out[i] = used ? g.out[i] : 1;
      kernel[i] = used ? g.kernel[i] : 1;
      stride[i] = used ? g.stride[i] : 1;
      pad[i] = used ? g.pad_lo[i] : 0;
      dilation[i] = used ? g.dilation[i] : 1;
    }
  }
  int64_t in_size() const { return in[0] * in[1] * in[2]; }
  int64_t out_size() const { return out[0] * out[1] * out[2]; }
  int64_t kernel_size() const { return kernel[0] * kernel[1] * kernel[2]; }
};

// Rows r = n * C + c (sample n, input channel c): x[r] is one (in...) image and col[r] its (K, P) block,
// K = prod(kernel), P = prod(out), since col (N, G, C/G * K, P) puts channel g * C/G + c at row
// block n * C + g * C/G + c. Each row block is independent, so rows are split over the pool.
template <class T, bool Gather>
void im2col_rows(T* image_base, T* col_base, const Axes& a, int64_t rows) {
  const int64_t I = a.in_size(), P = a.out_size(), K = a.kernel_size();
  int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, K * P));
  parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* image = image_base + r * I;
      T* col = col_base + r * K * P;
      for (int64_t k0 = 0; k0 < a.kernel[0]; ++k0)
        for (int64_t k1 = 0; k1 < a.kernel[1]; ++k1)
          for (int64_t k2 = 0; k2 < a.kernel[2]; ++k2, col += P) {
            T* c = col;
            for (int64_t o0 = 0; o0 < a.out[0]; ++o0) {
              int64_t i0 = o0 * a.stride[0] - a.pad[0] + k0 * a.dilation[0];
              bool in0 = i0 >= 0 && i0 < a.in[0];
              for (int64_t o1 = 0; o1 < a.out[1]; ++o1) {
                int64_t i1 = o1 * a.stride[1] - a.pad[1] + k1 * a.dilation[1];
                bool inside = in0 && i1 >= 0 && i1 < a.in[1];
                T* src = inside ? image + (i0 * a.in[1] + i1) * a.in[2] : image;  // no out-of-range offset
                for (int64_t o2 = 0; o2 < a.out[2]; ++o2, ++c) {
                  int64_t i2 = o2 * a.stride[2] - a.pad[2] + k2 * a.dilation[2];
                  bool ok = inside && i2 >= 0 && i2 < a.in[2];
                  if constexpr (Gather) *c = ok ? src[i2] : T(0);
                  else if (ok) src[i2] += *c;
                }
              }
            }
          }
    }
  });
}

}  // namespace

void im2col(DType t, const void* x, void* col, const backend::ConvGeometry& g) {
  Axes a(g);
  int64_t rows = g.batch * g.in_channels;
  if (t == DType::f32) im2col_rows<float, true>(const_cast<float*>(static_cast<const float*>(x)), static_cast<float*>(col), a, rows);
  else if (t == DType::f64) im2col_rows<double, true>(const_cast<double*>(static_cast<const double*>(x)), static_cast<double*>(col), a, rows);
  else detail::fail("[im2col] CPU kernel supports Float32 and Float64; got ", dtype_name(t));
}

void col2im(DType t, const void* col, void* dx, const backend::ConvGeometry& g) {
  Axes a(g);
  int64_t rows = g.batch * g.in_channels;
  if (t == DType::f32) im2col_rows<float, false>(static_cast<float*>(dx), const_cast<float*>(static_cast<const float*>(col)), a, rows);
  else if (t == DType::f64) im2col_rows<double, false>(static_cast<double*>(dx), const_cast<double*>(static_cast<const double*>(col)), a, rows);
  else detail::fail("[col2im] CPU kernel supports Float32 and Float64; got ", dtype_name(t));
}

// ---- oneDNN ----
#if FLUX_HAVE_ONEDNN

namespace {

using dnnl::memory;
using Tag = memory::format_tag;

enum class Kind : int64_t { forward, forward_relu, forward_affine, backward_data, backward_weight };

bool is_forward(Kind k) { return k == Kind::forward || k == Kind::forward_relu || k == Kind::forward_affine; }

/// Kind::forward_affine's post-ops after conv * scale + shift (Backend::conv_forward_affine).
struct Epilogue {
  bool relu = false, residual = false, relu_after = false;
  int64_t flags() const { return int64_t(relu) | int64_t(residual) << 1 | int64_t(relu_after) << 2; }
};

using Key = std::array<int64_t, 32>;

Key make_key(Kind kind, bool bias, const backend::ConvGeometry& g, const Epilogue& ep) {
  Key k{};
  k[k.size() - 2] = ep.flags();
  size_t i = 0;
  k[i++] = int64_t(kind), k[i++] = bias, k[i++] = g.spatial, k[i++] = g.batch, k[i++] = g.in_channels;
  k[i++] = g.out_channels, k[i++] = g.groups;
  for (int a = 0; a < g.spatial; ++a) {
    k[i++] = g.in[a], k[i++] = g.out[a], k[i++] = g.kernel[a], k[i++] = g.stride[a];
    k[i++] = g.pad_lo[a], k[i++] = g.pad_hi[a], k[i++] = g.dilation[a];
  }
  return k;
}

/// One primitive argument: the plain (user) memory, and when the primitive chose another layout, a
/// scratch memory in that layout with the reorder between them.
struct Operand {
  int arg = 0;  // kNoArgument: read by a reorder, not by the primitive
  bool input = true;
  int scales = -1;  // >= 0: the reorder multiplies output channel o by operand[scales][o] (runtime output scales)
  memory user;
  memory inner;  // == user when no reorder is needed
  dnnl::reorder reorder;
  bool reordered = false;
  KeptWeights kept;  // forward weights with a known stamp (convs of one geometry share the entry)
  memory view;       // inner's layout over memory we do not own (a BlockedActivations copy)
};

constexpr int kNoArgument = -1;

/// How a fused forward adds its residual: not at all, or by oneDNN's sum post-op (the residual is
/// first written into the destination, reordered to its layout).
enum class Residual { none, sum };

struct Entry {
  dnnl::primitive primitive;
  std::vector<Operand> operands;
  memory scratchpad;  // its own (scratchpad_mode::user): chunks run concurrently on pool threads
  Residual residual = Residual::none;
  Operand residual_operand;  // plain (N, O, out...) residual -> the destination's layout
};

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

/// Blocked copies of recent forward outputs: a conv whose destination oneDNN keeps channel-blocked
/// (nChw16c / nChw8c) writes it into one of these copies and reorders that into the plain y, and the
/// copy stays, named by y's buffer and content stamp (ConvGeometry::output_stamp). A later forward whose
/// input (or fused residual) is that tensor, unchanged (the same stamp) and wanted in the same layout,
/// reads the copy instead of reordering the plain tensor: the nchw -> blocked reorder of every conv in
/// a chain of convs. kMax copies (a ResNet block needs four at once: its input, conv1's output, the
/// downsample's and the block's output), the least recently used refilled, each grown to the largest
/// activation it held and kept (no page faults per call), at most kMaxBytes in all. Used under the
/// Dnnl mutex.
class BlockedActivations {
 public:
  static constexpr size_t kMax = 4;
  static constexpr size_t kMaxBytes = size_t(256) << 20;

  struct Copy {
    const void* plain = nullptr;  // null: holds nothing
    uint64_t stamp = 0;
    bool deferred = false;  // the plain y was not written (ConvGeometry::output_deferred): only here
    int block = 0;  // channels per block
    memory::dims dims;
    std::unique_ptr<float, void (*)(void*)> data{nullptr, std::free};
    size_t capacity = 0;  // bytes
    uint64_t used = 0;
  };

  /// The copy of (plain, stamp) in `block` with these dims, or null.
  Copy* find(const void* plain, uint64_t stamp, int block, const memory::dims& dims) {
    if (!plain || stamp == 0 || block == 0) return nullptr;
    for (Copy& c : copies_)
      if (c.plain == plain && c.stamp == stamp && c.block == block && c.dims == dims) {
        c.used = ++calls_;
        return &c;
      }
    return nullptr;
  }

  /// A copy with room for `bytes`, emptied (it names nothing until filled and named), other than
  /// `keep_a` / `keep_b` (the copies this call reads); null when the bound does not allow it. A
  /// deferred copy is written out by materialise(copy) before it is refilled.
  template <class Materialise>
  Copy* acquire(size_t bytes, const Copy* keep_a, const Copy* keep_b, Materialise&& materialise) {
    if (bytes > kMaxBytes) return nullptr;
    Copy* pick = nullptr;
    if (copies_.size() < kMax) {
      pick = &copies_.emplace_back();
    } else {
      for (Copy& c : copies_)
        if (&c != keep_a && &c != keep_b && (!pick || c.used < pick->used)) pick = &c;
    }
    if (pick->plain && pick->deferred) materialise(*pick);
    pick->plain = nullptr;
    pick->used = ++calls_;
    if (pick->capacity < bytes) {
      size_t total = bytes;
      for (const Copy& c : copies_)
        if (&c != pick) total += c.capacity;
      if (total > kMaxBytes) return nullptr;
      pick->data.reset(static_cast<float*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
      pick->capacity = pick->data ? bytes : 0;
      if (!pick->data) return nullptr;
    }
    return pick;
  }

  /// Deferred copies now (read without the lock by onednn_forget, to skip it when there are none).
  std::atomic<int> deferred_count{0};

  /// `c` (acquired and filled) now holds the content of the tensor at `plain` with `stamp`; deferred:
  /// that tensor's plain memory was not written.
  void name(Copy& c, const void* plain, uint64_t stamp, bool deferred) {
    c.plain = plain, c.stamp = stamp, c.deferred = deferred;
    if (deferred) deferred_count.fetch_add(1, std::memory_order_relaxed);
  }

  /// The deferred copy whose plain tensor is at `plain`, or null.
  Copy* deferred(const void* plain) {
    for (Copy& c : copies_)
      if (c.plain == plain && c.deferred) return &c;
    return nullptr;
  }

  /// `plain` was freed: no copy names it any longer (its memory may hold another tensor next).
  void forget(const void* plain) {
    for (Copy& c : copies_)
      if (c.plain == plain) {
        if (c.deferred) deferred_count.fetch_sub(1, std::memory_order_relaxed);
        c.plain = nullptr, c.deferred = false;
      }
  }

 private:
  std::deque<Copy> copies_;  // stable addresses
  uint64_t calls_ = 0;
};

struct Dnnl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mutex;  // guards the cache and serialises the calls
  std::map<Key, std::unique_ptr<Entry>> cache;
  BlockedActivations activations;
  // materialise()'s reorders, by part shape and channel block (created once: a reorder's primitive
  // descriptor costs tens of microseconds, more than writing a small output).
  std::map<std::pair<memory::dims, int64_t>, dnnl::reorder> materialisers;
  // few_pixel_forward's columns and product, grown to the largest call and kept (no page faults).
  std::vector<float> few_pixel_col, few_pixel_out;
  // Inference forwards that fit winograd.cpp: -1 not yet timed, 0 oneDNN, 1 Winograd (winograd_race).
  std::map<Key, int> winograd;
  std::vector<Key>* looked_up = nullptr;  // while set, lookup() adds each key it is asked for
  int layout = 0;  // FLUX_ONEDNN_LAYOUT: 0 auto, 1 plain, 2 any, 3 plain-src (dst/weights any)
  bool pool_threading = true;  // false (FLUX_ONEDNN_THREADING=omp): one call on an OpenMP team
  void (*omp_set_num_threads)(int) = nullptr;
  Dnnl() {
    const char* v = std::getenv("FLUX_ONEDNN_LAYOUT");
    layout = !v                              ? 0
             : std::strcmp(v, "plain") == 0     ? 1
             : std::strcmp(v, "any") == 0       ? 2
             : std::strcmp(v, "plain-src") == 0 ? 3
                                                : 0;
    const char* t = std::getenv("FLUX_ONEDNN_THREADING");
    pool_threading = !(t && std::strcmp(t, "omp") == 0);
    // Debian's oneDNN runs on libgomp's OpenMP: we set each calling thread's team size.
    omp_set_num_threads = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  }
};

Dnnl& state() {
  static Dnnl* d = new Dnnl();  // never destroyed, as the backend
  return *d;
}

memory::dims activation_dims(const backend::ConvGeometry& g, int64_t channels, const int64_t* sizes) {
  memory::dims d{g.batch, channels};
  for (int i = 0; i < g.spatial; ++i) d.push_back(sizes[i]);
  return d;
}

Tag activation_tag(int spatial) { return spatial == 1 ? Tag::ncw : spatial == 2 ? Tag::nchw : Tag::ncdhw; }
/// The channel-blocked activation layout (nCw / nChw / nCdhw with `block` = 16 or 8 channels a block).
Tag blocked_tag(int64_t block, int spatial) {
  static const Tag by16[] = {Tag::aBc16b, Tag::aBcd16b, Tag::aBcde16b}, by8[] = {Tag::aBc8b, Tag::aBcd8b, Tag::aBcde8b};
  return block == 16 ? by16[spatial - 1] : by8[spatial - 1];
}

/// Writes a deferred copy's plain tensor and clears `deferred`: oneDNN's reorder, cut over the pool
/// by samples (or, for one image, by ranges of whole channel blocks), each part contiguous in both
/// layouts. Under the Dnnl mutex.
void materialise(Dnnl& s, BlockedActivations::Copy& c) {
  const int spatial = int(c.dims.size()) - 2;
  const int64_t batch = c.dims[0], channels = c.dims[1], block = c.block;
  int64_t pixels = 1;
  for (int i = 0; i < spatial; ++i) pixels *= c.dims[size_t(2 + i)];
  const int64_t blocks = (channels + block - 1) / block;
  // Parts: one sample each, or (one image) up to num_threads() ranges of channel blocks.
  const int64_t parts = batch > 1 ? batch : std::min<int64_t>(num_threads(), blocks);
  auto first_block = [&](int64_t p) { return batch > 1 ? 0 : blocks * p / parts; };
  auto part_channels = [&](int64_t p) {
    if (batch > 1) return channels;
    return std::min(channels, blocks * (p + 1) / parts * block) - first_block(p) * block;
  };
  const Tag blocked = blocked_tag(block, spatial);
  // The kept primitive for a part of `width` channels; made here, before the pool runs the parts. The
  // bound is applied first, so that the two looked up below stay valid.
  if (s.materialisers.size() + 2 > 256) s.materialisers.clear();
  auto reorder_for = [&](int64_t width) {
    memory::dims d = c.dims;
    d[0] = 1, d[1] = width;
    auto key = std::make_pair(d, block);
    auto it = s.materialisers.find(key);
    if (it == s.materialisers.end())
      it = s.materialisers
               .emplace(key, dnnl::reorder(dnnl::reorder::primitive_desc(
                                 s.engine, memory::desc(d, memory::data_type::f32, blocked), s.engine,
                                 memory::desc(d, memory::data_type::f32, activation_tag(spatial)))))
               .first;
    return &it->second;
  };
  // Every part but the last has the first part's width; the last may be narrower.
  const int64_t first_width = part_channels(0), last_width = part_channels(parts - 1);
  dnnl::reorder* const first = reorder_for(first_width);
  dnnl::reorder* const last = last_width == first_width ? first : reorder_for(last_width);
  const float* from = c.data.get();
  float* to = static_cast<float*>(const_cast<void*>(c.plain));
  const int64_t padded = blocks * block;
  parallel_for(parts, 1, [&](int64_t p0, int64_t p1) {
    thread_local dnnl::stream stream(s.engine);
    if (s.omp_set_num_threads) s.omp_set_num_threads(1);  // this pool thread alone
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t width = part_channels(p);
      const int64_t n = batch > 1 ? p : 0, cb = first_block(p);
      memory::dims d = c.dims;
      d[0] = 1, d[1] = width;
      memory src(memory::desc(d, memory::data_type::f32, blocked), s.engine,
                 const_cast<float*>(from) + (n * padded + cb * block) * pixels);
      memory dst(memory::desc(d, memory::data_type::f32, activation_tag(spatial)), s.engine,
                 to + (n * channels + cb * block) * pixels);
      (p + 1 == parts ? last : first)->execute(stream, src, dst);
      stream.wait();
    }
  });
  c.deferred = false;
  s.activations.deferred_count.fetch_sub(1, std::memory_order_relaxed);
}

/// The tensor at `plain`, if a conv or pool left it unwritten (deferred), written now. Under the mutex.
void materialise_if_deferred(Dnnl& s, const void* plain) {
  if (!plain) return;
  if (BlockedActivations::Copy* c = s.activations.deferred(plain)) materialise(s, *c);
}

memory::desc weight_desc(const backend::ConvGeometry& g, bool any) {
  memory::dims d;
  if (g.groups > 1) d = {g.groups, g.out_channels / g.groups, g.in_channels / g.groups};
  else d = {g.out_channels, g.in_channels};
  for (int i = 0; i < g.spatial; ++i) d.push_back(g.kernel[i]);
  Tag tag = any ? Tag::any
            : g.groups > 1 ? (g.spatial == 1 ? Tag::goiw : g.spatial == 2 ? Tag::goihw : Tag::goidhw)
                           : (g.spatial == 1 ? Tag::oiw : g.spatial == 2 ? Tag::oihw : Tag::oidhw);
  return memory::desc(d, memory::data_type::f32, tag);
}

struct Descs {
  memory::desc src, weights, dst, bias;
  memory::dims strides, dilates, pad_l, pad_r;
};

/// any: oneDNN chooses the layouts of dst and weights, and of src too unless plain_src.
Descs make_descs(const backend::ConvGeometry& g, bool any, bool bias, bool plain_src = false) {
  Descs d;
  Tag act = any ? Tag::any : activation_tag(g.spatial);
  d.src = memory::desc(activation_dims(g, g.in_channels, g.in), memory::data_type::f32,
                       plain_src ? activation_tag(g.spatial) : act);
  d.dst = memory::desc(activation_dims(g, g.out_channels, g.out), memory::data_type::f32, act);
  d.weights = weight_desc(g, any);
  if (bias) d.bias = memory::desc({g.out_channels}, memory::data_type::f32, Tag::x);
  for (int i = 0; i < g.spatial; ++i) {
    d.strides.push_back(g.stride[i]);
    d.dilates.push_back(g.dilation[i] - 1);  // oneDNN counts the gaps
    d.pad_l.push_back(g.pad_lo[i]);
    d.pad_r.push_back(g.pad_hi[i]);
  }
  return d;
}

/// relu: oneDNN eltwise post-ops that keep NaN (onednn_relu.hpp), applied to conv + bias before y is written.
dnnl::convolution_forward::primitive_desc forward_pd(Dnnl& s, const Descs& d, bool bias, bool relu = false) {
  using F = dnnl::convolution_forward;
  auto desc = bias ? F::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, d.src, d.weights,
                             d.bias, d.dst, d.strides, d.dilates, d.pad_l, d.pad_r)
                   : F::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, d.src, d.weights,
                             d.dst, d.strides, d.dilates, d.pad_l, d.pad_r);
  dnnl::primitive_attr attr = user_scratchpad();
  if (relu) {
    dnnl::post_ops ops;
    append_relu_keeping_nan(ops);
    attr.set_post_ops(ops);
  }
  return F::primitive_desc(desc, attr, s.engine);
}

Operand make_operand(Dnnl& s, int arg, bool input, const memory::desc& plain, const memory::desc& chosen) {
  Operand op;
  op.arg = arg;
  op.input = input;
  op.user = memory(plain, s.engine, DNNL_MEMORY_NONE);
  if (chosen == plain) {
    op.inner = op.user;
  } else {
    op.inner = memory(chosen, s.engine);
    op.reordered = true;
    op.reorder = input ? dnnl::reorder(op.user, op.inner) : dnnl::reorder(op.inner, op.user);
  }
  return op;
}

/// The fused inference forward. The BatchNorm's per-channel scale multiplies the weights while the
/// per-call weight reorder (plain -> the kernel's blocked layout) runs anyway (the reorder's runtime
/// output scales: no extra pass, nothing cached), its shift is the conv's bias, then relu, the residual
/// (sum post-op) and relu again as asked: the kernels and layouts of the unfused forward (LibTorch's
/// conv + bias + sum + relu pattern). Measured against binary mul/add post-ops on the output: those
/// ran ~5% slower than no fusion at all at batch 1 (1 thread, AVX-512). Null when the layouts are
/// plain (oneDNN's gemm kernel) or oneDNN offers a reference kernel only: the core then runs the
/// unfused composition.
std::unique_ptr<Entry> create_affine(Dnnl& s, const Descs& plain, const Descs& asked, const backend::ConvGeometry& g,
                                     const Epilogue& ep) {
  using F = dnnl::convolution_forward;
  if (asked.dst == plain.dst) return nullptr;
  F::primitive_desc unfused = forward_pd(s, asked, false);  // the unfused forward's layouts
  memory::desc channels({g.out_channels}, memory::data_type::f32, Tag::x);
  dnnl::post_ops ops;
  if (ep.relu) append_relu_keeping_nan(ops);
  if (ep.residual) ops.append_sum(1.0f);
  if (ep.relu_after) append_relu_keeping_nan(ops);
  dnnl::primitive_attr attr = user_scratchpad();
  attr.set_post_ops(ops);
  F::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, unfused.src_desc(),
               unfused.weights_desc(), channels, unfused.dst_desc(), asked.strides, asked.dilates, asked.pad_l,
               asked.pad_r);
  F::primitive_desc pd(desc, attr, s.engine);
  if (std::strncmp(pd.impl_info_str(), "ref", 3) == 0) return nullptr;
  auto e = std::make_unique<Entry>();
  e->primitive = F(pd);
  e->scratchpad = memory(pd.scratchpad_desc(), s.engine);
  e->operands.push_back(make_operand(s, DNNL_ARG_SRC, true, plain.src, pd.src_desc()));
  // Weights (O, C/G, k...) or (G, O/G, C/G, k...): the output channel is axis 0, or axes 0 and 1.
  Operand weights;
  weights.arg = DNNL_ARG_WEIGHTS;
  weights.user = memory(plain.weights, s.engine, DNNL_MEMORY_NONE);
  weights.inner = memory(pd.weights_desc(), s.engine);
  weights.reordered = true;
  weights.scales = 2;
  dnnl::primitive_attr scaled;
  scaled.set_output_scales(g.groups > 1 ? 3 : 1, {DNNL_RUNTIME_F32_VAL});
  weights.reorder = dnnl::reorder(dnnl::reorder::primitive_desc(s.engine, plain.weights, s.engine, pd.weights_desc(), scaled));
  e->operands.push_back(std::move(weights));
  Operand scale;
  scale.arg = kNoArgument;
  scale.user = scale.inner = memory(channels, s.engine, DNNL_MEMORY_NONE);
  e->operands.push_back(std::move(scale));
  e->operands.push_back(make_operand(s, DNNL_ARG_BIAS, true, channels, pd.bias_desc()));
  e->operands.push_back(make_operand(s, DNNL_ARG_DST, false, plain.dst, pd.dst_desc()));
  if (ep.residual) {
    // Written into the destination (its blocked scratch memory) before the conv adds onto it.
    const Operand& dst = e->operands.back();
    e->residual = Residual::sum;
    e->residual_operand.user = memory(plain.dst, s.engine, DNNL_MEMORY_NONE);
    e->residual_operand.inner = dst.inner;
    e->residual_operand.reordered = dst.reordered;
    if (dst.reordered) e->residual_operand.reorder = dnnl::reorder(e->residual_operand.user, dst.inner);
  }
  return e;
}

std::unique_ptr<Entry> create(Dnnl& s, Kind kind, bool bias, const backend::ConvGeometry& g, const Epilogue& ep) {
  auto e = std::make_unique<Entry>();
  Descs plain = make_descs(g, false, bias);
  // oneDNN's blocked kernels (jit:avx2/avx512 on nChw8c/16c) beat its plain-layout gemm kernel when
  // the work per pixel (C / G * prod(kernel)) repays reordering the activations; below that (a
  // first layer on 1 channel, depthwise) the reorders cost more than they save. See the header.
  int64_t per_pixel = g.in_channels / g.groups;
  for (int i = 0; i < g.spatial; ++i) per_pixel *= g.kernel[i];
  // A few-channel dense conv (a first layer: 1-3 channels) keeps its source plain and lets oneDNN
  // choose blocked dst/weights, as LibTorch does: its direct kernels read a plain source with few
  // channels, and the source is not padded to 8/16 channels by a reorder.
  bool few = g.groups == 1 && g.in_channels < 4;
  // A forward with very few output pixels (few_pixels(): ResNet-18's last stage at batch 1) does not
  // come here in the auto layout: few_pixel_forward runs it.
  bool any = s.layout == 2 || s.layout == 3 || (s.layout == 0 && (per_pixel >= 64 || few));
  bool plain_src = s.layout == 3 || (s.layout == 0 && per_pixel < 64 && few);
  Descs asked = make_descs(g, any, bias, plain_src);
  if (kind == Kind::forward_affine) return create_affine(s, plain, asked, g, ep);
  if (kind == Kind::forward || kind == Kind::forward_relu) {
    auto pd = forward_pd(s, asked, bias, kind == Kind::forward_relu);
    e->primitive = dnnl::convolution_forward(pd);
    e->scratchpad = memory(pd.scratchpad_desc(), s.engine);
    e->operands.push_back(make_operand(s, DNNL_ARG_SRC, true, plain.src, pd.src_desc()));
    e->operands.push_back(make_operand(s, DNNL_ARG_WEIGHTS, true, plain.weights, pd.weights_desc()));
    if (bias) e->operands.push_back(make_operand(s, DNNL_ARG_BIAS, true, plain.bias, pd.bias_desc()));
    e->operands.push_back(make_operand(s, DNNL_ARG_DST, false, plain.dst, pd.dst_desc()));
  } else if (kind == Kind::backward_data) {
    using B = dnnl::convolution_backward_data;
    auto hint = forward_pd(s, asked, false);
    B::desc desc(dnnl::algorithm::convolution_direct, asked.src, asked.weights, asked.dst, asked.strides,
                 asked.dilates, asked.pad_l, asked.pad_r);
    B::primitive_desc pd(desc, user_scratchpad(), s.engine, hint);
    e->primitive = B(pd);
    e->scratchpad = memory(pd.scratchpad_desc(), s.engine);
    e->operands.push_back(make_operand(s, DNNL_ARG_DIFF_DST, true, plain.dst, pd.diff_dst_desc()));
    e->operands.push_back(make_operand(s, DNNL_ARG_WEIGHTS, true, plain.weights, pd.weights_desc()));
    e->operands.push_back(make_operand(s, DNNL_ARG_DIFF_SRC, false, plain.src, pd.diff_src_desc()));
  } else {
    using B = dnnl::convolution_backward_weights;
    auto hint = forward_pd(s, asked, bias);
    auto desc = bias ? B::desc(dnnl::algorithm::convolution_direct, asked.src, asked.weights, asked.bias, asked.dst,
                               asked.strides, asked.dilates, asked.pad_l, asked.pad_r)
                     : B::desc(dnnl::algorithm::convolution_direct, asked.src, asked.weights, asked.dst,
                               asked.strides, asked.dilates, asked.pad_l, asked.pad_r);
    B::primitive_desc pd(desc, user_scratchpad(), s.engine, hint);
    e->primitive = B(pd);
    e->scratchpad = memory(pd.scratchpad_desc(), s.engine);
    e->operands.push_back(make_operand(s, DNNL_ARG_SRC, true, plain.src, pd.src_desc()));
    e->operands.push_back(make_operand(s, DNNL_ARG_DIFF_DST, true, plain.dst, pd.diff_dst_desc()));
    e->operands.push_back(make_operand(s, DNNL_ARG_DIFF_WEIGHTS, false, plain.weights, pd.diff_weights_desc()));
    if (bias) e->operands.push_back(make_operand(s, DNNL_ARG_DIFF_BIAS, false, plain.bias, pd.diff_bias_desc()));
  }
  return e;
}

/// The cached entry for (kind, bias, g, chunk), created on first use; null when oneDNN refuses the
/// case (remembered, so the portable path runs without asking again). Called under the mutex.
Entry* lookup(Dnnl& s, Kind kind, bool bias, const backend::ConvGeometry& g, int64_t chunk, const Epilogue& ep) {
  Key key = make_key(kind, bias, g, ep);
  key[key.size() - 1] = chunk;  // one entry per chunk: chunks run at once and each binds its own memories
  if (s.looked_up) s.looked_up->push_back(key);
  auto it = s.cache.find(key);
  if (it == s.cache.end()) {
    std::unique_ptr<Entry> e;
    try {
      e = create(s, kind, bias, g, ep);
    } catch (const dnnl::error&) {
      e = nullptr;
    }
    if (s.cache.size() >= 512) s.cache.clear();  // a bound for programs that sweep many shapes
    it = s.cache.emplace(key, std::move(e)).first;
  }
  return it->second.get();
}

/// An input operand's reorder into `to` (its scratch memory or a kept copy), multiplying in the
/// runtime output scales where it has them (the fused BatchNorm's weights).
void reorder_input(Entry& e, Operand& op, memory& to, dnnl::stream& stream) {
  if (op.scales >= 0)
    op.reorder.execute(stream, {{DNNL_ARG_FROM, op.user}, {DNNL_ARG_TO, to},
                                {DNNL_ARG_ATTR_OUTPUT_SCALES, e.operands[size_t(op.scales)].user}});
  else
    op.reorder.execute(stream, op.user, to);
}

/// One chunk's blocked operands held in BlockedActivations copies (null: none): the source to read
/// instead of reordering the plain x, the destination to write (then reordered into the plain y), the
/// residual to copy into the destination instead of reordering the plain residual.
struct Views {
  void* src = nullptr;
  void* dst = nullptr;
  const void* residual = nullptr;
  bool defer = false;  // leave the plain y unwritten (dst holds it; ConvGeometry::output_deferred)
};

/// op's layout over `data` (memory we do not own).
memory& view_of(Dnnl& s, Operand& op, void* data) {
  if (!op.view) op.view = memory(op.inner.get_desc(), s.engine, DNNL_MEMORY_NONE);
  op.view.set_data_handle(data);
  return op.view;
}

/// residual: Kind::forward_affine's residual (plain, the destination's shape), or null. stamp: the
/// weights' content stamp for a forward (0: unknown, reorder them).
void execute(Dnnl& s, Entry& e, const std::vector<void*>& buffers, void* residual, uint64_t stamp,
             const Views& views) {
  thread_local dnnl::stream stream(s.engine);  // one stream per pool thread
  if (s.omp_set_num_threads) s.omp_set_num_threads(s.pool_threading ? 1 : num_threads());
  std::unordered_map<int, memory> args;
  for (size_t i = 0; i < e.operands.size(); ++i) e.operands[i].user.set_data_handle(buffers[i]);
  memory* dst = nullptr;  // where the primitive writes its destination when that is blocked
  for (Operand& op : e.operands) {
    if (op.reordered && op.arg == DNNL_ARG_SRC && views.src) {
      args[op.arg] = view_of(s, op, views.src);
      continue;
    }
    if (op.reordered && op.arg == DNNL_ARG_DST) {
      dst = views.dst ? &view_of(s, op, views.dst) : &op.inner;
      args[op.arg] = *dst;
      continue;
    }
    if (stamp != 0 && op.reordered && op.input && op.arg == DNNL_ARG_WEIGHTS) {
      const float* scales = nullptr;
      size_t n_scales = 0;
      if (op.scales >= 0) {
        const memory& sm = e.operands[size_t(op.scales)].user;
        scales = static_cast<const float*>(sm.get_data_handle());
        n_scales = sm.get_desc().get_size() / sizeof(float);
      }
      args[op.arg] = op.kept.get(op.user.get_data_handle(), stamp, scales, n_scales, op.inner.get_desc(), s.engine,
                                 [&](memory& to) { reorder_input(e, op, to, stream); });
      continue;
    }
    if (op.reordered && op.input) reorder_input(e, op, op.inner, stream);
    if (op.arg != kNoArgument) args[op.arg] = op.inner;
  }
  if (e.residual == Residual::sum) {
    Operand& r = e.residual_operand;
    r.user.set_data_handle(residual);
    if (r.reordered && views.residual)  // the same blocked layout: a copy
      std::memcpy(dst->get_data_handle(), views.residual, dst->get_desc().get_size());
    else if (r.reordered) r.reorder.execute(stream, r.user, *dst);
    else std::memcpy(buffers.back(), residual, r.user.get_desc().get_size());  // plain: dst starts as it
  }
  args[DNNL_ARG_SCRATCHPAD] = e.scratchpad;
  e.primitive.execute(stream, args);
  for (Operand& op : e.operands)
    if (op.reordered && !op.input && !(op.arg == DNNL_ARG_DST && views.defer))
      op.reorder.execute(stream, op.arg == DNNL_ARG_DST ? *dst : op.inner, op.user);
  stream.wait();
}

const Operand* operand(const Entry& e, int arg) {
  for (const Operand& op : e.operands)
    if (op.arg == arg) return &op;
  return nullptr;
}

/// The channel block of a channel-blocked activation layout (nCw / nChw / nCdhw, 16 or 8 channels a
/// block: what oneDNN's f32 direct kernels choose), 0 for any other layout.
int channel_block(const memory::desc& d, int spatial) {
  const memory::dims dims = d.dims();
  for (int block : {16, 8})
    if (memory::desc(dims, memory::data_type::f32, blocked_tag(block, spatial)) == d) return block;
  return 0;
}

/// A forward's BlockedActivations copies for its chunks (chunk c covers samples from at[c][0] and, for
/// one image, output channels from at[c][1]; each chunk reads the whole input then): the input and the
/// residual where a copy of them is held in the layout every chunk wants, and a copy that the
/// destination is written into, returned to be named once the chunks have run (null: none). views:
/// one per chunk, empty on entry.
BlockedActivations::Copy* plan_views(Dnnl& s, const backend::ConvGeometry& g, const std::vector<Entry*>& entries,
                                     const std::vector<std::array<int64_t, 2>>& at, const void* x, const void* residual,
                                     std::vector<Views>& views) {
  auto block_of = [&](int arg) {
    int block = -1;
    for (const Entry* e : entries) {
      const Operand* op = operand(*e, arg);
      int b = op && op->reordered ? channel_block(op->inner.get_desc(), g.spatial) : 0;
      if (block != -1 && b != block) return 0;
      block = b;
    }
    return std::max(block, 0);
  };
  const int src_block = block_of(DNNL_ARG_SRC), dst_block = block_of(DNNL_ARG_DST);
  int64_t in_pixels = 1, out_pixels = 1;
  for (int i = 0; i < g.spatial; ++i) in_pixels *= g.in[i], out_pixels *= g.out[i];
  auto padded = [](int64_t channels, int block) { return block ? (channels + block - 1) / block * block : channels; };
  const memory::dims in_dims = activation_dims(g, g.in_channels, g.in), out_dims = activation_dims(g, g.out_channels, g.out);
  BlockedActivations& acts = s.activations;
  BlockedActivations::Copy* in = acts.find(x, g.input_stamp, src_block, in_dims);
  BlockedActivations::Copy* res = residual ? acts.find(residual, g.residual_stamp, dst_block, out_dims) : nullptr;
  // An input not read from its copy is read plain: written out first if its writing was deferred.
  if (!in) materialise_if_deferred(s, x);
  if (!res) materialise_if_deferred(s, residual);
  BlockedActivations::Copy* out = nullptr;
  if (dst_block && g.output_stamp) {
    out = acts.acquire(size_t(g.batch * padded(g.out_channels, dst_block) * out_pixels) * sizeof(float), in, res,
                       [&](BlockedActivations::Copy& c) { materialise(s, c); });
    if (out) out->block = dst_block, out->dims = out_dims;
  }
  const bool defer = out && g.output_deferred;
  for (size_t c = 0; c < entries.size(); ++c) {
    const int64_t b0 = at[c][0], o0 = at[c][1];
    const int64_t dst_at = b0 * padded(g.out_channels, dst_block) * out_pixels + o0 * out_pixels;
    if (in) views[c].src = in->data.get() + b0 * padded(g.in_channels, src_block) * in_pixels;
    if (res) views[c].residual = res->data.get() + dst_at;
    if (out) views[c].dst = out->data.get() + dst_at;
    views[c].defer = defer;
  }
  return out;
}

// ---- Forwards with few output pixels: the weights streamed once through a register-blocked kernel ----
// A forward with at most kFewPixels output pixels in all (batch x out: ResNet-18's last stage at
// batch 1, 4x4 = 16 pixels at 112x112) is bound by the pass over its weights (9.4 MB for 512 -> 512
// 3x3) and the FMAs on them. oneDNN's blocked kernels reorder and reread the weights (512 -> 512 on
// 4x4, 1 thread, AVX-512: 1.17 ms with the reorder kept), its gemm kernel reads them in place but
// reaches 77 GFLOP/s on this shape (dnnl_sgemm of W 512 x 4608 by 16 columns alone: 976 us), gathers
// its columns with a scalar loop (~40 us more) and fuses no BatchNorm. Here the columns (C k, N P)
// are gathered once, zero-padded to whole vectors of the active ISA, and each pool thread runs its
// rows of W through few_pixel_rows (broadcast_rows.hpp): R rows of the product held in registers (R x V
// vectors), one pass over those rows of W, each weight broadcast against the V vectors of its column row. Measured on
// that shape (1 thread, W cycling through 6 copies so that it comes from memory as in the network):
// AVX-512 723 us (104 GFLOP/s), AVX2 code 931 us against dnnl_sgemm's 1151. Then scale and shift (or
// bias), relu, residual and relu in one pass into y. FLUX_ONEDNN_LAYOUT=plain runs oneDNN's gemm
// kernel instead (the comparison).
constexpr int64_t kFewPixels = 32;

/// Whether the forward (kind, g) takes the few-pixel path (auto layout, dense, C / G * prod(kernel)
/// >= 64, at most kFewPixels output pixels over the batch).
bool few_pixels(const Dnnl& s, Kind kind, const backend::ConvGeometry& g) {
  if (s.layout != 0 || !is_forward(kind) || g.groups != 1) return false;
  int64_t per_pixel = g.in_channels, out_pixels = g.batch, padded_image = 1;
  for (int i = 0; i < g.spatial; ++i) {
    per_pixel *= g.kernel[i], out_pixels *= g.out[i];
    padded_image *= g.in[i] + g.pad_lo[i] + g.pad_hi[i];
  }
  // few_pixel_columns' offsets into one (padded) image are 32-bit.
  return per_pixel >= 64 && out_pixels <= kFewPixels && padded_image < (int64_t(1) << 31);
}

// Rows a kernel call holds for V vectors a row: as many as the ISA's vector registers allow beside
// the V column vectors (32 zmm; 16 ymm / xmm), measured best at 8 (AVX-512, V = 1, 2) and 6 (AVX2, V = 2).
constexpr int few_pixel_block(int lanes, int v) {
  if (lanes == 16) return 8;
  if (lanes == 8) return v == 1 ? 8 : v == 2 ? 6 : v == 3 ? 4 : 3;
  return v <= 2 ? 6 : v <= 4 ? 3 : 1;
}

/// c (rows, V L) = w (rows, k) col (k, V L): blocks of R rows of w (k apart) through broadcast_rows.hpp.
template <class Vec, int V> FLUX_CPU_INLINE void few_pixel_rows(const float* w, int64_t k, int64_t rows, const float* col, float* c) {
  constexpr int L = int(sizeof(Vec) / sizeof(float)), R = few_pixel_block(L, V);
  for (int64_t r = 0; r < rows; r += R)
    broadcast_block<Vec, R, V>(std::min<int64_t>(R, rows - r), w + r * k, k, col, k, nullptr, false, c + r * V * L, V * L);
}
template <int V> FLUX_CPU_TARGET_AVX512 void few_pixel_avx512(const float* w, int64_t k, int64_t rows, const float* col, float* c) {
  few_pixel_rows<Vec16, V>(w, k, rows, col, c);
}
template <int V> FLUX_CPU_TARGET_AVX2 void few_pixel_avx2(const float* w, int64_t k, int64_t rows, const float* col, float* c) {
  few_pixel_rows<Vec8, V>(w, k, rows, col, c);
}
template <int V> void few_pixel_baseline(const float* w, int64_t k, int64_t rows, const float* col, float* c) {
  few_pixel_rows<Vec4, V>(w, k, rows, col, c);
}

/// The vector width (floats) of the active ISA's few-pixel kernel.
int64_t few_pixel_lanes() {
  Isa isa = active_isa();
  return isa == Isa::avx512 ? 16 : isa == Isa::avx2 ? 8 : 4;
}

/// c (rows, ldc) = w (rows, k) col (k, ldc), ldc = few_pixel_lanes() x V, V <= kFewPixels / lanes.
void few_pixel_gemm(const float* w, int64_t k, int64_t rows, const float* col, int64_t ldc, float* c) {
  const int64_t v = ldc / few_pixel_lanes();
  switch (active_isa()) {
    case Isa::avx512:
      if (v == 1) return few_pixel_avx512<1>(w, k, rows, col, c);
      return few_pixel_avx512<2>(w, k, rows, col, c);
    case Isa::avx2:
      switch (v) {
        case 1: return few_pixel_avx2<1>(w, k, rows, col, c);
        case 2: return few_pixel_avx2<2>(w, k, rows, col, c);
        case 3: return few_pixel_avx2<3>(w, k, rows, col, c);
        default: return few_pixel_avx2<4>(w, k, rows, col, c);
      }
    default:
      switch (v) {
        case 1: return few_pixel_baseline<1>(w, k, rows, col, c);
        case 2: return few_pixel_baseline<2>(w, k, rows, col, c);
        case 3: return few_pixel_baseline<3>(w, k, rows, col, c);
        case 4: return few_pixel_baseline<4>(w, k, rows, col, c);
        case 5: return few_pixel_baseline<5>(w, k, rows, col, c);
        case 6: return few_pixel_baseline<6>(w, k, rows, col, c);
        case 7: return few_pixel_baseline<7>(w, k, rows, col, c);
        default: return few_pixel_baseline<8>(w, k, rows, col, c);
      }
  }
}

/// out[t ldc + p] = image[idx[t P + p]] for taps t < taps, pixels p < P: scalar loads (GCC does not
/// vectorise it; ~30 us for ResNet-18's 4608 x 16, 1 thread).
void gather_taps(const float* __restrict image, const int32_t* __restrict idx, int64_t taps, int64_t P,
                 float* __restrict out, int64_t ldc) {
  for (int64_t t = 0; t < taps; ++t, out += ldc, idx += P)
    for (int64_t p = 0; p < P; ++p) out[p] = image[idx[p]];
}

/// The columns of x (N, C, in...) for (g): col row (c, k...) holds, at n P + p, the input under
/// kernel tap k of output pixel p of sample n (0 in the padding); columns N P .. ldc are 0. Each image
/// (copied first into a zero-bordered buffer when the conv pads) is read through one table of
/// offsets, tap by pixel, shared by every channel: for ResNet-18's 512 x 4x4 input (4608 rows of 16)
/// ~100 us with a bounds check per element, ~50 with loops per output row, ~30 here, 1 thread, AVX-512
/// (the kernel after it: ~720 us).
void few_pixel_columns(const float* x, float* col, int64_t ldc, const backend::ConvGeometry& g) {
  // Axes padded with unit axes in front.
  int64_t in[3], out[3], kernel[3], stride[3], dilation[3], lo[3], size[3];
  for (int i = 0; i < 3; ++i) {
    const int from = i - (3 - g.spatial);
    const bool used = from >= 0;
    in[i] = used ? g.in[from] : 1, out[i] = used ? g.out[from] : 1, kernel[i] = used ? g.kernel[from] : 1;
    stride[i] = used ? g.stride[from] : 1, dilation[i] = used ? g.dilation[from] : 1;
    lo[i] = used ? g.pad_lo[from] : 0;
    size[i] = in[i] + lo[i] + (used ? g.pad_hi[from] : 0);  // the padded image
  }
  const bool padded = size[0] != in[0] || size[1] != in[1] || size[2] != in[2];
  const int64_t I = in[0] * in[1] * in[2], S = size[0] * size[1] * size[2];
  const int64_t P = out[0] * out[1] * out[2], K = kernel[0] * kernel[1] * kernel[2], NP = g.batch * P;
  // idx[t P + p]: the offset in the (padded) image of tap t of output pixel p. Offsets are < S <= 2^31
  // for any image a few-pixel conv reads (checked: else the caller's oneDNN path runs).
  std::vector<int32_t> idx(size_t(K * P));
  int32_t* at = idx.data();
  for (int64_t k0 = 0; k0 < kernel[0]; ++k0)
    for (int64_t k1 = 0; k1 < kernel[1]; ++k1)
      for (int64_t k2 = 0; k2 < kernel[2]; ++k2)
        for (int64_t o0 = 0; o0 < out[0]; ++o0)
          for (int64_t o1 = 0; o1 < out[1]; ++o1)
            for (int64_t o2 = 0; o2 < out[2]; ++o2)
              *at++ = int32_t(((o0 * stride[0] + k0 * dilation[0]) * size[1] + o1 * stride[1] + k1 * dilation[1]) * size[2] +
                              o2 * stride[2] + k2 * dilation[2]);
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, K * NP + (padded ? S : 0)));
  parallel_for(g.in_channels, grain, [&](int64_t c0, int64_t c1) {
    std::vector<float> buffer(padded ? size_t(S) : 0, 0.0f);  // the border stays 0
    for (int64_t c = c0; c < c1; ++c) {
      float* rows = col + c * K * ldc;
      for (int64_t n = 0; n < g.batch; ++n) {
        const float* image = x + (n * g.in_channels + c) * I;
        if (padded) {
          for (int64_t i0 = 0; i0 < in[0]; ++i0)
            for (int64_t i1 = 0; i1 < in[1]; ++i1)
              std::copy_n(image + (i0 * in[1] + i1) * in[2], in[2],
                          buffer.data() + ((i0 + lo[0]) * size[1] + i1 + lo[1]) * size[2] + lo[2]);
          image = buffer.data();
        }
        gather_taps(image, idx.data(), K, P, rows + n * P, ldc);
      }
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = NP; j < ldc; ++j) rows[k * ldc + j] = 0.0f;
    }
  });
}

/// The few-pixel forward (see above): buffers as run()'s (forward: x, w, [bias,] y; forward_affine:
/// x, w, scale, shift, y), y (N, O, out...) written plain. Under the Dnnl mutex.
void few_pixel_forward(Dnnl& s, Kind kind, bool bias, const backend::ConvGeometry& g,
                       const std::vector<void*>& buffers, const Epilogue& ep, const void* residual) {
  // Inputs whose plain content a conv left unwritten (deferred): written now, read plain here.
  materialise_if_deferred(s, buffers[0]);
  materialise_if_deferred(s, residual);
  int64_t P = 1, K = g.in_channels;
  for (int i = 0; i < g.spatial; ++i) P *= g.out[i], K *= g.kernel[i];
  const int64_t O = g.out_channels, NP = g.batch * P, lanes = few_pixel_lanes();
  const int64_t ldc = (NP + lanes - 1) / lanes * lanes;
  if (s.few_pixel_col.size() < size_t(K * ldc)) s.few_pixel_col.resize(size_t(K * ldc));
  if (s.few_pixel_out.size() < size_t(O * ldc)) s.few_pixel_out.resize(size_t(O * ldc));
  float* col = s.few_pixel_col.data();
  float* prod = s.few_pixel_out.data();
  few_pixel_columns(static_cast<const float*>(buffers[0]), col, ldc, g);
  const float* w = static_cast<const float*>(buffers[1]);
  const bool affine = kind == Kind::forward_affine;
  const float* scale = affine ? static_cast<const float*>(buffers[2]) : nullptr;
  const float* shift = affine ? static_cast<const float*>(buffers[3]) : bias ? static_cast<const float*>(buffers[2]) : nullptr;
  const bool relu = kind == Kind::forward_relu || (affine && ep.relu);
  const float* r = affine && ep.residual ? static_cast<const float*>(residual) : nullptr;
  const bool relu_after = affine && ep.relu_after;
  float* y = static_cast<float*>(buffers.back());
  // Rows of W split over the pool in blocks of 16 (a multiple of every kernel's R but AVX2's 6).
  const int64_t blocks = (O + 15) / 16;
  const int64_t chunks = std::min<int64_t>({num_threads(), blocks, std::max<int64_t>(1, (2 * O * K * NP) >> 21)});
  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t o0 = std::min(O, blocks * c / chunks * 16), o1 = std::min(O, blocks * (c + 1) / chunks * 16);
      few_pixel_gemm(w + o0 * K, K, o1 - o0, col, ldc, prod + o0 * ldc);
      for (int64_t o = o0; o < o1; ++o) {
        const float a = scale ? scale[o] : 1.0f, b = shift ? shift[o] : 0.0f;
        for (int64_t n = 0; n < g.batch; ++n) {
          const float* from = prod + o * ldc + n * P;
          float* to = y + (n * O + o) * P;
          const float* add = r ? r + (n * O + o) * P : nullptr;
          for (int64_t p = 0; p < P; ++p) {
            float v = from[p] * a + b;
            if (relu) v = v <= 0.0f ? 0.0f : v;  // NaN stays NaN
            if (add) v += add[p];
            if (relu_after) v = v <= 0.0f ? 0.0f : v;
            to[p] = v;
          }
        }
      }
    }
  });
}

// ---- Winograd F(2x2, 3x3) at inference (winograd.cpp) ----
/// run() past its own kernels (defined below).
bool run_onednn(Dnnl& s, Kind kind, bool bias, const backend::ConvGeometry& g, const std::vector<void*>& buffers,
                const Epilogue& ep, void* residual);

// A 3x3 stride-1 conv as 16 products of 2.25x fewer multiply-adds in all, on flux's panel kernel. Where
// it fits (winograd_fits, inference: output_deferred set) the first call of a geometry times it
// against oneDNN's path (after one untimed run of each: oneDNN creates its primitives and reorders the
// weights, Winograd transforms them; then one wall-clock run each, both split over the pool) and keeps
// the faster for the process. That first call costs four runs: ResNet-18's first inference at batch
// 32, 1 thread, AVX2 settings (flux_bench's resnet32_first_ms) took 373 ms with oneDNN alone and
// 772-781 ms with the timing (1022 ms with two timed runs each; later inferences 299 and 208 ms). Its output is plain (no kept blocked copy: the
// next oneDNN conv reorders it). ResNet-18 at 112x112, batch 32, 1 thread, AVX2 paths: see bench/README.md.
std::atomic<int> g_forced_winograd{-1};

bool winograd_candidate(const Dnnl& s, Kind kind, const backend::ConvGeometry& g) {
  return s.layout == 0 && is_forward(kind) && g.output_deferred && g_forced_winograd.load(std::memory_order_relaxed) != 0 &&
         winograd_fits(g);
}

/// The forward (as few_pixel_forward's buffers) by winograd_forward; y written plain.
void winograd_run(Dnnl& s, Kind kind, bool bias, const backend::ConvGeometry& g, const std::vector<void*>& buffers,
                  const Epilogue& ep, const void* residual) {
  materialise_if_deferred(s, buffers[0]);
  materialise_if_deferred(s, residual);
  const bool affine = kind == Kind::forward_affine;
  WinogradEpilogue e;
  e.scale = affine ? static_cast<const float*>(buffers[2]) : nullptr;
  e.shift = affine ? static_cast<const float*>(buffers[3]) : bias ? static_cast<const float*>(buffers[2]) : nullptr;
  e.relu = kind == Kind::forward_relu || (affine && ep.relu);
  e.residual = affine && ep.residual ? static_cast<const float*>(residual) : nullptr;
  e.relu_after = affine && ep.relu_after;
  winograd_forward(static_cast<const float*>(buffers[0]), static_cast<const float*>(buffers[1]), g, e,
                   static_cast<float*>(buffers.back()));
}

double wall_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

/// Times both paths on this call's buffers (see above); returns 1 for Winograd, 0 for oneDNN, and
/// leaves y as the chosen path writes it.
int winograd_race(Dnnl& s, Kind kind, bool bias, const backend::ConvGeometry& g, const std::vector<void*>& buffers,
                  const Epilogue& ep, void* residual) {
  void* y = buffers.back();
  bool deferred = false;
  backend::ConvGeometry timed = g;
  timed.output_deferred = &deferred;  // the oneDNN runs may keep y blocked and deferred, as in use
  double best_onednn = 1e30, best_winograd = 1e30;
  std::vector<Key> entries;  // the oneDNN entries (primitives, kept weights, scratchpads) this geometry uses
  for (int rep = 0; rep < 2; ++rep) {
    const double t0 = wall_seconds();
    s.looked_up = rep == 0 ? &entries : nullptr;
    const bool ran = run_onednn(s, kind, bias, timed, buffers, ep, residual);
    s.looked_up = nullptr;
    if (!ran) {  // no oneDNN kernel for it
      winograd_run(s, kind, bias, g, buffers, ep, residual);
      return 1;
    }
    const double t1 = wall_seconds();
    s.activations.forget(y);  // y is written plain next: no copy of it stays
    winograd_run(s, kind, bias, g, buffers, ep, residual);
    const double t2 = wall_seconds();
    if (rep > 0) best_onednn = std::min(best_onednn, t1 - t0), best_winograd = std::min(best_winograd, t2 - t1);
  }
  if (best_winograd < best_onednn) {
    // Every call of this geometry runs Winograd from now on: its oneDNN entries go, with the weights
    // they kept reordered and their scratchpads (remade if a later call is forced onto oneDNN).
    for (const Key& k : entries) s.cache.erase(k);
    return 1;
  }
  winograd_forget_weights(static_cast<const float*>(buffers[1]));  // the loser's copy (oneDNN's stays kept)
  run_onednn(s, kind, bias, g, buffers, ep, residual);  // y as oneDNN's path leaves it (perhaps kept and deferred)
  return 0;
}

/// Runs (kind, g) on the buffers, given in the order of Entry::operands; false when oneDNN has no
/// implementation for this case. The batch is split over our pool's threads, each running oneDNN on
/// one OpenMP thread (libgomp's idle threads spin and fought our pool and OpenBLAS: see the header);
/// weight gradients of the later chunks go to scratch rows and are summed into the first.
/// forward_affine: list = {x, w, scale, shift, y}, with `residual` (y's shape) or null.
bool run(Kind kind, bool bias, const backend::ConvGeometry& g, std::initializer_list<void*> list,
         const Epilogue& ep = {}, void* residual = nullptr) {
  if (g.spatial < 1 || g.spatial > 3) return false;
  // oneDNN's kernels index in 32 bits: a geometry with a size, stride, pad or dilation beyond that
  // (valid, e.g. a stride of 2^62 with a one-pixel output; found by tests/fuzz/fuzz_shapes) takes the
  // portable im2col path, whose 64-bit offsets never exceed the padded input.
  constexpr int64_t kLimit = int64_t(1) << 30;
  for (int i = 0; i < g.spatial; ++i)
    if (g.in[i] > kLimit || g.out[i] > kLimit || g.kernel[i] > kLimit || g.stride[i] > kLimit ||
        g.dilation[i] > kLimit || g.pad_lo[i] > kLimit || g.pad_hi[i] > kLimit)
      return false;
  Dnnl& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  // Before creating primitives too: oneDNN fixes some kernels' thread count when it creates them.
  if (s.omp_set_num_threads) s.omp_set_num_threads(s.pool_threading ? 1 : num_threads());
  std::vector<void*> buffers(list);
  if (few_pixels(s, kind, g)) {
    few_pixel_forward(s, kind, bias, g, buffers, ep, residual);
    return true;
  }
  if (winograd_candidate(s, kind, g)) {
    const int forced = g_forced_winograd.load(std::memory_order_relaxed);
    int& choice = s.winograd.try_emplace(make_key(kind, bias, g, ep), -1).first->second;
    int use = forced >= 0 ? forced : choice;
    if (use < 0) {  // the first call: timed, y written by the kernel chosen
      choice = winograd_race(s, kind, bias, g, buffers, ep, residual);
      return true;
    }
    if (use == 1) {
      winograd_run(s, kind, bias, g, buffers, ep, residual);
      return true;
    }
  }
  return run_onednn(s, kind, bias, g, buffers, ep, residual);
}

/// run() past its own kernels: oneDNN's primitives.
bool run_onednn(Dnnl& s, Kind kind, bool bias, const backend::ConvGeometry& g, const std::vector<void*>& buffers,
                const Epilogue& ep, void* residual) {
  int64_t in_size = g.in_channels, out_size = g.out_channels;
  for (int i = 0; i < g.spatial; ++i) in_size *= g.in[i], out_size *= g.out[i];
  int64_t flops = 2 * g.batch * out_size * (g.in_channels / g.groups);
  for (int i = 0; i < g.spatial; ++i) flops *= g.kernel[i];
  int64_t chunks = s.pool_threading ? std::min<int64_t>({num_threads(), g.batch, std::max<int64_t>(1, flops >> 21)}) : 1;
  std::vector<Entry*> entries;
  std::vector<std::vector<void*>> args;
  std::vector<void*> residuals;  // per chunk, for forward_affine
  // Forwards only: a backward's weights could have been written since the forward read the stamp.
  const uint64_t stamp = is_forward(kind) ? g.weight_stamp : 0;
  int64_t weight_size = (g.in_channels / g.groups) * g.out_channels;
  for (int i = 0; i < g.spatial; ++i) weight_size *= g.kernel[i];
  size_t partial_size = size_t(weight_size + (bias ? g.out_channels : 0));
  auto shift = [](void* p, int64_t elements) { return static_cast<void*>(static_cast<float*>(p) + elements); };
  // One image (inference at batch 1) has no batch to split: the forward splits its output channels
  // instead, in multiples of 16 (oneDNN's block); the weights' first axis and, for one image, the
  // output's channel axis are contiguous. Each chunk reads the whole input. A chunk per 2^20 FLOPs
  // (ResNet-18's 1x1 downsamples at batch 1, 3.2 MFLOP, split in two; 2^21 left them on one thread).
  // Runs entries[0, n) with their args: inline for one, one per pool task otherwise.
  // at: each chunk's first sample and (one image) first output channel, for the blocked copies.
  std::vector<std::array<int64_t, 2>> at;
  auto execute_all = [&](int64_t n) {
    residuals.resize(size_t(n), nullptr);
    std::vector<Views> views(static_cast<size_t>(n));
    BlockedActivations::Copy* out = nullptr;
    if (is_forward(kind)) out = plan_views(s, g, entries, at, buffers[0], residual, views);
    if (n == 1) {
      execute(s, *entries[0], args[0], residuals[0], stamp, views[0]);
    } else {
      parallel_for(n, 1, [&](int64_t begin, int64_t end) {
        for (int64_t c = begin; c < end; ++c)
          execute(s, *entries[size_t(c)], args[size_t(c)], residuals[size_t(c)], stamp, views[size_t(c)]);
      });
    }
    if (out) {  // y's content, also (or, deferred: only) in out
      const bool deferred = g.output_deferred != nullptr;  // plan_views deferred every chunk's write then
      s.activations.name(*out, buffers.back(), g.output_stamp, deferred);
      if (deferred) *g.output_deferred = true;
    }
  };
  int64_t oc_chunks = 1;
  if (is_forward(kind) && s.pool_threading && g.batch == 1 && g.groups == 1)
    oc_chunks = std::min<int64_t>({num_threads(), g.out_channels / 16, std::max<int64_t>(1, flops >> 20)});
  if (oc_chunks > 1) {
    int64_t blocks = g.out_channels / 16, per_oc_w = weight_size / g.out_channels, per_oc_y = out_size / g.out_channels;
    for (int64_t c = 0; c < oc_chunks; ++c) {
      int64_t o0 = blocks * c / oc_chunks * 16;
      int64_t o1 = c + 1 == oc_chunks ? g.out_channels : blocks * (c + 1) / oc_chunks * 16;
      backend::ConvGeometry part = g;
      part.out_channels = o1 - o0;
      Entry* e = lookup(s, kind, bias, part, c, ep);
      if (!e) return false;
      std::vector<void*> a = buffers;
      a[1] = shift(a[1], o0 * per_oc_w);
      if (bias) a[2] = shift(a[2], o0);
      if (kind == Kind::forward_affine) a[2] = shift(a[2], o0), a[3] = shift(a[3], o0);
      a.back() = shift(a.back(), o0 * per_oc_y);
      entries.push_back(e);
      args.push_back(std::move(a));
      residuals.push_back(residual ? shift(residual, o0 * per_oc_y) : nullptr);
      at.push_back({0, o0});
    }
    execute_all(oc_chunks);
    return true;
  }
  std::vector<std::vector<float>> partials(size_t(chunks > 1 && kind == Kind::backward_weight ? chunks - 1 : 0));
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t b0 = g.batch * c / chunks, b1 = g.batch * (c + 1) / chunks;
    backend::ConvGeometry part = g;
    part.batch = b1 - b0;
    Entry* e = lookup(s, kind, bias, part, chunks > 1 ? c : -1, ep);
    if (!e) return false;
    entries.push_back(e);
    residuals.push_back(residual ? shift(residual, b0 * out_size) : nullptr);
    at.push_back({b0, 0});
    std::vector<void*> a = buffers;
    if (is_forward(kind)) {
      a[0] = shift(a[0], b0 * in_size), a.back() = shift(a.back(), b0 * out_size);
    } else if (kind == Kind::backward_data) {
      a[0] = shift(a[0], b0 * out_size), a[2] = shift(a[2], b0 * in_size);
    } else {
      a[0] = shift(a[0], b0 * in_size), a[1] = shift(a[1], b0 * out_size);
      if (c > 0) {
        std::vector<float>& row = partials[size_t(c - 1)];
        row.resize(partial_size);
        a[2] = row.data();
        if (bias) a[3] = row.data() + weight_size;
      }
    }
    args.push_back(std::move(a));
  }
  execute_all(chunks);
  if (kind == Kind::backward_weight) {
    float* dw = static_cast<float*>(buffers[2]);
    float* db = bias ? static_cast<float*>(buffers[3]) : nullptr;
    for (const std::vector<float>& row : partials) {
      for (int64_t i = 0; i < weight_size; ++i) dw[i] += row[size_t(i)];
      for (int64_t i = 0; db && i < g.out_channels; ++i) db[i] += row[size_t(weight_size + i)];
    }
  }
  return true;
}

}  // namespace

int force_conv_winograd(int mode) { return g_forced_winograd.exchange(mode); }

bool onednn_conv_forward(DType t, void* x, void* w, void* bias, void* y, const backend::ConvGeometry& g, bool relu) {
  if (t != DType::f32) return false;
  Kind kind = relu ? Kind::forward_relu : Kind::forward;
  if (bias) return run(kind, true, g, {x, w, bias, y});
  return run(kind, false, g, {x, w, y});
}

bool onednn_conv_forward_affine(DType t, void* x, void* w, void* scale, void* shift, void* residual, void* y,
                                const backend::ConvGeometry& g, bool relu, bool relu_after) {
  if (t != DType::f32) return false;
  Epilogue ep;
  ep.relu = relu, ep.residual = residual != nullptr, ep.relu_after = relu_after;
  return run(Kind::forward_affine, false, g, {x, w, scale, shift, y}, ep, residual);
}

// ResNet's stem conv keeps its output blocked and the max pooling after it read the plain y: the
// stem's output written out for it (60 us at batch 1, 1 thread), the pool over planes (~150 us) and
// its output reordered back to blocked for the next conv and its residual (2 x 17 us). At inference
// the pool reads the copy (pooling.cpp's blocked_max_pool) and keeps its output blocked and deferred.
bool onednn_pool_forward(backend::PoolOp op, DType t, const void* x, void* y, const backend::ConvGeometry& g) {
  if (op != backend::PoolOp::max || t != DType::f32 || !g.output_deferred || !g.input_stamp || !g.output_stamp ||
      g.spatial < 1 || g.spatial > 3)
    return false;
  Dnnl& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  const memory::dims in_dims = activation_dims(g, g.in_channels, g.in), out_dims = activation_dims(g, g.out_channels, g.out);
  BlockedActivations::Copy* in = nullptr;
  int block = 0;
  for (int b : {16, 8})
    if ((in = s.activations.find(x, g.input_stamp, b, in_dims))) {
      block = b;
      break;
    }
  if (!in) return false;
  int64_t out_pixels = 1;
  for (int i = 0; i < g.spatial; ++i) out_pixels *= g.out[i];
  const int64_t blocks = (g.in_channels + block - 1) / block;
  BlockedActivations::Copy* out =
      s.activations.acquire(size_t(g.batch * blocks * block * out_pixels) * sizeof(float), in, nullptr,
                            [&](BlockedActivations::Copy& c) { materialise(s, c); });
  if (!out) return false;
  blocked_max_pool(block, in->data.get(), out->data.get(), g);
  out->block = block, out->dims = out_dims;
  s.activations.name(*out, y, g.output_stamp, true);
  *g.output_deferred = true;
  return true;
}

void onednn_materialise(const void* plain) {
  Dnnl& s = state();
  if (s.activations.deferred_count.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(s.mutex);
  materialise_if_deferred(s, plain);
}

void onednn_forget(const void* plain) {
  Dnnl& s = state();
  if (s.activations.deferred_count.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(s.mutex);
  s.activations.forget(plain);
}

bool onednn_conv_backward_data(DType t, void* dy, void* w, void* dx, const backend::ConvGeometry& g) {
  if (t != DType::f32) return false;
  return run(Kind::backward_data, false, g, {dy, w, dx});
}

bool onednn_conv_backward_weight(DType t, void* x, void* dy, void* dw, void* dbias, const backend::ConvGeometry& g) {
  if (t != DType::f32) return false;
  if (dbias) return run(Kind::backward_weight, true, g, {x, dy, dw, dbias});
  return run(Kind::backward_weight, false, g, {x, dy, dw});
}

#else  // built without oneDNN (FLUX_ONEDNN=OFF or libdnnl-dev missing): the portable path only

bool onednn_conv_forward(DType, void*, void*, void*, void*, const backend::ConvGeometry&, bool) { return false; }
bool onednn_conv_forward_affine(DType, void*, void*, void*, void*, void*, void*, const backend::ConvGeometry&, bool, bool) {
  return false;
}
bool onednn_conv_backward_data(DType, void*, void*, void*, const backend::ConvGeometry&) { return false; }
bool onednn_pool_forward(backend::PoolOp, DType, const void*, void*, const backend::ConvGeometry&) { return false; }
void onednn_materialise(const void*) {}
void onednn_forget(const void*) {}
bool onednn_conv_backward_weight(DType, void*, void*, void*, void*, const backend::ConvGeometry&) { return false; }
int force_conv_winograd(int mode) { return mode; }

#endif  // FLUX_HAVE_ONEDNN

}  // namespace flux::cpu_backend
