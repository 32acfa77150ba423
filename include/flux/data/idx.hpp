// IDX files (the MNIST / Fashion-MNIST format, http://yann.lecun.com/exdb/mnist/) and the
// Fashion-MNIST data set from Debian's `dataset-fashion-mnist` package.
//
// An IDX file is 4 magic bytes 0x00 0x00 <type> <ndims>, then ndims big-endian u32 dimensions, then
// the values, big-endian, row-major. Types: 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64.
// Files may be gzip-compressed (recognised by the gzip magic 0x1f 0x8b, whatever their name).
//   Tensor images = data::read_idx("train-images-idx3-ubyte.gz");   // (60000, 28, 28) UInt8
//   auto fm = data::load_fashion_mnist();   // images (N, 1, 28, 28) Float32 in [0, 1], labels (N,) Int64
#pragma once
#include <array>
#include <string>

#include "flux/tensor.hpp"

namespace flux::data {

/// Reads an IDX file (plain or gzip) into a CPU tensor of its own shape. Element types map to
/// u8 -> UInt8, i8 / i16 / i32 -> Int32, f32 -> Float32, f64 -> Float64. Throws flux::Error naming
/// the file and what was expected for a missing, short, truncated or malformed file.
Tensor read_idx(const std::string& path);
/// The same, converted to `dtype` (values unchanged, e.g. UInt8 pixels 0..255 as Float32 0..255).
Tensor read_idx(const std::string& path, DType dtype);

/// Debian's dataset-fashion-mnist folder, where load_fashion_mnist looks by default.
inline constexpr const char* kFashionMnistFolder = "/usr/share/datasets/fashion-mnist";

/// Fashion-MNIST's ten class names, in label order.
inline constexpr std::array<const char*, 10> kFashionMnistClasses = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

/// Images (N, 1, 28, 28) Float32 scaled to [0, 1] and labels (N,) Int64 in 0..9, on the CPU.
struct ImageSet {
  Tensor images;
  Tensor labels;
};
struct FashionMnist {
  ImageSet train;  // 60,000 images
  ImageSet test;   // 10,000 images
  std::string folder;
};

/// Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from `folder` (default
/// kFashionMnistFolder). A missing folder or file is a flux::Error naming the path and the Debian
/// package that provides it; images and labels must agree in count and labels lie in 0..9.
FashionMnist load_fashion_mnist(const std::string& folder = kFashionMnistFolder);

}  // namespace flux::data
