// How the fused CUDA step hands over to the other paths (named _CUDA: run on
// a GPU in optimizers_tests, on the SIMT executor in simt_optimizers_tests):
// a step on the CPU or reference path between CUDA steps continues from the
// step counts the device kept, and goes back to the device from its own.
#include "engine_device.h"
#include "golden_check.h"

#include "../../bigbatch.h"

#include <gtest/gtest.h>

#if defined(BIGBATCH_SIMT)
#include "../../kernels/simt/cuda.h"
#endif

#include <string>
#include <vector>

namespace {

using namespace bigbatch::optim;
using golden::to_vec;
using ref64::Vec;

class EngineHandOver : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!engine_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// Steps 1-2 fused on the device, 3 on the reference path (fused(false)), 4-5
// fused again, against the float64 reference of five steps: the bias
// correction of LAMB and the first-step rule of NovoGrad need the true count.
template <typename Opt, typename Options, typename Ref>
void expect_counts_survive_path_switches(Options options, Ref ref, const std::string& name) {
  torch::manual_seed(3);
  const std::vector<std::int64_t> sizes = {20000, 7};
  std::vector<at::Tensor> params;
  std::vector<Vec> ws;
  for (const auto n : sizes) {
    params.push_back(at::randn({n}).to(engine_device()));
    ws.push_back(to_vec(params.back()));
  }
  const std::vector<Vec> start = ws;
  Opt opt(params, options);
  auto& group_options = static_cast<Options&>(opt.param_groups()[0].options());
  std::vector<ref64::State> state(sizes.size());
  for (int s = 1; s <= 5; ++s) {
    group_options.fused(s != 3);
    std::vector<Vec> gs;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      params[k].mutable_grad() = (0.1 * at::randn({sizes[k]})).to(engine_device());
      gs.push_back(to_vec(params[k].grad()));
    }
    opt.step();
    ref(ws, gs, state);
  }
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    EXPECT_EQ(opt.param_state(params[k])->step(), 5) << name << ", tensor " << k;
  }
  golden::expect_fp32_close({params, ws, start, nullptr}, name);
}

TEST_F(EngineHandOver, LAMBStepCountsSurviveAReferenceStep_CUDA) {
  ref64::Lamb r;
  r.lr = 0.02;
  expect_counts_survive_path_switches<LAMB>(
      LAMBOptions(0.02), [r](auto& ws, const auto& gs, auto& st) { r.step(ws, gs, st); }, "LAMB");
}

TEST_F(EngineHandOver, NovoGradStepCountsSurviveAReferenceStep_CUDA) {
  ref64::NovoGrad r;
  r.lr = 0.5;
  expect_counts_survive_path_switches<NovoGrad>(
      NovoGradOptions(0.5),
      [r](auto& ws, const auto& gs, auto& st) {
        for (std::size_t k = 0; k < ws.size(); ++k) r.step(ws[k], gs[k], st[k]);
      },
      "NovoGrad");
}

TEST_F(EngineHandOver, SkippedStepsOnBothPathsAddUp_CUDA) {
  auto w = at::randn({6}).to(engine_device());
  LAMB opt({w}, LAMBOptions(0.1));
  auto& o = static_cast<LAMBOptions&>(opt.param_groups()[0].options());
  for (const bool fused : {true, false, true}) {
    o.fused(fused);
    w.mutable_grad() = at::full({6}, NAN).to(engine_device());
    opt.step();
  }
  EXPECT_EQ(opt.skipped_steps(), 3);
}

#if defined(BIGBATCH_SIMT)
// A graph capture cannot read the step counts back: a capture of a step whose
// tensors changed must fail with the message that says what to do, not with
// the CUDA error the read-back would raise.
TEST_F(EngineHandOver, CapturingAStepWithChangedTensorsSaysWhatToDo_CUDA) {
  auto a = at::randn({5}).to(engine_device());
  auto b = at::randn({3}).to(engine_device());
  LAMB opt({a, b}, LAMBOptions(0.1));
  a.mutable_grad() = at::randn({5}).to(engine_device());
  opt.step();  // bound: a only
  b.mutable_grad() = at::randn({3}).to(engine_device());
  bigbatch::simt::set_capturing(nullptr, true);
  std::string message;
  try {
    opt.step();
  } catch (const c10::Error& e) {
    message = e.what();
  }
  bigbatch::simt::set_capturing(nullptr, false);
  cudaGetLastError();
  EXPECT_NE(message.find("run one step outside the capture first"), std::string::npos) << message;
}
#endif

}  // namespace
