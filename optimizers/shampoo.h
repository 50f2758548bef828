// Shampoo with grafting (Gupta et al. 2018, "Shampoo: Preconditioned
// Stochastic Tensor Optimization", arXiv:1802.09568), in the design of the
// distributed PyTorch implementation (Shi et al. 2023, "A Distributed
// Data-Parallel PyTorch Implementation of the Distributed Shampoo Optimizer
// for Training Neural Networks At-Scale", arXiv:2309.06497), with its option
// names and defaults. docs/formulas.md, per parameter W viewed in its merged
// shape (use_merge_dims) and cut into blocks of at most max_preconditioner_dim
// along each dimension; per block B of order k, a factor L_d per dimension:
//   g = grad (+ wd*W where the decay is coupled)
//   L_d = b2*L_d + (1-b2) * G_(d) G_(d)^T     (b2 = 1: L_d += G_(d) G_(d)^T)
//   at the start step and every precondition_frequency steps after it:
//     R_d = (L_d/(1-b2^t) + eps*I)^(-1/r), r = 2k (or inv_root_override), by
//     eigendecomposition (eigenvalues below eps, from rounding, shifted up to it)
//   m = b1*m + (1-b1)*g;  mh = m/(1-b1^t)      (the filtered gradient)
//   D = the graft's direction of mh (Adam: mh / (sqrt(v/(1-bg^t)) + eps_g),
//       v = bg*v + (1-bg)*g^2; AdaGrad, RMSprop, SGD likewise)
//   from start_preconditioning_step on, per block:
//     P = mh x_1 R_1 ... x_k R_k;  S = P * ||D_B|| / (||P|| + 1e-16)   (grafting none: S = P)
//   before it: S = D
//   d = S + wd*W (decoupled decay);  u = mu*u + (1-dampening)*d
//   W = W - lr * (Nesterov: (1-dampening)*d + mu*u; momentum: u; none: d)
// Fused (default): the blocks batched by group, shape and step, their factor
// products, eigendecompositions and preconditioning batched products; the
// elementwise parts on the multi-tensor engine (kernels/shampoo.h). Sharded,
// each rank holds whole tensors, as Muon and SOAP.
#pragma once

#include "../kernels/shampoo.h"
#include "layerwise_optimizer.h"

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace bigbatch::optim {

struct ShampooOptions : public torch::optim::OptimizerCloneableOptions<ShampooOptions> {
  ShampooOptions(double lr = 1e-2);  // NOLINT(google-explicit-constructor): as LibTorch
  TORCH_ARG(double, lr) = 1e-2;
  typedef std::tuple<double, double> betas_t;
  /// (b1, b2): the filtered gradient's rate (0: none) and the factors' (1: a sum).
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 1.0);
  /// Added to each factor's eigenvalues before the inverse root.
  TORCH_ARG(double, epsilon) = 1e-12;
  /// Heavy-ball momentum on the grafted direction (0: none).
  TORCH_ARG(double, momentum) = 0;
  TORCH_ARG(double, dampening) = 0;
  TORCH_ARG(double, weight_decay) = 0;
  /// The longest side of a block (a longer dimension is cut).
  TORCH_ARG(int64_t, max_preconditioner_dim) = 1024;
  /// Steps between recomputations of the inverse roots (at multiples of it
  /// after the start step, and at the start step).
  TORCH_ARG(int64_t, precondition_frequency) = 1;
  /// The first step that uses the preconditioner (before it: the graft's
  /// direction); -1: precondition_frequency. At least precondition_frequency.
  TORCH_ARG(int64_t, start_preconditioning_step) = -1;
  /// The root r of the inverse roots; 0: twice the block's order.
  TORCH_ARG(int64_t, inv_root_override) = 0;
  TORCH_ARG(bool, use_nesterov) = false;
  /// Divides the filtered gradient by 1-b1^t and the factors by 1-b2^t.
  TORCH_ARG(bool, use_bias_correction) = true;
  /// true: d = S + wd*W after preconditioning; false: g = grad + wd*W.
  TORCH_ARG(bool, use_decoupled_weight_decay) = true;
  /// Whose update norm each block takes: "adam", "rmsprop", "adagrad", "sgd"
  /// or "none" (the preconditioned direction as it is).
  TORCH_ARG(std::string, grafting) = "adam";
  /// The graft's second-moment rate (Adam and RMSprop).
  TORCH_ARG(double, grafting_beta2) = 0.999;
  TORCH_ARG(double, grafting_epsilon) = 1e-10;
  /// Drop dimensions of size 1 and merge adjacent ones, from the last, while
  /// their product stays within max_preconditioner_dim (a matrix of at most
  /// that many numbers becomes a vector with one factor).
  TORCH_ARG(bool, use_merge_dims) = true;
  /// Precondition 1-D (and 0-D) parameters too; false: the graft's direction.
  TORCH_ARG(bool, precondition_1d) = true;
  /// No effect (no trust ratio); kept so all optimizers share group helpers.
  TORCH_ARG(bool, adapt) = true;
  /// A step with an inf/NaN gradient in a group that asks changes nothing and
  /// is counted in skipped_steps().
  TORCH_ARG(bool, skip_nonfinite) = true;
  /// true: batched products and the engine; false: the reference path, one
  /// block at a time in plain ATen ops.
  TORCH_ARG(bool, fused) = true;
  /// Keep an fp32 copy of bf16/fp16 parameters in the state.
  TORCH_ARG(bool, master_weights) = false;

 public:
  /// Throws an OptionError naming the first invalid option and its value.
  void validate() const;
  /// start_preconditioning_step with -1 resolved.
  std::int64_t start_step() const;
  double get_lr() const override { return lr(); }
  void set_lr(const double new_lr) override { lr(new_lr); }
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const ShampooOptions& lhs, const ShampooOptions& rhs);
  ~ShampooOptions() override = default;

 private:
  template <typename Self>
  static auto fields(Self& self);
};

struct ShampooParamState : public torch::optim::OptimizerCloneableParamState<ShampooParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, exp_avg);          ///< the filtered gradient m (betas[0] > 0), fp32
  TORCH_ARG(torch::Tensor, grafting_sq);      ///< the graft's v (Adam, RMSprop, AdaGrad), fp32
  TORCH_ARG(torch::Tensor, momentum_buffer);  ///< u (momentum > 0), fp32
  /// The factors L_d of every block, each s x s row-major, block after block
  /// (fp32, 1-D; shampoo_layout()).
  TORCH_ARG(torch::Tensor, factors);
  TORCH_ARG(torch::Tensor, inverse_roots);  ///< the R_d, packed as the factors
  TORCH_ARG(torch::Tensor, master);         ///< fp32 copy of a 16-bit parameter (master_weights)

 public:
  static ShampooParamState fresh(const at::Tensor& param);
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  std::int64_t tensor_bytes() const;
  NamedState named() const;
  void set_named(const NamedState& values);
  static std::vector<StateField> declared();
  friend bool operator==(const ShampooParamState& lhs, const ShampooParamState& rhs);
  ~ShampooParamState() override = default;

 private:
  template <typename Self>
  static auto fields(Self& self);
};

/// One block of a parameter: where it starts and its size along each
/// dimension of the merged shape, and where each of its factors starts in
/// the packed factors.
struct ShampooBlock {
  std::vector<std::int64_t> start, size, offset;
};

/// How Shampoo sees a parameter: its merged shape and its blocks (none: the
/// parameter takes the graft's direction alone).
struct ShampooLayout {
  std::vector<std::int64_t> shape;
  std::vector<ShampooBlock> blocks;
  std::int64_t packed = 0;  ///< the sum of s^2 over every factor of every block
};
ShampooLayout shampoo_layout(const at::Tensor& param, const ShampooOptions& options);

/// The graft pass's group of `options` at step t (kernels/shampoo.h; its bias
/// corrections depend on t).
kernels::ShampooGraftGroup kernel_group(const ShampooOptions& options, std::int64_t t = 1);
/// The apply pass's group of `options`.
kernels::ShampooApplyGroup apply_group(const ShampooOptions& options);

/// A parameter and the norm of its graft's direction at its last step (the
/// size of step the graft lends Shampoo's direction, before lr).
struct GraftingNorm {
  at::Tensor param;
  double norm = 0;
};

class ShampooFusedState;  // the engines of the fused step (shampoo.cpp)

/// Shampoo as a drop-in torch::optim::Optimizer.
class Shampoo : public LayerwiseOptimizer<ShampooOptions, ShampooParamState> {
 public:
  explicit Shampoo(std::vector<torch::optim::OptimizerParamGroup> param_groups, ShampooOptions defaults = {});
  explicit Shampoo(std::vector<torch::Tensor> params, ShampooOptions defaults = {});
  ~Shampoo() override;

  torch::Tensor step(LossClosure closure = nullptr) override;

  /// Sharded, each rank holds whole tensors (its blocks' factors are of whole
  /// dimensions), and a sharding that cuts one is refused; the skip decision
  /// spans the ranks. Null ends it.
  void shard(std::shared_ptr<const OptimizerSharding> sharding) override;
  bool shards_whole_tensors() const override { return true; }

  /// Each stepped parameter's grafting norm (above); waits for the device.
  std::vector<GraftingNorm> grafting_norms() const;

  /// The grafting norms as "shampoo_grafting_norm".
  std::vector<ParamScalar> scalars() const override;

 protected:
  void step_reference(const std::vector<Group>& groups) override;

 private:
  /// The states of the parameters taking their first step, made; a state
  /// that does not fit its parameter and options refused.
  void start(const std::vector<Group>& groups);
  bool step_fused(const std::vector<Group>& groups);
  std::unordered_map<const void*, at::Tensor> graft_norms_;  // by the parameter's TensorImpl: ||D||^2, on the device
  std::unique_ptr<ShampooFusedState> fused_;
  std::shared_ptr<const OptimizerSharding> sharding_;
};

}  // namespace bigbatch::optim
