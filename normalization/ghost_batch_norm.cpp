// GhostBatchNorm1d/2d (ghost_batch_norm.h): at::batch_norm on each chunk of
// the batch, in order, sharing the running-statistics buffers it updates.
#include "ghost_batch_norm.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <ostream>
#include <vector>

namespace bigbatch::nn {

GhostBatchNormOptions::GhostBatchNormOptions(std::int64_t num_features, std::int64_t ghost_batch_size)
    : num_features_(num_features), ghost_batch_size_(ghost_batch_size) {}

template <std::size_t D, typename Derived>
GhostBatchNormImplBase<D, Derived>::GhostBatchNormImplBase(GhostBatchNormOptions options_)
    : options(std::move(options_)) {
  reset();
}

template <std::size_t D, typename Derived>
void GhostBatchNormImplBase<D, Derived>::reset() {
  const auto& o = options;
  TORCH_CHECK(o.num_features() > 0, "GhostBatchNorm: num_features must be > 0, got ", o.num_features());
  TORCH_CHECK(o.ghost_batch_size() > 0, "GhostBatchNorm: ghost_batch_size must be > 0, got ",
              o.ghost_batch_size());
  TORCH_CHECK(o.eps() > 0, "GhostBatchNorm: eps must be > 0, got ", o.eps());
  TORCH_CHECK(o.momentum() >= 0 && o.momentum() <= 1, "GhostBatchNorm: momentum must be in [0, 1], got ",
              o.momentum());
  if (o.affine()) {
    weight = this->register_parameter("weight", at::ones({o.num_features()}));
    bias = this->register_parameter("bias", at::zeros({o.num_features()}));
  } else {
    weight = this->register_parameter("weight", at::Tensor(), /*requires_grad=*/false);
    bias = this->register_parameter("bias", at::Tensor(), /*requires_grad=*/false);
  }
  if (o.track_running_stats()) {
    running_mean = this->register_buffer("running_mean", at::zeros({o.num_features()}));
    running_var = this->register_buffer("running_var", at::ones({o.num_features()}));
    num_batches_tracked = this->register_buffer("num_batches_tracked", at::zeros({}, at::kLong));
  } else {
    running_mean = this->register_buffer("running_mean", at::Tensor());
    running_var = this->register_buffer("running_var", at::Tensor());
    num_batches_tracked = this->register_buffer("num_batches_tracked", at::Tensor());
  }
}

template <std::size_t D, typename Derived>
void GhostBatchNormImplBase<D, Derived>::reset_running_stats() {
  if (!options.track_running_stats()) return;
  at::NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

template <std::size_t D, typename Derived>
at::Tensor GhostBatchNormImplBase<D, Derived>::forward(const at::Tensor& input) {
  const char* name = D == 1 ? "GhostBatchNorm1d" : "GhostBatchNorm2d";
  if constexpr (D == 1) {
    TORCH_CHECK(input.dim() == 2 || input.dim() == 3, name, ": expected a 2-D or 3-D input, got ",
                input.dim(), "-D");
  } else {
    TORCH_CHECK(input.dim() == 4, name, ": expected a 4-D input, got ", input.dim(), "-D");
  }
  TORCH_CHECK(input.size(1) == options.num_features(), name, ": expected ", options.num_features(),
              " features (dim 1), got ", input.size(1));
  const bool cudnn = at::globalContext().userEnabledCuDNN();
  const bool use_running = !this->is_training() && options.track_running_stats();
  if (use_running) {
    return at::batch_norm(input, weight, bias, running_mean, running_var, /*training=*/false,
                          options.momentum(), options.eps(), cudnn);
  }
  const bool update = this->is_training() && options.track_running_stats();
  const std::int64_t per_example = input.numel() / std::max<std::int64_t>(1, input.size(0) * input.size(1));
  const std::int64_t ghost = options.ghost_batch_size();
  const std::int64_t last = input.size(0) % ghost == 0 ? std::min(ghost, input.size(0)) : input.size(0) % ghost;
  TORCH_CHECK(!this->is_training() || last * per_example > 1, name,
              ": a chunk needs more than 1 value per channel in training; batch ", input.size(0),
              " with ghost_batch_size ", ghost, " leaves a last chunk of ", last, " example(s)");
  const std::vector<at::Tensor> chunks = input.split(ghost, 0);
  std::vector<at::Tensor> outputs;
  outputs.reserve(chunks.size());
  for (const auto& chunk : chunks) {
    // at::batch_norm updates running_mean/var in place: one update per chunk.
    outputs.push_back(at::batch_norm(chunk, weight, bias, update ? running_mean : at::Tensor(),
                                     update ? running_var : at::Tensor(), /*training=*/true,
                                     options.momentum(), options.eps(), cudnn));
  }
  if (update) {
    at::NoGradGuard no_grad;
    num_batches_tracked.add_(static_cast<std::int64_t>(chunks.size()));
  }
  return outputs.size() == 1 ? outputs.front() : at::cat(outputs, 0);
}

template <std::size_t D, typename Derived>
void GhostBatchNormImplBase<D, Derived>::pretty_print(std::ostream& stream) const {
  stream << "bigbatch::nn::GhostBatchNorm" << D << "d(" << options.num_features()
         << ", ghost_batch_size=" << options.ghost_batch_size() << ", eps=" << options.eps()
         << ", momentum=" << options.momentum() << ", affine=" << options.affine()
         << ", track_running_stats=" << options.track_running_stats() << ")";
}

template class GhostBatchNormImplBase<1, GhostBatchNorm1dImpl>;
template class GhostBatchNormImplBase<2, GhostBatchNorm2dImpl>;

}  // namespace bigbatch::nn
