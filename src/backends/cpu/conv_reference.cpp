// Convolution's portable path on the CPU: the im2col / col2im loops (f32, f64) that the core's
// im2col + GEMM composition runs on where no library kernel takes a case, and the reference the
// library kernels are tested against.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "flux/error.hpp"
#include "src/backends/cpu/cpu_backend.hpp"

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

}  // namespace flux::cpu_backend
