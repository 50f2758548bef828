// What LayerwiseOptimizer's members share that is not a template
// (layerwise_optimizer.h); the members are in layerwise_optimizer_impl.h.
#include "layerwise_optimizer.h"

#include <ATen/ATen.h>

#include <utility>

namespace bigbatch::optim {

kernels::DType kernel_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return kernels::DType::kFloat32;
    case at::kBFloat16: return kernels::DType::kBFloat16;
    case at::kHalf: return kernels::DType::kFloat16;
    default: break;
  }
  TORCH_CHECK(false, "bigbatch optimizers support float32, bfloat16 and float16 parameters, got ",
              t.scalar_type());
}

at::Tensor run_closure(const std::function<at::Tensor()>& closure) {
  if (!closure) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

OptionError::OptionError(std::string optimizer_, std::string option_, std::string value_, std::string requirement_)
    : c10::ValueError({__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)},
                      "Invalid " + optimizer_ + " option " + option_ + ": " + value_ + " (must be " + requirement_ + ")"),
      optimizer(std::move(optimizer_)),
      option(std::move(option_)),
      value(std::move(value_)),
      requirement(std::move(requirement_)) {}

std::vector<ParamScalar> LayerwiseOptimizerBase::scalars() const {
  std::vector<ParamScalar> out;
  for (const auto& r : trust_ratios()) out.push_back({"trust_ratio", r.param, r.ratio});
  return out;
}

void LayerwiseOptimizerBase::warn_reference_path(const std::string& why) {
  if (why.empty() || !warned_.insert(why).second) return;
  TORCH_WARN(kind(), ": steps on the reference path (ATen ops one tensor at a time, with host syncs), not the "
             "fused engine: ", why, ". Warned once per optimizer and reason.");
}

at::Tensor fp32_zeros_like(const at::Tensor& param) {
  return at::zeros_like(param, param.options().dtype(at::kFloat));
}

at::Tensor fp32_contiguous_zeros_like(const at::Tensor& param) {
  return at::zeros(param.sizes(), param.options().dtype(at::kFloat));
}

}  // namespace bigbatch::optim
