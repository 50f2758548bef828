// A GPT-style decoder-only Transformer (Radford et al. 2019's GPT-2 layout),
// registered as the model "gpt" (workload.h): token and position
// embeddings, pre-LayerNorm blocks of causal multi-head self-attention and a
// GELU MLP, each added to the residual stream, a final LayerNorm, and the
// output layer tied to the token embedding. Inputs are windows of tokens
// [N, T] (int64), outputs the next token's logits [N, T, vocabulary]: the
// "text" dataset's examples (text.h). docs/workloads.md "Language models".
#pragma once

#include "workload.h"

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>

namespace bigbatch::experiments {

struct GptSpec {
  std::int64_t layers = 2;
  std::int64_t width = 128;  ///< the residual stream's width (d_model)
  std::int64_t heads = 4;    ///< width must be a multiple
  std::int64_t context = 0;  ///< the longest window (position embeddings); 0: the dataset's
  std::int64_t mlp = 4;      ///< the MLP's hidden width, in multiples of width
  double dropout = 0.0;      ///< on the embeddings, the attention weights and each residual branch
  std::int64_t vocabulary = 0;  ///< from the dataset
};

/// Causal multi-head self-attention: one projection to queries, keys and
/// values, compat::causal_attention, an output projection.
class CausalSelfAttentionImpl : public torch::nn::Cloneable<CausalSelfAttentionImpl> {
 public:
  explicit CausalSelfAttentionImpl(const GptSpec& spec);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);  ///< [N, T, width] -> [N, T, width]

  torch::nn::Linear qkv{nullptr}, proj{nullptr};

 private:
  GptSpec spec_;
};
TORCH_MODULE(CausalSelfAttention);

/// x + attn(ln1(x)), then x + mlp(ln2(x)); mlp = fc, GELU, out.
class GptBlockImpl : public torch::nn::Cloneable<GptBlockImpl> {
 public:
  explicit GptBlockImpl(const GptSpec& spec);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::Linear fc{nullptr}, out{nullptr};
  torch::nn::Dropout drop{nullptr};

 private:
  GptSpec spec_;
};
TORCH_MODULE(GptBlock);

class GptImpl : public torch::nn::Cloneable<GptImpl> {
 public:
  explicit GptImpl(const GptSpec& spec);
  /// GPT-2's initialization: weights and embeddings N(0, 0.02), the two
  /// projections into the residual stream N(0, 0.02 / sqrt(2 layers)),
  /// biases 0, LayerNorm scales 1.
  void reset() override;
  at::Tensor forward(const at::Tensor& tokens);  ///< [N, T] int64 -> logits [N, T, vocabulary]
  const GptSpec& spec() const { return spec_; }

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};

 private:
  GptSpec spec_;
};
TORCH_MODULE(Gpt);

/// The registration "gpt".
ModelRegistration gpt_model();

}  // namespace bigbatch::experiments
