// What the golden tests (golden_test.cpp, engine_test.cpp) compare: a run's
// tensors against the float64 reference of reference64.h, to fp32 rounding.
#pragma once

#include "reference64.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

namespace golden {

using ref64::Vec;

inline Vec to_vec(const at::Tensor& t) {
  const at::Tensor d = t.detach().to(at::kCPU).to(at::kDouble).contiguous();
  return Vec(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

/// The library's tensors after some steps, the reference's, and where both started.
struct GoldenRun {
  std::vector<at::Tensor> params;
  std::vector<Vec> ref;
  std::vector<Vec> start;
  std::unique_ptr<torch::optim::Optimizer> opt;
  std::vector<ref64::State> states;  ///< the reference's (golden_test.cpp fills it)
};

// Asserts that every element is within fp32 rounding of the float64
// reference, and that the steps moved the weights (else the check is empty).
inline void expect_fp32_close(const GoldenRun& r, const std::string& what) {
  double moved = 0;
  double total = 0;
  for (std::size_t k = 0; k < r.params.size(); ++k) {
    const Vec got = to_vec(r.params[k]);
    double scale = 0;
    for (double e : r.ref[k]) scale = std::max(scale, std::abs(e));
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], r.ref[k][i], 2e-5 * scale + 1e-6) << what << ", tensor " << k << ", element " << i;
      moved += std::abs(r.ref[k][i] - r.start[k][i]);
      total += std::abs(r.start[k][i]);
    }
  }
  EXPECT_GT(moved, 1e-3 * total) << what;
}

}  // namespace golden
