// SOAP (soap.h): options, state, the first step that builds the factors, the
// reference path in plain ATen ops (one parameter at a time, the rotations as
// the authors write them: tensordot along each dimension), and the fused
// step: the parameters batched by group, rotated shape and step, each
// rotation one batched product per dimension, Adam's part on the engine
// (kernels/soap.h) and the update on Muon's apply pass (kernels/muon.h).
#include "soap.h"

#include "../kernels/muon.h"
#include "internal.h"
#include "kronecker.h"
#include "layerwise_optimizer_impl.h"

#include <ATen/ops/geqrf.h>
#include <ATen/ops/linalg_eigh.h>
#include <ATen/ops/linalg_householder_product.h>
#include <ATen/ops/linalg_qr.h>

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

namespace bigbatch::optim {

using kronecker::outer_along_batch;
using kronecker::rotate_batch;

// The engine path LayerwiseOptimizer would take (SOAP::step never does: its
// step rotates around the engine's pass); declared before anything here
// instantiates LayerwiseOptimizer.
template <>
struct FusedTraits<SOAPOptions> : MomentState<SOAPParamState> {
  using Plan = kernels::SoapAdamPlan;
  using Optimizer = SOAP;
};

SOAPOptions::SOAPOptions(double lr) : lr_(lr) {}

template <typename Self>
auto SOAPOptions::fields(Self& self) {
  using internal::field;
  auto& [lr, betas, shampoo_beta, eps, weight_decay, precondition_frequency, max_precond_dim, merge_dims,
         precondition_1d, normalize_grads, correct_bias, adapt, skip_nonfinite, fused, master_weights] = self;
  return std::make_tuple(field("lr", lr),
                         field("betas", betas),
                         field("shampoo_beta", shampoo_beta),
                         field("eps", eps),
                         field("weight_decay", weight_decay),
                         field("precondition_frequency", precondition_frequency),
                         field("max_precond_dim", max_precond_dim),
                         field("merge_dims", merge_dims),
                         field("precondition_1d", precondition_1d),
                         field("normalize_grads", normalize_grads),
                         field("correct_bias", correct_bias),
                         field("adapt", adapt),
                         field("skip_nonfinite", skip_nonfinite),
                         field("fused", fused),
                         field("master_weights", master_weights));
}
BIGBATCH_DEFINE_FIELD_IO(SOAPOptions)

template <typename Self>
auto SOAPParamState::fields(Self& self) {
  using internal::field;
  using internal::own_shape;
  auto& [step, exp_avg, exp_avg_sq, factors, eigenbases, master] = self;
  return std::make_tuple(field("step", step),
                         field("exp_avg", exp_avg),
                         field("exp_avg_sq", exp_avg_sq),
                         field("factors", factors, own_shape),
                         field("eigenbases", eigenbases, own_shape),
                         field("master", master));
}
BIGBATCH_DEFINE_FIELD_IO(SOAPParamState)
BIGBATCH_DEFINE_STATE_ACCESS(SOAPParamState)

void SOAPOptions::validate() const {
  using namespace internal;
  check_nonnegative("SOAP", "lr", lr());
  check_betas("SOAP", betas());
  check_option(shampoo_beta() < 1, "SOAP", "shampoo_beta", shampoo_beta(), "< 1 (negative: betas[1])");
  check_nonnegative("SOAP", "eps", eps());
  check_nonnegative("SOAP", "weight_decay", weight_decay());
  check_option(precondition_frequency() >= 1, "SOAP", "precondition_frequency", precondition_frequency(), ">= 1");
  check_option(max_precond_dim() >= 1, "SOAP", "max_precond_dim", max_precond_dim(), ">= 1");
}

SOAPParamState SOAPParamState::fresh(const at::Tensor&) { return {}; }

kernels::SoapAdamGroup kernel_group(const SOAPOptions& o) {
  kernels::SoapAdamGroup g;
  std::tie(g.beta1, g.beta2) = o.betas();
  g.eps = o.eps();
  g.skip_nonfinite = false;  // SOAP::step decides the skip for every group first
  return g;
}

// ------------------------------------------------------------ the layout ----

namespace {

// The authors' merge: adjacent dimensions multiplied while the product stays
// within `max`; a dimension above it stands alone.
std::vector<std::int64_t> merged_shape(at::IntArrayRef sizes, std::int64_t max) {
  std::vector<std::int64_t> out;
  std::int64_t current = 1;
  for (const std::int64_t s : sizes) {
    if (current * s > max) {
      if (current > 1) {
        out.push_back(current);
        current = s;
      } else {
        out.push_back(s);
        current = 1;
      }
    } else {
      current *= s;
    }
  }
  if (current > 1 || out.empty()) out.push_back(current);
  return out;
}

double shampoo_rate(const SOAPOptions& o) {
  return o.shampoo_beta() >= 0 ? o.shampoo_beta() : std::get<1>(o.betas());
}

// The step size of step t (lr with Adam's bias correction folded in).
double step_size(const SOAPOptions& o, std::int64_t t) {
  if (!o.correct_bias()) return o.lr();
  const auto [b1, b2] = o.betas();
  const double td = static_cast<double>(t);
  return o.lr() * std::sqrt(1 - std::pow(b2, td)) / (1 - std::pow(b1, td));
}

}  // namespace

SOAPLayout soap_layout(const at::Tensor& param, const SOAPOptions& o) {
  SOAPLayout layout;
  if (param.dim() == 1) {
    layout.shape = {param.size(0)};
  } else if (o.merge_dims()) {
    layout.shape = merged_shape(param.sizes(), o.max_precond_dim());
  } else {
    layout.shape = param.sizes().vec();
  }
  const bool rotate = param.dim() != 1 || o.precondition_1d();
  for (const std::int64_t s : layout.shape) {
    if (rotate && s <= o.max_precond_dim()) {
      layout.offset.push_back(layout.packed);
      layout.packed += s * s;
    } else {
      layout.offset.push_back(-1);
    }
  }
  return layout;
}

namespace {

// Factor or basis d of a packed tensor (1-D, one parameter), as an s x s view.
at::Tensor unpacked(const at::Tensor& packed, const SOAPLayout& layout, std::size_t d) {
  const std::int64_t s = layout.shape[d];
  return packed.reshape({-1}).narrow(0, layout.offset[d], s * s).view({s, s});
}

// L_d's eigenvalues and eigenvectors, largest first, as the authors take
// them (eigh of L + 1e-30 I; in double if that fails to converge in float;
// NaN where the factor is not finite).
std::pair<at::Tensor, at::Tensor> eigen(const at::Tensor& factor) {
  const at::Tensor eye = at::eye(factor.size(-1), factor.options());
  at::Tensor values, vectors;
  try {
    std::tie(values, vectors) = at::linalg_eigh(factor + eye * 1e-30);
  } catch (const c10::Error&) {
    try {
      std::tie(values, vectors) = at::linalg_eigh(factor.to(at::kDouble) + eye.to(at::kDouble) * 1e-30);
      values = values.to(at::kFloat);
      vectors = vectors.to(at::kFloat);
    } catch (const c10::Error&) {
      // A factor of non-finite values (a step taken with skip_nonfinite(false)):
      // its basis is too, and so is every update through it.
      values = at::full({factor.size(-1)}, std::numeric_limits<float>::quiet_NaN(), factor.options());
      vectors = at::full_like(factor, std::numeric_limits<float>::quiet_NaN());
    }
  }
  return {values.flip({-1}), vectors.flip({-1})};
}

// ---- one parameter at a time (the reference path and the first step) ----

// x (the rotated shape) with each dimension that has a basis contracted
// against it: Q_d^T along d forward (into the eigenbasis), Q_d back; a
// dimension without one is carried along. As the authors' tensordot loop,
// which moves each dimension to the end in turn.
at::Tensor rotate(at::Tensor x, const std::vector<at::Tensor>& bases, bool forward) {
  for (const at::Tensor& q : bases) {
    if (q.defined()) {
      x = at::tensordot(x, q, {0}, {forward ? 0 : 1});
    } else {
      std::vector<std::int64_t> order;
      for (std::int64_t i = 1; i < x.dim(); ++i) order.push_back(i);
      order.push_back(0);
      x = x.permute(order);
    }
  }
  return x;
}

// G_(d) G_(d)^T: G unfolded along d times its transpose.
at::Tensor outer_along(const at::Tensor& g, std::int64_t d) {
  std::vector<std::int64_t> others;
  for (std::int64_t i = 0; i < g.dim(); ++i) {
    if (i != d) others.push_back(i);
  }
  return at::tensordot(g, g, others, others);
}

std::vector<at::Tensor> bases_of(const SOAPParamState& st, const SOAPLayout& layout) {
  std::vector<at::Tensor> bases;
  for (std::size_t d = 0; d < layout.shape.size(); ++d) {
    bases.push_back(layout.offset[d] >= 0 ? unpacked(st.eigenbases(), layout, d) : at::Tensor());
  }
  return bases;
}

// The Q of each matrix's QR decomposition (Householder, as linalg_qr's,
// without forming R).
at::Tensor q_factor(const at::Tensor& a) {
  const auto [reflectors, tau] = at::geqrf(a);
  return at::linalg_householder_product(reflectors, tau);
}

}  // namespace

// ------------------------------------------------------------ the optimizer ----

SOAP::SOAP(std::vector<torch::optim::OptimizerParamGroup> param_groups, SOAPOptions defaults)
    : LayerwiseOptimizer(std::move(param_groups), defaults, "SOAP") {}

SOAP::SOAP(std::vector<torch::Tensor> params, SOAPOptions defaults)
    : SOAP({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

SOAP::~SOAP() = default;

void SOAP::start(std::vector<Group>& groups) {
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const SOAPOptions& o = *groups[i].options;
    std::vector<ParamGrad> stepping;
    for (const auto& pg : groups[i].params) {
      const SOAPLayout layout = soap_layout(pg.param, o);
      auto& st = state_of(pg.param);
      if (st.eigenbases().defined()) {
        TORCH_CHECK(st.factors().defined() && st.factors().numel() == layout.packed &&
                        st.eigenbases().numel() == layout.packed && st.exp_avg().defined() &&
                        st.exp_avg_sq().defined(),
                    "SOAP: the state of a parameter of shape ", pg.param.sizes(), " in group ", i, " holds factors of ",
                    st.factors().defined() ? st.factors().numel() : 0, " numbers and bases of ",
                    st.eigenbases().numel(), "; its shape and the group's merge_dims, max_precond_dim and "
                    "precondition_1d need ", layout.packed, " (a state saved with other options?)");
        stepping.push_back(pg);
        continue;
      }
      // The first step: the factors from this gradient, their eigenvectors;
      // the parameter does not move (so no step is taken with a basis that
      // saw no gradient).
      st.exp_avg(fp32_contiguous_zeros_like(pg.param));
      st.exp_avg_sq(fp32_contiguous_zeros_like(pg.param));
      if (uses_master(o, pg.param)) fp32_weights(o, pg.param);
      const at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat).device(pg.param.device());
      st.factors(at::zeros({layout.packed}, f32));
      st.eigenbases(at::zeros({layout.packed}, f32));
      const at::Tensor g = pg.grad.to(at::kFloat).reshape(layout.shape);
      for (std::size_t d = 0; d < layout.shape.size(); ++d) {
        if (layout.offset[d] < 0) continue;
        at::Tensor factor = unpacked(st.factors(), layout, d);
        factor.lerp_(outer_along(g, static_cast<std::int64_t>(d)), 1 - shampoo_rate(o));
        const auto [values, vectors] = eigen(factor);
        unpacked(st.eigenbases(), layout, d).copy_(vectors);
        note_estimates(pg.param, d, values);
      }
    }
    groups[i].params = std::move(stepping);
  }
}

// The formulas of soap.h in ATen ops, one parameter at a time.
void SOAP::step_reference(const std::vector<Group>& groups) {
  for (const Group& group : groups) {
    const SOAPOptions& o = *group.options;
    const auto [b1, b2] = o.betas();
    for (const auto& pg : group.params) {
      auto& st = state_of(pg.param);
      const SOAPLayout layout = soap_layout(pg.param, o);
      const at::Tensor g = pg.grad.to(at::kFloat).reshape(layout.shape);
      std::vector<at::Tensor> bases = bases_of(st, layout);
      const std::int64_t t = st.step() + 1;
      st.step(t);
      at::Tensor m = st.exp_avg().view(layout.shape);
      at::Tensor v = st.exp_avg_sq().view(layout.shape);
      const at::Tensor rotated = rotate(g, bases, /*forward=*/true);  // G'
      m.mul_(b1).add_(rotated * (1 - b1));
      v.mul_(b2).add_(rotated * rotated * (1 - b2));
      at::Tensor u = rotate(m / (v.sqrt() + o.eps()), bases, /*forward=*/false);
      if (o.normalize_grads()) u = u / (u.square().mean().sqrt() + 1e-30);
      at::Tensor w = fp32_weights(o, pg.param);
      w.sub_(u.reshape(pg.param.sizes()) * step_size(o, t));
      w.mul_(1 - o.lr() * o.weight_decay());
      if (!w.is_same(pg.param)) pg.param.copy_(w);
      // The factors take this gradient; every precondition_frequency steps the
      // bases are refreshed and m is carried from the old basis to the new.
      for (std::size_t d = 0; d < layout.shape.size(); ++d) {
        if (layout.offset[d] >= 0) {
          unpacked(st.factors(), layout, d).lerp_(outer_along(g, static_cast<std::int64_t>(d)), 1 - shampoo_rate(o));
        }
      }
      if (t % o.precondition_frequency() != 0) continue;
      const at::Tensor m_plain = rotate(m, bases, /*forward=*/false);
      at::Tensor v_sorted = v;
      for (std::size_t d = 0; d < layout.shape.size(); ++d) {
        if (layout.offset[d] < 0) continue;
        const at::Tensor factor = unpacked(st.factors(), layout, d);
        const at::Tensor lq = factor.mm(bases[d]);                                  // one power iteration
        const at::Tensor estimates = (bases[d] * lq).sum(0);                        // diag(Q^T L Q)
        note_estimates(pg.param, d, estimates);
        const at::Tensor order = estimates.argsort(/*stable=*/false, /*dim=*/0, /*descending=*/true);
        v_sorted = v_sorted.index_select(static_cast<std::int64_t>(d), order);
        const at::Tensor q = std::get<0>(at::linalg_qr(lq.index_select(1, order)));
        bases[d].copy_(q);  // a view of the packed bases
      }
      v.copy_(v_sorted);
      m.copy_(rotate(m_plain, bases, /*forward=*/true));
    }
  }
}

// ------------------------------------------------------------ fused step ----

/// The fused step's two engines, kept while the device stays.
class SOAPFusedState {
 public:
  at::Device device{at::kCPU};
  bool cuda = false;
  std::unique_ptr<kernels::MultiTensorStep<kernels::SoapAdamPlan>> adam;
  std::unique_ptr<kernels::MultiTensorStep<kernels::MuonApplyPlan>> apply;
};

namespace {

// Parameters that step together: one group, one rotated shape, one step count.
struct Batch {
  std::size_t group;
  SOAPLayout layout;
  std::int64_t step;  // before this one
  std::vector<const ParamGrad*> members;
};

}  // namespace

bool SOAP::step_fused(const std::vector<Group>& groups) {
  std::optional<at::Device> device;
  if (!whole_tensor_fused(groups, device)) return false;
  if (!device) return true;  // nothing steps
  const bool cuda = runner_for(*device) == Runner::kCuda;
  const DeviceGuard guard(*device);
  if (!fused_ || fused_->device != *device || fused_->cuda != cuda) {
    auto fresh = std::make_unique<SOAPFusedState>();
    fresh->device = *device;
    fresh->cuda = cuda;
    rethrow_as_torch_error("SOAP", [&] {
      fresh->adam = make_engine_step<kernels::SoapAdamPlan>(cuda);
      fresh->apply = make_engine_step<kernels::MuonApplyPlan>(cuda);
    });
    fused_ = std::move(fresh);
  }
  SOAPFusedState& f = *fused_;

  // The batches: one per (group, rotated shape, step).
  std::vector<Batch> batches;
  std::map<std::tuple<std::size_t, std::vector<std::int64_t>, std::int64_t>, std::size_t> index;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    for (const auto& pg : groups[i].params) {
      SOAPLayout layout = soap_layout(pg.param, *groups[i].options);
      const std::int64_t step = state_of(pg.param).step();
      const auto key = std::make_tuple(i, layout.shape, step);
      const auto it = index.emplace(key, batches.size()).first;
      if (it->second == batches.size()) batches.push_back({i, std::move(layout), step, {}});
      batches[it->second].members.push_back(&pg);
    }
  }

  // Into the eigenbasis: G' of each batch, in one fp32 buffer per batch.
  struct Work {
    at::Tensor grads;    // (k, shape) fp32: G
    at::Tensor rotated;  // (k, shape) fp32: G', then N, in place
    std::vector<at::Tensor> factor, basis;  // per dimension: (k, s, s) (the factors at a refresh only), or undefined
  };
  std::vector<Work> work(batches.size());
  std::vector<kernels::SoapAdamGroup> adam_groups;
  std::vector<kernels::TensorSlot> slots;
  for (std::size_t b = 0; b < batches.size(); ++b) {
    const Batch& batch = batches[b];
    Work& w = work[b];
    std::vector<at::Tensor> grads;
    for (const ParamGrad* pg : batch.members) grads.push_back(pg->grad.reshape(batch.layout.shape));
    w.grads = at::stack(grads).to(at::kFloat);
    for (std::size_t d = 0; d < batch.layout.shape.size(); ++d) {
      if (batch.layout.offset[d] < 0) {
        w.factor.emplace_back();
        w.basis.emplace_back();
        continue;
      }
      std::vector<at::Tensor> bases;
      for (const ParamGrad* pg : batch.members) bases.push_back(unpacked(state_of(pg->param).eigenbases(), batch.layout, d));
      w.factor.emplace_back();  // stacked at a refresh only
      w.basis.push_back(at::stack(bases));
    }
    w.rotated = rotate_batch(w.grads, w.basis, /*forward=*/true);
    if (w.rotated.is_same(w.grads)) w.rotated = w.grads.clone();  // nothing rotated: G stays for the factors
    adam_groups.push_back(kernel_group(*groups[batch.group].options));
    for (std::size_t k = 0; k < batch.members.size(); ++k) {
      auto& st = state_of(batch.members[k]->param);
      kernels::TensorSlot slot;
      float* buffer = w.rotated[static_cast<std::int64_t>(k)].data_ptr<float>();
      slot.param = buffer;  // N, written over
      slot.grad = buffer;   // G', read first
      slot.m = st.exp_avg().data_ptr<float>();
      slot.v = st.exp_avg_sq().data_ptr<float>();
      slot.numel = batch.members[k]->param.numel();
      slot.group = static_cast<std::int32_t>(b);
      slot.dtype = kernels::DType::kFloat32;
      slots.push_back(slot);
    }
  }
  const cudaStream_t stream = current_stream(*device);
  rethrow_as_torch_error("SOAP", [&] {
    f.adam->bind(slots, adam_groups, stream);
    f.adam->run(stream);
  });

  // Back out of the eigenbasis, and the update on the apply pass.
  std::vector<kernels::MuonApplyGroup> apply_groups;
  std::vector<at::Tensor> updates;
  slots.clear();
  for (std::size_t b = 0; b < batches.size(); ++b) {
    const Batch& batch = batches[b];
    const SOAPOptions& o = *groups[batch.group].options;
    at::Tensor u = rotate_batch(work[b].rotated, work[b].basis, /*forward=*/false);
    if (o.normalize_grads()) {
      std::vector<std::int64_t> dims;
      for (std::int64_t d = 1; d < u.dim(); ++d) dims.push_back(d);
      u = u / (u.square().mean(dims, /*keepdim=*/true).sqrt() + 1e-30);
    }
    updates.push_back(u);
    const double decay = 1 - o.lr() * o.weight_decay();
    apply_groups.push_back({decay, step_size(o, batch.step + 1) * decay, false});
    for (std::size_t k = 0; k < batch.members.size(); ++k) {
      const at::Tensor& param = batch.members[k]->param;
      auto& st = state_of(param);
      float* direction = u[static_cast<std::int64_t>(k)].data_ptr<float>();
      kernels::TensorSlot slot;
      slot.param = param.data_ptr();
      slot.grad = direction;  // not read
      slot.m = direction;     // U
      slot.master = uses_master(o, param) ? fp32_weights(o, param).data_ptr<float>() : nullptr;
      slot.numel = param.numel();
      slot.group = static_cast<std::int32_t>(b);
      slot.dtype = kernel_dtype(param);
      slots.push_back(slot);
      st.step(batch.step + 1);
    }
  }
  rethrow_as_torch_error("SOAP", [&] {
    f.apply->bind(slots, apply_groups, stream);
    f.apply->run(stream);
  });

  // The factors take the gradients; the refreshes.
  for (std::size_t b = 0; b < batches.size(); ++b) {
    const Batch& batch = batches[b];
    const SOAPOptions& o = *groups[batch.group].options;
    Work& w = work[b];
    const auto& shape = batch.layout.shape;
    bool any = false;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (batch.layout.offset[d] < 0) continue;
      const at::Tensor outer = outer_along_batch(w.grads, static_cast<std::int64_t>(d));
      for (std::size_t k = 0; k < batch.members.size(); ++k) {
        unpacked(state_of(batch.members[k]->param).factors(), batch.layout, d)
            .lerp_(outer[static_cast<std::int64_t>(k)], 1 - shampoo_rate(o));
      }
      any = true;
    }
    if (!any || (batch.step + 1) % o.precondition_frequency() != 0) continue;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (batch.layout.offset[d] < 0) continue;
      std::vector<at::Tensor> factors;
      for (const ParamGrad* pg : batch.members) factors.push_back(unpacked(state_of(pg->param).factors(), batch.layout, d));
      w.factor[d] = at::stack(factors);
    }
    std::vector<at::Tensor> ms, vs;
    for (const ParamGrad* pg : batch.members) {
      const auto& st = state_of(pg->param);
      ms.push_back(st.exp_avg().view(shape));
      vs.push_back(st.exp_avg_sq().view(shape));
    }
    const at::Tensor m_plain = rotate_batch(at::stack(ms), w.basis, /*forward=*/false);
    at::Tensor v = at::stack(vs);
    const std::int64_t count = static_cast<std::int64_t>(batch.members.size());
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (batch.layout.offset[d] < 0) continue;
      const std::int64_t s = shape[d];
      const at::Tensor lq = at::bmm(w.factor[d], w.basis[d]);  // one power iteration
      const at::Tensor estimates = (w.basis[d] * lq).sum(1);  // diag(Q^T L Q), (k, s)
      for (std::size_t k = 0; k < batch.members.size(); ++k) {
        note_estimates(batch.members[k]->param, d, estimates[static_cast<std::int64_t>(k)]);
      }
      const at::Tensor order = estimates.argsort(/*stable=*/false, /*dim=*/1, /*descending=*/true);
      std::vector<std::int64_t> view(static_cast<std::size_t>(v.dim()), 1);
      view[0] = count;
      view[d + 1] = s;
      v = v.gather(static_cast<std::int64_t>(d) + 1, order.view(view).expand(v.sizes()));
      w.basis[d] = q_factor(lq.gather(2, order.unsqueeze(1).expand({count, s, s})));
      for (std::size_t k = 0; k < batch.members.size(); ++k) {
        unpacked(state_of(batch.members[k]->param).eigenbases(), batch.layout, d)
            .copy_(w.basis[d][static_cast<std::int64_t>(k)]);
      }
    }
    const at::Tensor m = rotate_batch(m_plain, w.basis, /*forward=*/true);
    for (std::size_t k = 0; k < batch.members.size(); ++k) {
      auto& st = state_of(batch.members[k]->param);
      const auto i = static_cast<std::int64_t>(k);
      st.exp_avg().view(shape).copy_(m[i]);
      st.exp_avg_sq().view(shape).copy_(v[i]);
    }
  }
  return true;
}

// ------------------------------------------------------------ the step ----

template class LayerwiseOptimizer<SOAPOptions, SOAPParamState>;

void SOAP::shard(std::shared_ptr<const OptimizerSharding> sharding) {
  if (sharding != nullptr) check_whole_tensors(param_groups_, *sharding, "SOAP", "tensors");
  sharding_ = std::move(sharding);
}

torch::Tensor SOAP::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  const torch::Tensor loss = run_closure(closure);
  auto groups = gather();
  if (skip_nonfinite(groups, finite_whole_tensors(groups, param_groups_, sharding_.get()))) return loss;
  start(groups);
  if (!step_fused(groups)) {
    fused_.reset();
    step_reference(groups);
  }
  return loss;
}

void SOAP::note_estimates(const at::Tensor& param, std::size_t d, const at::Tensor& values) {
  Estimates& e = estimates_[param.unsafeGetTensorImpl()];
  if (e.values.size() <= d) e.values.resize(d + 1);
  e.values[d] = values;
  e.bases = state_of(param).eigenbases();
}

std::vector<EigenvalueRange> SOAP::eigenvalue_ranges() const {
  std::vector<EigenvalueRange> out;
  for (const auto& group : param_groups_) {
    const auto& o = static_cast<const SOAPOptions&>(group.options());
    for (const auto& p : group.params()) {
      const SOAPParamState* st = find_state(p);
      if (st == nullptr || !st->eigenbases().defined() || st->step() == 0) continue;
      // The estimates its last refresh (or its first step) made; where the
      // state came from elsewhere since (a load), made now from the state.
      std::vector<at::Tensor> values;
      const auto it = estimates_.find(p.unsafeGetTensorImpl());
      if (it != estimates_.end() && it->second.bases.is_same(st->eigenbases())) {
        for (const auto& v : it->second.values) {
          if (v.defined()) values.push_back(v);
        }
      } else {
        const SOAPLayout layout = soap_layout(p, o);
        for (std::size_t d = 0; d < layout.shape.size(); ++d) {
          if (layout.offset[d] < 0) continue;
          const at::Tensor q = unpacked(st->eigenbases(), layout, d);
          values.push_back((q * unpacked(st->factors(), layout, d).mm(q)).sum(0));
        }
      }
      if (values.empty()) continue;  // no factor
      const at::Tensor all = at::cat(values).to(at::kDouble).cpu();
      out.push_back({p, all.max().item<double>() / std::max(all.min().item<double>(), 1e-30)});
    }
  }
  return out;
}

std::vector<ParamScalar> SOAP::scalars() const {
  std::vector<ParamScalar> out = LayerwiseOptimizerBase::scalars();
  for (const auto& r : eigenvalue_ranges()) out.push_back({"soap_eigenvalue_range", r.param, r.ratio});
  return out;
}

}  // namespace bigbatch::optim
