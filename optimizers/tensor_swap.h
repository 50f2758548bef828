// Values put in place of tensors for a while, and the tensors' own put back
// bit for bit: what evaluating averaged weights (weight_average.h), the
// synchronized model of local SGD (distributed/local_sgd.h) or a gradient at
// stale parameters (distributed/delayed.h) needs.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <utility>
#include <vector>

namespace bigbatch::optim {

/// While it lives, each of `targets` holds the matching one of `values`
/// (same shapes); the targets' own values come back when it ends.
class TensorSwap {
 public:
  TensorSwap(std::vector<at::Tensor> targets, const std::vector<at::Tensor>& values) : targets_(std::move(targets)) {
    TORCH_CHECK(targets_.size() == values.size(), "TensorSwap: ", targets_.size(), " tensors and ", values.size(),
                " values");
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < targets_.size(); ++i) {
      at::Tensor t = targets_[i].detach();
      kept_.push_back(t.clone());
      t.copy_(values[i]);
    }
  }
  ~TensorSwap() {
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < kept_.size(); ++i) targets_[i].detach().copy_(kept_[i]);
  }
  TensorSwap(const TensorSwap&) = delete;
  TensorSwap& operator=(const TensorSwap&) = delete;

 private:
  std::vector<at::Tensor> targets_, kept_;
};

}  // namespace bigbatch::optim
