// Convolution on the CPU: the im2col / col2im reference loops (f32, f64) of the portable path, and
// the oneDNN fast path for float32 (forward with fused bias, data gradient, weight + bias gradient).
//   x (N, C, in...), w (O, C / G, k...) = (G, O / G, C / G, k...), y (N, O, out...), all plain
//   row-major (oneDNN's ncw/nchw/ncdhw and (g)oi(h)(w)); up to 3 spatial axes, unused ones 1.
// oneDNN primitives are created once per geometry and cached (creation costs more than a small conv).
// Each primitive is created with plain memory descriptors unless FLUX_ONEDNN_LAYOUT=any, which lets
// oneDNN choose its layout and reorders the operands into and out of it on every call.
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <oneapi/dnnl/dnnl.hpp>

#include "flux/error.hpp"
#include "src/backends/cpu/cpu_backend.hpp"

namespace flux::cpu {

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
                T* src = image + (i0 * a.in[1] + i1) * a.in[2];
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

namespace {

using dnnl::memory;
using Tag = memory::format_tag;

enum class Kind : int64_t { forward, backward_data, backward_weight };

using Key = std::array<int64_t, 32>;

Key make_key(Kind kind, bool bias, const backend::ConvGeometry& g) {
  Key k{};
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
  int arg = 0;
  bool input = true;
  memory user;
  memory inner;  // == user when no reorder is needed
  dnnl::reorder reorder;
  bool reordered = false;
};

struct Entry {
  dnnl::primitive primitive;
  std::vector<Operand> operands;
};

struct Dnnl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::mutex mutex;  // guards the cache and serialises execution (one scratchpad per primitive)
  std::map<Key, std::unique_ptr<Entry>> cache;
  bool any_layout = false;
  void (*omp_set_num_threads)(int) = nullptr;
  Dnnl() {
    const char* v = std::getenv("FLUX_ONEDNN_LAYOUT");
    any_layout = v && std::strcmp(v, "any") == 0;
    // Debian's oneDNN runs on libgomp's OpenMP; its team size follows our pool's (FLUX_NUM_THREADS).
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

Descs make_descs(const backend::ConvGeometry& g, bool any, bool bias) {
  Descs d;
  Tag act = any ? Tag::any : activation_tag(g.spatial);
  d.src = memory::desc(activation_dims(g, g.in_channels, g.in), memory::data_type::f32, act);
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

dnnl::convolution_forward::primitive_desc forward_pd(Dnnl& s, const Descs& d, bool bias) {
  using F = dnnl::convolution_forward;
  auto desc = bias ? F::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, d.src, d.weights,
                             d.bias, d.dst, d.strides, d.dilates, d.pad_l, d.pad_r)
                   : F::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, d.src, d.weights,
                             d.dst, d.strides, d.dilates, d.pad_l, d.pad_r);
  return F::primitive_desc(desc, s.engine);
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

std::unique_ptr<Entry> create(Dnnl& s, Kind kind, bool bias, const backend::ConvGeometry& g) {
  auto e = std::make_unique<Entry>();
  Descs plain = make_descs(g, false, bias);
  Descs asked = make_descs(g, s.any_layout, bias);
  if (kind == Kind::forward) {
    auto pd = forward_pd(s, asked, bias);
    e->primitive = dnnl::convolution_forward(pd);
    e->operands.push_back(make_operand(s, DNNL_ARG_SRC, true, plain.src, pd.src_desc()));
    e->operands.push_back(make_operand(s, DNNL_ARG_WEIGHTS, true, plain.weights, pd.weights_desc()));
    if (bias) e->operands.push_back(make_operand(s, DNNL_ARG_BIAS, true, plain.bias, pd.bias_desc()));
    e->operands.push_back(make_operand(s, DNNL_ARG_DST, false, plain.dst, pd.dst_desc()));
  } else if (kind == Kind::backward_data) {
    using B = dnnl::convolution_backward_data;
    auto hint = forward_pd(s, asked, false);
    B::desc desc(dnnl::algorithm::convolution_direct, asked.src, asked.weights, asked.dst, asked.strides,
                 asked.dilates, asked.pad_l, asked.pad_r);
    B::primitive_desc pd(desc, s.engine, hint);
    e->primitive = B(pd);
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
    B::primitive_desc pd(desc, s.engine, hint);
    e->primitive = B(pd);
    e->operands.push_back(make_operand(s, DNNL_ARG_SRC, true, plain.src, pd.src_desc()));
    e->operands.push_back(make_operand(s, DNNL_ARG_DIFF_DST, true, plain.dst, pd.diff_dst_desc()));
    e->operands.push_back(make_operand(s, DNNL_ARG_DIFF_WEIGHTS, false, plain.weights, pd.diff_weights_desc()));
    if (bias) e->operands.push_back(make_operand(s, DNNL_ARG_DIFF_BIAS, false, plain.bias, pd.diff_bias_desc()));
  }
  return e;
}

/// Runs the cached primitive for (kind, g) on the given buffers (in the order of Entry::operands);
/// false when oneDNN has no implementation for this case.
bool run(Kind kind, bool bias, const backend::ConvGeometry& g, std::initializer_list<void*> buffers) {
  if (g.spatial < 1 || g.spatial > 3) return false;
  Dnnl& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  Key key = make_key(kind, bias, g);
  auto it = s.cache.find(key);
  if (it == s.cache.end()) {
    std::unique_ptr<Entry> e;
    try {
      e = create(s, kind, bias, g);
    } catch (const dnnl::error&) {
      e = nullptr;  // remembered: this geometry takes the portable path
    }
    if (s.cache.size() >= 512) s.cache.clear();  // a bound for programs that sweep many shapes
    it = s.cache.emplace(key, std::move(e)).first;
  }
  Entry* e = it->second.get();
  if (!e) return false;
  if (s.omp_set_num_threads) s.omp_set_num_threads(num_threads());
  std::unordered_map<int, memory> args;
  size_t i = 0;
  for (void* p : buffers) {
    Operand& op = e->operands[i++];
    op.user.set_data_handle(p);
    if (op.reordered && op.input) op.reorder.execute(s.stream, op.user, op.inner);
    args[op.arg] = op.inner;
  }
  e->primitive.execute(s.stream, args);
  for (Operand& op : e->operands)
    if (op.reordered && !op.input) op.reorder.execute(s.stream, op.inner, op.user);
  s.stream.wait();
  return true;
}

}  // namespace

bool onednn_conv_forward(DType t, void* x, void* w, void* bias, void* y, const backend::ConvGeometry& g) {
  if (t != DType::f32) return false;
  if (bias) return run(Kind::forward, true, g, {x, w, bias, y});
  return run(Kind::forward, false, g, {x, w, y});
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

}  // namespace flux::cpu
