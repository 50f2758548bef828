// Dynamic loss scaling for fp16 mixed precision (Micikevicius et al. 2018,
// arXiv:1710.03740, section 3.2; the dynamic rule as PyTorch's GradScaler
// runs it). docs/formulas.md "Mixed precision and loss scaling":
//   backward of S * loss                 (small gradients stay above fp16's smallest normal)
//   g = g / S                            (exact: S is a power of two)
//   if some g is inf or NaN: skip the step, S = S * backoff, run = 0
//   else: step; run = run + 1; if run == growth_interval: S = S * growth, run = 0
// The chain around any optimizer: scale -> backward -> unscale and check ->
// step or skip -> update S. A skipped step changes no parameter and no
// optimizer state. bf16 has fp32's exponent range and needs none of this.
#pragma once

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <vector>

namespace bigbatch::optim {

struct LossScalerOptions {
  /// S at the first step (GradScaler's 2^16).
  TORCH_ARG(double, init_scale) = 65536.0;
  /// S is multiplied by this after growth_interval finite steps in a row.
  TORCH_ARG(double, growth_factor) = 2.0;
  /// S is multiplied by this after a step with an inf or NaN gradient.
  TORCH_ARG(double, backoff_factor) = 0.5;
  TORCH_ARG(std::int64_t, growth_interval) = 2000;

 public:
  /// Throws c10::Error naming the first invalid option and its value: every
  /// factor and the scale must be powers of two (so that scaling and
  /// unscaling round nothing), growth > 1, backoff < 1, interval >= 1.
  void validate() const;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& options = {});

  /// S, the factor the loss is multiplied by before backward.
  double scale() const { return scale_; }
  /// loss * S.
  at::Tensor scale(const at::Tensor& loss) const;

  /// Divides every defined gradient of `params` by S, in place; whether all
  /// of them are finite (one reduction, one wait for the device).
  bool unscale(const std::vector<at::Tensor>& params) const;
  /// S and the run of finite steps after a step whose gradients were (not) finite.
  void update(bool finite);
  /// unscale; optimizer.step() when finite, else nothing; update. Whether it stepped.
  bool step(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params);

  /// Steps skipped for inf or NaN gradients.
  std::int64_t skipped_steps() const { return skipped_; }
  /// Finite steps since S last changed.
  std::int64_t growth_run() const { return run_; }

  /// What a checkpoint keeps, and puts back.
  struct State {
    double scale = 0;
    std::int64_t run = 0;
    std::int64_t skipped = 0;
  };
  State state() const { return {scale_, run_, skipped_}; }
  void restore(const State& state);

  const LossScalerOptions& options() const { return options_; }

 private:
  LossScalerOptions options_;
  double scale_;
  std::int64_t run_ = 0;
  std::int64_t skipped_ = 0;
};

}  // namespace bigbatch::optim
