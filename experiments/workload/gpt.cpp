// The GPT-style Transformer (gpt.h).
#include "gpt.h"

#include "../../compat/attention.h"
#include "../../config/json_reader.h"

#include <c10/util/Exception.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>

#include <cmath>

namespace bigbatch::experiments {

namespace nn = torch::nn;

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptSpec& spec) : spec_(spec) { reset(); }

void CausalSelfAttentionImpl::reset() {
  qkv = register_module("qkv", nn::Linear(spec_.width, 3 * spec_.width));
  proj = register_module("proj", nn::Linear(spec_.width, spec_.width));
}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& x) {
  const std::int64_t n = x.size(0), t = x.size(1), c = x.size(2), h = spec_.heads;
  // [N, T, 3C] -> three [N, heads, T, C / heads]
  const auto parts = qkv(x).view({n, t, 3, h, c / h}).permute({2, 0, 3, 1, 4}).unbind(0);
  const double p = is_training() ? spec_.dropout : 0.0;
  const at::Tensor y = compat::causal_attention(parts[0], parts[1], parts[2], p);
  return proj(y.transpose(1, 2).reshape({n, t, c}));
}

GptBlockImpl::GptBlockImpl(const GptSpec& spec) : spec_(spec) { reset(); }

void GptBlockImpl::reset() {
  ln1 = register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({spec_.width})));
  attn = register_module("attn", CausalSelfAttention(spec_));
  ln2 = register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({spec_.width})));
  fc = register_module("fc", nn::Linear(spec_.width, spec_.mlp * spec_.width));
  out = register_module("out", nn::Linear(spec_.mlp * spec_.width, spec_.width));
  drop = register_module("drop", nn::Dropout(spec_.dropout));
}

at::Tensor GptBlockImpl::forward(const at::Tensor& x) {
  namespace F = torch::nn::functional;
  const at::Tensor h = x + drop(attn(ln1(x)));
  return h + drop(out(F::gelu(fc(ln2(h)))));
}

GptImpl::GptImpl(const GptSpec& spec) : spec_(spec) {
  TORCH_CHECK(spec.vocabulary >= 1 && spec.context >= 1 && spec.layers >= 1 && spec.heads >= 1 &&
                  spec.width % spec.heads == 0,
              "gpt: vocabulary ", spec.vocabulary, ", context ", spec.context, ", layers ", spec.layers, ", width ",
              spec.width, " in ", spec.heads, " heads");
  reset();
}

void GptImpl::reset() {
  wte = register_module("wte", nn::Embedding(spec_.vocabulary, spec_.width));
  wpe = register_module("wpe", nn::Embedding(spec_.context, spec_.width));
  drop = register_module("drop", nn::Dropout(spec_.dropout));
  blocks = register_module("blocks", nn::ModuleList());
  for (std::int64_t i = 0; i < spec_.layers; ++i) blocks->push_back(GptBlock(spec_));
  ln_f = register_module("ln_f", nn::LayerNorm(nn::LayerNormOptions({spec_.width})));
  at::NoGradGuard no_grad;
  const double residual = 0.02 / std::sqrt(2.0 * static_cast<double>(spec_.layers));
  nn::init::normal_(wte->weight, 0.0, 0.02);
  nn::init::normal_(wpe->weight, 0.0, 0.02);
  for (const auto& module : *blocks) {
    auto& b = *module->as<GptBlock>();
    for (nn::Linear* l : {&b.attn->qkv, &b.fc}) nn::init::normal_((*l)->weight, 0.0, 0.02);
    for (nn::Linear* l : {&b.attn->proj, &b.out}) nn::init::normal_((*l)->weight, 0.0, residual);
    for (nn::Linear* l : {&b.attn->qkv, &b.attn->proj, &b.fc, &b.out}) nn::init::zeros_((*l)->bias);
  }
}

at::Tensor GptImpl::forward(const at::Tensor& tokens) {
  TORCH_CHECK(tokens.dim() == 2, "gpt: tokens must be [N, T], got ", tokens.sizes());
  const std::int64_t t = tokens.size(1);
  TORCH_CHECK(t <= spec_.context, "gpt: a window of ", t, " tokens is longer than the model's context ", spec_.context);
  const at::Tensor positions = at::arange(t, tokens.options().dtype(at::kLong));
  at::Tensor x = drop(wte(tokens) + wpe(positions));
  for (const auto& module : *blocks) x = module->as<GptBlock>()->forward(x);
  // The output layer is the token embedding (weight tying, Press & Wolf 2017).
  return torch::nn::functional::linear(ln_f(x), wte->weight);
}

namespace {

GptSpec gpt_spec(const nlohmann::json& params) {
  config::JsonReader r(params, "model");
  GptSpec s;
  const auto positive = [&](const char* key, std::int64_t fallback, std::int64_t least) {
    const std::int64_t v = r.integer(key, fallback);
    if (v < least) config::config_error(r.path_of(key), "must be >= " + std::to_string(least) + ", got " + std::to_string(v));
    return v;
  };
  s.layers = positive("layers", s.layers, 1);
  s.width = positive("width", s.width, 1);
  s.heads = positive("heads", s.heads, 1);
  if (s.width % s.heads != 0) {
    config::config_error(r.path_of("heads"), std::to_string(s.heads) + " heads do not divide width " +
                                                 std::to_string(s.width));
  }
  s.context = positive("context", s.context, 0);
  s.mlp = positive("mlp", s.mlp, 1);
  s.dropout = r.number("dropout", s.dropout);
  if (!(s.dropout >= 0 && s.dropout < 1)) {
    config::config_error(r.path_of("dropout"), "must be in [0, 1), got " + std::to_string(s.dropout));
  }
  r.finish();
  return s;
}

nlohmann::json gpt_json(const GptSpec& s) {
  return {{"layers", s.layers}, {"width", s.width}, {"heads", s.heads},
          {"context", s.context}, {"mlp", s.mlp},   {"dropout", s.dropout}};
}

}  // namespace

ModelRegistration gpt_model() {
  return {"gpt", [](const nlohmann::json& p) { return gpt_json(gpt_spec(p)); },
          [](const nlohmann::json& p, const ModelInput& input) -> Model {
            GptSpec s = gpt_spec(p);
            TORCH_CHECK(input.example_shape.size() == 1,
                        "gpt: needs windows of tokens (examples of shape [T], a \"text\" dataset), got examples of "
                        "shape ", c10::IntArrayRef(input.example_shape));
            const std::int64_t window = input.example_shape[0];
            if (s.context == 0) s.context = window;
            TORCH_CHECK(window <= s.context, "gpt: model.context ", s.context, " is shorter than the dataset's windows of ",
                        window, " tokens");
            s.vocabulary = input.outputs;
            return Gpt(s);
          }};
}

}  // namespace bigbatch::experiments
