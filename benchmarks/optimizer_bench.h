// What the CPU and CUDA optimizer and compression benchmarks share: named
// lists of parameter tensors (BERT-large-like, ResNet-50-like), and an
// optimizer factory that takes the path (fused or not).
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace bigbatch::bench {

struct ParamList {
  const char* name;
  std::vector<std::int64_t> sizes;
  std::int64_t total() const {
    std::int64_t n = 0;
    for (auto s : sizes) n += s;
    return n;
  }
};

/// A list with each tensor's shape (what PowerSGD sees as matrices).
struct ShapeList {
  const char* name;
  std::vector<std::vector<std::int64_t>> shapes;
  ParamList sizes() const {
    ParamList p{name, {}};
    for (const auto& s : shapes) {
      std::int64_t n = 1;
      for (auto d : s) n *= d;
      p.sizes.push_back(n);
    }
    return p;
  }
};

/// BERT-large: embeddings (30522 + 512 + 2) x 1024 with a LayerNorm, 24
/// layers of Q, K, V, O (1024x1024 + bias), two LayerNorms, 1024x4096 and
/// 4096x1024 with biases; the pooler and the MLM head transform: 336M in 396
/// tensors.
inline ShapeList bert_large() {
  ShapeList p{"bert_large_335M", {{30522, 1024}, {512, 1024}, {2, 1024}, {1024}, {1024}}};
  for (int layer = 0; layer < 24; ++layer) {
    for (int k = 0; k < 4; ++k) {
      p.shapes.push_back({1024, 1024});
      p.shapes.push_back({1024});
    }
    for (int k = 0; k < 4; ++k) p.shapes.push_back({1024});  // two LayerNorms
    p.shapes.push_back({4096, 1024});
    p.shapes.push_back({4096});
    p.shapes.push_back({1024, 4096});
    p.shapes.push_back({1024});
  }
  for (const auto& s : std::vector<std::vector<std::int64_t>>{{1024, 1024}, {1024}, {1024, 1024}, {1024}, {1024}, {1024}, {30522}}) {
    p.shapes.push_back(s);
  }
  return p;
}

/// The hidden matrices of a GPT of `layers` blocks of `width`: Q, K, V as one
/// (3w, w), the projection (w, w), the MLP's (4w, w) and (w, 4w).
inline ShapeList gpt_matrices(const char* name, int layers, std::int64_t width) {
  ShapeList p{name, {}};
  for (int l = 0; l < layers; ++l) {
    p.shapes.push_back({3 * width, width});
    p.shapes.push_back({width, width});
    p.shapes.push_back({4 * width, width});
    p.shapes.push_back({width, 4 * width});
  }
  return p;
}

/// ResNet-50: the 53 convolutions with their BatchNorm weight and bias, and
/// the 2048x1000 classifier: ~25.5M in 161 tensors.
inline ShapeList resnet50() {
  ShapeList p{"resnet50_25M", {}};
  auto conv_bn = [&](std::int64_t in, std::int64_t out, std::int64_t k) {
    p.shapes.push_back({out, in, k, k});
    p.shapes.push_back({out});
    p.shapes.push_back({out});
  };
  conv_bn(3, 64, 7);
  std::int64_t in = 64;
  const std::int64_t widths[] = {64, 128, 256, 512};
  const int blocks[] = {3, 4, 6, 3};
  for (int stage = 0; stage < 4; ++stage) {
    const std::int64_t w = widths[stage];
    for (int b = 0; b < blocks[stage]; ++b) {
      conv_bn(in, w, 1);
      conv_bn(w, w, 3);
      conv_bn(w, 4 * w, 1);
      if (b == 0) conv_bn(in, 4 * w, 1);  // the projection shortcut
      in = 4 * w;
    }
  }
  p.shapes.push_back({1000, 2048});
  p.shapes.push_back({1000});
  return p;
}

/// (parameters, fused) -> the optimizer.
using Make = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>, bool)>;

template <typename Opt, typename Options>
Make maker(Options o) {
  return [o](std::vector<at::Tensor> params, bool fused) {
    Options copy = o;
    copy.fused(fused);
    return std::make_unique<Opt>(std::move(params), copy);
  };
}

}  // namespace bigbatch::bench
