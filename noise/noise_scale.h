// The gradient noise scale B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018,
// arXiv:1812.06162; docs/formulas.md), from gradient norms at two batch sizes, and a
// helper that gets both from one training step split into micro-batches.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace bigbatch::noise {

/// Sum over `params` of |grad|^2 (every defined gradient), in double.
double grad_sq_norm(const std::vector<at::Tensor>& params);

/// One step's unbiased estimates from |G_s|^2 at batch B_s and |G_b|^2 at B_b > B_s:
///   |G|^2 = (B_b |G_b|^2 - B_s |G_s|^2) / (B_b - B_s)
///   tr(S) = (|G_s|^2 - |G_b|^2) / (1/B_s - 1/B_b)
/// Either may be negative on one step; only their averages are meaningful.
struct NoiseScaleSample {
  double grad_sq;
  double trace;
};
NoiseScaleSample noise_scale_sample(double small_sq_norm, std::int64_t small_batch,
                                    double big_sq_norm, std::int64_t big_batch);

/// Exponential moving averages of both estimates and their ratio
/// B_simple = EMA(tr S) / EMA(|G|^2) (the ratio of the averages, not the
/// average of ratios). The averages are bias-corrected as Adam's moments.
class GradientNoiseScale {
 public:
  /// beta: EMA decay per update, in [0, 1).
  explicit GradientNoiseScale(double beta = 0.99);

  void update(double small_sq_norm, std::int64_t small_batch, double big_sq_norm, std::int64_t big_batch);

  /// Bias-corrected EMA of |G|^2 (NaN before the first update).
  double grad_sq() const;
  /// Bias-corrected EMA of tr(Sigma) (NaN before the first update).
  double trace() const;
  /// EMA(tr S) / EMA(|G|^2) (NaN before the first update).
  double b_simple() const;
  std::int64_t updates() const { return updates_; }

  /// The raw averages, to checkpoint and restore a run exactly.
  struct State {
    double grad_sq = 0;
    double trace = 0;
    double correction = 1;
    std::int64_t updates = 0;
  };
  State state() const { return {grad_sq_, trace_, correction_, updates_}; }
  void restore(const State& s) {
    grad_sq_ = s.grad_sq;
    trace_ = s.trace;
    correction_ = s.correction;
    updates_ = s.updates;
  }

 private:
  double beta_;
  double grad_sq_ = 0;
  double trace_ = 0;
  double correction_ = 1;  // beta^updates
  std::int64_t updates_ = 0;
};

/// What micro_batch_step() measured.
struct MicroBatchStep {
  double loss;             ///< mean of the micro-batch losses (the batch loss)
  double small_sq_norm;    ///< mean over micro-batches of |G_s|^2
  std::int64_t small_batch;
  double big_sq_norm;      ///< |G_b|^2 of the whole batch's gradient
  std::int64_t big_batch;
};

/// The sum of parameters' gradients over micro-batches, in fp32: add() after
/// each micro-batch's backward (the first makes the buffers), then set_mean()
/// writes sum / count into the gradients. (micro_batch_step, batched trials.)
class GradientSum {
 public:
  void add(const std::vector<at::Tensor>& params);
  void set_mean(const std::vector<at::Tensor>& params, std::int64_t count);

 private:
  std::vector<at::Tensor> sum_;  // per parameter; undefined while its gradient is
};

/// One training step's forward/backward split into `micro_batches` equal
/// parts: loss_of_rows(begin, end) returns the mean loss over rows [begin, end)
/// of the batch. Leaves the whole batch's mean gradient in each parameter's
/// .grad (as one backward of the full batch would) and returns the norms the
/// noise scale needs, at the cost of one extra fp32 buffer per parameter.
/// batch must be divisible by micro_batches >= 2.
MicroBatchStep micro_batch_step(const std::vector<at::Tensor>& params, std::int64_t batch,
                                std::int64_t micro_batches,
                                const std::function<at::Tensor(std::int64_t, std::int64_t)>& loss_of_rows);

}  // namespace bigbatch::noise
