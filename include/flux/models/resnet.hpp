// ResNet-18 (He et al., "Deep Residual Learning for Image Recognition", 2015) built from flux-cpp's
// layers with torchvision.models.resnet18's exact structure and state names, so a torchvision
// state_dict saved as safetensors loads unchanged (load(path, model)) and gives torchvision's logits.
//   x (N, 3, H, W) -> conv1 7x7/2 -> bn1, relu -> maxpool 3x3/2        (N, 64, H/4, W/4)
//     -> layer1 (2 BasicBlocks, 64) -> layer2 (128, /2) -> layer3 (256, /2) -> layer4 (512, /2)
//     -> avgpool (adaptive, 1x1) -> flatten -> fc (512 => num_classes)   (N, num_classes) logits
// BasicBlock: y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), conv 3x3 without bias; the
// first block of layer2..4 halves H and W and its shortcut `downsample` is conv 1x1/2 + BatchNorm
// (torchvision's downsample.0 / downsample.1). State names: conv1.weight, bn1.{weight, bias,
// running_mean, running_var, num_batches_tracked}, layer1.0.conv1.weight, ..., layer2.0.downsample.0.weight,
// layer2.0.downsample.1.running_mean, ..., fc.weight, fc.bias (122 tensors; 11,689,512 parameters).
//   auto net = models::ResNet18() | dev;  load("resnet18.safetensors", net);  testmode(net);
#pragma once
#include <cstdint>
#include <type_traits>

#include "flux/nn/chain.hpp"
#include "flux/nn/conv.hpp"
#include "flux/nn/conv_fusion.hpp"
#include "flux/nn/dense.hpp"
#include "flux/nn/normalisation.hpp"
#include "flux/nn/pooling.hpp"

namespace flux::models {

/// torchvision's shortcut for a block that changes shape: Sequential(conv 1x1/stride, BatchNorm).
using Downsample = Chain<Conv, BatchNorm>;
/// The identity shortcut; holds no tensors (torchvision's downsample = None).
struct NoDownsample {
  Tensor operator()(const Tensor& x) const { return x; }
};

/// torchvision.models.resnet.BasicBlock (expansion 1) with the shortcut type `Shortcut`.
template <class Shortcut> struct BasicBlock {
  Conv conv1;       // 3x3, in => planes, stride s, pad 1, no bias
  BatchNorm bn1;    // (planes), relu
  Conv conv2;       // 3x3, planes => planes, pad 1, no bias
  BatchNorm bn2;    // (planes)
  Shortcut downsample;

  BasicBlock() = default;
  BasicBlock(int64_t in, int64_t planes, int64_t stride = 1)
      : conv1({3, 3}, in, planes, {.stride = stride, .pad = 1, .bias = false, .init = kaiming_normal}),
        bn1(planes, relu),
        conv2({3, 3}, planes, planes, {.pad = 1, .bias = false, .init = kaiming_normal}),
        bn2(planes) {
    if constexpr (std::is_same_v<Shortcut, Downsample>)
      downsample = Downsample(Conv({1, 1}, in, planes, {.stride = stride, .bias = false, .init = kaiming_normal}),
                              BatchNorm(planes));
  }

  /// x: (N, in, H, W) -> (N, planes, H / stride, W / stride).
  /// In inference each conv runs fused with its BatchNorm, relu and the residual add
  /// (include/flux/nn/conv_fusion.hpp); otherwise (training, gradients) the layers as written.
  Tensor operator()(const Tensor& x) const {
    Tensor h = detail::conv_batchnorm(conv1, bn1, x);
    if (!h.defined()) h = bn1(conv1(x));
    Tensor shortcut = downsample(x);
    Tensor y = detail::conv_batchnorm(conv2, bn2, h, shortcut, true);
    return y.defined() ? y : relu(bn2(conv2(h)) + shortcut);
  }
};

template <class T> struct is_basic_block : std::false_type {};
template <class S> struct is_basic_block<BasicBlock<S>> : std::true_type {};

/// BasicBlock's fields in torchvision's order; the identity shortcut contributes no names.
template <class Self, class Visit>
  requires is_basic_block<std::remove_const_t<Self>>::value
void flux_fields(Self& self, Visit&& visit) {
  visit("conv1", self.conv1);
  visit("bn1", self.bn1);
  visit("conv2", self.conv2);
  visit("bn2", self.bn2);
  if constexpr (std::is_same_v<std::remove_const_t<decltype(self.downsample)>, Downsample>)
    visit("downsample", self.downsample);
}

/// A stage of two blocks; the first one halves the resolution and changes the width.
using Stage = Chain<BasicBlock<NoDownsample>, BasicBlock<NoDownsample>>;
using DownStage = Chain<BasicBlock<Downsample>, BasicBlock<NoDownsample>>;

/// torchvision.models.resnet18(num_classes): see the top of this file.
struct ResNet18 {
  Conv conv1;                 // 7x7, 3 => 64, stride 2, pad 3, no bias
  BatchNorm bn1;              // (64), relu
  MaxPool maxpool;            // 3x3, stride 2, pad 1
  Stage layer1;               // 64
  DownStage layer2;           // 128
  DownStage layer3;           // 256
  DownStage layer4;           // 512
  AdaptiveMeanPool avgpool;   // (1, 1)
  Dense fc;                   // 512 => num_classes

  explicit ResNet18(int64_t num_classes = 1000)
      : conv1({7, 7}, 3, 64, {.stride = 2, .pad = 3, .bias = false, .init = kaiming_normal}),
        bn1(64, relu),
        maxpool({3, 3}, {.stride = 2, .pad = 1}),
        layer1(BasicBlock<NoDownsample>(64, 64), BasicBlock<NoDownsample>(64, 64)),
        layer2(BasicBlock<Downsample>(64, 128, 2), BasicBlock<NoDownsample>(128, 128)),
        layer3(BasicBlock<Downsample>(128, 256, 2), BasicBlock<NoDownsample>(256, 256)),
        layer4(BasicBlock<Downsample>(256, 512, 2), BasicBlock<NoDownsample>(512, 512)),
        avgpool({1, 1}),
        fc(512, num_classes) {}

  /// x: (N, 3, H, W) with H, W >= 32 -> (N, num_classes) logits.
  Tensor operator()(const Tensor& x) const {
    Tensor y = detail::conv_batchnorm(conv1, bn1, x);  // the stem, fused in inference
    y = maxpool(y.defined() ? y : bn1(conv1(x)));
    // One stage at a time, each input released as the next is made (nested calls would keep every
    // stage's output alive until the last returned).
    y = layer1(y);
    y = layer2(y);
    y = layer3(y);
    y = layer4(y);
    return fc(flatten(avgpool(y)));
  }
};
FLUX_LAYER(ResNet18, conv1, bn1, layer1, layer2, layer3, layer4, fc)

}  // namespace flux::models
