// Muon: momentum orthogonalized by a Newton-Schulz iteration (Jordan et al.
// 2024; Liu et al. 2025, "Muon is Scalable for LLM Training", arXiv:2502.16982;
// PyTorch's torch.optim.Muon), with AdamW for the parameters that are not
// hidden matrices, in one optimizer object. docs/formulas.md, per matrix W
// (rows x cols; a convolution weight flattened to out x in*kh*kw) of a group
// with orthogonalize(true):
//   m = mu*m + (1-mu)*g                          (m starts at 0)
//   U = mu*m + (1-mu)*g with nesterov, else m
//   X = U (transposed when rows > cols), X = X / max(||X||_F, eps)
//   ns_steps times: A = X X^T;  X = a*X + (b*A + c*A A) X      (a, b, c) = ns_coefficients
//   O = X (transposed back)
//   W = W*(1 - lr*wd) - lr*s*O        s = sqrt(max(1, rows/cols))  ("original")
//                                       0.2*sqrt(max(rows, cols))  ("match_rms_adamw")
//                                       sqrt(rows/cols)            ("spectral_unclamped")
// and in groups with orthogonalize(false), AdamW (torch.optim.AdamW's update,
// betas adamw_betas, eps adamw_eps, the group's lr and weight_decay).
// Fused (default): the elementwise parts on the multi-tensor engine
// (kernels/muon.h; AdamW on LAMB's plan without trust ratio), the iteration as
// batched products, one batch per matrix shape. muon_param_groups() makes the
// usual split (hidden matrices; the rest).
#pragma once

#include "../kernels/lamb.h"
#include "../kernels/muon.h"
#include "layerwise_optimizer.h"

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace bigbatch::optim {

struct MuonOptions : public torch::optim::OptimizerCloneableOptions<MuonOptions> {
  MuonOptions(double lr = 1e-3);  // NOLINT(google-explicit-constructor): as LibTorch
  TORCH_ARG(double, lr) = 1e-3;
  /// Decoupled: the weights shrink by lr*weight_decay per step (the unadjusted rate).
  TORCH_ARG(double, weight_decay) = 0.1;
  /// true: the group's parameters are orthogonalized (matrices only); false: AdamW.
  TORCH_ARG(bool, orthogonalize) = true;
  TORCH_ARG(double, momentum) = 0.95;
  TORCH_ARG(bool, nesterov) = true;
  typedef std::tuple<double, double, double> coefficients_t;
  TORCH_ARG(coefficients_t, ns_coefficients) = std::make_tuple(3.4445, -4.7750, 2.0315);
  TORCH_ARG(int64_t, ns_steps) = 5;
  /// The Frobenius norm's floor in the iteration's normalization.
  TORCH_ARG(double, eps) = 1e-7;
  /// "original", "match_rms_adamw" or "spectral_unclamped" (see above).
  TORCH_ARG(std::string, adjust_lr) = "original";
  /// Run the iteration in bfloat16, as PyTorch's Muon does (faster on GPUs with
  /// bf16 tensor cores; the update then carries bf16's 3 significant digits).
  /// false: fp32.
  TORCH_ARG(bool, ns_bfloat16) = false;
  typedef std::tuple<double, double> betas_t;
  /// The AdamW groups' (b1, b2) and eps (torch.optim.AdamW's defaults).
  TORCH_ARG(betas_t, adamw_betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, adamw_eps) = 1e-8;
  /// A step with an inf/NaN gradient in a group that asks changes nothing and
  /// is counted in skipped_steps().
  TORCH_ARG(bool, skip_nonfinite) = true;
  /// true: the fused engine and batched products; false: the reference path,
  /// one matrix at a time in plain ATen ops.
  TORCH_ARG(bool, fused) = true;
  /// Keep an fp32 copy of bf16/fp16 parameters in the state.
  TORCH_ARG(bool, master_weights) = false;

 public:
  /// Throws c10::Error naming the first invalid option and its value.
  void validate() const;
  double get_lr() const override { return lr(); }
  void set_lr(const double new_lr) override { lr(new_lr); }
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const MuonOptions& lhs, const MuonOptions& rhs);
  ~MuonOptions() override = default;

 private:
  template <typename Self>
  static auto fields(Self& self);
};

struct MuonParamState : public torch::optim::OptimizerCloneableParamState<MuonParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, momentum_buffer);  ///< m of an orthogonalized matrix, fp32
  TORCH_ARG(torch::Tensor, exp_avg);          ///< AdamW's m, fp32
  TORCH_ARG(torch::Tensor, exp_avg_sq);       ///< AdamW's v, fp32
  TORCH_ARG(torch::Tensor, master);           ///< fp32 copy of a 16-bit parameter (master_weights)

 public:
  /// An empty state: the step makes the tensors its group needs.
  static MuonParamState fresh(const at::Tensor& param);
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// Bytes of its tensors (the moments, buffers and master copy it holds).
  std::int64_t tensor_bytes() const;
  /// Its fields by name (step, moments, master copy), as moved between
  /// optimizers that cut the tensor differently (distributed/sharded.h).
  NamedState named() const;
  void set_named(const NamedState& values);
  /// Its fields as declared (names, and which are counts or per-tensor numbers).
  static std::vector<StateField> declared();
  friend bool operator==(const MuonParamState& lhs, const MuonParamState& rhs);
  ~MuonParamState() override = default;

 private:
  template <typename Self>
  static auto fields(Self& self);
};

/// An AdamW group's options as LAMB's plan takes them (no trust ratio).
kernels::LambGroup kernel_group(const MuonOptions& options);

/// The shape a parameter is orthogonalized as: (rows, cols) = (size(0),
/// numel / size(0)); a convolution weight (out, in, kh, kw) is (out, in*kh*kw).
std::tuple<std::int64_t, std::int64_t> muon_matrix_shape(const at::Tensor& param);

/// The update scale of the rule `adjust_lr` for a rows x cols matrix
/// (without lr): 1 for ... see MuonOptions.
double muon_scale(const std::string& adjust_lr, std::int64_t rows, std::int64_t cols);

/// The Newton-Schulz iteration of a batch (k, rows, cols) of fp32 matrices,
/// in place, with `options`' coefficients, steps, eps and precision: each
/// matrix becomes its orthogonalized direction (not yet scaled).
void newton_schulz_(at::Tensor& batch, const MuonOptions& options);

/// A parameter and the RMS of its last update by the orthogonalized direction
/// (lr*s*||O||_F / sqrt(numel), the decay not included).
struct UpdateRms {
  at::Tensor param;
  double rms = 0;
};

class MuonFusedState;  // the engines and batches of the fused step (muon.cpp)

/// Muon (with its AdamW groups) as a drop-in torch::optim::Optimizer.
class Muon : public LayerwiseOptimizer<MuonOptions, MuonParamState> {
 public:
  torch::Tensor step(LossClosure closure = nullptr) override;

  /// Every parameter group's options are checked; a parameter of fewer than 2
  /// dimensions in a group with orthogonalize(true) is refused, naming it.
  explicit Muon(std::vector<torch::optim::OptimizerParamGroup> param_groups, MuonOptions defaults = {});
  explicit Muon(std::vector<torch::Tensor> params, MuonOptions defaults = {});
  ~Muon() override;

  void add_param_group(const torch::optim::OptimizerParamGroup& group);

  /// Sharded, each rank holds whole tensors (shards_whole_tensors(): a
  /// matrix is orthogonalized whole by the rank that owns it, as in Dion and
  /// Megatron's layer-sharded Muon), and a sharding that cuts one is refused.
  /// No norm spans ranks; the skip decision does: a step is skipped on every
  /// rank when any rank's gradient is inf or NaN (one all-reduce of a count per
  /// group). Null ends the sharding.
  void shard(std::shared_ptr<const OptimizerSharding> sharding) override;
  bool shards_whole_tensors() const override { return true; }

  /// Each orthogonalized parameter's update RMS in the last step (empty before
  /// the first, after a skipped one, and after one in which no orthogonalized
  /// parameter had a gradient). After fused CUDA steps this waits.
  std::vector<UpdateRms> update_rms() const;

  /// The trust ratios of its AdamW groups (none) and each matrix's update RMS
  /// as "muon_update_rms".
  std::vector<ParamScalar> scalars() const override;

 protected:
  /// The reference step of `groups` (the non-finite check done by step()).
  void step_reference(const std::vector<Group>& groups) override;

 private:
  void check_matrices(std::size_t first_group) const;
  bool step_fused(const std::vector<Group>& muon_groups);
  std::unique_ptr<MuonFusedState> fused_;
  std::shared_ptr<const OptimizerSharding> sharding_;  // the skip decision's all-reduce (the engine runs unsharded)
  std::vector<UpdateRms> reference_rms_;  // the last reference step's
  bool fused_ran_ = false;
};

/// Which parameters a rule sends where, by name and tensor.
using ParamRule = std::function<bool(const std::string& name, const at::Tensor& param)>;

/// The parameters Jordan's and Moonshot's implementations leave to AdamW
/// although they are matrices: the weights of torch::nn::Embedding modules,
/// and those of the first and of the last module (in registration order)
/// that has parameters of its own: the input layer and the output head.
ParamRule muon_adamw_rule(const torch::nn::Module& module);

/// The usual split for Muon, up to three groups (empty ones left out):
///   the hidden matrices (2 or more dimensions, neither rule says yes): `options`;
///   the matrices `adamw` says yes to: AdamW (orthogonalize(false)) with the decay;
///   the parameters of 0 or 1 dimensions (biases, normalization) and those
///   `plain` says yes to: AdamW without weight decay.
/// `adamw` defaults to muon_adamw_rule(module); `plain` wins over it.
///   Muon opt(muon_param_groups(model, MuonOptions(0.02)), MuonOptions(0.02));
std::vector<torch::optim::OptimizerParamGroup> muon_param_groups(const torch::nn::Module& module,
                                                                 const MuonOptions& options,
                                                                 const ParamRule& adamw = nullptr,
                                                                 const ParamRule& plain = nullptr);

}  // namespace bigbatch::optim
