// Each optimizer minimizes a badly conditioned quadratic, the Rosenbrock
// function and a small classification problem (both paths share the same
// kernels tested elsewhere, so these run the default fused path).
#include "../../bigbatch.h"

#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <torch/optim/schedulers/step_lr.h>

#include <functional>
#include <ostream>
#include <memory>

namespace {

using namespace bigbatch::optim;
using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

template <typename Opt, typename Options>
Factory make(Options o) {
  return [o](std::vector<at::Tensor> p) { return std::make_unique<Opt>(std::move(p), o); };
}

// Runs `steps` steps of opt on f(params), halving the rate every
// `halve_every` steps with LibTorch's StepLR, and returns the final loss.
double minimize(const Factory& factory, std::vector<at::Tensor> params,
                const std::function<at::Tensor(const std::vector<at::Tensor>&)>& f, int steps,
                int halve_every) {
  auto opt = factory(params);
  torch::optim::StepLR schedule(*opt, halve_every, 0.5);
  for (int s = 0; s < steps; ++s) {
    opt->zero_grad();
    f(params).backward();
    opt->step();
    schedule.step();
  }
  at::NoGradGuard no_grad;
  return f(params).item<double>();
}

// f(w) = 0.5 * sum_i a_i w_i^2 with a_i from 1 to 100 (condition number 100), min 0.
at::Tensor quadratic(const std::vector<at::Tensor>& p) {
  const auto a = at::logspace(0, 2, p[0].numel());
  return 0.5 * (a * p[0] * p[0]).sum();
}

// Rosenbrock (1 - x)^2 + 100 (y - x^2)^2 on w = [x, y], min 0 at (1, 1).
// One tensor: a layer-wise step scales with ||w||, so a lone scalar x could
// never cross 0 on its way from -1.2 to 1.
at::Tensor rosenbrock(const std::vector<at::Tensor>& p) {
  const auto x = p[0][0];
  const auto y = p[0][1];
  return (1 - x).pow(2) + 100 * (y - x * x).pow(2);
}

struct Problem {
  const char* name;
  Factory quadratic;
  Factory rosenbrock;
  Factory classifier;
};

void PrintTo(const Problem& p, std::ostream* os) { *os << p.name; }

class Convergence : public ::testing::TestWithParam<Problem> {};

TEST_P(Convergence, Quadratic) {
  torch::manual_seed(0);
  const auto w = (at::rand({50}) + 0.5).requires_grad_(true);
  const double start = quadratic({w}).item<double>();
  const double end = minimize(GetParam().quadratic, {w}, quadratic, 500, 1000);
  EXPECT_LT(end, 1e-4 * start) << "from " << start;
}

TEST_P(Convergence, Rosenbrock) {
  const auto w = at::tensor({-1.2f, 1.0f}).requires_grad_(true);
  const double end = minimize(GetParam().rosenbrock, {w}, rosenbrock, 4000, 500);
  EXPECT_LT(end, 1e-3);
  EXPECT_NEAR(w[0].item<double>(), 1.0, 0.05);
}

TEST_P(Convergence, SmallClassification) {
  // Three Gaussian blobs in 8 dimensions, an MLP, full-batch training.
  torch::manual_seed(1);
  const auto centres = 3 * at::randn({3, 8});
  const auto labels = at::randint(0, 3, {600});
  const auto x = centres.index_select(0, labels) + at::randn({600, 8});
  torch::nn::Sequential net(torch::nn::Linear(8, 32), torch::nn::ReLU(), torch::nn::Linear(32, 3));
  auto opt = GetParam().classifier(net->parameters());
  for (int s = 0; s < 200; ++s) {
    opt->zero_grad();
    torch::nn::functional::cross_entropy(net->forward(x), labels).backward();
    opt->step();
  }
  at::NoGradGuard no_grad;
  const double accuracy = (net->forward(x).argmax(1) == labels).to(at::kFloat).mean().item<double>();
  EXPECT_GT(accuracy, 0.95);
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, Convergence,
    ::testing::Values(
        Problem{"LARS", make<LARS>(LARSOptions(10.0).trust_coefficient(0.01)),
                make<LARS>(LARSOptions(2.0).trust_coefficient(1e-3)),
                make<LARS>(LARSOptions(0.1))},
        Problem{"LARC", make<LARC>(LARCOptions(0.01)), make<LARC>(LARCOptions(1e-3)),
                make<LARC>(LARCOptions(0.5))},
        Problem{"LAMB", make<LAMB>(LAMBOptions(0.05).weight_decay(0)),
                make<LAMB>(LAMBOptions(0.05).weight_decay(0)), make<LAMB>(LAMBOptions(0.01))},
        Problem{"NovoGrad", make<NovoGrad>(NovoGradOptions(0.05)), make<NovoGrad>(NovoGradOptions(0.005)),
                make<NovoGrad>(NovoGradOptions(0.01))}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
