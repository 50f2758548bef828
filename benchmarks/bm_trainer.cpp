// The trainer's overhead: one training step of the same MLP, batch and
// optimizer through experiments::Trainer and through a bare LibTorch loop;
// and the workload interface's (workload.h): the built-in MLP against the
// same MLP as a user's registered model and as a TorchScript file.
// Batched trials: a step of 5 LAMB trials (rates 1e-3 to 5e-3) as one
// stacked group against a step of each of 5 separate trainers, at batch
// sizes 16, 256 and 4096; and one evaluation (1024 examples) of each.
#include "../experiments/train/batched.h"
#include "../experiments/train/trial.h"
#include "../experiments/workload/workload.h"
#include "../optimizers/lamb.h"
#include "../optimizers/param_groups.h"

#include <ATen/CPUGeneratorImpl.h>
#include <benchmark/benchmark.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <string>

namespace {

namespace bx = bigbatch::experiments;

constexpr std::int64_t kBatch = 256;

bx::WorkloadData data() {
  auto gen = at::detail::createCPUGenerator(0);
  bx::WorkloadData d;
  d.classes = 10;
  const at::Tensor x = at::randn({16384, 1, 28, 28}, gen, at::kFloat);
  const at::Tensor y = at::randint(10, {16384}, gen, at::kLong);
  d.train = bx::tensor_examples(x, y);
  d.validation = bx::tensor_examples(x.slice(0, 0, 1024), y.slice(0, 0, 1024));
  return d;
}

bx::TrialConfig config() {
  bx::TrialConfig c;
  c.sweep = "bench";
  c.name = "trial";
  bx::ModelSpec mlp;
  mlp.widths = {256, 256};
  c.model = bx::model_part(mlp);
  c.optimizer = bx::resolve_optimizer("lamb");
  c.schedule.base_lr = 1e-3;
  c.target.threshold = 0.01;
  c.budget = {1e9, bigbatch::schedules::Unit::kSteps};
  c.batch_size = kBatch;
  return c;
}

void bm_trainer(benchmark::State& state) {
  const bx::WorkloadData d = data();
  bx::Trainer trainer(config(), d);
  for (auto _ : state) benchmark::DoNotOptimize(trainer.train_step());
  state.SetItemsProcessed(state.iterations() * kBatch);
}

void bm_bare_loop(benchmark::State& state) {
  const bx::WorkloadData d = data();
  at::manual_seed(0);
  auto model = bx::make_model(bx::model_spec(config().model), d.example_shape(), 10);
  const auto o = bigbatch::optim::LAMBOptions(1e-3);
  bigbatch::optim::LAMB opt(bigbatch::optim::layerwise_param_groups(*model, o), o);
  auto gen = at::detail::createCPUGenerator(1);
  std::int64_t pos = d.train_size();
  at::Tensor order;
  for (auto _ : state) {
    if (pos + kBatch > d.train_size()) {
      order = at::randperm(d.train_size(), gen, at::kLong);
      pos = 0;
    }
    const at::Tensor idx = order.slice(0, pos, pos + kBatch);
    pos += kBatch;
    opt.zero_grad();
    const bx::Batch b = d.train->get(idx);
    const at::Tensor loss = torch::nn::functional::cross_entropy(model->forward(b.input), b.target);
    loss.backward();
    opt.step();
    benchmark::DoNotOptimize(loss.item<double>());
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}

// The built-in MLP's layers as a user writes them: a module of their own.
struct UserMlpImpl : torch::nn::Module {
  UserMlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(784, 256))),
        fc2(register_module("fc2", torch::nn::Linear(256, 256))),
        fc3(register_module("fc3", torch::nn::Linear(256, 10))) {}
  at::Tensor forward(const at::Tensor& x) {
    return fc3(at::relu(fc2(at::relu(fc1(x.flatten(1))))));
  }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(UserMlp);

// A file of this process's, removed when the process ends.
struct TemporaryFile {
  std::string path;
  ~TemporaryFile() { std::remove(path.c_str()); }
};

// The same MLP as a TorchScript file (what torch.jit.script saves), with a
// UserMlp's initial weights; removed at exit (the trainer reads it when built).
std::string script_mlp_file() {
  static const TemporaryFile file = [] {
    at::manual_seed(0);
    UserMlp init;
    torch::jit::Module m("ScriptMlp");
    for (const auto& p : init->named_parameters()) {
      std::string name = p.key();
      std::replace(name.begin(), name.end(), '.', '_');
      m.register_parameter(name, p.value().detach().clone().requires_grad_(true), /*is_buffer=*/false);
    }
    m.define(R"(
def forward(self, x):
    h = x.flatten(1)
    h = torch.relu(torch.addmm(self.fc1_bias, h, self.fc1_weight.t()))
    h = torch.relu(torch.addmm(self.fc2_bias, h, self.fc2_weight.t()))
    return torch.addmm(self.fc3_bias, h, self.fc3_weight.t())
)");
    const std::string name = "/tmp/bigbatch_bm_script_mlp." + std::to_string(::getpid()) + ".pt";
    m.save(name);
    return TemporaryFile{name};
  }();
  return file.path;
}

void register_bench_models() {
  static std::once_flag once;
  std::call_once(once, [] {
    bx::register_model({"bench_user_mlp", nullptr,
                        [](const nlohmann::json&, const bx::ModelInput&) -> bx::Model { return UserMlp(); }});
  });
}

// One step of the MLP trial: 0 the built-in model, 1 the user's, 2 TorchScript.
void bm_workload_step(benchmark::State& state) {
  register_bench_models();
  const bx::WorkloadData d = data();
  bx::TrialConfig c = config();
  if (state.range(0) == 1) c.model = {"bench_user_mlp", nlohmann::json::object()};
  if (state.range(0) == 2) c.model = {"torchscript", {{"path", script_mlp_file()}}};
  bx::Trainer trainer(c, d);
  for (auto _ : state) benchmark::DoNotOptimize(trainer.train_step());
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.SetLabel(state.range(0) == 0 ? "built-in mlp" : state.range(0) == 1 ? "linked user model" : "torchscript");
}

constexpr int kLanes = 5;

std::vector<bx::TrialConfig> five(std::int64_t batch) {
  std::vector<bx::TrialConfig> out;
  for (int k = 0; k < kLanes; ++k) {
    bx::TrialConfig c = config();
    c.batch_size = batch;
    c.schedule.base_lr = 1e-3 * (k + 1);
    c.name = "trial" + std::to_string(k);
    out.push_back(c);
  }
  return out;
}

void bm_five_separate(benchmark::State& state) {
  const bx::WorkloadData d = data();
  std::vector<std::unique_ptr<bx::Trainer>> trainers;
  for (const auto& c : five(state.range(0))) trainers.push_back(std::make_unique<bx::Trainer>(c, d));
  for (auto _ : state) {
    for (auto& t : trainers) benchmark::DoNotOptimize(t->train_step());
  }
  state.SetItemsProcessed(state.iterations() * kLanes * state.range(0));
}

void bm_five_batched(benchmark::State& state) {
  const bx::WorkloadData d = data();
  bx::Trainer group(five(state.range(0)), d);
  for (auto _ : state) group.train_step();
  state.SetItemsProcessed(state.iterations() * kLanes * state.range(0));
}

void bm_five_separate_eval(benchmark::State& state) {
  const bx::WorkloadData d = data();
  std::vector<std::unique_ptr<bx::Trainer>> trainers;
  for (const auto& c : five(256)) trainers.push_back(std::make_unique<bx::Trainer>(c, d));
  for (auto _ : state) {
    for (auto& t : trainers) benchmark::DoNotOptimize(t->evaluate());
  }
}

void bm_five_batched_eval(benchmark::State& state) {
  const bx::WorkloadData d = data();
  bx::Trainer group(five(256), d);
  for (auto _ : state) benchmark::DoNotOptimize(group.evaluate());
}

}  // namespace

BENCHMARK(bm_workload_step)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_five_separate)->Arg(16)->Arg(256)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_five_batched)->Arg(16)->Arg(256)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_five_separate_eval)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_five_batched_eval)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_bare_loop)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_trainer)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
