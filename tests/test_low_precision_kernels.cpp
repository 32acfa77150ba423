// The native low-precision (Float16/BFloat16) kernels behind include/flux/backend.hpp's contract, on
// every test device (CPU, OpenCL on PoCL, CUDA where a GPU is present):
//   - low_precision_support's answer: OpenCL says units for Float16 exactly when the device lists
//     cl_khr_fp16 (asked of the OpenCL library here, not of the plugin) and never for BFloat16; the
//     CUDA plugin follows the compute-capability rule of src/backends/cuda/low_precision.hpp, whose
//     answers are also checked on the host for a range of GPUs.
//   - matmul_low_precision and conv_forward / conv_backward_data / conv_backward_weight (with bias)
//     called with Float16/BFloat16 buffers: whenever a backend takes the call, its result is compared
//     with a float64 reference computed here from the same (already rounded) inputs, within the
//     output dtype's rounding. A backend with the units and the library (CUDA with tensor cores and
//     cuBLAS / cuDNN) must take them; the others may decline (the core then computes through Float32).
//   - the public ops (matmul with transposes and batches) on Float16/BFloat16 tensors against the same
//     kind of reference, whichever path runs on the device.
// CudaLowPrecision.* runs the CUDA cases on CUDA:0 requiring the native paths, and skips where no
// CUDA device is present (FLUX_EXPECT_GPU=CUDA, set by scripts/gpu-check.sh, turns that skip into a
// failure).
#include <dlfcn.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "src/backends/cuda/low_precision.hpp"
#include "src/half_bits.hpp"
#include "test_devices.hpp"

using namespace flux;
using backend::ConvGeometry;
using backend::Gemm;

namespace {

const DType kLow[] = {DType::f16, DType::bf16};

bool is_low(DType t) { return t == DType::f16 || t == DType::bf16; }

// Float32 accumulation, one rounding of the result to t (relative to max(1, |reference|)); a
// second rounding (a bias added after the convolution) stays well inside. Float32: the check of
// the references themselves against the devices' Float32 kernels.
double tolerance(DType t) { return t == DType::bf16 ? 1.6e-2 : t == DType::f16 ? 2.5e-3 : 2e-5; }

// `n` values uniform in [-1, 1], rounded to t: the reference then starts from the device's inputs.
std::vector<double> values(size_t n, uint64_t seed, DType t) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) {
    const float f = float(u(rng));
    x = t == DType::bf16  ? half_bits::bfloat16_to_float(half_bits::bfloat16_from_float(f))
        : t == DType::f16 ? half_bits::to_float(half_bits::from_float(f))
                          : f;
  }
  return v;
}

// A flat tensor of dtype t on d holding v (exactly: v is representable in t).
Tensor place(const std::vector<double>& v, DType t, const Device& d) {
  return to(Tensor(v, Shape{int64_t(v.size())}).cast(t), d);
}

// A flat tensor of dtype t on d filled with NaN: every element must be written.
Tensor nan_filled(size_t n, DType t, const Device& d) {
  return place(std::vector<double>(n, std::numeric_limits<double>::quiet_NaN()), t, d);
}

bool is_cuda(const Device& d) { return d.backend() == "CUDA"; }

// ---------------------------------------------------------------- GEMM ----

struct GemmCase {
  const char* name;
  Gemm g;
};

std::vector<GemmCase> gemm_cases() {
  auto make = [](int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb, bool broadcast_b, double alpha,
                 double beta) {
    Gemm g;
    g.batch = batch, g.m = m, g.n = n, g.k = k, g.trans_a = ta, g.trans_b = tb;
    g.stride_a = m * k, g.stride_b = broadcast_b ? 0 : k * n, g.stride_c = m * n;
    g.alpha = alpha, g.beta = beta;
    return g;
  };
  return {
      {"7x5x33", make(1, 7, 5, 33, false, false, false, 1, 0)},
      {"trans_a 9x4x17", make(1, 9, 4, 17, true, false, false, 1, 0)},
      {"trans_b 6x11x20", make(1, 6, 11, 20, false, true, false, 1, 0)},
      {"both transposed, batch 3", make(3, 5, 7, 13, true, true, false, 1, 0)},
      {"batch 4, B broadcast (stride 0)", make(4, 8, 6, 10, false, false, true, 1, 0)},
      {"alpha 0.5 beta -1.5", make(2, 6, 9, 12, false, true, false, 0.5, -1.5)},
      {"64x48x96 (tensor-core tiles)", make(1, 64, 48, 96, false, false, false, 1, 0)},
      {"k = 0 gives zeros", make(2, 3, 4, 0, false, false, false, 1, 0)},
  };
}

// C[p] = alpha op(A[p]) op(B[p]) + beta C0[p] in float64.
std::vector<double> gemm_reference(const Gemm& g, const std::vector<double>& a, const std::vector<double>& b,
                                   const std::vector<double>& c0) {
  std::vector<double> c(size_t(g.batch * g.stride_c));
  for (int64_t p = 0; p < g.batch; ++p)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        double acc = 0;
        for (int64_t l = 0; l < g.k; ++l) {
          const double x = a[size_t(p * g.stride_a + (g.trans_a ? l * g.m + i : i * g.k + l))];
          const double y = b[size_t(p * g.stride_b + (g.trans_b ? j * g.k + l : l * g.n + j))];
          acc += x * y;
        }
        const size_t at = size_t(p * g.stride_c + i * g.n + j);
        c[at] = g.alpha * acc + (g.beta != 0 ? g.beta * c0[at] : 0.0);
      }
  return c;
}

// Runs every GEMM case through matmul_low_precision on d in dtype t (Float32: through matmul, always
// taken). Returns how many cases the backend took; `must_take`: every case must be taken.
int check_gemm_hook(const Device& d, DType t, bool must_take) {
  backend::Backend& be = detail::backend_for(d);
  int taken = 0;
  uint64_t seed = 100;
  for (const GemmCase& c : gemm_cases()) {
    const Gemm& g = c.g;
    const int64_t batches_b = g.stride_b == 0 ? 1 : g.batch;
    std::vector<double> a = values(size_t(g.batch * g.m * g.k), seed++, t);
    std::vector<double> b = values(size_t(batches_b * g.k * g.n), seed++, t);
    std::vector<double> c0 = values(size_t(g.batch * g.m * g.n), seed++, t);
    Tensor ad = place(a, t, d), bd = place(b, t, d);
    Tensor cd = g.beta != 0 ? place(c0, t, d) : nan_filled(c0.size(), t, d);
    bool took = true;
    if (is_low(t))
      took = be.matmul_low_precision(d.index(), t, ad.buffer(), bd.buffer(), cd.buffer(), g);
    else
      be.matmul(d.index(), t, ad.buffer(), bd.buffer(), cd.buffer(), g);
    if (must_take) {
      EXPECT_TRUE(took) << to_string(d) << " " << dtype_name(t) << " " << c.name << " declined";
    }
    if (!took) continue;
    ++taken;
    EXPECT_EQ(cd.dtype(), t);
    EXPECT_LE(flux::testing::max_rel_error(cd, gemm_reference(g, a, b, c0)), tolerance(t))
        << to_string(d) << " " << dtype_name(t) << " " << c.name;
  }
  return taken;
}

// ---------------------------------------------------------------- conv ----

struct ConvCase {
  const char* name;
  int spatial;
  int64_t batch, in_channels, out_channels, groups;
  std::vector<int64_t> in, kernel, stride, pad, dilation;
};

// The first case is the plain one every cuDNN build must take.
std::vector<ConvCase> conv_cases() {
  return {
      {"2-D 3x3 pad 1", 2, 2, 8, 16, 1, {9, 10}, {3, 3}, {1, 1}, {1, 1}, {1, 1}},
      {"2-D 3x3 stride 2, groups 2, dilation (1, 2)", 2, 2, 4, 6, 2, {11, 12}, {3, 3}, {2, 2}, {1, 2}, {1, 2}},
      {"1-D kernel 5 pad 2", 1, 3, 3, 5, 1, {17}, {5}, {1}, {2}, {1}},
      {"3-D 2x3x3 pad (0, 1, 1)", 3, 1, 2, 4, 1, {4, 6, 5}, {2, 3, 3}, {1, 1, 1}, {0, 1, 1}, {1, 1, 1}},
  };
}

ConvGeometry geometry_of(const ConvCase& c) {
  ConvGeometry g;
  g.spatial = c.spatial;
  g.batch = c.batch, g.in_channels = c.in_channels, g.out_channels = c.out_channels, g.groups = c.groups;
  for (int i = 0; i < c.spatial; ++i) {
    const size_t s = size_t(i);
    g.in[i] = c.in[s], g.kernel[i] = c.kernel[s], g.stride[i] = c.stride[s];
    g.pad_lo[i] = g.pad_hi[i] = c.pad[s], g.dilation[i] = c.dilation[s];
    g.out[i] = (g.in[i] + 2 * c.pad[s] - g.dilation[i] * (g.kernel[i] - 1) - 1) / g.stride[i] + 1;
  }
  return g;
}

int64_t prod(const int64_t* v, int n) {
  int64_t p = 1;
  for (int i = 0; i < n; ++i) p *= v[i];
  return p;
}

// The flat input position that window position k of output position o reads, or -1 (padding).
int64_t source_of(const ConvGeometry& g, int64_t o, int64_t k) {
  int64_t os[3], ks[3];
  for (int i = g.spatial - 1; i >= 0; --i) {
    os[i] = o % g.out[i], o /= g.out[i];
    ks[i] = k % g.kernel[i], k /= g.kernel[i];
  }
  int64_t flat = 0;
  for (int i = 0; i < g.spatial; ++i) {
    const int64_t p = os[i] * g.stride[i] - g.pad_lo[i] + ks[i] * g.dilation[i];
    if (p < 0 || p >= g.in[i]) return -1;
    flat = flat * g.in[i] + p;
  }
  return flat;
}

// The three float64 results of one convolution: y = conv(x, w) + bias, dx, dw and dbias for dy.
struct ConvReference {
  std::vector<double> y, dx, dw, dbias;
};

ConvReference conv_reference(const ConvGeometry& g, const std::vector<double>& x, const std::vector<double>& w,
                             const std::vector<double>& bias, const std::vector<double>& dy) {
  const int64_t I = prod(g.in, g.spatial), O = prod(g.out, g.spatial), K = prod(g.kernel, g.spatial);
  const int64_t cg = g.in_channels / g.groups, og = g.out_channels / g.groups;
  ConvReference r;
  r.y.assign(size_t(g.batch * g.out_channels * O), 0.0);
  r.dx.assign(size_t(g.batch * g.in_channels * I), 0.0);
  r.dw.assign(size_t(g.out_channels * cg * K), 0.0);
  r.dbias.assign(size_t(g.out_channels), 0.0);
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t oc = 0; oc < g.out_channels; ++oc) {
      const int64_t first_in = oc / og * cg;
      for (int64_t o = 0; o < O; ++o) {
        const size_t yi = size_t((n * g.out_channels + oc) * O + o);
        double acc = bias[size_t(oc)];
        for (int64_t c = 0; c < cg; ++c)
          for (int64_t k = 0; k < K; ++k) {
            const int64_t src = source_of(g, o, k);
            if (src < 0) continue;
            const size_t xi = size_t((n * g.in_channels + first_in + c) * I + src);
            const size_t wi = size_t((oc * cg + c) * K + k);
            acc += x[xi] * w[wi];
            r.dx[xi] += dy[yi] * w[wi];
            r.dw[wi] += dy[yi] * x[xi];
          }
        r.y[yi] = acc;
        r.dbias[size_t(oc)] += dy[yi];
      }
    }
  return r;
}

// Runs every conv case through conv_forward (with bias), conv_backward_data and conv_backward_weight
// (with dbias) on d in dtype t. Returns how many calls the backend took; `must_take_first`: the
// first (plain 2-D) case must be taken in all three directions.
int check_conv_hooks(const Device& d, DType t, bool must_take_first) {
  backend::Backend& be = detail::backend_for(d);
  int taken = 0;
  uint64_t seed = 500;
  bool first = true;
  for (const ConvCase& c : conv_cases()) {
    const ConvGeometry g = geometry_of(c);
    const int64_t I = prod(g.in, g.spatial), O = prod(g.out, g.spatial), K = prod(g.kernel, g.spatial);
    std::vector<double> x = values(size_t(g.batch * g.in_channels * I), seed++, t);
    std::vector<double> w = values(size_t(g.out_channels * (g.in_channels / g.groups) * K), seed++, t);
    std::vector<double> bias = values(size_t(g.out_channels), seed++, t);
    std::vector<double> dy = values(size_t(g.batch * g.out_channels * O), seed++, t);
    const ConvReference r = conv_reference(g, x, w, bias, dy);
    Tensor xd = place(x, t, d), wd = place(w, t, d), bd = place(bias, t, d), dyd = place(dy, t, d);
    const std::string what = to_string(d) + " " + dtype_name(t) + " " + c.name;

    Tensor y = nan_filled(r.y.size(), t, d);
    const bool fwd = be.conv_forward(d.index(), t, xd.buffer(), wd.buffer(), bd.buffer(), y.buffer(), g);
    if (fwd) {
      EXPECT_LE(flux::testing::max_rel_error(y, r.y), tolerance(t)) << what << " forward";
    }

    Tensor dx = nan_filled(r.dx.size(), t, d);
    const bool bwd_data = be.conv_backward_data(d.index(), t, dyd.buffer(), wd.buffer(), dx.buffer(), g);
    if (bwd_data) {
      EXPECT_LE(flux::testing::max_rel_error(dx, r.dx), tolerance(t)) << what << " backward data";
    }

    Tensor dw = nan_filled(r.dw.size(), t, d), db = nan_filled(r.dbias.size(), t, d);
    const bool bwd_weight = be.conv_backward_weight(d.index(), t, xd.buffer(), dyd.buffer(), dw.buffer(), db.buffer(), g);
    if (bwd_weight) {
      EXPECT_LE(flux::testing::max_rel_error(dw, r.dw), tolerance(t)) << what << " backward weight";
      EXPECT_LE(flux::testing::max_rel_error(db, r.dbias), tolerance(t)) << what << " backward bias";
    }
    if (first && must_take_first) {
      EXPECT_TRUE(fwd) << what << ": forward declined";
      EXPECT_TRUE(bwd_data) << what << ": backward data declined";
      EXPECT_TRUE(bwd_weight) << what << ": backward weight declined";
    }
    first = false;
    taken += int(fwd) + int(bwd_data) + int(bwd_weight);
  }
  return taken;
}

// The CUDA plugin takes f16/bf16 GEMMs where the GPU has the tensor cores, and convolutions where it
// was also built with cuDNN (its version_info names the DNN library).
bool cuda_must_take_gemm(const Device& d, DType t) {
  return is_cuda(d) && detail::backend_for(d).low_precision_support(d.index(), t).units;
}
bool cuda_must_take_conv(const Device& d, DType t) {
  return cuda_must_take_gemm(d, t) && detail::backend_for(d).version_info().find("DNN: cuDNN") != std::string::npos;
}

// ------------------------------------------------- OpenCL's own answer ----

// Whether the OpenCL device named `name` on platform `platform` lists `extension`, asked of the ICD
// loader directly (dlopen: flux_tests does not link OpenCL). -1 when it cannot be asked.
int opencl_device_has(const std::string& name, const std::string& platform, const char* extension) {
  using GetPlatforms = int (*)(unsigned, void**, unsigned*);
  using GetPlatformInfo = int (*)(void*, unsigned, size_t, void*, size_t*);
  using GetDevices = int (*)(void*, unsigned long, unsigned, void**, unsigned*);
  using GetDeviceInfo = int (*)(void*, unsigned, size_t, void*, size_t*);
  constexpr unsigned kPlatformName = 0x0902, kDeviceName = 0x102B, kDeviceExtensions = 0x1030;
  constexpr unsigned long kAllDevices = 0xFFFFFFFF;
  void* lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return -1;
  auto get_platforms = reinterpret_cast<GetPlatforms>(dlsym(lib, "clGetPlatformIDs"));
  auto platform_info = reinterpret_cast<GetPlatformInfo>(dlsym(lib, "clGetPlatformInfo"));
  auto get_devices = reinterpret_cast<GetDevices>(dlsym(lib, "clGetDeviceIDs"));
  auto device_info = reinterpret_cast<GetDeviceInfo>(dlsym(lib, "clGetDeviceInfo"));
  if (!get_platforms || !platform_info || !get_devices || !device_info) return -1;
  auto text = [](auto fn, void* obj, unsigned param) {
    size_t n = 0;
    if (fn(obj, param, 0, nullptr, &n) != 0 || n == 0) return std::string();
    std::string s(n, '\0');
    fn(obj, param, n, s.data(), nullptr);
    return std::string(s.c_str());
  };
  unsigned np = 0;
  if (get_platforms(0, nullptr, &np) != 0 || np == 0) return -1;
  std::vector<void*> platforms(np);
  get_platforms(np, platforms.data(), nullptr);
  for (void* p : platforms) {
    if (text(platform_info, p, kPlatformName) != platform) continue;
    unsigned nd = 0;
    if (get_devices(p, kAllDevices, 0, nullptr, &nd) != 0 || nd == 0) continue;
    std::vector<void*> devices(nd);
    get_devices(p, kAllDevices, nd, devices.data(), nullptr);
    for (void* dev : devices)
      if (text(device_info, dev, kDeviceName) == name)
        return text(device_info, dev, kDeviceExtensions).find(extension) != std::string::npos ? 1 : 0;
  }
  return -1;
}

class LowPrecisionKernels : public ::testing::TestWithParam<Device> {
 protected:
  Device dev() const { return GetParam(); }
  backend::Backend& be() const { return detail::backend_for(GetParam()); }
};

}  // namespace

// ---------------------------------------------------------------- tests ----

TEST_P(LowPrecisionKernels, SupportAnswerMatchesTheDevice) {
  for (DType t : kLow) {
    const backend::LowPrecisionSupport s = be().low_precision_support(dev().index(), t);
    EXPECT_FALSE(s.detail.empty()) << to_string(dev()) << " " << dtype_name(t);
    if (dev().backend() == "OpenCL") {
      const std::string full = be().device_name(dev().index());  // "<device> (<platform>)"
      const size_t open = full.rfind(" (");
      ASSERT_NE(open, std::string::npos) << full;
      const std::string name = full.substr(0, open), platform = full.substr(open + 2, full.size() - open - 3);
      const int fp16 = opencl_device_has(name, platform, "cl_khr_fp16");
      ASSERT_GE(fp16, 0) << "could not ask the OpenCL library about " << full;
      if (t == DType::f16) {
        EXPECT_EQ(s.units, fp16 == 1) << full << ": " << s.detail;
        EXPECT_NE(s.detail.find("cl_khr_fp16"), std::string::npos) << s.detail;
        EXPECT_NE(s.detail.find(name), std::string::npos) << s.detail;
      } else {
        EXPECT_FALSE(s.units) << s.detail;
        EXPECT_NE(s.detail.find("storage only"), std::string::npos) << s.detail;
      }
    } else if (dev().backend() == "AMDGPU") {
      EXPECT_FALSE(s.units) << s.detail;  // no rocBLAS / MIOpen in this build: through Float32
      EXPECT_NE(s.detail.find("Float32"), std::string::npos) << s.detail;
    } else if (is_cuda(dev())) {
      // device_name: "<GPU> (sm_<major><minor>, N GiB)", the minor one digit (sm_90, sm_120)
      const std::string full = be().device_name(dev().index());
      const size_t sm = full.find("(sm_");
      ASSERT_NE(sm, std::string::npos) << full;
      const size_t end = full.find(',', sm);
      ASSERT_NE(end, std::string::npos) << full;
      const std::string digits = full.substr(sm + 4, end - sm - 4);
      ASSERT_GE(digits.size(), 2u) << full;
      const int major = std::atoi(digits.substr(0, digits.size() - 1).c_str());
      EXPECT_EQ(s.units, cuda_backend::has_tensor_cores(major, t)) << full << ": " << s.detail;
      EXPECT_NE(s.detail.find("compute capability " + std::to_string(major) + "."), std::string::npos) << s.detail;
    }
  }
  // Not a low-precision dtype: never units.
  EXPECT_FALSE(be().low_precision_support(dev().index(), DType::f32).units);
}

// The float64 references of this file against every device's Float32 kernels (matmul; the conv
// fast paths where the device has them, and the conv op everywhere), so that the f16/bf16 checks,
// which only a GPU runs in full, compare with a reference known to be right.
TEST_P(LowPrecisionKernels, ReferencesAgreeWithFloat32Kernels) {
  EXPECT_EQ(check_gemm_hook(dev(), DType::f32, true), int(gemm_cases().size()));
  const int conv_taken = check_conv_hooks(dev(), DType::f32, false);
  if (dev().backend() == "CPU" && FLUX_TEST_HAVE_ONEDNN) {
    // oneDNN takes both backward directions (the forward may go to a chosen kernel of flux's own;
    // the conv op below checks the forward reference on every device).
    EXPECT_GE(conv_taken, 2 * int(conv_cases().size())) << "oneDNN declined Float32 convolutions";
  }
  uint64_t seed = 700;
  for (const ConvCase& c : conv_cases()) {
    const ConvGeometry g = geometry_of(c);
    const int64_t I = prod(g.in, g.spatial), O = prod(g.out, g.spatial), K = prod(g.kernel, g.spatial);
    std::vector<double> x = values(size_t(g.batch * g.in_channels * I), seed++, DType::f32);
    std::vector<double> w = values(size_t(g.out_channels * (g.in_channels / g.groups) * K), seed++, DType::f32);
    std::vector<double> bias = values(size_t(g.out_channels), seed++, DType::f32);
    const ConvReference r = conv_reference(g, x, w, bias, std::vector<double>(size_t(g.batch * g.out_channels * O)));
    Shape xs{g.batch, g.in_channels}, ws{g.out_channels, g.in_channels / g.groups};
    for (int i = 0; i < g.spatial; ++i) xs.push_back(g.in[i]), ws.push_back(g.kernel[i]);
    Tensor y = conv(place(x, DType::f32, dev()).reshape(xs), place(w, DType::f32, dev()).reshape(ws),
                    place(bias, DType::f32, dev()), ConvParams{c.stride, c.pad, c.dilation, c.groups});
    EXPECT_LE(flux::testing::max_rel_error(y, r.y), tolerance(DType::f32)) << to_string(dev()) << " " << c.name;
  }
}

// A device whose backend declines every case checked nothing: skipped, saying so.
TEST_P(LowPrecisionKernels, MatmulHookMatchesFloat64) {
  int total = 0;
  for (DType t : kLow) {
    const int taken = check_gemm_hook(dev(), t, cuda_must_take_gemm(dev(), t));
    RecordProperty(std::string("gemm_taken_") + dtype_name(t), taken);
    total += taken;
  }
  if (total == 0) GTEST_SKIP() << to_string(dev()) << " has no low-precision GEMM: every case declined";
}

TEST_P(LowPrecisionKernels, ConvHooksMatchFloat64) {
  int total = 0;
  for (DType t : kLow) {
    const int taken = check_conv_hooks(dev(), t, cuda_must_take_conv(dev(), t));
    RecordProperty(std::string("conv_taken_") + dtype_name(t), taken);
    total += taken;
  }
  if (total == 0) GTEST_SKIP() << to_string(dev()) << " has no low-precision convolution: every case declined";
}

// The public op on f16/bf16 tensors, whichever path the device runs (native or through Float32).
TEST_P(LowPrecisionKernels, MatmulOpMatchesFloat64) {
  for (DType t : kLow) {
    uint64_t seed = 900;
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        Gemm g;
        g.batch = 3, g.m = 10, g.n = 7, g.k = 24, g.trans_a = ta, g.trans_b = tb;
        g.stride_a = g.m * g.k, g.stride_b = g.k * g.n, g.stride_c = g.m * g.n;
        std::vector<double> a = values(size_t(g.batch * g.m * g.k), seed++, t);
        std::vector<double> b = values(size_t(g.batch * g.k * g.n), seed++, t);
        Tensor at = place(a, t, dev()).reshape({g.batch, ta ? g.k : g.m, ta ? g.m : g.k});
        Tensor bt = place(b, t, dev()).reshape({g.batch, tb ? g.n : g.k, tb ? g.k : g.n});
        Tensor c = matmul(at, bt, ta, tb);
        ASSERT_EQ(c.dtype(), t);
        ASSERT_EQ(c.shape(), (Shape{g.batch, g.m, g.n}));
        EXPECT_LE(flux::testing::max_rel_error(c, gemm_reference(g, a, b, {})), tolerance(t))
            << to_string(dev()) << " " << dtype_name(t) << " trans_a " << ta << " trans_b " << tb;
      }
  }
}

FLUX_DEVICE_SUITE(LowPrecisionKernels);

// The rule the CUDA plugin answers with, on the host (src/backends/cuda/low_precision.hpp).
TEST(CudaLowPrecision, TensorCoreRuleByComputeCapability) {
  struct Row {
    int major, minor;
    bool f16, bf16;
  };
  for (const Row& r : {Row{6, 1, false, false}, Row{7, 0, true, false}, Row{7, 5, true, false}, Row{8, 0, true, true},
                       Row{8, 9, true, true}, Row{9, 0, true, true}, Row{12, 0, true, true}}) {
    const auto f16 = cuda_backend::tensor_core_support("GPU X", r.major, r.minor, DType::f16);
    const auto bf16 = cuda_backend::tensor_core_support("GPU X", r.major, r.minor, DType::bf16);
    EXPECT_EQ(f16.units, r.f16) << r.major << "." << r.minor;
    EXPECT_EQ(bf16.units, r.bf16) << r.major << "." << r.minor;
    const std::string cc = "compute capability " + std::to_string(r.major) + "." + std::to_string(r.minor);
    for (const auto* s : {&f16, &bf16}) {
      EXPECT_NE(s->detail.find("GPU X"), std::string::npos) << s->detail;
      EXPECT_NE(s->detail.find(cc), std::string::npos) << s->detail;
    }
    if (!r.bf16) {
      EXPECT_NE(bf16.detail.find("need compute capability 8.0"), std::string::npos) << bf16.detail;
    }
    if (!r.f16) {
      EXPECT_NE(f16.detail.find("need compute capability 7.0"), std::string::npos) << f16.detail;
    }
  }
  EXPECT_FALSE(cuda_backend::tensor_core_support("GPU X", 9, 0, DType::f32).units);
}

// CUDA:0's native paths (cuBLAS GemmEx; cuDNN where built), required on a GPU with the units.
TEST(CudaLowPrecision, GemmAndConvOnCuda0MatchFloat64) {
  if (!functional("CUDA")) {
    const char* expect = std::getenv("FLUX_EXPECT_GPU");
    if (expect && std::string(expect).find("CUDA") != std::string::npos)
      FAIL() << "FLUX_EXPECT_GPU names CUDA but it is not functional: "
             << detail::backend_for("CUDA").not_functional_reason();
    GTEST_SKIP() << "no functional CUDA device";
  }
  const Device d("CUDA", 0);
  for (DType t : kLow) {
    if (!cuda_must_take_gemm(d, t)) {
      // No tensor cores for t: the hooks must decline (the core computes through Float32).
      EXPECT_EQ(check_gemm_hook(d, t, false), 0) << dtype_name(t);
      EXPECT_EQ(check_conv_hooks(d, t, false), 0) << dtype_name(t);
      continue;
    }
    EXPECT_EQ(check_gemm_hook(d, t, true), int(gemm_cases().size())) << dtype_name(t);
    const int conv_taken = check_conv_hooks(d, t, cuda_must_take_conv(d, t));
    if (cuda_must_take_conv(d, t)) {
      EXPECT_GE(conv_taken, 3) << dtype_name(t);
    }
  }
}
