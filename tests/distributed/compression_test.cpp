// Gradient compression (distributed/compression.h): each compressor against a
// float64 re-derivation of its math on fixed inputs (a world of one, Gloo),
// error feedback's conservation, the unbiased compressors' means, the state
// of a checkpoint, bad parameters; and over 2 ranks (processes): the exchange
// against the re-derivation from both ranks' gradients, identical parameters
// on both ranks after every step, the bytes against their formula, and
// `none` against the exchange written out (cat, all-reduce, divide) bit for bit.
#include "../../distributed/compression.h"
#include "../../kernels/compress.h"

#include "ranks.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace {

namespace bd = bigbatch::distributed;
using bd::Compression;

bd::CompressionSpec spec_of(Compression method) {
  bd::CompressionSpec s;
  s.method = method;
  return s;
}

// A world of one on Gloo: its collectives run and change nothing, so the
// exchange's output is this rank's compressed gradient.
bd::ProcessGroup& solo() {
  static bd::ProcessGroup group(
      [] {
        bd::WorldInfo w;
        w.master_port = bigbatch::testing_support::free_port();
        return w;
      }(),
      std::chrono::seconds(30));
  return group;
}

// Leaf tensors of the given shapes whose gradients a test sets.
using Shapes = std::vector<std::vector<std::int64_t>>;

struct Params {
  std::vector<at::Tensor> p;
  explicit Params(const std::vector<std::vector<std::int64_t>>& shapes) {
    for (const auto& s : shapes) p.push_back(at::zeros(s).requires_grad_(true));
  }
  // Sets the gradients, runs the exchange, returns the gradients it left (double).
  std::vector<at::Tensor> exchange(bd::GradientExchange& ex, const std::vector<at::Tensor>& grads,
                                   bd::ProcessGroup& group = solo()) {
    for (std::size_t i = 0; i < p.size(); ++i) p[i].mutable_grad() = grads[i].to(at::kFloat).clone();
    ex.exchange(group, p);
    std::vector<at::Tensor> out;
    for (const auto& t : p) out.push_back(t.grad().to(at::kDouble));
    return out;
  }
};

std::vector<at::Tensor> random_grads(const std::vector<std::vector<std::int64_t>>& shapes, std::uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  std::vector<at::Tensor> g;
  for (const auto& s : shapes) g.push_back(at::randn(s, gen, at::kFloat));
  return g;
}

double rel(const at::Tensor& got, const at::Tensor& want) {
  return (got.to(at::kDouble) - want.to(at::kDouble)).norm().item<double>() /
         std::max(want.to(at::kDouble).norm().item<double>(), 1e-30);
}

// ------------------------------------------------------------ references --
// Float64, flat; each returns what is sent and updates the memory it keeps.

// The k largest |a| kept, the rest zero.
at::Tensor top_k(const at::Tensor& a, std::int64_t k) {
  const at::Tensor order = std::get<1>(a.abs().sort(0, /*descending=*/true));
  at::Tensor out = at::zeros_like(a);
  const at::Tensor idx = order.slice(0, 0, k);
  out.index_put_({idx}, a.index_select(0, idx));
  return out;
}

std::int64_t kept(double ratio, std::int64_t n) {
  return std::max<std::int64_t>(1, std::min<std::int64_t>(n, std::llround(ratio * static_cast<double>(n))));
}

at::Tensor topk_ref(const at::Tensor& g, at::Tensor& e, double ratio) {
  const at::Tensor a = g + e;
  const at::Tensor sent = top_k(a, kept(ratio, a.numel()));
  e = a - sent;
  return sent;
}

// Each tensor (of `sizes`, in order) its own scale.
at::Tensor sign_ref(const at::Tensor& g, at::Tensor& e, const std::vector<std::int64_t>& sizes) {
  const at::Tensor a = g + e;
  at::Tensor sent = at::empty_like(a);
  std::int64_t begin = 0;
  for (const std::int64_t size : sizes) {
    const at::Tensor part = a.slice(0, begin, begin + size);
    const double scale = part.abs().mean().item<double>();
    sent.slice(0, begin, begin + size) = at::where(part >= 0, at::full_like(part, scale), at::full_like(part, -scale));
    begin += size;
  }
  e = a - sent;
  return sent;
}

// DGC at step t: u = m u + g, v = v + u, the top-k of v sent and cleared in v and u.
at::Tensor dgc_ref(const at::Tensor& g, at::Tensor& u, at::Tensor& v, const bd::CompressionSpec& s, std::int64_t t) {
  u = s.momentum * u + g;
  v = v + u;
  double ratio = s.ratio;
  if (t < s.warmup_steps && s.ratio < 0.25) ratio = 0.25 * std::pow(s.ratio / 0.25, double(t) / s.warmup_steps);
  const at::Tensor sent = top_k(v, kept(ratio, v.numel()));
  const at::Tensor mask = sent != 0;
  v = at::where(mask, at::zeros_like(v), v);
  u = at::where(mask, at::zeros_like(u), u);
  return sent;
}

at::Tensor flat(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> parts;
  for (const auto& t : ts) parts.push_back(t.reshape({-1}).to(at::kDouble));
  return at::cat(parts);
}

// ------------------------------------------------------------ world of one --

TEST(Compression, HalfPrecisionRoundsOnceAfterDividing) {
  for (const Compression c : {Compression::kFp16, Compression::kBf16}) {
    bd::GradientExchange ex(spec_of(c));
    Params p({{257}, {3, 5}});
    const auto g = random_grads({{257}, {3, 5}}, 1);
    const auto out = p.exchange(ex, g);
    const auto type = c == Compression::kFp16 ? at::kHalf : at::kBFloat16;
    for (std::size_t i = 0; i < g.size(); ++i) {
      EXPECT_TRUE(at::equal(out[i], g[i].to(type).to(at::kDouble))) << bd::compression_name(c);
      EXPECT_FALSE(at::equal(out[i], g[i].to(at::kDouble))) << "nothing was rounded";
    }
  }
}

TEST(Compression, TopKSendsTheLargestAndRemembersTheRest) {
  auto s = spec_of(Compression::kTopK);
  s.ratio = 0.1;
  s.bucket_bytes = 300 * 4;  // two buckets: [300] and [200]
  bd::GradientExchange ex(s);
  Params p({{300}, {20, 10}});
  at::Tensor e0 = at::zeros({300}, at::kDouble), e1 = at::zeros({200}, at::kDouble);
  for (int step = 0; step < 4; ++step) {
    const auto g = random_grads({{300}, {20, 10}}, 10 + step);
    const auto out = p.exchange(ex, g);
    const at::Tensor want0 = topk_ref(g[0].to(at::kDouble), e0, s.ratio);
    const at::Tensor want1 = topk_ref(g[1].reshape({-1}).to(at::kDouble), e1, s.ratio);
    EXPECT_LT(rel(out[0], want0), 1e-7) << "step " << step;
    EXPECT_LT(rel(out[1].reshape({-1}), want1), 1e-7) << "step " << step;
    EXPECT_EQ(out[0].count_nonzero().item<std::int64_t>(), 30);
    EXPECT_EQ(out[1].count_nonzero().item<std::int64_t>(), 20);
  }
  EXPECT_EQ(ex.steps(), 4);
}

TEST(Compression, DgcCorrectsMomentumMasksItAndWarmsUpItsSparsity) {
  auto s = spec_of(Compression::kDgc);
  s.ratio = 0.02;
  s.momentum = 0.9;
  s.warmup_steps = 4;
  bd::GradientExchange ex(s);
  Params p(Shapes{{500}});
  at::Tensor u = at::zeros({500}, at::kDouble), v = at::zeros({500}, at::kDouble);
  const std::int64_t expected_kept[] = {125, 66, 35, 19, 10, 10};  // 0.25 * (0.02 / 0.25)^(t / 4) of 500
  for (int step = 0; step < 6; ++step) {
    const auto g = random_grads(Shapes{{500}}, 20 + step);
    const auto out = p.exchange(ex, g);
    const at::Tensor want = dgc_ref(g[0].to(at::kDouble), u, v, s, step);
    EXPECT_LT(rel(out[0], want), 1e-6) << "step " << step;
    EXPECT_EQ(out[0].count_nonzero().item<std::int64_t>(), expected_kept[step]) << "step " << step;
  }
}

TEST(Compression, SignSendsTheMeanMagnitudeTimesTheSign) {
  bd::GradientExchange ex(spec_of(Compression::kSign));
  Params p({{100}, {7, 9}});
  at::Tensor e = at::zeros({163}, at::kDouble);
  for (int step = 0; step < 3; ++step) {
    const auto g = random_grads({{100}, {7, 9}}, 30 + step);
    const at::Tensor want = sign_ref(flat(g), e, {100, 63});  // one bucket, two scales
    EXPECT_LT(rel(flat(p.exchange(ex, g)), want), 1e-6) << "step " << step;
  }
}

// Gram-Schmidt in float64: orthonormal columns spanning p's.
at::Tensor orthonormal(at::Tensor p) {
  p = p.clone();
  for (std::int64_t j = 0; j < p.size(1); ++j) {
    for (std::int64_t i = 0; i < j; ++i) p.select(1, j) -= p.select(1, i) * p.select(1, i).dot(p.select(1, j));
    p.select(1, j) /= p.select(1, j).norm();
  }
  return p;
}

TEST(Compression, PowerSgdIsOnePowerIterationFromTheLastQ) {
  auto s = spec_of(Compression::kPowerSgd);
  s.rank = 2;
  bd::GradientExchange ex(s);
  const std::vector<std::vector<std::int64_t>> shapes{{16, 12}, {16}, {4, 2, 3}};  // the vector stays dense
  Params p(shapes);
  p.exchange(ex, random_grads(shapes, 40));
  for (int step = 1; step < 4; ++step) {
    // The state after the last step: Q and the error of each compressed matrix.
    const auto st = ex.state();
    ASSERT_EQ(st.size(), 2u + 2 * 1 + 2 * 2);  // step, totals; one dense bucket; two matrices
    const auto g = random_grads(shapes, 40 + step);
    const auto out = p.exchange(ex, g);
    for (std::size_t m = 0; m < 2; ++m) {
      const std::size_t param = m == 0 ? 0 : 2;
      const at::Tensor q = st[4 + 2 * m].to(at::kDouble), err = st[5 + 2 * m].to(at::kDouble);
      const at::Tensor mat = g[param].reshape({q.size(0) == 12 ? 16 : 4, -1}).to(at::kDouble) + err;
      const at::Tensor ph = orthonormal(at::mm(mat, q));
      const at::Tensor want = at::mm(ph, at::mm(mat.t(), ph).t());
      EXPECT_LT(rel(out[param].reshape(want.sizes()), want), 1e-5) << "matrix " << m << " step " << step;
    }
    EXPECT_TRUE(at::equal(out[1], g[1].to(at::kDouble))) << "the vector is all-reduced as it is";
  }
}

TEST(Compression, PowerSgdStartsWithPlainAllReduce) {
  auto s = spec_of(Compression::kPowerSgd);
  s.start_steps = 2;
  bd::GradientExchange ex(s);
  const std::vector<std::vector<std::int64_t>> shapes{{32, 32}};
  Params p(shapes);
  for (int step = 0; step < 3; ++step) {
    const auto g = random_grads(shapes, 50 + step);
    const auto out = p.exchange(ex, g);
    EXPECT_EQ(at::equal(out[0], g[0].to(at::kDouble)), step < 2) << "step " << step;
  }
}

// Sum over steps of what was sent + what is left in memory = sum of the gradients.
TEST(Compression, ErrorFeedbackLosesNothing) {
  const std::vector<std::vector<std::int64_t>> shapes{{24, 20}, {50}};
  for (const Compression c : {Compression::kTopK, Compression::kRandomK, Compression::kSign, Compression::kPowerSgd}) {
    auto s = spec_of(c);
    s.ratio = 0.05;
    bd::GradientExchange ex(s);
    Params p(shapes);
    at::Tensor sent = at::zeros({530}, at::kDouble), total = at::zeros({530}, at::kDouble);
    for (int step = 0; step < 25; ++step) {
      const auto g = random_grads(shapes, 60 + step);
      total += flat(g);
      sent += flat(p.exchange(ex, g));
    }
    const auto st = ex.state();
    at::Tensor left = at::zeros({530}, at::kDouble);
    if (c == Compression::kPowerSgd) {
      left.slice(0, 0, 480) += st[5].reshape({-1}).to(at::kDouble);  // the matrix's error (the vector is dense)
    } else {
      left += st[2].to(at::kDouble);  // one bucket's memory
    }
    EXPECT_LT(rel(sent + left, total), 1e-6) << bd::compression_name(c);
    EXPECT_GT(rel(sent, total), 1e-3) << bd::compression_name(c) << ": something must have been held back";
  }
}

// The mean of T draws is within 5 standard errors of the gradient, each
// coordinate, with the variance of each compressor's closed form.
TEST(Compression, UnbiasedCompressorsAverageToTheGradient) {
  constexpr int kDraws = 3000;
  const auto g = random_grads(Shapes{{64}}, 70);
  const at::Tensor x = g[0].to(at::kDouble);
  for (const Compression c : {Compression::kTernGrad, Compression::kQsgd, Compression::kRandomK}) {
    auto s = spec_of(c);
    s.levels = 4;
    s.ratio = 0.25;
    s.error_feedback = false;
    bd::GradientExchange ex(s);
    Params p(Shapes{{64}});
    at::Tensor sum = at::zeros({64}, at::kDouble);
    for (int t = 0; t < kDraws; ++t) sum += p.exchange(ex, g)[0];
    const at::Tensor mean = sum / kDraws;
    at::Tensor var;
    if (c == Compression::kTernGrad) {
      const double scale = x.abs().max().item<double>();
      var = x.abs() * scale - x * x;
    } else if (c == Compression::kQsgd) {
      const double step = x.norm().item<double>() / s.levels;
      const at::Tensor frac = x.abs() / step - (x.abs() / step).floor();
      var = step * step * frac * (1 - frac);
    } else {
      var = x * x * (1 / s.ratio - 1);
    }
    const at::Tensor bound = 5 * (var / kDraws).sqrt() + 1e-6;
    EXPECT_TRUE(((mean - x).abs() <= bound).all().item<bool>())
        << bd::compression_name(c) << ": worst |mean - g| / bound "
        << ((mean - x).abs() / bound).max().item<double>();
    EXPECT_GT((mean - x).abs().max().item<double>(), 0) << bd::compression_name(c) << " drew nothing";
  }
}

TEST(Compression, AStateLoadedContinuesTheRun) {
  for (const Compression c : {Compression::kTopK, Compression::kDgc, Compression::kPowerSgd}) {
    const std::vector<std::vector<std::int64_t>> shapes{{30, 20}, {10}};
    auto s = spec_of(c);
    s.ratio = 0.1;
    bd::GradientExchange first(s);
    Params p(shapes);
    for (int step = 0; step < 3; ++step) p.exchange(first, random_grads(shapes, 80 + step));
    bd::GradientExchange resumed(s);
    resumed.load_state(first.state());
    const auto g = random_grads(shapes, 90);
    Params q(shapes);
    const auto a = flat(p.exchange(first, g));
    const auto b = flat(q.exchange(resumed, g));
    EXPECT_TRUE(at::equal(a, b)) << bd::compression_name(c);
    EXPECT_EQ(resumed.steps(), 4);
    EXPECT_EQ(resumed.totals().steps, 4) << "the totals go on";
    bd::GradientExchange other(spec_of(Compression::kSign));
    EXPECT_THROW(other.load_state(first.state()), c10::Error) << bd::compression_name(c) << "'s state in sign";
    // What a checkpoint of rank 0 can give every rank: no error memory, the
    // step, the totals and PowerSGD's Q (the same on every rank).
    const auto shared = first.state(/*shared_only=*/true);
    EXPECT_EQ(shared[2].numel(), 0) << bd::compression_name(c);
    if (c == Compression::kPowerSgd) EXPECT_GT(shared[4].numel(), 0) << "Q";
    bd::GradientExchange restarted(s);
    restarted.load_state(shared);
    EXPECT_EQ(restarted.state()[0][0].item<std::int64_t>(), 4) << "a loaded state is the state before it applies";
    Params r(shapes);
    r.exchange(restarted, g);
    EXPECT_EQ(restarted.steps(), 5);
    EXPECT_EQ(restarted.totals().steps, 5);
  }
}

TEST(Compression, BadParametersAreRefusedByName) {
  const auto message = [](const bd::CompressionSpec& s) {
    try {
      bd::check_spec(s);
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string();
  };
  auto s = spec_of(Compression::kTopK);
  s.ratio = 0;
  EXPECT_NE(message(s).find("compression topk: ratio must be in (0, 1], got 0"), std::string::npos) << message(s);
  s.ratio = 1.5;
  EXPECT_NE(message(s).find("got 1.5"), std::string::npos);
  s = spec_of(Compression::kPowerSgd);
  s.rank = 0;
  EXPECT_NE(message(s).find("compression powersgd: rank must be >= 1, got 0"), std::string::npos) << message(s);
  s = spec_of(Compression::kQsgd);
  s.levels = 128;
  EXPECT_NE(message(s).find("levels must be in [1, 127], got 128"), std::string::npos) << message(s);
  s = spec_of(Compression::kDgc);
  s.momentum = 1;
  EXPECT_NE(message(s).find("momentum must be in [0, 1), got 1"), std::string::npos) << message(s);
  EXPECT_THROW(bd::GradientExchange{s}, c10::Error);
  EXPECT_FALSE(bd::compression_from_name("zip").has_value());
  EXPECT_EQ(bd::compression_from_name("powersgd"), Compression::kPowerSgd);
}

// ------------------------------------------------------------------ kernels --
// The CPU loops against their definition, draw by draw.

TEST(CompressKernels, TernaryAndQsgdRoundByTheirDraws) {
  const auto g = random_grads(Shapes{{1000}}, 5);
  const float* x = g[0].data_ptr<float>();
  const float scale = g[0].abs().max().item<float>();
  std::vector<std::uint32_t> words(bigbatch::kernels::compress::words_for(1000, 16));
  bigbatch::kernels::compress::cpu::ternary_pack(x, 1000, scale, 77, words.data());
  std::vector<float> back(1000, 0.0f);
  bigbatch::kernels::compress::cpu::ternary_unpack_add(words.data(), 1000, scale, back.data());
  std::vector<std::int8_t> levels(1000);
  const float norm = g[0].norm().item<float>();
  bigbatch::kernels::compress::cpu::qsgd_pack(x, 1000, &norm, 1000, 8, 99, levels.data());
  int nonzero = 0;
  for (int i = 0; i < 1000; ++i) {
    const double u = bigbatch::kernels::compress::uniform(77, i);
    const double want = u < std::fabs(double(x[i])) / scale ? (x[i] >= 0 ? scale : -scale) : 0.0;
    ASSERT_EQ(back[i], want) << i;
    nonzero += want != 0;
    const double a = std::fabs(double(x[i])) / norm * 8;
    const double l = std::floor(a) + (bigbatch::kernels::compress::uniform(99, i) < a - std::floor(a) ? 1 : 0);
    ASSERT_EQ(levels[i], (x[i] < 0 ? -1 : 1) * static_cast<int>(l)) << i;
  }
  EXPECT_GT(nonzero, 50);
  EXPECT_LT(nonzero, 950);
}

TEST(CompressKernels, DrawsAreUniform) {
  // 2^16 draws in 16 bins: each within 5 standard deviations of 4096.
  std::vector<int> bins(16, 0);
  for (int i = 0; i < 65536; ++i) ++bins[static_cast<int>(bigbatch::kernels::compress::uniform(1234, i) * 16)];
  for (int b : bins) EXPECT_NEAR(b, 4096, 5 * std::sqrt(4096.0 * 15 / 16));
}

// ---------------------------------------------------------------- 2 ranks --

TEST(CompressionTwoRanks, NoneIsTheAllReduceBitForBit) {
  const bigbatch::test::Ranks r = bigbatch::test::launch("compress:none", bigbatch::test::tmp("c_none"));
  EXPECT_EQ(r.status, (std::vector<int>{0, 0})) << bigbatch::test::slurp(r.logs[0]) << bigbatch::test::slurp(r.logs[1]);
}

TEST(CompressionTwoRanks, OverlappedExchangesEqualTheExchangeAfterBackward) {
  for (const char* name : {"none", "fp16"}) {
    const bigbatch::test::Ranks r =
        bigbatch::test::launch(std::string("compress:overlap_") + name, bigbatch::test::tmp(std::string("c_ov_") + name));
    EXPECT_EQ(r.status, (std::vector<int>{0, 0})) << bigbatch::test::slurp(r.logs[0]) << bigbatch::test::slurp(r.logs[1]);
  }
}

TEST(Compression, OnlyTheAllReduceExchangesOverlap) {
  auto s = spec_of(Compression::kTopK);
  s.overlap = true;
  EXPECT_THROW(bd::check_spec(s), c10::Error);
  s.overlap = false;
  bd::GradientExchange ex(s);
  Params p(Shapes{{4}});
  EXPECT_THROW(ex.begin(solo(), p.p), c10::Error);
}

class CompressedRanks : public testing::TestWithParam<const char*> {};

TEST_P(CompressedRanks, MatchTheReferenceAgreeAndCountTheirBytes) {
  const std::string name = GetParam();
  const bigbatch::test::Ranks r = bigbatch::test::launch("compress:" + name, bigbatch::test::tmp("c_" + name));
  EXPECT_EQ(r.status, (std::vector<int>{0, 0})) << bigbatch::test::slurp(r.logs[0]) << bigbatch::test::slurp(r.logs[1]);
}

INSTANTIATE_TEST_SUITE_P(Compressors, CompressedRanks,
                         testing::Values("fp16", "bf16", "topk", "randomk", "dgc", "sign", "terngrad", "qsgd",
                                         "powersgd"));

}  // namespace

// --------------------------------------------------------------- the ranks --

namespace bigbatch::test {

namespace {

// Fails the rank with a message.
int fail(int code, const std::string& what) {
  std::cerr << "rank " << std::getenv("RANK") << ": " << what << "\n";
  return code;
}

// Bytes one rank sends in one step for a net of tensors of `sizes` elements,
// `n` in all, whose matrices are `mats` (rows, cols), over 2 ranks, as
// compression.h counts them.
double expected_bytes(const bd::CompressionSpec& s, std::int64_t n, const std::vector<std::int64_t>& sizes,
                      const std::vector<std::pair<std::int64_t, std::int64_t>>& mats) {
  switch (s.method) {
    case Compression::kNone: return 4.0 * n;
    case Compression::kFp16:
    case Compression::kBf16: return 2.0 * n;
    case Compression::kTopK:
    case Compression::kDgc: return 8.0 * kept(s.ratio, n);
    case Compression::kRandomK: return 4.0 * kept(s.ratio, n);
    case Compression::kSign:
    case Compression::kTernGrad: {  // per tensor: its words and its scale
      const std::int64_t per_word = s.method == Compression::kSign ? 32 : 16;
      double bytes = 0;
      for (const std::int64_t size : sizes) bytes += 4.0 * ((size + per_word - 1) / per_word + 1);
      return bytes;
    }
    case Compression::kQsgd: return n + 4.0 * ((n + s.chunk - 1) / s.chunk);
    case Compression::kPowerSgd: {
      std::int64_t dense = n, factors = 0;
      for (const auto& [rows, cols] : mats) {
        dense -= rows * cols;
        factors += (rows + cols) * s.rank;
      }
      return 4.0 * (dense + factors);
    }
  }
  return -1;
}

// The same net trained twice from the same start on the same rows, its
// exchange after backward and overlapped with it (small buckets: several
// all-reduces under way at once): the same averaged gradients, bit for bit,
// and the same bytes.
int overlap_worker(bd::ProcessGroup& group, const std::string& name, int rank) {
  bd::CompressionSpec spec = spec_of(*bd::compression_from_name(name));
  spec.bucket_bytes = 256;
  bd::CompressionSpec with = spec;
  with.overlap = true;
  bd::GradientExchange after(spec), during(with);
  std::vector<torch::nn::Sequential> nets;
  for (int k = 0; k < 2; ++k) {
    at::manual_seed(7);
    nets.emplace_back(torch::nn::Linear(20, 16), torch::nn::Tanh(), torch::nn::Linear(16, 16), torch::nn::Tanh(),
                      torch::nn::Linear(16, 4));
  }
  auto gen = at::detail::createCPUGenerator(5);
  const at::Tensor x = at::randn({8 * 16, 20}, gen, at::kFloat), y = at::randint(4, {8 * 16}, gen, at::kLong);
  for (int step = 0; step < 8; ++step) {
    const std::int64_t begin = step * 16 + rank * 8;
    for (int k = 0; k < 2; ++k) {
      for (auto& p : nets[k]->parameters()) {
        if (p.grad().defined()) p.mutable_grad().zero_();
      }
      if (k == 1) during.begin(group, nets[k]->parameters());
      torch::nn::functional::cross_entropy(nets[k]->forward(x.slice(0, begin, begin + 8)),
                                           y.slice(0, begin, begin + 8))
          .backward();
      (k == 0 ? after : during).exchange(group, nets[k]->parameters());
    }
    const auto a = nets[0]->parameters(), b = nets[1]->parameters();
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (!at::equal(a[i].grad(), b[i].grad())) return fail(9, name + ": overlapped gradient " + std::to_string(i) + " differs at step " + std::to_string(step));
      at::NoGradGuard no_grad;
      a[i].sub_(0.1 * a[i].grad());
      b[i].sub_(0.1 * b[i].grad());
    }
    if (after.last().bytes_sent != during.last().bytes_sent) return fail(7, name + ": overlapped bytes differ");
    if (during.buckets() < 3 || during.last_overlapped() != during.buckets()) {
      return fail(10, name + ": " + std::to_string(during.last_overlapped()) + " of " +
                          std::to_string(during.buckets()) + " buckets started during backward");
    }
  }
  std::cerr << name << " overlapped: " << during.totals().communicate_seconds << " s waiting, "
            << after.totals().communicate_seconds << " s without overlap\n";
  return 0;
}

}  // namespace

int compression_worker(const std::string& name) {
  const bd::WorldInfo world = bd::world_from_env();
  bd::ProcessGroup group(world, std::chrono::seconds(60));  // room for the ranks' start-ups to differ under load
  if (name.rfind("overlap_", 0) == 0) return overlap_worker(group, name.substr(8), world.rank);
  const auto method = bd::compression_from_name(name);
  if (!method) return fail(2, "unknown compressor " + name);
  bd::CompressionSpec spec = spec_of(*method);
  spec.ratio = 0.05;
  spec.seed = 11;
  bd::GradientExchange exchange(spec);
  at::manual_seed(100 + world.rank);  // different weights: the broadcast makes them equal
  torch::nn::Sequential net(torch::nn::Linear(20, 16), torch::nn::Tanh(), torch::nn::Linear(16, 4));
  bd::broadcast_module(group, *net);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  const std::vector<std::int64_t> sizes{20 * 16, 16, 16 * 4, 4};
  const std::int64_t n = 20 * 16 + 16 + 16 * 4 + 4;
  const std::vector<std::pair<std::int64_t, std::int64_t>> mats{{16, 20}, {4, 16}};
  // Both ranks' memories, re-derived in float64 from both ranks' gradients.
  std::vector<at::Tensor> e(2, at::zeros({n}, at::kDouble)), u = e, v = e;
  auto gen = at::detail::createCPUGenerator(5);
  const at::Tensor x = at::randn({8 * 16, 20}, gen, at::kFloat), y = at::randint(4, {8 * 16}, gen, at::kLong);
  for (int step = 0; step < 8; ++step) {
    opt.zero_grad();
    const std::int64_t begin = step * 16 + world.rank * 8;
    torch::nn::functional::cross_entropy(net->forward(x.slice(0, begin, begin + 8)), y.slice(0, begin, begin + 8))
        .backward();
    std::vector<at::Tensor> raw;
    for (const auto& p : net->parameters()) raw.push_back(p.grad().reshape({-1}).clone());
    const auto grads = group.allgather(at::cat(raw));  // both ranks' gradients, before the exchange
    exchange.exchange(group, net->parameters());
    std::vector<at::Tensor> got_parts;
    for (const auto& p : net->parameters()) got_parts.push_back(p.grad().reshape({-1}));
    const at::Tensor got = at::cat(got_parts);
    // The reference of the deterministic compressors.
    at::Tensor want;
    double tolerance = 1e-6;
    const at::Tensor g0 = grads[0].to(at::kDouble), g1 = grads[1].to(at::kDouble);
    switch (*method) {
      case Compression::kNone:  // the exchange written out: fp32 sum, divided by 2
        if (!at::equal(got, (grads[0] + grads[1]) / 2)) return fail(6, "none differs from the plain all-reduce");
        break;
      case Compression::kFp16:
      case Compression::kBf16: {
        const auto type = *method == Compression::kFp16 ? at::kHalf : at::kBFloat16;
        want = (grads[0] / 2).to(type).to(at::kDouble) + (grads[1] / 2).to(type).to(at::kDouble);
        tolerance = type == at::kHalf ? 1e-3 : 8e-3;  // the sum may be rounded to 16 bits once more
        break;
      }
      case Compression::kTopK:
        want = (topk_ref(g0, e[0], spec.ratio) + topk_ref(g1, e[1], spec.ratio)) / 2;
        break;
      case Compression::kSign:
        want = (sign_ref(g0, e[0], sizes) + sign_ref(g1, e[1], sizes)) / 2;
        tolerance = 1e-5;
        break;
      case Compression::kDgc:
        want = (dgc_ref(g0, u[0], v[0], spec, step) + dgc_ref(g1, u[1], v[1], spec, step)) / 2;
        break;
      default:  // stochastic: the world-of-one tests check their math
        break;
    }
    if (want.defined() && rel(got, want) > tolerance) {
      return fail(6, name + " step " + std::to_string(step) + ": relative error " + std::to_string(rel(got, want)));
    }
    const double bytes = expected_bytes(spec, n, sizes, mats);
    if (exchange.last().bytes_sent != bytes || exchange.last().bytes_received != bytes) {
      return fail(7, name + ": " + std::to_string(exchange.last().bytes_sent) + " bytes sent, expected " +
                         std::to_string(bytes));
    }
    opt.step();
    std::vector<at::Tensor> params;
    for (const auto& p : net->parameters()) params.push_back(p.detach().reshape({-1}));
    const auto both = group.allgather(at::cat(params));
    if (!at::equal(both[0], both[1])) return fail(5, name + ": the ranks' parameters differ after step " + std::to_string(step));
  }
  if (*method != Compression::kNone && !(exchange.totals().ratio() > 1.9)) {
    return fail(8, name + ": compression ratio " + std::to_string(exchange.totals().ratio()));
  }
  std::cerr << name << ": ratio " << exchange.totals().ratio() << "\n";
  return 0;
}

}  // namespace bigbatch::test
