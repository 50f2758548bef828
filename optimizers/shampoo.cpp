// Shampoo (shampoo.h): options, state, the layout of blocks and factors, the
// inverse roots, the reference path in plain ATen ops (one block at a time,
// each contraction a tensordot) and the fused step: the blocks batched by
// group, shape and step, their factor products, eigendecompositions and
// preconditioning batched products (kronecker.h), the elementwise parts on
// the engine (kernels/shampoo.h).
#include "shampoo.h"

#include "internal.h"
#include "kronecker.h"
#include "layerwise_optimizer_impl.h"

#include <ATen/ops/linalg_eigh.h>
#include <ATen/ops/tensordot.h>

#include <cmath>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

namespace bigbatch::optim {

using kronecker::outer_along_batch;
using kronecker::rotate_batch;

// The engine path LayerwiseOptimizer would take (Shampoo::step never does:
// its step runs the passes around its products); declared before anything
// here instantiates LayerwiseOptimizer.
template <>
struct FusedTraits<ShampooOptions> {
  using Plan = kernels::ShampooGraftPlan;
  using Optimizer = Shampoo;
  static void bind(ShampooParamState& st, kernels::TensorSlot& slot) {
    slot.m = st.exp_avg().data_ptr<float>();
    slot.v = st.grafting_sq().data_ptr<float>();
    slot.step = st.step();
  }
  static void set_step(ShampooParamState& st, std::int64_t step) { st.step(step); }
};

ShampooOptions::ShampooOptions(double lr) : lr_(lr) {}

template <typename Self>
auto ShampooOptions::fields(Self& self) {
  using internal::field;
  auto& [lr, betas, epsilon, momentum, dampening, weight_decay, max_preconditioner_dim, precondition_frequency,
         start_preconditioning_step, inv_root_override, use_nesterov, use_bias_correction,
         use_decoupled_weight_decay, grafting, grafting_beta2, grafting_epsilon, use_merge_dims, precondition_1d,
         adapt, skip_nonfinite, fused, master_weights] = self;
  return std::make_tuple(field("lr", lr),
                         field("betas", betas),
                         field("epsilon", epsilon),
                         field("momentum", momentum),
                         field("dampening", dampening),
                         field("weight_decay", weight_decay),
                         field("max_preconditioner_dim", max_preconditioner_dim),
                         field("precondition_frequency", precondition_frequency),
                         field("start_preconditioning_step", start_preconditioning_step),
                         field("inv_root_override", inv_root_override),
                         field("use_nesterov", use_nesterov),
                         field("use_bias_correction", use_bias_correction),
                         field("use_decoupled_weight_decay", use_decoupled_weight_decay),
                         field("grafting", grafting),
                         field("grafting_beta2", grafting_beta2),
                         field("grafting_epsilon", grafting_epsilon),
                         field("use_merge_dims", use_merge_dims),
                         field("precondition_1d", precondition_1d),
                         field("adapt", adapt),
                         field("skip_nonfinite", skip_nonfinite),
                         field("fused", fused),
                         field("master_weights", master_weights));
}
BIGBATCH_DEFINE_FIELD_IO(ShampooOptions)

template <typename Self>
auto ShampooParamState::fields(Self& self) {
  using internal::field;
  using internal::own_shape;
  auto& [step, exp_avg, grafting_sq, momentum_buffer, factors, inverse_roots, master] = self;
  return std::make_tuple(field("step", step),
                         field("exp_avg", exp_avg),
                         field("grafting_sq", grafting_sq),
                         field("momentum_buffer", momentum_buffer),
                         field("factors", factors, own_shape),
                         field("inverse_roots", inverse_roots, own_shape),
                         field("master", master));
}
BIGBATCH_DEFINE_FIELD_IO(ShampooParamState)
BIGBATCH_DEFINE_STATE_ACCESS(ShampooParamState)

namespace {

constexpr const char* kGraftings[] = {"adam", "rmsprop", "adagrad", "sgd", "none"};

// The graft keeps a second moment.
bool graft_keeps_v(const ShampooOptions& o) {
  return o.grafting() == "adam" || o.grafting() == "rmsprop" || o.grafting() == "adagrad";
}

}  // namespace

void ShampooOptions::validate() const {
  using namespace internal;
  check_nonnegative("Shampoo", "lr", lr());
  const auto [b1, b2] = betas();
  check_option(b1 >= 0 && b1 < 1, "Shampoo", "betas[0]", b1, "in [0, 1)");
  check_option(b2 > 0 && b2 <= 1, "Shampoo", "betas[1]", b2, "in (0, 1]");
  check_nonnegative("Shampoo", "epsilon", epsilon());
  check_option(momentum() >= 0 && momentum() < 1, "Shampoo", "momentum", momentum(), "in [0, 1)");
  check_option(dampening() >= 0 && dampening() < 1, "Shampoo", "dampening", dampening(), "in [0, 1)");
  check_nonnegative("Shampoo", "weight_decay", weight_decay());
  check_option(max_preconditioner_dim() >= 1, "Shampoo", "max_preconditioner_dim", max_preconditioner_dim(), ">= 1");
  check_option(precondition_frequency() >= 1, "Shampoo", "precondition_frequency", precondition_frequency(), ">= 1");
  check_option(start_preconditioning_step() == -1 || start_preconditioning_step() >= precondition_frequency(),
               "Shampoo", "start_preconditioning_step", start_preconditioning_step(),
               ">= precondition_frequency, or -1 (precondition_frequency): the first inverse roots are computed "
               "at step precondition_frequency");
  check_nonnegative("Shampoo", "inv_root_override", static_cast<double>(inv_root_override()));
  bool known = false;
  for (const char* g : kGraftings) known = known || grafting() == g;
  check_option(known, "Shampoo", "grafting", "\"" + grafting() + "\"",
               "\"adam\", \"rmsprop\", \"adagrad\", \"sgd\" or \"none\"");
  check_option(grafting_beta2() > 0 && grafting_beta2() < 1, "Shampoo", "grafting_beta2", grafting_beta2(),
               "in (0, 1)");
  check_option(grafting_epsilon() > 0, "Shampoo", "grafting_epsilon", grafting_epsilon(), "> 0");
}

std::int64_t ShampooOptions::start_step() const {
  return start_preconditioning_step() < 0 ? precondition_frequency() : start_preconditioning_step();
}

ShampooParamState ShampooParamState::fresh(const at::Tensor&) { return {}; }

kernels::ShampooGraftGroup kernel_group(const ShampooOptions& o, std::int64_t t) {
  kernels::ShampooGraftGroup g;
  const double b1 = std::get<0>(o.betas()), bg = o.grafting_beta2();
  const double td = static_cast<double>(t);
  g.beta1 = b1;
  g.m_scale = o.use_bias_correction() && b1 > 0 ? 1 / (1 - std::pow(b1, td)) : 1.0;
  g.eps = o.grafting_epsilon();
  g.divide = graft_keeps_v(o);
  if (o.grafting() == "adagrad") {
    g.v_decay = 1;
    g.v_weight = 1;
  } else if (g.divide) {
    g.v_decay = bg;
    g.v_weight = 1 - bg;
  } else {
    g.v_decay = 0;
    g.v_weight = 0;
  }
  g.v_scale = o.grafting() == "adam" ? 1 / (1 - std::pow(bg, td)) : 1.0;  // Adam's graft is bias-corrected
  g.skip_nonfinite = false;  // Shampoo::step decides the skip for every group first
  return g;
}

kernels::ShampooApplyGroup apply_group(const ShampooOptions& o) {
  kernels::ShampooApplyGroup a;
  a.lr = o.lr();
  a.weight_decay = o.use_decoupled_weight_decay() ? o.weight_decay() : 0.0;
  a.momentum = o.momentum();
  a.dampening = o.dampening();
  a.nesterov = o.use_nesterov();
  a.skip_nonfinite = false;
  return a;
}

// ------------------------------------------------------------ the layout ----

namespace {

// Shi et al.'s merge: dimensions of size 1 dropped; from the last dimension
// back, each joins the one after it while their product stays within `max`.
std::vector<std::int64_t> merged_shape(at::IntArrayRef sizes, std::int64_t max) {
  std::vector<std::int64_t> out;  // reversed
  for (auto it = sizes.rbegin(); it != sizes.rend(); ++it) {
    if (*it == 1) continue;
    if (!out.empty() && out.back() * *it <= max) {
      out.back() *= *it;
    } else {
      out.push_back(*it);
    }
  }
  if (out.empty()) out.push_back(1);  // a 0-D parameter, or all ones: one number
  return {out.rbegin(), out.rend()};
}

}  // namespace

ShampooLayout shampoo_layout(const at::Tensor& param, const ShampooOptions& o) {
  ShampooLayout layout;
  if (param.dim() <= 1) {
    layout.shape = {param.numel()};
  } else if (o.use_merge_dims()) {
    layout.shape = merged_shape(param.sizes(), o.max_preconditioner_dim());
  } else {
    layout.shape = param.sizes().vec();
  }
  if ((param.dim() <= 1 && !o.precondition_1d()) || param.numel() == 0) return layout;
  // The blocks: each dimension cut every max_preconditioner_dim, the first
  // dimension's cut outermost.
  const std::int64_t max = o.max_preconditioner_dim();
  const std::size_t n = layout.shape.size();
  std::vector<std::int64_t> index(n, 0);
  while (true) {
    ShampooBlock b;
    for (std::size_t d = 0; d < n; ++d) {
      b.start.push_back(index[d] * max);
      b.size.push_back(std::min(max, layout.shape[d] - index[d] * max));
      b.offset.push_back(layout.packed);
      layout.packed += b.size.back() * b.size.back();
    }
    layout.blocks.push_back(std::move(b));
    std::size_t d = n;
    while (d > 0) {
      --d;
      if ((index[d] + 1) * max < layout.shape[d]) {
        ++index[d];
        break;
      }
      index[d] = 0;
      if (d == 0) return layout;
    }
  }
}

namespace {

// Block b of x (the merged shape), a view.
at::Tensor block_of(const at::Tensor& x, const ShampooBlock& b) {
  at::Tensor v = x;
  for (std::size_t d = 0; d < b.start.size(); ++d) v = v.narrow(static_cast<std::int64_t>(d), b.start[d], b.size[d]);
  return v;
}

// Factor or root d of block b of a packed tensor, as an s x s view.
at::Tensor unpacked(const at::Tensor& packed, const ShampooBlock& b, std::size_t d) {
  const std::int64_t s = b.size[d];
  return packed.reshape({-1}).narrow(0, b.offset[d], s * s).view({s, s});
}

// The factors' rate at step t: (decay, weight) of L = decay*L + weight*G G^T.
std::pair<double, double> factor_rates(const ShampooOptions& o) {
  const double b2 = std::get<1>(o.betas());
  return b2 == 1 ? std::make_pair(1.0, 1.0) : std::make_pair(b2, 1 - b2);
}

// Whether step t recomputes the inverse roots: at the start step, and at each
// multiple of precondition_frequency after it.
bool refreshes(const ShampooOptions& o, std::int64_t t) {
  const std::int64_t start = o.start_step();
  return t == start || (t > start && t % o.precondition_frequency() == 0);
}

std::int64_t root_of(const ShampooOptions& o, std::size_t order) {
  return o.inv_root_override() > 0 ? o.inv_root_override() : 2 * static_cast<std::int64_t>(order);
}

// The inverse roots of a batch of factors (k, s, s) at step t, as Shi et
// al.'s: A = L/(1-b2^t); the eigendecomposition of A + eps*I; where the least
// eigenvalue is below eps (rounding leaves a semi-definite A a little
// negative), every eigenvalue shifted so that it is eps; then
// Q diag(lambda^(-1/r)) Q^T. Undefined where the decomposition fails (in
// float and in double) or its result is not finite: the previous roots stay.
at::Tensor inverse_roots(const at::Tensor& factors, const ShampooOptions& o, std::int64_t t, std::int64_t root) {
  const double b2 = std::get<1>(o.betas());
  at::Tensor a = factors;
  if (o.use_bias_correction() && b2 < 1) a = a / (1 - std::pow(b2, static_cast<double>(t)));
  a = a + at::eye(a.size(-1), a.options()) * o.epsilon();
  at::Tensor values, vectors;
  try {
    std::tie(values, vectors) = at::linalg_eigh(a);
  } catch (const c10::Error&) {
    try {
      std::tie(values, vectors) = at::linalg_eigh(a.to(at::kDouble));
      values = values.to(at::kFloat);
      vectors = vectors.to(at::kFloat);
    } catch (const c10::Error&) {
      return {};
    }
  }
  const at::Tensor least = values.amin(-1, /*keepdim=*/true);
  values = values + (o.epsilon() - least).clamp_min(0);
  const at::Tensor scale = values.pow(-1.0 / static_cast<double>(root));
  const at::Tensor r = at::matmul(vectors * scale.unsqueeze(-2), vectors.transpose(-1, -2));
  if (!r.isfinite().all().item<bool>()) return {};
  return r;
}

}  // namespace

// ------------------------------------------------------------ the optimizer ----

Shampoo::Shampoo(std::vector<torch::optim::OptimizerParamGroup> param_groups, ShampooOptions defaults)
    : LayerwiseOptimizer(std::move(param_groups), defaults, "Shampoo") {}

Shampoo::Shampoo(std::vector<torch::Tensor> params, ShampooOptions defaults)
    : Shampoo({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

Shampoo::~Shampoo() = default;

void Shampoo::start(const std::vector<Group>& groups) {
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const ShampooOptions& o = *groups[i].options;
    for (const auto& pg : groups[i].params) {
      const ShampooLayout layout = shampoo_layout(pg.param, o);
      auto& st = state_of(pg.param);
      const bool want_m = std::get<0>(o.betas()) > 0, want_v = graft_keeps_v(o), want_u = o.momentum() > 0;
      if (st.factors().defined()) {
        const auto fits = [&](const at::Tensor& t, bool wanted) {
          return wanted ? t.defined() && t.numel() == pg.param.numel() : true;
        };
        TORCH_CHECK(st.factors().numel() == layout.packed && st.inverse_roots().defined() &&
                        st.inverse_roots().numel() == layout.packed && fits(st.exp_avg(), want_m) &&
                        fits(st.grafting_sq(), want_v) && fits(st.momentum_buffer(), want_u),
                    "Shampoo: the state of a parameter of shape ", pg.param.sizes(), " in group ", i,
                    " holds factors of ", st.factors().numel(), " numbers and roots of ",
                    st.inverse_roots().defined() ? st.inverse_roots().numel() : 0,
                    " (exp_avg, grafting_sq, momentum_buffer: ", st.exp_avg().defined(), ", ",
                    st.grafting_sq().defined(), ", ", st.momentum_buffer().defined(),
                    "); its shape and the group's use_merge_dims, max_preconditioner_dim and precondition_1d need ",
                    layout.packed, ", and its betas, grafting and momentum need ", want_m, ", ", want_v, ", ", want_u,
                    " (a state saved with other options?)");
        continue;
      }
      const at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat).device(pg.param.device());
      st.factors(at::zeros({layout.packed}, f32));
      st.inverse_roots(at::zeros({layout.packed}, f32));
      for (const ShampooBlock& b : layout.blocks) {  // the roots start as the identity
        for (std::size_t d = 0; d < b.size.size(); ++d) unpacked(st.inverse_roots(), b, d).fill_diagonal_(1);
      }
      if (want_m) st.exp_avg(fp32_contiguous_zeros_like(pg.param));
      if (want_v) st.grafting_sq(fp32_contiguous_zeros_like(pg.param));
      if (want_u) st.momentum_buffer(fp32_contiguous_zeros_like(pg.param));
      if (uses_master(o, pg.param)) fp32_weights(o, pg.param);
    }
  }
}

namespace {

// x contracted along each dimension against the matrices (symmetric), one
// tensordot per dimension, each moving its dimension last: after all of them
// the dimensions are back in order.
at::Tensor precondition(at::Tensor x, const std::vector<at::Tensor>& roots) {
  for (const at::Tensor& r : roots) x = at::tensordot(x, r, {0}, {0});
  return x;
}

}  // namespace

// The formulas of shampoo.h in ATen ops, one parameter and one block at a time.
void Shampoo::step_reference(const std::vector<Group>& groups) {
  for (const Group& group : groups) {
    const ShampooOptions& o = *group.options;
    const auto [decay, weight] = factor_rates(o);
    const kernels::ShampooApplyGroup a = apply_group(o);
    for (const auto& pg : group.params) {
      auto& st = state_of(pg.param);
      const ShampooLayout layout = shampoo_layout(pg.param, o);
      const std::int64_t t = st.step() + 1;
      st.step(t);
      at::Tensor w = fp32_weights(o, pg.param);
      at::Tensor g = pg.grad.to(at::kFloat).reshape(layout.shape);
      if (!o.use_decoupled_weight_decay() && o.weight_decay() != 0) g = g + w.reshape(layout.shape) * o.weight_decay();
      // The factors take g; their inverse roots every precondition_frequency steps.
      for (const ShampooBlock& b : layout.blocks) {
        const at::Tensor gb = block_of(g, b);
        for (std::size_t d = 0; d < b.size.size(); ++d) {
          std::vector<std::int64_t> others;
          for (std::int64_t i = 0; i < gb.dim(); ++i) {
            if (i != static_cast<std::int64_t>(d)) others.push_back(i);
          }
          unpacked(st.factors(), b, d).mul_(decay).add_(at::tensordot(gb, gb, others, others) * weight);
        }
        if (!refreshes(o, t)) continue;
        for (std::size_t d = 0; d < b.size.size(); ++d) {
          const at::Tensor r = inverse_roots(unpacked(st.factors(), b, d), o, t, root_of(o, b.size.size()));
          if (r.defined()) unpacked(st.inverse_roots(), b, d).copy_(r);
        }
      }
      // The filtered gradient and the graft's direction.
      const kernels::ShampooGraftGroup gg = kernel_group(o, t);
      at::Tensor m = g;
      if (st.exp_avg().defined()) {
        m = st.exp_avg().view(layout.shape);
        m.mul_(gg.beta1).add_(g * (1 - gg.beta1));
      }
      at::Tensor direction = m * gg.m_scale;
      if (gg.divide) {
        at::Tensor v = st.grafting_sq().view(layout.shape);
        v.mul_(gg.v_decay).add_(g * g * gg.v_weight);
        direction = direction / ((v * gg.v_scale).sqrt() + gg.eps);
      }
      at::Tensor norm_sq = direction.square().sum();
      // Shampoo's direction, block by block, at the graft's norm.
      if (!layout.blocks.empty() && t >= o.start_step()) {
        at::Tensor s = at::empty_like(direction);
        norm_sq = at::zeros({}, direction.options());
        for (const ShampooBlock& b : layout.blocks) {
          std::vector<at::Tensor> roots;
          for (std::size_t d = 0; d < b.size.size(); ++d) roots.push_back(unpacked(st.inverse_roots(), b, d));
          const at::Tensor p = precondition(block_of(m, b), roots);
          const at::Tensor graft = block_of(direction, b);
          norm_sq = norm_sq + graft.square().sum();
          if (o.grafting() == "none") {
            block_of(s, b).copy_(p * gg.m_scale);
          } else {
            block_of(s, b).copy_(p * (graft.norm() / (p.norm() + 1e-16)));
          }
        }
        direction = s;
      }
      graft_norms_[pg.param.unsafeGetTensorImpl()] = norm_sq;
      // The decoupled decay, the momentum and the update.
      at::Tensor d = direction.reshape(pg.param.sizes()) + w * a.weight_decay;
      at::Tensor u = d;
      if (st.momentum_buffer().defined()) {
        st.momentum_buffer().mul_(a.momentum).add_(d * (1 - a.dampening));
        u = a.nesterov ? d * (1 - a.dampening) + st.momentum_buffer() * a.momentum : st.momentum_buffer();
      }
      w.sub_(u * a.lr);
      if (!w.is_same(pg.param)) pg.param.copy_(w);
    }
  }
}

// ------------------------------------------------------------ fused step ----

/// The fused step's two engines, kept while the device stays.
class ShampooFusedState {
 public:
  at::Device device{at::kCPU};
  bool cuda = false;
  std::unique_ptr<kernels::MultiTensorStep<kernels::ShampooGraftPlan>> graft;
  std::unique_ptr<kernels::MultiTensorStep<kernels::ShampooApplyPlan>> apply;
};

namespace {

// One parameter's step in the fused path.
struct Entry {
  std::size_t group;
  const ParamGrad* pg;
  ShampooLayout layout;
  std::int64_t t;    // this step
  at::Tensor g;      // fp32, the merged shape, contiguous (coupled decay added)
  at::Tensor m;      // the filtered gradient (the state's, or g)
  at::Tensor graft;  // D, fp32, the merged shape
  at::Tensor s;      // S (D where no block is preconditioned)
};

// Blocks that step together: one group, one block shape, one step.
struct Batch {
  std::size_t group;
  std::vector<std::int64_t> shape;
  std::int64_t t;
  std::vector<std::pair<Entry*, const ShampooBlock*>> members;
};

at::Tensor stacked_blocks(const std::vector<std::pair<Entry*, const ShampooBlock*>>& members,
                          at::Tensor Entry::*field) {
  std::vector<at::Tensor> parts;
  for (const auto& [e, b] : members) parts.push_back(block_of(e->*field, *b));
  return at::stack(parts);
}

}  // namespace

bool Shampoo::step_fused(const std::vector<Group>& groups) {
  std::optional<at::Device> device;
  if (!whole_tensor_fused(groups, device)) return false;
  if (!device) return true;  // nothing steps
  const bool cuda = runner_for(*device) == Runner::kCuda;
  const DeviceGuard guard(*device);
  if (!fused_ || fused_->device != *device || fused_->cuda != cuda) {
    auto fresh = std::make_unique<ShampooFusedState>();
    fresh->device = *device;
    fresh->cuda = cuda;
    rethrow_as_torch_error("Shampoo", [&] {
      fresh->graft = make_engine_step<kernels::ShampooGraftPlan>(cuda);
      fresh->apply = make_engine_step<kernels::ShampooApplyPlan>(cuda);
    });
    fused_ = std::move(fresh);
  }
  ShampooFusedState& f = *fused_;

  // The parameters, their fp32 gradients (a copy the graft pass may write m
  // into), and the batches of their blocks.
  std::vector<Entry> entries;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const ShampooOptions& o = *groups[i].options;
    for (const auto& pg : groups[i].params) {
      Entry e{i, &pg, shampoo_layout(pg.param, o), state_of(pg.param).step() + 1, {}, {}, {}, {}};
      at::Tensor g = pg.grad.to(at::kFloat).reshape(e.layout.shape);
      if (!o.use_decoupled_weight_decay() && o.weight_decay() != 0) {
        g = g + fp32_weights(o, pg.param).reshape(e.layout.shape) * o.weight_decay();
      } else {
        g = g.clone(at::MemoryFormat::Contiguous);
      }
      e.g = g;
      entries.push_back(std::move(e));
    }
  }
  std::vector<Batch> batches;
  std::map<std::tuple<std::size_t, std::vector<std::int64_t>, std::int64_t>, std::size_t> index;
  for (Entry& e : entries) {
    for (const ShampooBlock& b : e.layout.blocks) {
      const auto key = std::make_tuple(e.group, b.size, e.t);
      const auto it = index.emplace(key, batches.size()).first;
      if (it->second == batches.size()) batches.push_back({e.group, b.size, e.t, {}});
      batches[it->second].members.emplace_back(&e, &b);
    }
  }

  // The factors take g; the inverse roots at a refresh (kept stacked for the
  // preconditioning below).
  std::vector<std::vector<at::Tensor>> roots(batches.size());
  for (std::size_t bi = 0; bi < batches.size(); ++bi) {
    const Batch& batch = batches[bi];
    const ShampooOptions& o = *groups[batch.group].options;
    const auto [decay, weight] = factor_rates(o);
    const at::Tensor g = stacked_blocks(batch.members, &Entry::g);
    const bool refresh = refreshes(o, batch.t);
    for (std::size_t d = 0; d < batch.shape.size(); ++d) {
      const at::Tensor outer = outer_along_batch(g, static_cast<std::int64_t>(d));
      std::vector<at::Tensor> factors;
      for (std::size_t k = 0; k < batch.members.size(); ++k) {
        const auto& [e, b] = batch.members[k];
        at::Tensor factor = unpacked(state_of(e->pg->param).factors(), *b, d);
        factor.mul_(decay).add_(outer[static_cast<std::int64_t>(k)], weight);
        factors.push_back(factor);
      }
      if (!refresh) continue;
      const at::Tensor r = inverse_roots(at::stack(factors), o, batch.t, root_of(o, batch.shape.size()));
      if (r.defined()) {
        for (std::size_t k = 0; k < batch.members.size(); ++k) {
          const auto& [e, b] = batch.members[k];
          unpacked(state_of(e->pg->param).inverse_roots(), *b, d).copy_(r[static_cast<std::int64_t>(k)]);
        }
        roots[bi].push_back(r);
      } else {
        // One failed (or not finite): each member keeps its previous root
        // where its own decomposition fails too.
        std::vector<at::Tensor> kept;
        for (std::size_t k = 0; k < batch.members.size(); ++k) {
          const auto& [e, b] = batch.members[k];
          at::Tensor root = unpacked(state_of(e->pg->param).inverse_roots(), *b, d);
          const at::Tensor one = inverse_roots(factors[k], o, batch.t, root_of(o, batch.shape.size()));
          if (one.defined()) root.copy_(one);
          kept.push_back(root);
        }
        roots[bi].push_back(at::stack(kept));
      }
    }
  }

  // The graft pass: m, v and D of every parameter.
  std::vector<kernels::ShampooGraftGroup> graft_groups;
  std::vector<kernels::TensorSlot> slots;
  std::map<std::pair<std::size_t, std::int64_t>, std::int32_t> graft_index;  // (group, t) -> its pass group
  std::vector<at::Tensor> scratch;  // v where the graft keeps none (zeros: 0*v stays 0)
  for (Entry& e : entries) {
    const ShampooOptions& o = *groups[e.group].options;
    auto& st = state_of(e.pg->param);
    const auto it = graft_index.emplace(std::make_pair(e.group, e.t), static_cast<std::int32_t>(graft_groups.size()));
    if (it.second) graft_groups.push_back(kernel_group(o, e.t));
    e.m = st.exp_avg().defined() ? st.exp_avg().view(e.layout.shape) : e.g;
    e.graft = at::empty_like(e.g);
    kernels::TensorSlot slot;
    slot.param = e.graft.data_ptr<float>();
    slot.grad = e.g.data_ptr<float>();
    slot.m = e.m.data_ptr<float>();
    if (!st.grafting_sq().defined()) scratch.push_back(at::zeros_like(e.g));
    slot.v = st.grafting_sq().defined() ? st.grafting_sq().data_ptr<float>() : scratch.back().data_ptr<float>();
    slot.numel = e.g.numel();
    slot.group = it.first->second;
    slot.dtype = kernels::DType::kFloat32;
    slots.push_back(slot);
  }
  const cudaStream_t stream = current_stream(*device);
  rethrow_as_torch_error("Shampoo", [&] {
    f.graft->bind(slots, graft_groups, stream);
    f.graft->run(stream);
  });

  // S: each preconditioned block of m at its graft's norm; D elsewhere.
  for (Entry& e : entries) {
    const bool preconditioned = !e.layout.blocks.empty() && e.t >= groups[e.group].options->start_step();
    e.s = preconditioned ? at::empty_like(e.graft) : e.graft;
    if (!preconditioned) graft_norms_[e.pg->param.unsafeGetTensorImpl()] = e.graft.square().sum();
  }
  std::unordered_map<const Entry*, at::Tensor> norm_sq;
  for (std::size_t bi = 0; bi < batches.size(); ++bi) {
    const Batch& batch = batches[bi];
    const ShampooOptions& o = *groups[batch.group].options;
    if (batch.t < o.start_step()) continue;
    if (roots[bi].empty()) {  // no refresh this step: the roots as they are
      for (std::size_t d = 0; d < batch.shape.size(); ++d) {
        std::vector<at::Tensor> r;
        for (const auto& [e, b] : batch.members) r.push_back(unpacked(state_of(e->pg->param).inverse_roots(), *b, d));
        roots[bi].push_back(at::stack(r));
      }
    }
    at::Tensor p = rotate_batch(stacked_blocks(batch.members, &Entry::m), roots[bi], /*forward=*/true);
    const at::Tensor graft = stacked_blocks(batch.members, &Entry::graft);
    const std::int64_t k = p.size(0);
    const at::Tensor graft_sq = graft.reshape({k, -1}).square().sum(1);
    std::vector<std::int64_t> view(static_cast<std::size_t>(p.dim()), 1);
    view[0] = k;
    if (o.grafting() == "none") {
      p = p * kernel_group(o, batch.t).m_scale;
    } else {
      const at::Tensor pn = p.reshape({k, -1}).square().sum(1).sqrt();
      p = p * (graft_sq.sqrt() / (pn + 1e-16)).view(view);
    }
    for (std::size_t i = 0; i < batch.members.size(); ++i) {
      const auto& [e, b] = batch.members[i];
      block_of(e->s, *b).copy_(p[static_cast<std::int64_t>(i)]);
      at::Tensor& sum = norm_sq[e];
      sum = sum.defined() ? sum + graft_sq[static_cast<std::int64_t>(i)] : graft_sq[static_cast<std::int64_t>(i)];
    }
  }
  for (const auto& [e, sum] : norm_sq) graft_norms_[e->pg->param.unsafeGetTensorImpl()] = sum;

  // The apply pass: the decay, the momentum and the update.
  std::vector<kernels::ShampooApplyGroup> apply_groups;
  for (const Group& g : groups) apply_groups.push_back(apply_group(*g.options));
  slots.clear();
  for (Entry& e : entries) {
    const ShampooOptions& o = *groups[e.group].options;
    auto& st = state_of(e.pg->param);
    kernels::TensorSlot slot;
    slot.param = e.pg->param.data_ptr();
    slot.grad = e.s.data_ptr<float>();  // not read
    slot.m = e.s.data_ptr<float>();
    slot.v = st.momentum_buffer().defined() ? st.momentum_buffer().data_ptr<float>() : e.s.data_ptr<float>();
    slot.master = uses_master(o, e.pg->param) ? fp32_weights(o, e.pg->param).data_ptr<float>() : nullptr;
    slot.numel = e.pg->param.numel();
    slot.group = static_cast<std::int32_t>(e.group);
    slot.dtype = kernel_dtype(e.pg->param);
    slots.push_back(slot);
    st.step(e.t);
  }
  rethrow_as_torch_error("Shampoo", [&] {
    f.apply->bind(slots, apply_groups, stream);
    f.apply->run(stream);
  });
  return true;
}

// ------------------------------------------------------------ the step ----

template class LayerwiseOptimizer<ShampooOptions, ShampooParamState>;

void Shampoo::shard(std::shared_ptr<const OptimizerSharding> sharding) {
  if (sharding != nullptr) check_whole_tensors(param_groups_, *sharding, "Shampoo", "tensors");
  sharding_ = std::move(sharding);
}

torch::Tensor Shampoo::step(LossClosure closure) {
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

std::vector<GraftingNorm> Shampoo::grafting_norms() const {
  std::vector<GraftingNorm> out;
  for (const auto& group : param_groups_) {
    for (const auto& p : group.params()) {
      const auto it = graft_norms_.find(p.unsafeGetTensorImpl());
      if (it == graft_norms_.end()) continue;
      out.push_back({p, std::sqrt(it->second.item<double>())});
    }
  }
  return out;
}

std::vector<ParamScalar> Shampoo::scalars() const {
  std::vector<ParamScalar> out = LayerwiseOptimizerBase::scalars();
  for (const auto& g : grafting_norms()) out.push_back({"shampoo_grafting_norm", g.param, g.norm});
  return out;
}

}  // namespace bigbatch::optim
