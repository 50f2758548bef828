// The GPT model (experiments/workload/gpt.h): causality, and its forward and
// backward against a float64 re-derivation written here from the formulas
// (explicit mask, softmax, LayerNorm, erf GELU, log-sum-exp loss), not from
// the modules, the fused attention or cross_entropy; and the parameter
// groups the runner gives it.
#include "../../experiments/runconfig/config.h"
#include "../../experiments/workload/gpt.h"
#include "../../experiments/optim/optimizer.h"
#include "../../experiments/workload/workload.h"

#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include "../../optimizers/lamb.h"

#include <cmath>
#include <map>
#include <string>

namespace bigbatch::experiments {
namespace {

GptSpec small_spec() {
  GptSpec s;
  s.layers = 2;
  s.width = 12;
  s.heads = 3;
  s.context = 6;
  s.vocabulary = 11;
  return s;
}

Gpt small_model() {
  at::manual_seed(5);
  Gpt model(small_spec());
  // Non-zero biases and LayerNorm parameters, so that every term is tested.
  at::NoGradGuard no_grad;
  for (auto& p : model->named_parameters()) {
    if (p.value().dim() == 1) p.value().uniform_(-0.3, 0.3).add_(p.key().find("ln") != std::string::npos ? 1.0 : 0.0);
  }
  return model;
}

// The model from its formulas, in float64, over copies of its parameters.
struct Reference {
  std::map<std::string, at::Tensor> w;  // float64 leaves
  GptSpec spec;

  explicit Reference(const Gpt& model) : spec(model->spec()) {
    for (const auto& p : model->named_parameters()) {
      w[p.key()] = p.value().detach().to(at::kDouble).clone().requires_grad_(true);
    }
  }
  at::Tensor layer_norm(const at::Tensor& x, const std::string& name) {
    const at::Tensor mean = x.mean(-1, true);
    const at::Tensor var = (x - mean).pow(2).mean(-1, true);
    return (x - mean) / (var + 1e-5).sqrt() * w[name + ".weight"] + w[name + ".bias"];
  }
  at::Tensor linear(const at::Tensor& x, const std::string& name) {
    return x.matmul(w[name + ".weight"].t()) + w[name + ".bias"];
  }
  at::Tensor logits(const at::Tensor& tokens) {
    const std::int64_t n = tokens.size(0), t = tokens.size(1), c = spec.width, h = spec.heads, d = c / h;
    at::Tensor x = w["wte.weight"].index_select(0, tokens.reshape({-1})).view({n, t, c}) +
                   w["wpe.weight"].slice(0, 0, t);
    at::Tensor mask = at::zeros({t, t}, at::kDouble);
    for (std::int64_t i = 0; i < t; ++i) {
      for (std::int64_t j = i + 1; j < t; ++j) mask[i][j] = -1e300;  // position i sees j <= i only
    }
    for (std::int64_t l = 0; l < spec.layers; ++l) {
      const std::string b = "blocks." + std::to_string(l) + ".";
      const at::Tensor qkv = linear(layer_norm(x, b + "ln1"), b + "attn.qkv");
      std::vector<at::Tensor> heads;
      for (std::int64_t k = 0; k < h; ++k) {
        const at::Tensor q = qkv.slice(2, k * d, (k + 1) * d);
        const at::Tensor kk = qkv.slice(2, c + k * d, c + (k + 1) * d);
        const at::Tensor v = qkv.slice(2, 2 * c + k * d, 2 * c + (k + 1) * d);
        const at::Tensor s = q.matmul(kk.transpose(1, 2)) / std::sqrt(static_cast<double>(d)) + mask;
        const at::Tensor e = (s - std::get<0>(s.max(-1, true))).exp();
        heads.push_back((e / e.sum(-1, true)).matmul(v));
      }
      x = x + linear(at::cat(heads, 2), b + "attn.proj");
      const at::Tensor u = linear(layer_norm(x, b + "ln2"), b + "fc");
      const at::Tensor gelu = 0.5 * u * (1 + (u / std::sqrt(2.0)).erf());
      x = x + linear(gelu, b + "out");
    }
    return layer_norm(x, "ln_f").matmul(w["wte.weight"].t());
  }
  // Mean over examples of each example's mean token loss.
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets) {
    const at::Tensor z = logits(tokens);
    const at::Tensor m = std::get<0>(z.max(-1, true));
    const at::Tensor lse = (z - m).exp().sum(-1).log() + m.squeeze(-1);
    return (lse - z.gather(-1, targets.unsqueeze(-1)).squeeze(-1)).mean();
  }
};

TEST(GptTest, AnEarlierPositionNeverSeesALaterToken) {
  Gpt model = small_model();
  model->eval();
  at::Tensor tokens = at::randint(0, 11, {2, 6}, at::kLong);
  const at::Tensor before = model->forward(tokens);
  ASSERT_EQ(before.sizes(), (std::vector<std::int64_t>{2, 6, 11}));
  tokens[0][4] = (tokens[0][4].item<std::int64_t>() + 1) % 11;
  const at::Tensor after = model->forward(tokens);
  EXPECT_TRUE(after[0].slice(0, 0, 4).equal(before[0].slice(0, 0, 4)));  // positions 0..3: bit for bit
  EXPECT_FALSE(after[0][4].equal(before[0][4]));
  EXPECT_FALSE(after[0][5].equal(before[0][5]));
  EXPECT_TRUE(after[1].equal(before[1]));
}

TEST(GptTest, ForwardAndBackwardMatchAFloat64Rederivation) {
  Gpt model = small_model();
  const at::Tensor tokens = at::randint(0, 11, {3, 6}, at::kLong);
  const at::Tensor targets = at::randint(0, 11, {3, 6}, at::kLong);
  Reference ref(model);

  const at::Tensor logits = model->forward(tokens);
  const at::Tensor expected = ref.logits(tokens);
  EXPECT_LT((logits.to(at::kDouble) - expected).abs().max().item<double>(), 2e-5);

  // The runner's loss: the dataset's per-example loss, averaged over the batch.
  WorkloadData data;
  data.classes = 11;
  const at::Tensor loss = data.example_loss(logits, targets).mean();
  const at::Tensor ref_loss = ref.loss(tokens, targets);
  EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 2e-6);
  loss.backward();
  ref_loss.backward();
  for (const auto& p : model->named_parameters()) {
    const at::Tensor want = ref.w[p.key()].grad();
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    const double scale = want.abs().max().item<double>();
    EXPECT_GT(scale, 0) << p.key();
    EXPECT_LT((p.value().grad().to(at::kDouble) - want).abs().max().item<double>(), 1e-4 * scale + 1e-7) << p.key();
  }
  // Next-token error: the fraction of positions whose largest logit is not the target.
  const at::Tensor error = data.example_error(logits, targets);
  const double first = (expected[0].argmax(-1).ne(targets[0])).sum().item<double>() / 6.0;
  EXPECT_NEAR(error[0].item<double>(), first, 1e-7);
}

TEST(GptTest, EmbeddingsLayerNormAndBiasesGetNoDecayAndNoTrustRatio) {
  Gpt model = small_model();
  OptimizerSpec spec = resolve_optimizer("lamb", {{"weight_decay", 0.1}});
  const auto lamb = make_optimizer(spec, 1e-3, *model);
  ASSERT_EQ(lamb->param_groups().size(), 2u);
  const auto& adapted = lamb->param_groups()[0];
  const auto& plain = lamb->param_groups()[1];
  EXPECT_EQ(adapted.params().size(), 8u);  // qkv, proj, fc, out weights of 2 blocks
  EXPECT_EQ(plain.params().size(), 20u);   // wte, wpe, 2 x (4 LayerNorm + 4 biases), ln_f's 2
  const auto& options = static_cast<const optim::LAMBOptions&>(plain.options());
  EXPECT_EQ(options.weight_decay(), 0.0);
  EXPECT_FALSE(options.adapt());
  EXPECT_EQ(static_cast<const optim::LAMBOptions&>(adapted.options()).weight_decay(), 0.1);
  const auto in = [](const torch::optim::OptimizerParamGroup& g, const at::Tensor& t) {
    for (const auto& p : g.params()) {
      if (p.is_same(t)) return true;
    }
    return false;
  };
  EXPECT_TRUE(in(plain, model->wte->weight));
  EXPECT_TRUE(in(plain, model->wpe->weight));
  // AdamW: the same two groups, no decay on the plain one.
  spec = resolve_optimizer("adamw", {{"weight_decay", 0.1}});
  const auto adamw = make_optimizer(spec, 1e-3, *model);
  ASSERT_EQ(adamw->param_groups().size(), 2u);
  EXPECT_TRUE(in(adamw->param_groups()[1], model->wte->weight));
  EXPECT_EQ(static_cast<const torch::optim::AdamWOptions&>(adamw->param_groups()[1].options()).weight_decay(), 0.0);
  EXPECT_EQ(static_cast<const torch::optim::AdamWOptions&>(adamw->param_groups()[0].options()).weight_decay(), 0.1);
}

TEST(GptTest, RegistrationChecksItsShapeAndTheData) {
  const ModelRegistration r = gpt_model();
  EXPECT_NE(std::string([&] {
              try {
                r.resolve({{"width", 10}, {"heads", 3}});
              } catch (const std::exception& e) {
                return std::string(e.what());
              }
              return std::string();
            }())
                .find("model.heads: 3 heads do not divide width 10"),
            std::string::npos);
  ModelInput input;
  input.example_shape = {16};
  input.outputs = 30;
  const Model m = r.build(r.resolve({{"layers", 1}, {"width", 8}, {"heads", 2}}), input);
  const at::Tensor out = m.forward(at::zeros({2, 16}, at::kLong));
  EXPECT_EQ(out.sizes(), (std::vector<std::int64_t>{2, 16, 30}));
  input.example_shape = {1, 28, 28};
  EXPECT_THROW(r.build(r.resolve(nlohmann::json::object()), input), c10::Error);
}

}  // namespace
}  // namespace bigbatch::experiments
