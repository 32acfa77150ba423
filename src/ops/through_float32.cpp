// The low-precision op pattern (through_float32.hpp): forward unrecorded, one node keeping the half
// tensors, gradients cast back to the inputs' dtypes.
#include "src/ops/through_float32.hpp"

#include "flux/autodiff.hpp"
#include "src/autodiff_state.hpp"
#include "src/ops/ops_internal.hpp"

namespace flux::detail {

bool half_storage(const Tensor& x) {
  return x.defined() && is_half(x.dtype()) && x.backend().reads_half_storage(x.device().index());
}

bool reads_half(const Tensor& x) { return half_storage(x) && !trace::active(); }

Tensor float32_of(const Tensor& t) { return t.defined() && is_half(t.dtype()) ? raw_cast(t, DType::f32) : t; }

Tensor through_float32(const ops::Op* op, std::initializer_list<const Tensor*> inputs, std::vector<Tensor> keep,
                       const std::function<Tensor(std::vector<Tensor>& kept)>& forward, LowBackward backward,
                       std::vector<trace::Attr> attrs, std::optional<DType> compute, unsigned float32_grads) {
  Tensor y;
  {
    RecordedForward training(autodiff::recording());  // what derives from weights: not kept (inference_call)
    autodiff::NoGrad no_grad;                          // recorded once, below
    y = forward(keep);
  }
  if (op && trace::active()) {
    std::vector<Tensor> traced;
    for (const Tensor* t : inputs) traced.push_back(*t);
    trace::emit(*op, std::move(traced), y, std::move(attrs));
  }
  bool any = false;
  for (const Tensor* t : inputs) any = any || autodiff::tracked(*t);
  if (!any) return y;
  std::vector<DType> dtypes;
  for (const Tensor* t : inputs) dtypes.push_back(t->defined() ? t->dtype() : y.dtype());
  auto to = [compute](const Tensor& t) {
    return compute && t.defined() && is_floating(t.dtype()) && t.dtype() != *compute ? raw_cast(t, *compute) : t;
  };
  autodiff::record(y, inputs, [keep = std::move(keep), backward = std::move(backward), dtypes, to,
                               float32_grads](const Tensor& gy) {
    std::vector<Tensor> kept;
    kept.reserve(keep.size());
    for (const Tensor& t : keep) kept.push_back(to(t));
    std::vector<Tensor> grads = backward(kept, to(gy));
    kept.clear();  // the compute copies go before the gradients are cast back
    for (size_t i = 0; i < grads.size() && i < dtypes.size(); ++i)
      if (grads[i].defined() && grads[i].dtype() != dtypes[i] &&
          !(grads[i].dtype() == DType::f32 && i < 32 && (float32_grads >> i & 1u)))
        grads[i] = raw_cast(grads[i], dtypes[i]);
    return grads;
  });
  return y;
}

}  // namespace flux::detail
