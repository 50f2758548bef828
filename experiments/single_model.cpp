// One trial's model as the training loop's LaneModel (lane_model.h): the
// step's gradient in one of three ways (the whole batch; micro-batches whose
// norms give the noise scale; data-parallel over a process group, where the
// ranks' norms give it), and the evaluation (under a process group, rank 0's,
// broadcast so that every rank stops at the same step).
#include "lane_model.h"

#include "../noise/noise_scale.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/nn/functional/loss.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace bigbatch::experiments {
namespace {

namespace F = torch::nn::functional;

class SingleModel final : public LaneModel {
 public:
  SingleModel(torch::nn::Sequential model, const Dataset& data, const at::Device& device,
              distributed::ProcessGroup* group)
      : LaneModel(1), model_(std::move(model)), data_(data), device_(device), group_(group) {
    model_->to(device_);
    if (group_) distributed::broadcast_module(*group_, *model_);
    params_ = model_->parameters();
  }

  torch::nn::Module& lane(std::size_t) override { return *model_; }
  torch::nn::Sequential* sequential() override { return &model_; }

  std::vector<LaneGradient> gradients(const StepBatch& b, const std::vector<bool>&,
                                      std::int64_t micro_batches) override {
    // Every rank drew the same global batch; each takes its share.
    at::Tensor index = b.index, weights = b.weights;
    std::int64_t local = b.size;
    if (group_) {
      const std::int64_t world = group_->size();
      TORCH_CHECK(b.size % world == 0, "batch size ", b.size, " is not divisible by the world size ", world);
      local = b.size / world;
      const std::int64_t begin = group_->rank() * local;
      index = index.slice(0, begin, begin + local);
      if (weights.defined()) weights = weights.slice(0, begin, begin + local);
    }
    const at::Tensor x = rows_of(data_.x_train, index, device_);
    const at::Tensor y = rows_of(data_.y_train, index, device_);
    if (weights.defined()) weights = weights.to(device_);
    // Zeroed in place, as LibTorch 1.13's Optimizer::zero_grad does (2.x's sets
    // them to none: the same sums).
    for (const auto& p : params_) {
      if (p.grad().defined()) {
        p.mutable_grad().detach_();
        p.mutable_grad().zero_();
      }
    }
    if (group_) return {data_parallel(x, y, weights, local, b.size)};
    if (micro_batches >= 2) return {in_micro_batches(x, y, weights, b.size, micro_batches)};
    const at::Tensor l = loss(x, y, weights);
    l.backward();
    return {{l.item<double>(), std::nullopt}};
  }

  std::vector<std::pair<double, double>> evaluate() override {
    if (group_) {  // rank 0 measures, every rank gets its numbers: one stopping decision
      std::vector<at::Tensor> result{at::zeros({2}, at::kDouble)};
      if (group_->rank() == 0) {
        const auto [l, e] = evaluate_here();
        result[0][0] = l;
        result[0][1] = e;
      }
      group_->broadcast(result, 0);
      return {{result[0][0].item<double>(), result[0][1].item<double>()}};
    }
    return {evaluate_here()};
  }

 private:
  // The mean (or weighted mean) loss of the model on rows x, y.
  at::Tensor loss(const at::Tensor& x, const at::Tensor& y, const at::Tensor& weights) {
    const at::Tensor out = model_->forward(x);
    const at::Tensor per_sample = data_.classes > 0
                                      ? F::cross_entropy(out, y, F::CrossEntropyFuncOptions().reduction(torch::kNone))
                                      : (out - y).pow(2).sum(1);
    return weights.defined() ? (per_sample * weights).mean() : per_sample.mean();
  }

  // The averaged gradient over the ranks; each rank's own gradient norm and
  // the averaged one are the two batch sizes of the noise scale.
  LaneGradient data_parallel(const at::Tensor& x, const at::Tensor& y, const at::Tensor& weights,
                             std::int64_t local, std::int64_t global) {
    const at::Tensor l = loss(x, y, weights);
    l.backward();
    const auto norms = distributed::allreduce_gradients(*group_, params_);
    std::vector<at::Tensor> mean{l.detach().reshape({1}).to(at::kDouble)};
    group_->allreduce_sum(mean);
    LaneGradient g{mean[0].item<double>() / static_cast<double>(group_->size()), std::nullopt};
    if (std::isfinite(norms.local_sq) && std::isfinite(norms.global_sq)) {
      g.noise = NoiseSample{norms.local_sq, norms.global_sq, local, global};
    }
    return g;
  }

  // One process: the batch in micro-batches, whose gradient norms and their
  // sum's give the noise scale.
  LaneGradient in_micro_batches(const at::Tensor& x, const at::Tensor& y, const at::Tensor& weights,
                                std::int64_t batch, std::int64_t micro_batches) {
    const auto m = noise::micro_batch_step(params_, batch, micro_batches, [&](std::int64_t begin, std::int64_t end) {
      return loss(x.slice(0, begin, end), y.slice(0, begin, end),
                  weights.defined() ? weights.slice(0, begin, end) : at::Tensor());
    });
    LaneGradient g{m.loss, std::nullopt};
    if (std::isfinite(m.small_sq_norm) && std::isfinite(m.big_sq_norm)) {
      g.noise = NoiseSample{m.small_sq_norm, m.big_sq_norm, m.small_batch, m.big_batch};
    }
    return g;
  }

  std::pair<double, double> evaluate_here() {
    at::NoGradGuard no_grad;
    model_->eval();
    const std::int64_t n = data_.x_val.size(0);
    double loss = 0;
    double wrong = 0;
    for (std::int64_t begin = 0; begin < n; begin += kEvalChunk) {
      const std::int64_t end = std::min(n, begin + kEvalChunk);
      const at::Tensor x = data_.x_val.slice(0, begin, end).to(device_);
      const at::Tensor y = data_.y_val.slice(0, begin, end).to(device_);
      const at::Tensor out = model_->forward(x);
      if (data_.classes > 0) {
        loss += F::cross_entropy(out, y, F::CrossEntropyFuncOptions().reduction(torch::kSum)).item<double>();
        wrong += out.argmax(1).ne(y).sum().item<double>();
      } else {
        loss += (out - y).pow(2).sum().item<double>();
      }
    }
    model_->train();
    const auto count = static_cast<double>(n);
    return {loss / count, data_.classes > 0 ? wrong / count : std::numeric_limits<double>::quiet_NaN()};
  }

  torch::nn::Sequential model_;
  const Dataset& data_;
  at::Device device_;
  distributed::ProcessGroup* group_;
  std::vector<at::Tensor> params_;
};

}  // namespace

std::unique_ptr<LaneModel> single_model(torch::nn::Sequential model, const Dataset& data, const at::Device& device,
                                        distributed::ProcessGroup* group) {
  return std::make_unique<SingleModel>(std::move(model), data, device, group);
}

}  // namespace bigbatch::experiments
