#include "src/onnx/onnx_common.hpp"

#if FLUX_HAVE_ONNX
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "flux/backend.hpp"
#include "flux/ops.hpp"
#include "src/internal.hpp"

namespace flux::onnx::detail {

using flux::detail::fail;

int32_t onnx_dtype(DType t) {
  switch (t) {
    case DType::f32: return ::onnx::TensorProto::FLOAT;
    case DType::f64: return ::onnx::TensorProto::DOUBLE;
    case DType::f16: return ::onnx::TensorProto::FLOAT16;
    case DType::bf16: return ::onnx::TensorProto::BFLOAT16;
    case DType::i32: return ::onnx::TensorProto::INT32;
    case DType::i64: return ::onnx::TensorProto::INT64;
    case DType::u8: return ::onnx::TensorProto::UINT8;
    case DType::boolean: return ::onnx::TensorProto::BOOL;
  }
  return ::onnx::TensorProto::UNDEFINED;
}

DType flux_dtype(int32_t t, const std::string& context) {
  switch (t) {
    case ::onnx::TensorProto::FLOAT: return DType::f32;
    case ::onnx::TensorProto::DOUBLE: return DType::f64;
    case ::onnx::TensorProto::FLOAT16: return DType::f16;
    case ::onnx::TensorProto::BFLOAT16: return DType::bf16;
    case ::onnx::TensorProto::INT32: return DType::i32;
    case ::onnx::TensorProto::INT64: return DType::i64;
    case ::onnx::TensorProto::UINT8: return DType::u8;
    case ::onnx::TensorProto::BOOL: return DType::boolean;
    default: break;
  }
  const std::string name = ::onnx::TensorProto::DataType_IsValid(t) ? ::onnx::TensorProto::DataType_Name(t) : std::to_string(t);
  fail(context, ": ONNX data type ", name, " has no flux dtype (Float32/64, Float16, BFloat16, Int32/64, UInt8, Bool)");
}

std::string host_bytes(const Tensor& x0) {
  Tensor x = to(x0, Device());
  std::string out(x.nbytes(), '\0');
  if (!out.empty()) x.backend().copy_to_host(0, out.data(), flux::detail::buffer_of(x), out.size());
  return out;
}

void tensor_proto(const Tensor& x, const std::string& name, ::onnx::TensorProto* out) {
  if (!name.empty()) out->set_name(name);
  out->set_data_type(onnx_dtype(x.dtype()));
  for (int i = 0; i < x.ndim(); ++i) out->add_dims(x.shape()[i]);
  out->set_raw_data(host_bytes(x));  // the host is little-endian (x86-64, AArch64), ONNX's raw_data order
}

void write_model(const std::string& path, const ::onnx::ModelProto& model, const char* api) {
  const size_t bytes = model.ByteSizeLong();
  if (bytes > size_t(INT32_MAX))
    fail(api, " the model is ", bytes >> 20, " MiB without its initialisers: over protobuf's 2 GiB limit for one file");
  std::string data;
  if (!model.SerializeToString(&data)) fail(api, " protobuf could not serialise the model");
  write_file(path, data, api);
}

void write_file(const std::string& path, const std::string& data, const char* api) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  std::string temp = dir + "/." + base + ".tmp-" + std::to_string(::getpid()) + "-XXXXXX";
  int fd = ::mkostemp(temp.data(), O_CLOEXEC);
  if (fd < 0) fail(api, " cannot create a temporary file in '", dir, "': ", std::strerror(errno));
  size_t done = 0;
  while (done < data.size()) {
    ssize_t w = ::write(fd, data.data() + done, data.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int err = errno;
      ::close(fd);
      ::unlink(temp.c_str());
      fail(api, " cannot write '", path, "': ", std::strerror(err));
    }
    done += size_t(w);
  }
  if (::fchmod(fd, 0644) != 0 || ::fsync(fd) != 0 || ::close(fd) != 0) {
    int err = errno;
    ::unlink(temp.c_str());
    fail(api, " cannot write '", path, "': ", std::strerror(err));
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(temp.c_str());
    fail(api, " cannot rename the temporary file to '", path, "': ", std::strerror(err));
  }
}

}  // namespace flux::onnx::detail
#endif
