// Helpers shared by the ONNX exporter and importer (not installed): dtypes, tensors <-> TensorProto,
// the atomic file write and the bounded file read.
#pragma once
#include <string>

#include "flux/tensor.hpp"

#if FLUX_HAVE_ONNX
#include <onnx/onnx_pb.h>

namespace flux::onnx::detail {

/// The newest opset Debian 12's ONNX 1.12 (its checker) knows: onnx::save's default.
inline constexpr int64_t kMaxOpset = 17;
/// The newest opset onnx::save writes on request (ONNX Runtime reads it; ONNX 1.12's checker does not).
inline constexpr int64_t kMaxExportOpset = 21;
inline constexpr const char* kOnnxVersion = "1.12";
inline constexpr const char* kFluxVersion = "0.1.0";

int32_t onnx_dtype(DType t);
/// The flux dtype of an ONNX TensorProto data type; fails naming `context` for types flux lacks.
DType flux_dtype(int32_t onnx_type, const std::string& context);
/// x's raw little-endian bytes (from any device).
std::string host_bytes(const Tensor& x);
/// Fills `out` with x (name, dtype, dims, raw_data).
void tensor_proto(const Tensor& x, const std::string& name, ::onnx::TensorProto* out);
/// Writes model to path atomically (temporary file in the same folder, fsync, rename).
void write_model(const std::string& path, const ::onnx::ModelProto& model, const char* api);
/// Writes `bytes` to path atomically (temporary file in the same folder, fsync, rename).
void write_file(const std::string& path, const std::string& bytes, const char* api);

}  // namespace flux::onnx::detail
#endif
