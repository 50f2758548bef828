// Local SGD and DiLoCo (distributed/local_sgd.h) over Gloo ranks on
// 127.0.0.1: one synchronization per step against synchronous data
// parallelism, DiLoCo with streaming fragments against a float64
// re-derivation of Douillard et al.'s Algorithm 1, the bytes of one
// synchronization against the fragments' sizes, and the pseudo-gradients
// through a compressor.
#include "../../distributed/local_sgd.h"
#include "../../distributed/process_group.h"

#include "ranks.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace bigbatch::test {
namespace {

namespace bd = bigbatch::distributed;
namespace F = torch::nn::functional;
constexpr std::int64_t kPer = 4;  // rows per rank and step
constexpr std::int64_t kSteps = 10;
constexpr double kInnerLr = 0.05;

torch::nn::Sequential net_of(std::uint64_t seed, at::ScalarType dtype) {
  at::manual_seed(seed);
  torch::nn::Sequential net(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 3));
  net->to(dtype);
  return net;
}

// Every step's global batch: world x kPer rows; rank r trains on its r-th kPer.
std::pair<at::Tensor, at::Tensor> rows(int world, at::ScalarType dtype) {
  auto gen = at::detail::createCPUGenerator(321);
  const std::int64_t n = kSteps * world * kPer;
  return {at::randn({n, 6}, gen, at::kDouble).to(dtype), at::randint(3, {n}, gen, at::kLong)};
}

at::Tensor flat(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> parts;
  for (const auto& p : params) parts.push_back(p.detach().reshape({-1}).to(at::kDouble));
  return at::cat(parts);
}

void write_doubles(const std::string& path, const at::Tensor& t) {
  std::ofstream out(path, std::ios::binary);
  const at::Tensor c = t.to(at::kDouble).contiguous();
  out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.numel() * sizeof(double)));
}

at::Tensor read_doubles(const std::string& path, std::int64_t n) {
  std::ifstream in(path, std::ios::binary);
  at::Tensor t = at::empty({n}, at::kDouble);
  in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(n * sizeof(double)));
  EXPECT_TRUE(in.good()) << path;
  return t;
}

// A rank's loss on its share of step s's global batch, backward run.
void backward_share(torch::nn::Sequential& net, const std::pair<at::Tensor, at::Tensor>& data, std::int64_t s,
                    int rank, int world) {
  const std::int64_t begin = (s * world + rank) * kPer;
  F::cross_entropy(net->forward(data.first.slice(0, begin, begin + kPer)), data.second.slice(0, begin, begin + kPer))
      .backward();
}

// --------------------------------------------------------------- the ranks --
//   dp:DTYPE           synchronous data parallelism, SGD with momentum (float:
//                      the toolkit's allreduce_gradients; double: an all-reduce in double)
//   local:DTYPE:H      local SGD every H steps, the same SGD
//   diloco:H:P         DiLoCo, AdamW inner, Nesterov outer, P fragments (double)
//   bytes              one synchronization's bytes with 1 and 4 fragments
//   topk               DiLoCo's pseudo-gradients through top-k with error feedback

at::ScalarType dtype_of(const std::string& name) { return name == "double" ? at::kDouble : at::kFloat; }

std::vector<std::string> fields(const std::string& s) {
  std::vector<std::string> out(1);
  for (const char c : s) {
    if (c == ':') {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

}  // namespace

int local_sgd_worker(const std::string& scenario) {
  const bd::WorldInfo world = bd::world_from_env();
  const std::string out = std::string(std::getenv("BIGBATCH_DIST_OUT")) + "." + std::to_string(world.rank);
  bd::ProcessGroup group(world, std::chrono::seconds(60));
  const std::vector<std::string> f = fields(scenario);
  const int w = world.world_size;
  if (f[0] == "bytes") {  // 3 layers of unequal sizes; the fragments are equal runs of elements
    std::ofstream report(out);
    for (const std::int64_t p : {1, 4}) {
      at::manual_seed(7);
      torch::nn::Sequential net(torch::nn::Linear(30, 24), torch::nn::Linear(24, 8), torch::nn::Linear(8, 2));
      bd::broadcast_module(group, *net);
      bd::LocalSgdSpec spec;
      spec.every = 4;
      spec.fragments = p;
      bd::LocalSgd sync(spec, net->parameters());
      for (std::int64_t s = 1; s <= 8; ++s) {
        {
          at::NoGradGuard no_grad;
          for (auto& q : net->parameters()) q.add_(0.01 * (world.rank + 1));
        }
        sync.after_step(&group, s);
      }
      report << p << ' ' << sync.totals().rounds << ' ' << sync.totals().fragment_syncs << ' '
             << sync.totals().peak_round_bytes << ' ' << sync.totals().bytes_sent << ' '
             << sync.totals().dense_bytes << '\n';
    }
    return 0;
  }
  const bool local = f[0] != "dp";
  const at::ScalarType dtype = f[0] == "diloco" || f[0] == "topk" ? at::kDouble : dtype_of(f[1]);
  auto net = net_of(100 + world.rank, dtype);  // different seeds: the broadcast makes them equal
  bd::broadcast_module(group, *net);
  const auto data = rows(w, dtype);
  std::unique_ptr<torch::optim::Optimizer> opt;
  bd::LocalSgdSpec spec;
  if (f[0] == "dp" || f[0] == "local") {
    opt = std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(kInnerLr).momentum(0.9));
    if (local) spec.every = std::stoll(f[2]);
  } else {
    opt = std::make_unique<torch::optim::AdamW>(net->parameters(),
                                                torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    spec.type = bd::SyncType::kDiloco;
    spec.outer = bd::diloco_outer();
    spec.every = f[0] == "topk" ? 2 : std::stoll(f[1]);
    spec.fragments = f[0] == "topk" ? 1 : std::stoll(f[2]);
    if (f[0] == "topk") {
      spec.compression.method = bd::Compression::kTopK;
      spec.compression.ratio = f.size() > 1 ? std::stod(f[1]) : 0.1;
      spec.compression.seed = 3;
    }
  }
  std::unique_ptr<bd::LocalSgd> sync;
  if (local) sync = std::make_unique<bd::LocalSgd>(spec, net->parameters());
  std::ofstream report(out + ".txt");
  for (std::int64_t s = 0; s < kSteps; ++s) {
    opt->zero_grad();
    backward_share(net, data, s, world.rank, w);
    if (!local) {
      if (dtype == at::kFloat) {
        bd::allreduce_gradients(group, net->parameters());
      } else {
        for (auto& p : net->parameters()) {
          std::vector<at::Tensor> grad{p.grad()};
          group.allreduce_sum(grad);
          p.mutable_grad().div_(w);
        }
      }
    }
    opt->step();
    if (sync && sync->after_step(&group, s + 1) && f[0] == "topk") {
      // The ranks leave every synchronization with one model, bit for bit.
      const auto all = group.allgather(flat(net->parameters()));
      report << "agree " << at::equal(all[0], all[1]) << '\n';
    }
  }
  if (sync) sync->finish(&group, kSteps);
  if (sync) {
    report << "sent " << sync->totals().bytes_sent << " dense " << sync->totals().dense_bytes << '\n';
  }
  write_doubles(out, flat(net->parameters()));
  return 0;
}

namespace {

std::vector<at::Tensor> run_ranks(const std::string& scenario, int world, std::int64_t n) {
  const std::string out = tmp(scenario);
  const Ranks r = launch(scenario, out, world, 120);
  std::vector<at::Tensor> params;
  for (int k = 0; k < world; ++k) {
    EXPECT_EQ(r.status[k], 0) << scenario << " rank " << k << ": " << slurp(r.logs[k]);
    params.push_back(read_doubles(out + "." + std::to_string(k), n));
  }
  return params;
}

std::int64_t parameter_count() { return flat(net_of(100, at::kFloat)->parameters()).numel(); }

// |a - b|_inf relative to the largest change from the start.
double relative(const at::Tensor& a, const at::Tensor& b, const at::Tensor& start) {
  return (a - b).abs().max().item<double>() / (b - start).abs().max().item<double>();
}

TEST(LocalSgd, OneStepBetweenSynchronizationsIsSynchronousDataParallelism) {
  const std::int64_t n = parameter_count();
  const at::Tensor start = flat(net_of(100, at::kDouble)->parameters());
  // In float64 the two differ by rounding only: the average of (anchor -
  // lr m_r) is anchor - lr mean(m_r) in exact arithmetic.
  const auto dp = run_ranks("local_sgd:dp:double", 2, n);
  const auto h1 = run_ranks("local_sgd:local:double:1", 2, n);
  EXPECT_TRUE(at::equal(h1[0], h1[1])) << "the ranks left the last synchronization with different models";
  const double d = relative(h1[0], dp[0], start);
  EXPECT_LT(d, 1e-12) << "H = 1 against synchronous SGD";
  // Two local steps are another algorithm, and the test sees it.
  const auto h2 = run_ranks("local_sgd:local:double:2", 2, n);
  EXPECT_GT(relative(h2[0], dp[0], start), 1e3 * std::max(d, 1e-16)) << "H = 2 looks like synchronous SGD";
  // In fp32, against the toolkit's own all-reduce of the gradients: the
  // parameters' difference, anchor - (anchor - lr m_r), rounds once more.
  const auto dp32 = run_ranks("local_sgd:dp:float", 2, n);
  const auto h1_32 = run_ranks("local_sgd:local:float:1", 2, n);
  const double d32 = relative(h1_32[0], dp32[0], start);
  EXPECT_LT(d32, 1e-5);
  std::cout << "H = 1 against synchronous SGD, max difference over the largest change: " << d << " (float64), "
            << d32 << " (fp32); H = 2: " << relative(h2[0], dp[0], start) << "\n";
}

// Douillard et al. 2023, Algorithm 1, with Streaming DiLoCo's fragments, in
// float64 over `world` simulated workers, on the parameters as one flat
// vector: each worker trains kPer rows a step with its own AdamW (torch's
// update: decoupled decay, bias-corrected moments); fragment p, the elements
// [p N / P, (p + 1) N / P), is averaged after the steps t with t mod H =
// p H / P, and at the end, with an outer Nesterov step (rate 0.7, momentum
// 0.9) on the averaged pseudo-gradient.
at::Tensor diloco_reference(int world, std::int64_t h, std::int64_t p) {
  auto net = net_of(100, at::kDouble);
  std::vector<std::vector<std::int64_t>> shapes;
  for (const auto& q : net->parameters()) shapes.push_back(q.sizes().vec());
  at::Tensor anchor = flat(net->parameters());
  const std::int64_t n = anchor.numel();
  std::vector<at::Tensor> theta(world, anchor), m(world, at::zeros({n}, at::kDouble)), v = m;
  at::Tensor b = at::zeros({n}, at::kDouble);
  const auto data = rows(world, at::kDouble);
  const double lr = 1e-2, wd = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  for (std::int64_t s = 0; s < kSteps; ++s) {
    for (int r = 0; r < world; ++r) {
      std::vector<at::Tensor> leaf;  // W1, b1, W2, b2 from the flat vector
      std::int64_t at_ = 0;
      for (const auto& shape : shapes) {
        std::int64_t k = 1;
        for (const auto d : shape) k *= d;
        leaf.push_back(theta[r].slice(0, at_, at_ + k).reshape(shape).clone().requires_grad_(true));
        at_ += k;
      }
      const std::int64_t begin = (s * world + r) * kPer;
      const at::Tensor x = data.first.slice(0, begin, begin + kPer);
      const at::Tensor hidden = at::tanh(at::matmul(x, leaf[0].t()) + leaf[1]);
      F::cross_entropy(at::matmul(hidden, leaf[2].t()) + leaf[3], data.second.slice(0, begin, begin + kPer))
          .backward();
      std::vector<at::Tensor> grads;
      for (const auto& l : leaf) grads.push_back(l.grad().reshape({-1}));
      const at::Tensor g = at::cat(grads);
      const double t = static_cast<double>(s + 1);
      m[r] = b1 * m[r] + (1 - b1) * g;
      v[r] = b2 * v[r] + (1 - b2) * g * g;
      const at::Tensor m_hat = m[r] / (1 - std::pow(b1, t)), v_hat = v[r] / (1 - std::pow(b2, t));
      theta[r] = theta[r] * (1 - lr * wd) - lr * m_hat / (at::sqrt(v_hat) + eps);
    }
    for (std::int64_t frag = 0; frag < p; ++frag) {
      if ((s + 1) % h != frag * h / p && s + 1 != kSteps) continue;
      const std::int64_t lo = frag * n / p, hi = (frag + 1) * n / p;
      at::Tensor mean = at::zeros({hi - lo}, at::kDouble);
      for (int r = 0; r < world; ++r) mean += theta[r].slice(0, lo, hi);
      mean /= world;
      const at::Tensor delta = anchor.slice(0, lo, hi) - mean;
      const at::Tensor momentum = 0.9 * b.slice(0, lo, hi) + delta;
      const at::Tensor next = anchor.slice(0, lo, hi) - 0.7 * (delta + 0.9 * momentum);
      b = at::cat({b.slice(0, 0, lo), momentum, b.slice(0, hi, n)});
      anchor = at::cat({anchor.slice(0, 0, lo), next, anchor.slice(0, hi, n)});
      for (int r = 0; r < world; ++r) theta[r] = at::cat({theta[r].slice(0, 0, lo), next, theta[r].slice(0, hi, n)});
    }
  }
  return anchor;
}

TEST(LocalSgd, DilocoIsAlgorithmOneInFloat64) {
  const std::int64_t n = parameter_count();
  const at::Tensor start = flat(net_of(100, at::kDouble)->parameters());
  // The fragments local_sgd.h promises: the joined elements cut in equal
  // runs. The net's tensors hold 48, 8, 24 and 3 elements (83): halves [0, 41), [41, 83).
  auto net = net_of(100, at::kDouble);
  bd::LocalSgdSpec two;
  two.fragments = 2;
  two.every = 4;
  using Piece = bd::LocalSgd::Piece;
  EXPECT_EQ(bd::LocalSgd(two, net->parameters()).fragments(),
            (std::vector<std::vector<Piece>>{{{0, 0, 41}}, {{0, 41, 48}, {1, 0, 8}, {2, 0, 24}, {3, 0, 3}}}));
  for (const int world : {2, 4}) {
    for (const std::int64_t p : {1, 2}) {
      const std::int64_t h = 4;
      const auto got = run_ranks("local_sgd:diloco:" + std::to_string(h) + ":" + std::to_string(p), world, n);
      const at::Tensor want = diloco_reference(world, h, p);
      for (int r = 0; r < world; ++r) {
        EXPECT_LT(relative(got[r], want, start), 1e-10) << world << " ranks, " << p << " fragments, rank " << r;
      }
    }
  }
}

TEST(LocalSgd, FragmentsCutOneSynchronizationsBytes) {
  const std::string out = tmp("local_sgd_bytes");
  const int world = 2;
  const Ranks r = launch("local_sgd:bytes", out, world, 120);
  ASSERT_EQ(r.status, (std::vector<int>{0, 0})) << slurp(r.logs[0]) << slurp(r.logs[1]);
  std::ifstream in(out + ".0");
  // 30 x 24 + 24 + 24 x 8 + 8 + 8 x 2 + 2 = 962 fp32 elements, cut in 4
  // runs of 240 or 241 (the largest); a ring all-reduce of N bytes sends 2 (W - 1) / W N.
  const double model = 962 * 4.0 * 2 * (world - 1) / world, largest = 241 * 4.0 * 2 * (world - 1) / world;
  double peak1 = 0, total1 = 0;
  for (int k = 0; k < 2; ++k) {
    std::int64_t p = 0, rounds = 0, syncs = 0;
    double peak = 0, sent = 0, dense = 0;
    ASSERT_TRUE(in >> p >> rounds >> syncs >> peak >> sent >> dense);
    // 8 steps at H = 4: fragment 0 after 4 and 8; with 4 fragments, fragment q also after q, 4 + q.
    EXPECT_EQ(syncs, 2 * p);
    EXPECT_EQ(rounds, p == 1 ? 2 : 8);
    EXPECT_DOUBLE_EQ(sent, dense);  // uncompressed fp32
    EXPECT_DOUBLE_EQ(sent, 2 * model);
    EXPECT_DOUBLE_EQ(peak, p == 1 ? model : largest);
    if (p == 1) {
      peak1 = peak;
      total1 = sent;
    } else {
      std::cout << "one synchronization's peak: " << peak1 << " bytes with 1 fragment, " << peak << " with 4 ("
                << peak / peak1 << "x); in all " << total1 << " and " << sent << "\n";
    }
  }
}

TEST(LocalSgd, PseudoGradientsThroughTopKWithErrorFeedback) {
  const std::int64_t n = parameter_count();
  const std::string out = tmp("local_sgd:topk");
  const auto got = run_ranks("local_sgd:topk", 2, n);
  EXPECT_TRUE(at::equal(got[0], got[1]));
  const std::string report = slurp(out + ".0.txt");
  EXPECT_EQ(report.find("agree 0"), std::string::npos) << report;
  EXPECT_NE(report.find("agree 1"), std::string::npos) << report;
  double sent = 0, dense = 0;
  ASSERT_EQ(std::sscanf(report.substr(report.find("sent")).c_str(), "sent %lf dense %lf", &sent, &dense), 2) << report;
  // Each synchronization all-gathers 10% of each bucket's values and int32
  // indices: well under the dense all-reduce.
  EXPECT_LT(sent, 0.5 * dense) << report;
  // The model moved from its start: the compressed average is not nothing.
  const at::Tensor start = flat(net_of(100, at::kDouble)->parameters());
  EXPECT_GT((got[0] - start).abs().max().item<double>(), 1e-3);
  // Top-k of everything is the average itself, through fp32 buckets: the
  // uncompressed run's parameters to fp32 rounding (a sum for a mean, or a
  // memory added twice, is far off).
  const auto all = run_ranks("local_sgd:topk:1", 2, n);
  const auto plain = run_ranks("local_sgd:diloco:2:1", 2, n);
  EXPECT_LT(relative(all[0], plain[0], start), 1e-5);
  EXPECT_GT(relative(got[0], plain[0], start), 1e-3) << "10% top-k sent everything";
}

TEST(LocalSgd, EvaluationsSeeTheLastSynchronizedModelAndBuffers) {
  // A world of one: the outer step alone. The parameter moves by a local
  // step; until its synchronization the global view is the start.
  at::Tensor p = at::tensor({1.0, 2.0}), b = at::tensor({3.0});
  bd::LocalSgdSpec s;
  s.every = 2;
  bd::LocalSgd sync(s, {p}, {b, at::tensor({7}, at::kLong)});
  p.copy_(at::tensor({5.0, 5.0}));
  b.fill_(7.0);
  EXPECT_FALSE(sync.after_step(nullptr, 1));
  {
    bd::LocalSgd::Global global(sync);
    EXPECT_TRUE(at::equal(p, at::tensor({1.0, 2.0})));
    EXPECT_TRUE(at::equal(b, at::tensor({3.0})));
  }
  EXPECT_TRUE(at::equal(p, at::tensor({5.0, 5.0})));  // this rank's own, back
  EXPECT_TRUE(at::equal(b, at::tensor({7.0})));
  EXPECT_TRUE(sync.after_step(nullptr, 2));  // the average of one: its own
  p.copy_(at::tensor({6.0, 6.0}));
  {
    bd::LocalSgd::Global global(sync);
    EXPECT_TRUE(at::equal(p, at::tensor({5.0, 5.0})));
    EXPECT_TRUE(at::equal(b, at::tensor({7.0})));
  }
  EXPECT_DOUBLE_EQ(sync.totals().last_outer_norm, 5.0);  // |(5, 5) - (1, 2)|
}

TEST(LocalSgd, RefusesABadSpecNamingTheField) {
  auto net = net_of(1, at::kFloat);
  const auto refused = [&](bd::LocalSgdSpec s, const std::string& words) {
    try {
      bd::LocalSgd sync(s, net->parameters());
      ADD_FAILURE() << "accepted: " << words;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find(words), std::string::npos) << e.what_without_backtrace();
    }
  };
  bd::LocalSgdSpec s;
  s.every = 0;
  refused(s, "every must be >= 1 (steps), got 0");
  s.every = 6;
  s.fragments = 4;
  refused(s, "every (6) must divide by fragments (4)");
  s.every = 100;
  s.fragments = 100;
  refused(s, "fragments (100) must not exceed the parameters' elements (83)");
  s.fragments = 1;
  s.outer.momentum = 1;
  refused(s, "outer.momentum must be in [0, 1), got 1");
  s.outer.momentum = 0;
  s.outer.lr = -1;
  refused(s, "outer.lr must be > 0, got -1");
  s.outer.lr = 1;
  s.outer.momentum = 0.9;
  refused(s, "local_sgd averages the models (outer lr 1, momentum 0), got outer lr 1, momentum 0.9");
  s.outer.momentum = 0;
  s.type = bd::SyncType::kEveryStep;
  refused(s, "type must be local_sgd or diloco");
}

}  // namespace
}  // namespace bigbatch::test
