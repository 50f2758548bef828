// SOAP: Adam run in the eigenbasis of Shampoo's preconditioner (Vyas et al.
// 2024, "SOAP: Improving and Stabilizing Shampoo using Adam",
// arXiv:2409.11321), with the options, defaults and order of operations of
// the authors' code. docs/formulas.md, per parameter W viewed as a tensor of
// shape (s_1, ..., s_n) (merge_dims: small dimensions merged first), with a
// factor L_d (s_d x s_d) for each dimension of at most max_precond_dim:
//   first step:  L_d = (1-sb) * G_(d) G_(d)^T;  Q_d = the eigenvectors of L_d,
//                largest eigenvalue first; W does not change
//   each step t = 1, 2, ...:
//     G' = G x_1 Q_1 ... x_n Q_n           (the gradient in the eigenbasis: Q_d^T along d)
//     m = b1*m + (1-b1)*G';  v = b2*v + (1-b2)*G'^2
//     U = (m / (sqrt(v) + eps)) rotated back (Q_d along d);  U = U / rms(U) with normalize_grads
//     W = (W - lr * sqrt(1-b2^t)/(1-b1^t) * U) * (1 - lr*wd)   (without correct_bias: lr alone)
//     L_d = sb*L_d + (1-sb) * G_(d) G_(d)^T     (G_(d): G unfolded along d)
//     every precondition_frequency steps: Q_d = QR(L_d Q_d) (one power iteration),
//       Q_d's columns and v along d sorted by the estimated eigenvalues
//       diag(Q_d^T L_d Q_d), largest first; m rotated from the old basis to the new
// sb = shampoo_beta, or b2 where shampoo_beta < 0. A dimension above
// max_precond_dim is left unrotated (one-sided preconditioning); a 1-D
// parameter is rotated only with precondition_1d. m and v are kept in the
// eigenbasis (the authors' layout), so only a refresh rotates them.
// Fused (default): the parameters are batched by group, shape and step; the
// rotations are batched matrix products, Adam's part runs on the
// multi-tensor engine (kernels/soap.h) and the update on Muon's apply pass.
// Sharded, each rank holds whole tensors, as Muon.
#pragma once

#include "../kernels/soap.h"
#include "layerwise_optimizer.h"

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace bigbatch::optim {

struct SOAPOptions : public torch::optim::OptimizerCloneableOptions<SOAPOptions> {
  SOAPOptions(double lr = 3e-3);  // NOLINT(google-explicit-constructor): as LibTorch
  TORCH_ARG(double, lr) = 3e-3;
  typedef std::tuple<double, double> betas_t;
  /// Adam's (b1, b2), in the eigenbasis.
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.95, 0.95);
  /// The factors' moving-average rate; negative: b2 (the authors' -1).
  TORCH_ARG(double, shampoo_beta) = -1;
  TORCH_ARG(double, eps) = 1e-8;
  /// Decoupled: the weights shrink by lr*weight_decay after each update.
  TORCH_ARG(double, weight_decay) = 0.01;
  /// Steps between refreshes of the eigenbases (one power iteration and QR).
  TORCH_ARG(int64_t, precondition_frequency) = 10;
  /// A dimension longer than this gets no factor (left unrotated).
  TORCH_ARG(int64_t, max_precond_dim) = 10000;
  /// Merge adjacent dimensions while their product stays <= max_precond_dim
  /// (a convolution weight (out, in, kh, kw) becomes, say, (out*in, kh*kw)).
  TORCH_ARG(bool, merge_dims) = false;
  /// Rotate 1-D parameters too (one factor); false: Adam for them.
  TORCH_ARG(bool, precondition_1d) = false;
  /// Scale each update to unit RMS before the rate.
  TORCH_ARG(bool, normalize_grads) = false;
  /// Adam's bias correction, folded into the rate.
  TORCH_ARG(bool, correct_bias) = true;
  /// No effect (no trust ratio); kept so all optimizers share group helpers.
  TORCH_ARG(bool, adapt) = true;
  /// A step with an inf/NaN gradient in a group that asks changes nothing and
  /// is counted in skipped_steps().
  TORCH_ARG(bool, skip_nonfinite) = true;
  /// true: batched rotations and the engine; false: the reference path, one
  /// parameter at a time in plain ATen ops.
  TORCH_ARG(bool, fused) = true;
  /// Keep an fp32 copy of bf16/fp16 parameters in the state.
  TORCH_ARG(bool, master_weights) = false;

 public:
  /// Throws an OptionError naming the first invalid option and its value.
  void validate() const;
  double get_lr() const override { return lr(); }
  void set_lr(const double new_lr) override { lr(new_lr); }
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const SOAPOptions& lhs, const SOAPOptions& rhs);
  ~SOAPOptions() override = default;

 private:
  template <typename Self>
  static auto fields(Self& self);
};

struct SOAPParamState : public torch::optim::OptimizerCloneableParamState<SOAPParamState> {
  /// Adam steps taken (the first call only builds the factors: still 0).
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, exp_avg);     ///< m in the eigenbasis, fp32, shaped like the parameter
  TORCH_ARG(torch::Tensor, exp_avg_sq);  ///< v in the eigenbasis, fp32, shaped like the parameter
  /// The factors L_d, each s_d x s_d row-major, one after another in the
  /// order of the dimensions that have one (fp32, 1-D; soap_layout()).
  TORCH_ARG(torch::Tensor, factors);
  TORCH_ARG(torch::Tensor, eigenbases);  ///< the bases Q_d, packed as the factors
  TORCH_ARG(torch::Tensor, master);      ///< fp32 copy of a 16-bit parameter (master_weights)

 public:
  /// An empty state: the first step builds the factors and bases.
  static SOAPParamState fresh(const at::Tensor& param);
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  std::int64_t tensor_bytes() const;
  NamedState named() const;
  void set_named(const NamedState& values);
  static std::vector<StateField> declared();
  friend bool operator==(const SOAPParamState& lhs, const SOAPParamState& rhs);
  ~SOAPParamState() override = default;

 private:
  template <typename Self>
  static auto fields(Self& self);
};

/// How SOAP sees a parameter: the shape it rotates (merge_dims applied; a
/// 1-D parameter as itself) and, per dimension, whether it has a factor and
/// where that factor starts in the packed `factors` (-1: none).
struct SOAPLayout {
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> offset;
  std::int64_t packed = 0;  ///< sum of s_d^2 over the dimensions with a factor
};
SOAPLayout soap_layout(const at::Tensor& param, const SOAPOptions& options);

/// The Adam pass's group of `options` (kernels/soap.h).
kernels::SoapAdamGroup kernel_group(const SOAPOptions& options);

/// A parameter and the spread of its preconditioner: over its factors, the
/// largest eigenvalue estimate diag(Q^T L Q) over the smallest.
struct EigenvalueRange {
  at::Tensor param;
  double ratio = 0;
};

class SOAPFusedState;  // the engines of the fused step (soap.cpp)

/// SOAP as a drop-in torch::optim::Optimizer.
class SOAP : public LayerwiseOptimizer<SOAPOptions, SOAPParamState> {
 public:
  explicit SOAP(std::vector<torch::optim::OptimizerParamGroup> param_groups, SOAPOptions defaults = {});
  explicit SOAP(std::vector<torch::Tensor> params, SOAPOptions defaults = {});
  ~SOAP() override;

  torch::Tensor step(LossClosure closure = nullptr) override;

  /// Sharded, each rank holds whole tensors (its factors are of whole
  /// dimensions), and a sharding that cuts one is refused; the skip decision
  /// spans the ranks (one all-reduce of a count per group). Null ends it.
  void shard(std::shared_ptr<const OptimizerSharding> sharding) override;
  bool shards_whole_tensors() const override { return true; }

  /// Each parameter's eigenvalue range (above), for those that have a factor
  /// and have taken a step: from the estimates its last refresh made (at the
  /// first step, the eigenvalues), kept on the device, so that asking costs
  /// no product (waits for the device).
  std::vector<EigenvalueRange> eigenvalue_ranges() const;

  /// The eigenvalue ranges as "soap_eigenvalue_range".
  std::vector<ParamScalar> scalars() const override;

 protected:
  void step_reference(const std::vector<Group>& groups) override;

 private:
  /// Builds the factors and bases of the parameters taking their first step
  /// (removed from `groups`), which then do not change.
  void start(std::vector<Group>& groups);
  bool step_fused(const std::vector<Group>& groups);
  /// Keeps factor d's eigenvalue estimates of `param` for eigenvalue_ranges().
  void note_estimates(const at::Tensor& param, std::size_t d, const at::Tensor& values);
  struct Estimates {
    std::vector<at::Tensor> values;  // per dimension, or undefined
    at::Tensor bases;                // the state's bases they belong to (a loaded state has others)
  };
  std::unordered_map<const void*, Estimates> estimates_;  // by the parameter's TensorImpl
  std::unique_ptr<SOAPFusedState> fused_;
  std::shared_ptr<const OptimizerSharding> sharding_;
};

}  // namespace bigbatch::optim
