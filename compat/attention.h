// Causal scaled-dot-product attention: LibTorch 2.x's fused
// at::scaled_dot_product_attention (flash or memory-efficient kernels where
// the device has them), and the same attention written out for 1.13, which
// has no public fused one. Apart from torch_compat.h because it needs ATen's
// operators, which most users of that header do not.
#pragma once

#include <ATen/ATen.h>
#include <torch/version.h>

#include <cmath>
#include <limits>

namespace bigbatch::compat {

/// Whether causal_attention runs LibTorch's fused operator.
constexpr bool kFusedAttention = TORCH_VERSION_MAJOR >= 2;

/// softmax(q k^T / sqrt(d) + causal mask) v, with dropout on the weights
/// (dropout_p > 0 while training). q, k, v: [N, heads, T, d].
inline at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout_p) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, {}, dropout_p, /*is_causal=*/true);
#else
  const std::int64_t t = q.size(-2);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  const at::Tensor future = at::ones({t, t}, q.options().dtype(at::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  at::Tensor weights = at::softmax(scores, -1);
  if (dropout_p > 0) weights = at::dropout(weights, dropout_p, /*train=*/true);
  return at::matmul(weights, v);
#endif
}

}  // namespace bigbatch::compat
