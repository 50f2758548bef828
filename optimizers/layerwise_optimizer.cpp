// The machinery of LayerwiseOptimizer (layerwise_optimizer.h), instantiated
// once for each of the four optimizers at the bottom of this file.
#include <bigbatch/optimizers/layerwise_optimizer.h>

#include <bigbatch/optimizers/lamb.h>
#include <bigbatch/optimizers/larc.h>
#include <bigbatch/optimizers/lars.h>
#include <bigbatch/optimizers/novograd.h>

#include <bigbatch/optimizers/internal.h>

#include <algorithm>
#include <cmath>

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

at::Tensor fp32_zeros_like(const at::Tensor& param) {
  return at::zeros_like(param, param.options().dtype(at::kFloat));
}

template <typename Options, typename ParamState>
LayerwiseOptimizer<Options, ParamState>::LayerwiseOptimizer(
    std::vector<torch::optim::OptimizerParamGroup> groups, const Options& defaults,
    const char* name)
    : torch::optim::Optimizer(std::vector<torch::optim::OptimizerParamGroup>{},
                              std::make_unique<Options>(defaults)),
      name_(name) {
  defaults.validate();
  for (const auto& group : groups) add_param_group(group);
}

template <typename Options, typename ParamState>
void LayerwiseOptimizer<Options, ParamState>::add_param_group(
    const torch::optim::OptimizerParamGroup& group) {
  if (group.has_options()) {
    const auto* own = dynamic_cast<const Options*>(&group.options());
    TORCH_CHECK(own != nullptr, name_, ": the options of parameter group ", param_groups_.size(),
                " are not ", name_, "Options");
    own->validate();
  }
  for (const auto& p : group.params()) {
    TORCH_CHECK(p.is_floating_point(), name_, ": parameter group ", param_groups_.size(),
                " holds a tensor of dtype ", p.scalar_type(), "; only floating point tensors can be optimized");
  }
  torch::optim::Optimizer::add_param_group(group);
  if (group.has_options()) param_groups_.back().set_options(group.options().clone());
}

template <typename Options, typename ParamState>
std::int64_t LayerwiseOptimizer<Options, ParamState>::skipped_steps() const {
  return skipped_steps_ + engine_skipped_steps();
}

template <typename Options, typename ParamState>
const ParamState* LayerwiseOptimizer<Options, ParamState>::param_state(
    const at::Tensor& param) const {
  sync_engine_state();
  return find_state(param);
}

template <typename Options, typename ParamState>
ParamState* LayerwiseOptimizer<Options, ParamState>::find_state(const at::Tensor& param) const {
  const auto it = state_.find(compat::optimizer_state_key(param));
  return it == state_.end() ? nullptr : static_cast<ParamState*>(it->second.get());
}

template <typename Options, typename ParamState>
auto LayerwiseOptimizer<Options, ParamState>::gather() -> std::vector<Group> {
  created_in_norm_pass_.clear();
  in_norm_pass_ = true;
  std::vector<Group> groups;
  groups.reserve(param_groups_.size());
  for (std::size_t i = 0; i < param_groups_.size(); ++i) {
    Group group{&static_cast<const Options&>(param_groups_[i].options()), {}};
    const auto& params = param_groups_[i].params();
    for (std::size_t j = 0; j < params.size(); ++j) {
      const auto& p = params[j];
      const auto& g = p.grad();
      if (!g.defined()) continue;  // no gradient: no update, no state
      TORCH_CHECK(!g.is_sparse(), name_, " does not support sparse gradients (group ", i,
                  ", parameter ", j, ")");
      TORCH_CHECK(g.scalar_type() == p.scalar_type() && g.device() == p.device(), name_,
                  ": the gradient of group ", i, ", parameter ", j, " is ", g.scalar_type(), " on ",
                  g.device(), " but the parameter is ", p.scalar_type(), " on ", p.device());
      kernel_dtype(p);  // rejects unsupported dtypes with a clear message
      group.params.push_back({p, g.contiguous()});
    }
    groups.push_back(std::move(group));
  }
  return groups;
}

template <typename Options, typename ParamState>
ParamState& LayerwiseOptimizer<Options, ParamState>::state_of(const at::Tensor& param) {
  auto key = compat::optimizer_state_key(param);
  auto it = state_.find(key);
  if (it == state_.end()) {
    it = state_.emplace(key, std::make_unique<ParamState>(ParamState::fresh(param))).first;
    if (in_norm_pass_) created_in_norm_pass_.push_back(std::move(key));
  }
  return static_cast<ParamState&>(*it->second);
}

template <typename Options, typename ParamState>
bool LayerwiseOptimizer<Options, ParamState>::skip_nonfinite(const std::vector<Group>& groups,
                                                             const std::vector<bool>& finite) {
  bool skip = false;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    skip = skip || (groups[i].options->skip_nonfinite() && !finite[i]);
  }
  if (skip) {
    for (const auto& key : created_in_norm_pass_) state_.erase(key);
    ++skipped_steps_;
  }
  created_in_norm_pass_.clear();
  in_norm_pass_ = false;
  return skip;
}

template <typename Options, typename ParamState>
torch::Tensor LayerwiseOptimizer<Options, ParamState>::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  const torch::Tensor loss = run_closure(closure);
  const auto groups = gather();
  if (!step_engine(groups)) step_reference(groups);
  return loss;
}

template <typename Options, typename ParamState>
bool LayerwiseOptimizer<Options, ParamState>::reference_norms(const std::vector<Group>& groups, bool with_weight,
                                                              std::vector<std::vector<TensorNorms>>& norms) {
  std::vector<bool> finite(groups.size(), true);
  norms.assign(groups.size(), {});
  for (std::size_t i = 0; i < groups.size(); ++i) {
    for (const auto& pg : groups[i].params) {
      TensorNorms n;
      n.g_norm = internal::norm_of(pg.grad);
      n.w_norm = with_weight ? internal::norm_of(fp32_weights(*groups[i].options, pg.param)) : 0.0;
      n.finite = internal::all_finite(pg.grad);
      finite[i] = finite[i] && n.finite;
      norms[i].push_back(n);
    }
  }
  return !skip_nonfinite(groups, finite);
}

template <typename Options, typename ParamState>
void LayerwiseOptimizer<Options, ParamState>::save(torch::serialize::OutputArchive& archive) const {
  sync_engine_state();
  torch::optim::serialize<ParamState, Options>(archive, *this);
  archive.write("bigbatch/skipped_steps", at::scalar_tensor(skipped_steps(), at::kLong));
}

template <typename Options, typename ParamState>
void LayerwiseOptimizer<Options, ParamState>::load(torch::serialize::InputArchive& archive) {
  skipped_steps_ = skipped_steps();  // kept if the archive has no count
  torch::optim::serialize<ParamState, Options>(archive, *this);
  engine_.reset();  // the loaded states replace what the engine held; the next step rebuilds
  at::Tensor skipped;
  if (archive.try_read("bigbatch/skipped_steps", skipped)) skipped_steps_ = skipped.item<std::int64_t>();
}

template class LayerwiseOptimizer<LARSOptions, LARSParamState>;
template class LayerwiseOptimizer<LARCOptions, LARCParamState>;
template class LayerwiseOptimizer<LAMBOptions, LAMBParamState>;
template class LayerwiseOptimizer<NovoGradOptions, NovoGradParamState>;

}  // namespace bigbatch::optim
