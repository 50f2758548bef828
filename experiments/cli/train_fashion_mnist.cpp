// bigbatch-fmnist-lamb: trains an MLP on the embedded Fashion-MNIST
// (55k/5k train/validation split, 10k test) with LAMB and the two usual
// parameter groups, printing loss and accuracy per epoch.
// Usage: bigbatch-fmnist-lamb [--epochs N] [--batch-size B] [--lr X] [--seed S]
#include "../../bigbatch.h"
#include "../io/idx.h"

#include <ATen/core/grad_mode.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>

namespace {

struct Args {
  int epochs = 3;
  std::int64_t batch_size = 512;
  double lr = 1e-2;
  std::uint64_t seed = 0;
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    if (key == "--help" || key == "-h") {
      std::cout << "usage: bigbatch-fmnist-lamb [--epochs N] [--batch-size B] [--lr X] [--seed S]\n";
      std::exit(0);
    }
    if (i + 1 >= argc) throw UsageError(key + " needs a value");
    const std::string value = argv[++i];
    try {
      std::size_t used = 0;
      if (key == "--epochs") a.epochs = std::stoi(value, &used);
      else if (key == "--batch-size") a.batch_size = std::stoll(value, &used);
      else if (key == "--lr") a.lr = std::stod(value, &used);
      else if (key == "--seed") a.seed = std::stoull(value, &used);
      else throw UsageError("unknown option " + key);
      if (used != value.size()) throw std::invalid_argument(value);
    } catch (const std::logic_error&) {
      throw UsageError(key + ": not a number: " + value);
    }
  }
  if (a.epochs < 1) throw UsageError("--epochs must be >= 1, got " + std::to_string(a.epochs));
  if (a.batch_size < 1 || a.batch_size > 55000) {
    throw UsageError("--batch-size must be in [1, 55000], got " + std::to_string(a.batch_size));
  }
  if (!(a.lr > 0)) throw UsageError("--lr must be > 0, got " + std::to_string(a.lr));
  return a;
}

// Images as float (N, 784) standardized with Fashion-MNIST's mean and std; labels as int64.
std::pair<at::Tensor, at::Tensor> to_tensors(const bigbatch::experiments::IdxArray& images,
                                             const bigbatch::experiments::IdxArray& labels) {
  const auto n = images.dims[0];
  auto x = at::from_blob(const_cast<std::uint8_t*>(images.data.data()), {n, 28 * 28}, at::kByte)
               .to(at::kFloat)
               .div_(255)
               .sub_(0.2860)
               .div_(0.3530);
  auto y = at::from_blob(const_cast<std::uint8_t*>(labels.data.data()), {n}, at::kByte).to(at::kLong);
  return {x, y};
}

struct Eval {
  double loss;
  double accuracy;
};

Eval evaluate(torch::nn::Sequential& net, const at::Tensor& x, const at::Tensor& y) {
  at::NoGradGuard no_grad;
  const auto logits = net->forward(x);
  return {torch::nn::functional::cross_entropy(logits, y).item<double>(),
          (logits.argmax(1) == y).to(at::kFloat).mean().item<double>()};
}

int run(const Args& a) {
  torch::manual_seed(a.seed);
  const auto data = bigbatch::experiments::load_fashion_mnist();
  auto [train_x, train_y] = to_tensors(data.train_images, data.train_labels);
  auto [test_x, test_y] = to_tensors(data.test_images, data.test_labels);
  const auto val_x = train_x.slice(0, 55000);
  const auto val_y = train_y.slice(0, 55000);
  train_x = train_x.slice(0, 0, 55000);
  train_y = train_y.slice(0, 0, 55000);

  torch::nn::Sequential net(torch::nn::Linear(784, 256), torch::nn::ReLU(),
                            torch::nn::Linear(256, 256), torch::nn::ReLU(), torch::nn::Linear(256, 10));
  const auto options = bigbatch::optim::LAMBOptions(a.lr).weight_decay(0.01);
  bigbatch::optim::LAMB optimizer(bigbatch::optim::layerwise_param_groups(*net, options), options);

  std::printf("Fashion-MNIST MLP 784-256-256-10, LAMB lr %g, batch %lld, %d epochs\n", a.lr,
              static_cast<long long>(a.batch_size), a.epochs);
  const auto start = std::chrono::steady_clock::now();
  for (int epoch = 1; epoch <= a.epochs; ++epoch) {
    const auto order = at::randperm(train_x.size(0));
    double loss_sum = 0;
    std::int64_t batches = 0;
    for (std::int64_t b = 0; b + a.batch_size <= train_x.size(0); b += a.batch_size) {
      const auto idx = order.slice(0, b, b + a.batch_size);
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(net->forward(train_x.index_select(0, idx)),
                                                       train_y.index_select(0, idx));
      loss.backward();
      optimizer.step();
      loss_sum += loss.item<double>();
      ++batches;
    }
    const auto val = evaluate(net, val_x, val_y);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("epoch %d  steps %lld  train loss %.4f  val loss %.4f  val accuracy %.4f  (%.1f s)\n",
                epoch, static_cast<long long>(batches * epoch), loss_sum / std::max<std::int64_t>(batches, 1),
                val.loss, val.accuracy, seconds);
  }
  const auto test = evaluate(net, test_x, test_y);
  std::printf("test loss %.4f  test accuracy %.4f  skipped steps %lld\n", test.loss, test.accuracy,
              static_cast<long long>(optimizer.skipped_steps()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "bigbatch-fmnist-lamb: %s\n", e.what());
    return 2;
  }
  try {
    return run(args);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "bigbatch-fmnist-lamb: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bigbatch-fmnist-lamb: %s\n", e.what());
  }
  return 1;
}
