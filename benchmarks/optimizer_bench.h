// What the CPU and CUDA optimizer benchmarks share: a named list of parameter
// tensor sizes, and an optimizer factory that takes the path (fused or not).
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
