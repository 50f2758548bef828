// Muon (muon.h): options, state, the reference path in plain ATen ops (one
// matrix at a time), and the fused step: the momentum pass on the engine,
// the Newton-Schulz iteration as batched products (one batch per group and
// matrix shape, held in fp32 buffers the passes write and read in place),
// the apply pass on the engine; the AdamW groups on LAMB's plan.
#include "muon.h"

#include "internal.h"
#include "layerwise_optimizer_impl.h"

#include <torch/nn/modules/embedding.h>

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>

namespace bigbatch::optim {

// The AdamW groups' state as LAMB's plan takes it (exp_avg, exp_avg_sq, step);
// declared before anything here instantiates LayerwiseOptimizer.
template <>
struct FusedTraits<MuonOptions> : MomentState<MuonParamState> {
  using Plan = kernels::LambPlan;
  using Optimizer = Muon;
};

MuonOptions::MuonOptions(double lr) : lr_(lr) {}

template <typename Self>
auto MuonOptions::fields(Self& self) {
  using internal::field;
  auto& [lr, weight_decay, orthogonalize, momentum, nesterov, ns_coefficients, ns_steps, eps, adjust_lr,
         ns_bfloat16, adamw_betas, adamw_eps, skip_nonfinite, fused, master_weights] = self;
  return std::make_tuple(field("lr", lr),
                         field("weight_decay", weight_decay),
                         field("orthogonalize", orthogonalize),
                         field("momentum", momentum),
                         field("nesterov", nesterov),
                         field("ns_coefficients", ns_coefficients),
                         field("ns_steps", ns_steps),
                         field("eps", eps),
                         field("adjust_lr", adjust_lr),
                         field("ns_bfloat16", ns_bfloat16),
                         field("adamw_betas", adamw_betas),
                         field("adamw_eps", adamw_eps),
                         field("skip_nonfinite", skip_nonfinite),
                         field("fused", fused),
                         field("master_weights", master_weights));
}
BIGBATCH_DEFINE_FIELD_IO(MuonOptions)

template <typename Self>
auto MuonParamState::fields(Self& self) {
  using internal::field;
  auto& [step, momentum_buffer, exp_avg, exp_avg_sq, master] = self;
  return std::make_tuple(field("step", step),
                         field("momentum_buffer", momentum_buffer),
                         field("exp_avg", exp_avg),
                         field("exp_avg_sq", exp_avg_sq),
                         field("master", master));
}
BIGBATCH_DEFINE_FIELD_IO(MuonParamState)
BIGBATCH_DEFINE_STATE_ACCESS(MuonParamState)

namespace {

const char* const kAdjustRules[] = {"original", "match_rms_adamw", "spectral_unclamped"};

}  // namespace

void MuonOptions::validate() const {
  using namespace internal;
  check_nonnegative("Muon", "lr", lr());
  check_nonnegative("Muon", "weight_decay", weight_decay());
  check_option(momentum() >= 0 && momentum() < 1, "Muon", "momentum", momentum(), "in [0, 1)");
  check_option(ns_steps() >= 1 && ns_steps() < 100, "Muon", "ns_steps", ns_steps(), "in [1, 99]");
  const auto [a, b, c] = ns_coefficients();
  check_option(std::isfinite(a) && std::isfinite(b) && std::isfinite(c), "Muon", "ns_coefficients",
               std::to_string(a) + ", " + std::to_string(b) + ", " + std::to_string(c), "finite");
  check_option(eps() > 0, "Muon", "eps", eps(), "> 0");
  bool known = false;
  for (const char* rule : kAdjustRules) known = known || adjust_lr() == rule;
  check_option(known, "Muon", "adjust_lr", "\"" + adjust_lr() + "\"",
               "\"original\", \"match_rms_adamw\" or \"spectral_unclamped\"");
  const auto [b1, b2] = adamw_betas();
  check_option(b1 >= 0 && b1 < 1, "Muon", "adamw_betas[0]", b1, "in [0, 1)");
  check_option(b2 >= 0 && b2 < 1, "Muon", "adamw_betas[1]", b2, "in [0, 1)");
  check_nonnegative("Muon", "adamw_eps", adamw_eps());
}

MuonParamState MuonParamState::fresh(const at::Tensor&) { return {}; }

std::tuple<std::int64_t, std::int64_t> muon_matrix_shape(const at::Tensor& param) {
  const std::int64_t rows = param.dim() >= 1 ? param.size(0) : 1;
  return {rows, rows == 0 ? 0 : param.numel() / rows};
}

double muon_scale(const std::string& rule, std::int64_t rows, std::int64_t cols) {
  const double r = static_cast<double>(rows), c = static_cast<double>(cols);
  if (rule == "match_rms_adamw") return 0.2 * std::sqrt(std::max(r, c));
  if (rule == "spectral_unclamped") return std::sqrt(r / c);
  return std::sqrt(std::max(1.0, r / c));  // "original"
}

void newton_schulz_(at::Tensor& batch, const MuonOptions& o) {
  TORCH_CHECK(batch.dim() == 3 && batch.scalar_type() == at::kFloat, "Muon: the iteration takes a (k, rows, cols) "
              "fp32 batch, got ", batch.sizes(), " ", batch.scalar_type());
  if (batch.numel() == 0) return;
  const auto [a, b, c] = o.ns_coefficients();
  const bool tall = batch.size(1) > batch.size(2);
  at::Tensor x = o.ns_bfloat16() ? batch.to(at::kBFloat16) : batch;
  if (tall) x = x.transpose(1, 2);  // X X^T is then the smaller Gram matrix
  // Each matrix's spectral norm at most 1 (the Frobenius norm bounds it).
  x = x / at::norm(x, 2, {1, 2}, /*keepdim=*/true).clamp_min(o.eps());
  for (std::int64_t k = 0; k < o.ns_steps(); ++k) {
    const at::Tensor gram = at::bmm(x, x.transpose(1, 2));             // A = X X^T
    const at::Tensor poly = at::baddbmm(gram, gram, gram, b, c);        // B = b*A + c*A A
    x = at::baddbmm(x, poly, x, a);                                     // X = a*X + B X
  }
  batch.copy_(tall ? x.transpose(1, 2) : x);
}

// ------------------------------------------------------------ the groups ----

kernels::LambGroup kernel_group(const MuonOptions& o) {
  kernels::LambGroup g;  // AdamW: LAMB without trust ratio, decoupled decay, bias correction
  g.lr = o.lr();
  std::tie(g.beta1, g.beta2) = o.adamw_betas();
  g.eps = o.adamw_eps();
  g.weight_decay = o.weight_decay();
  g.max_grad_norm = 0;
  g.min_trust = 0;
  g.max_trust = std::numeric_limits<double>::infinity();
  g.bias_correction = true;
  g.grad_averaging = true;
  g.adam_w_mode = true;
  g.always_adapt = false;
  g.trust_clip = false;
  g.adapt = false;
  g.skip_nonfinite = false;  // Muon::step decides the skip for every group first
  return g;
}

Muon::Muon(std::vector<torch::optim::OptimizerParamGroup> param_groups, MuonOptions defaults)
    : LayerwiseOptimizer(std::move(param_groups), defaults, "Muon") {
  check_matrices(0);
}

Muon::Muon(std::vector<torch::Tensor> params, MuonOptions defaults)
    : Muon({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

Muon::~Muon() = default;

void Muon::add_param_group(const torch::optim::OptimizerParamGroup& group) {
  const std::size_t first = param_groups_.size();
  LayerwiseOptimizer::add_param_group(group);
  try {
    check_matrices(first);
  } catch (...) {
    param_groups_.pop_back();
    throw;
  }
}

void Muon::check_matrices(std::size_t first_group) const {
  for (std::size_t i = first_group; i < param_groups_.size(); ++i) {
    const auto& o = static_cast<const MuonOptions&>(param_groups_[i].options());
    if (!o.orthogonalize()) continue;
    const auto& params = param_groups_[i].params();
    for (std::size_t j = 0; j < params.size(); ++j) {
      TORCH_CHECK(params[j].dim() >= 2, "Muon: parameter ", j, " of group ", i, " has shape ", params[j].sizes(),
                  " (", params[j].dim(), "-D), but the group has orthogonalize(true), which takes matrices (2-D, "
                  "or convolution weights flattened to (out, in*kh*kw)); give it a group with orthogonalize(false) "
                  "(AdamW), as muon_param_groups() does");
    }
  }
}

// ------------------------------------------------------------ reference ----

// The formulas of muon.h in ATen ops, one matrix at a time; AdamW as
// torch.optim.AdamW writes it.
void Muon::step_reference(const std::vector<Group>& groups) {
  reference_rms_.clear();
  for (const Group& group : groups) {
    const MuonOptions& o = *group.options;
    for (const auto& pg : group.params) {
      auto& st = state_of(pg.param);
      at::Tensor w = fp32_weights(o, pg.param);  // the parameter itself when it is fp32
      const at::Tensor g = pg.grad.to(at::kFloat);
      if (!o.orthogonalize()) {  // AdamW
        if (!st.exp_avg().defined()) {
          st.exp_avg(fp32_zeros_like(pg.param));
          st.exp_avg_sq(fp32_zeros_like(pg.param));
        }
        st.step(st.step() + 1);
        const auto t = static_cast<double>(st.step());
        const auto [b1, b2] = o.adamw_betas();
        auto& m = st.exp_avg();
        auto& v = st.exp_avg_sq();
        m.mul_(b1).add_(g * (1 - b1));
        v.mul_(b2).add_(g * g * (1 - b2));
        const at::Tensor u = (m / (1 - std::pow(b1, t))) / ((v / (1 - std::pow(b2, t))).sqrt() + o.adamw_eps()) +
                             o.weight_decay() * w;
        w.sub_(u * o.lr());
      } else {
        if (!st.momentum_buffer().defined()) st.momentum_buffer(fp32_contiguous_zeros_like(pg.param));
        const auto [rows, cols] = muon_matrix_shape(pg.param);
        const double mu = o.momentum();
        auto& m = st.momentum_buffer();
        m.mul_(mu).add_(g * (1 - mu));                                     // m = mu*m + (1-mu)*g
        at::Tensor u = o.nesterov() ? m * mu + g * (1 - mu) : m.clone();  // U
        // The iteration on this one matrix: X = U / max(||U||, eps), then
        // X = a*X + (b*A + c*A^2) X with A = X X^T, on the wide orientation.
        const auto [a, b, c] = o.ns_coefficients();
        at::Tensor x = u.reshape({rows, cols});
        if (o.ns_bfloat16()) x = x.to(at::kBFloat16);
        if (rows > cols) x = x.t();
        x = x / x.norm().clamp_min(o.eps());
        for (std::int64_t k = 0; k < o.ns_steps(); ++k) {
          const at::Tensor gram = x.mm(x.t());
          x = x * a + (gram * b + gram.mm(gram) * c).mm(x);
        }
        if (rows > cols) x = x.t();
        const at::Tensor orth = x.to(at::kFloat).reshape(pg.param.sizes());
        const double scale = o.lr() * muon_scale(o.adjust_lr(), rows, cols);
        w.mul_(1 - o.lr() * o.weight_decay());  // decoupled decay, the unadjusted rate
        w.sub_(orth * scale);
        reference_rms_.push_back({pg.param, scale * internal::norm_of(orth) / std::sqrt(double(pg.param.numel()))});
      }
      if (!w.is_same(pg.param)) pg.param.copy_(w);
    }
  }
}

// ------------------------------------------------------------ fused step ----

/// The fused step's engines and batches, rebuilt when the matrices change.
class MuonFusedState {
 public:
  struct Batch {
    std::int64_t group;  // index in the step's Muon groups
    std::int64_t rows, cols;
    at::Tensor buffer;   // (k, rows, cols) fp32: U, then O
    double scale = 0;    // lr * the shape's rule, this step
  };
  struct Matrix {
    at::Tensor param;
    std::size_t batch;
    std::int64_t index;  // in the batch
  };
  at::Device device{at::kCPU};
  bool cuda = false;
  std::vector<Batch> batches;
  std::vector<Matrix> matrices;  // in step order
  std::unique_ptr<kernels::MultiTensorStep<kernels::MuonMomentumPlan>> momentum;
  std::unique_ptr<kernels::MultiTensorStep<kernels::MuonApplyPlan>> apply;
};

namespace {

using FusedKey = std::vector<std::tuple<std::int64_t, at::Tensor, at::Tensor>>;  // (group, param, grad), in step order

// The matrices with a gradient, in step order (their device: why_not_fused).
template <typename Groups>
FusedKey fused_key(const Groups& groups) {
  FusedKey key;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    for (const auto& pg : groups[i].params) key.emplace_back(static_cast<std::int64_t>(i), pg.param, pg.grad);
  }
  return key;
}

// Whether `f` holds the batches of exactly these matrices, on this device.
bool same_batches(const MuonFusedState* f, const FusedKey& key, at::Device device, bool cuda) {
  bool same = f != nullptr && f->cuda == cuda && f->device == device && f->matrices.size() == key.size();
  for (std::size_t k = 0; same && k < key.size(); ++k) {
    const auto& mat = f->matrices[k];
    same = mat.param.is_same(std::get<1>(key[k])) && f->batches[mat.batch].group == std::get<0>(key[k]);
  }
  return same;
}

// The batches of `key`: one per (group, rows, cols), and the two engines.
std::unique_ptr<MuonFusedState> fused_batches(const FusedKey& key, at::Device device, bool cuda) {
  auto fresh = std::make_unique<MuonFusedState>();
  fresh->device = device;
  fresh->cuda = cuda;
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, std::size_t> index;
  std::vector<std::int64_t> counts;
  for (const auto& [group, param, grad] : key) {
    const auto [rows, cols] = muon_matrix_shape(param);
    const auto it = index.emplace(std::make_tuple(group, rows, cols), fresh->batches.size()).first;
    if (it->second == fresh->batches.size()) {
      fresh->batches.push_back({group, rows, cols, {}, 0});
      counts.push_back(0);
    }
    fresh->matrices.push_back({param, it->second, counts[it->second]++});
  }
  for (std::size_t b = 0; b < fresh->batches.size(); ++b) {
    auto& batch = fresh->batches[b];
    batch.buffer = at::empty({counts[b], batch.rows, batch.cols}, at::TensorOptions(device).dtype(at::kFloat));
  }
  rethrow_as_torch_error("Muon", [&] {
    fresh->momentum = make_engine_step<kernels::MuonMomentumPlan>(cuda);
    fresh->apply = make_engine_step<kernels::MuonApplyPlan>(cuda);
  });
  return fresh;
}

// The iteration, one batched product chain per batch, and the apply pass's
// kernel groups: one per batch (its decay and scale).
template <typename Groups>
std::vector<kernels::MuonApplyGroup> orthogonalize(MuonFusedState& f, const Groups& groups) {
  std::vector<kernels::MuonApplyGroup> apply_groups;
  for (auto& batch : f.batches) {
    const MuonOptions& o = *groups[static_cast<std::size_t>(batch.group)].options;
    newton_schulz_(batch.buffer, o);
    batch.scale = o.lr() * muon_scale(o.adjust_lr(), batch.rows, batch.cols);
  }
  for (const auto& batch : f.batches) {
    const MuonOptions& o = *groups[static_cast<std::size_t>(batch.group)].options;
    apply_groups.push_back({1 - o.lr() * o.weight_decay(), batch.scale, false});
  }
  return apply_groups;
}

// The momentum pass's slots as the apply pass's: each reads its direction O
// from its batch buffer, in its batch's group.
void retarget_for_apply(const MuonFusedState& f, std::vector<kernels::TensorSlot>& slots,
                        const std::vector<at::Tensor>& masters) {
  for (std::size_t k = 0; k < slots.size(); ++k) {
    const auto& mat = f.matrices[k];
    float* direction = slots[k].v;
    slots[k].m = direction;  // O
    slots[k].v = nullptr;
    slots[k].grad = direction;  // not read
    slots[k].master = masters[k].defined() ? masters[k].data_ptr<float>() : nullptr;
    slots[k].group = static_cast<std::int32_t>(mat.batch);
  }
}

}  // namespace

bool Muon::step_fused(const std::vector<Group>& groups) {
  std::optional<at::Device> device;
  if (!whole_tensor_fused(groups, device)) return false;
  const FusedKey key = fused_key(groups);
  if (!device) {  // no matrix has a gradient: nothing to step, and no update RMS to report
    fused_.reset();
    return true;
  }
  const bool cuda = runner_for(*device) == Runner::kCuda;
  const DeviceGuard guard(*device);
  // The batches are kept while the same matrices step.
  if (!same_batches(fused_.get(), key, *device, cuda)) fused_ = fused_batches(key, *device, cuda);
  MuonFusedState& f = *fused_;

  // The momentum pass: m and U (into the batch buffers).
  std::vector<kernels::MuonMomentumGroup> momentum_groups;
  for (const Group& g : groups) momentum_groups.push_back({g.options->momentum(), g.options->nesterov(), false});
  std::vector<kernels::TensorSlot> slots;
  std::vector<at::Tensor> masters;  // per matrix, or undefined
  for (std::size_t k = 0; k < key.size(); ++k) {
    const auto& [group, param, grad] = key[k];
    const MuonOptions& o = *groups[static_cast<std::size_t>(group)].options;
    auto& st = state_of(param);
    if (!st.momentum_buffer().defined()) st.momentum_buffer(fp32_contiguous_zeros_like(param));
    masters.push_back(uses_master(o, param) ? fp32_weights(o, param) : at::Tensor());
    const auto& mat = f.matrices[k];
    kernels::TensorSlot slot;
    slot.param = param.data_ptr();
    slot.grad = grad.data_ptr();
    slot.m = st.momentum_buffer().data_ptr<float>();
    slot.v = f.batches[mat.batch].buffer[mat.index].data_ptr<float>();
    slot.numel = param.numel();
    slot.group = static_cast<std::int32_t>(group);
    slot.dtype = kernel_dtype(param);
    slots.push_back(slot);
  }
  const cudaStream_t stream = current_stream(*device);
  rethrow_as_torch_error("Muon", [&] {
    f.momentum->bind(slots, momentum_groups, stream);
    f.momentum->run(stream);
  });

  const std::vector<kernels::MuonApplyGroup> apply_groups = orthogonalize(f, groups);
  retarget_for_apply(f, slots, masters);
  rethrow_as_torch_error("Muon", [&] {
    f.apply->bind(slots, apply_groups, stream);
    f.apply->run(stream);
  });
  return true;
}

// ------------------------------------------------------------ the step ----

template class LayerwiseOptimizer<MuonOptions, MuonParamState>;

void Muon::shard(std::shared_ptr<const OptimizerSharding> sharding) {
  if (sharding != nullptr) check_whole_tensors(param_groups_, *sharding, "Muon", "matrices");
  sharding_ = std::move(sharding);  // the engine itself runs each rank's whole tensors unsharded
}

torch::Tensor Muon::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  const torch::Tensor loss = run_closure(closure);
  const auto groups = gather();
  fused_ran_ = false;
  reference_rms_.clear();
  // The non-finite check for every group that asks, before anything changes.
  const std::vector<bool> finite = finite_whole_tensors(groups, param_groups_, sharding_.get());
  if (skip_nonfinite(groups, finite)) return loss;

  std::vector<Group> orthogonal, adamw;
  for (const Group& g : groups) (g.options->orthogonalize() ? orthogonal : adamw).push_back(g);
  // AdamW's state before the engine binds it (MuonParamState::fresh is empty).
  for (const Group& g : adamw) {
    for (const auto& pg : g.params) {
      auto& st = state_of(pg.param);
      if (!st.exp_avg().defined()) {
        st.exp_avg(fp32_zeros_like(pg.param));
        st.exp_avg_sq(fp32_zeros_like(pg.param));
      }
    }
  }
  if (step_fused(orthogonal)) {
    fused_ran_ = true;
  } else {
    fused_.reset();
    step_reference(orthogonal);
  }
  if (!adamw.empty() && !step_engine(adamw)) {
    const auto rms = reference_rms_;
    step_reference(adamw);
    reference_rms_ = rms;
  }
  return loss;
}

std::vector<ParamScalar> Muon::scalars() const {
  std::vector<ParamScalar> out = LayerwiseOptimizerBase::scalars();
  for (const auto& r : update_rms()) out.push_back({"muon_update_rms", r.param, r.rms});
  return out;
}

std::vector<UpdateRms> Muon::update_rms() const {
  if (!fused_ran_ || !fused_) return reference_rms_;
  const DeviceGuard guard(fused_->device);
  std::vector<at::Tensor> norms;
  for (const auto& batch : fused_->batches) norms.push_back(at::norm(batch.buffer, 2, {1, 2}).to(at::kDouble).cpu());
  std::vector<UpdateRms> out;
  for (const auto& mat : fused_->matrices) {
    const auto& batch = fused_->batches[mat.batch];
    const double norm = norms[mat.batch].data_ptr<double>()[mat.index];
    out.push_back({mat.param, batch.scale * norm / std::sqrt(static_cast<double>(mat.param.numel()))});
  }
  return out;
}

// ------------------------------------------------------------ the groups ----

ParamRule muon_adamw_rule(const torch::nn::Module& module) {
  std::set<const void*> aside;
  std::vector<const torch::nn::Module*> owners;
  const auto note = [&](const torch::nn::Module& m) {
    if (const auto* e = dynamic_cast<const torch::nn::EmbeddingImpl*>(&m)) aside.insert(e->weight.unsafeGetTensorImpl());
    if (!m.parameters(/*recurse=*/false).empty()) owners.push_back(&m);
  };
  note(module);  // itself first, then its modules depth first in registration order
  for (const auto& m : module.modules(/*include_self=*/false)) note(*m);
  if (!owners.empty()) {
    for (const torch::nn::Module* m : {owners.front(), owners.back()}) {
      for (const auto& p : m->parameters(/*recurse=*/false)) aside.insert(p.unsafeGetTensorImpl());
    }
  }
  return [aside = std::move(aside)](const std::string&, const at::Tensor& p) {
    return aside.count(p.unsafeGetTensorImpl()) > 0;
  };
}

std::vector<torch::optim::OptimizerParamGroup> muon_param_groups(const torch::nn::Module& module,
                                                                 const MuonOptions& options, const ParamRule& adamw,
                                                                 const ParamRule& plain) {
  const ParamRule to_adamw = adamw ? adamw : muon_adamw_rule(module);
  std::vector<at::Tensor> hidden, matrices, others;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!p.requires_grad()) continue;
    if (p.dim() < 2 || (plain && plain(item.key(), p))) {
      others.push_back(p);
    } else {
      (to_adamw(item.key(), p) ? matrices : hidden).push_back(p);
    }
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!hidden.empty()) groups.emplace_back(hidden, std::make_unique<MuonOptions>(options));
  if (!matrices.empty()) {
    auto o = std::make_unique<MuonOptions>(options);
    o->orthogonalize(false);
    groups.emplace_back(matrices, std::move(o));
  }
  if (!others.empty()) {
    auto o = std::make_unique<MuonOptions>(options);
    o->orthogonalize(false).weight_decay(0);
    groups.emplace_back(others, std::move(o));
  }
  return groups;
}

}  // namespace bigbatch::optim
