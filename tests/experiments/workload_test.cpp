// The workload interface (workload.h) against independent references: a
// LibTorch map-style dataset through the adapter against the same tensors in
// memory; a user's module and a TorchScript file against the built-in model
// with the same weights; the bad inputs it must refuse in one line; a
// workload that throws; the workload's own metrics against val_error.
#include "../../experiments/runconfig/config.h"
#include "../../experiments/io/files.h"
#include "../../experiments/sweep/preflight.h"
#include "../../experiments/sweep/results.h"
#include "../../experiments/sweep/sweep.h"
#include "../../experiments/train/trial.h"
#include "../../experiments/workload/workload.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/data/datasets/base.h>
#include <torch/data/example.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/optimizer.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace bigbatch::experiments;
namespace fs = std::filesystem;
using nlohmann::json;

// Four overlapping Gaussian classes in 6 dimensions: the tensors behind
// both the in-memory and the torch::data registrations.
struct Mixture {
  at::Tensor x, y;
};
Mixture mixture(std::int64_t n, std::uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  const at::Tensor means = at::randn({4, 6}, gen, at::kFloat) * 1.5;
  Mixture m;
  m.y = at::randint(4, {n}, gen, at::kLong);
  m.x = means.index_select(0, m.y) + at::randn({n, 6}, gen, at::kFloat);
  return m;
}

// What a LibTorch user already has: a map-style dataset, one example per get().
class MixtureDataset : public torch::data::datasets::Dataset<MixtureDataset> {
 public:
  explicit MixtureDataset(Mixture m) : m_(std::move(m)) {}
  torch::data::Example<> get(std::size_t i) override {
    const auto k = static_cast<std::int64_t>(i);
    return {m_.x[k], m_.y[k]};
  }
  torch::optional<std::size_t> size() const override { return static_cast<std::size_t>(m_.x.size(0)); }

 private:
  Mixture m_;
};

// A user's own model: the built-in "linear" model's one layer, written by hand.
struct UserLinearImpl : torch::nn::Module {
  UserLinearImpl(std::int64_t in, std::int64_t out) : fc(register_module("fc", torch::nn::Linear(in, out))) {}
  at::Tensor forward(const at::Tensor& x) { return fc(x.flatten(1)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(UserLinear);

// A model whose training step throws at one batch size: a workload bug.
struct ThrowsAt64Impl : torch::nn::Module {
  ThrowsAt64Impl() : fc(register_module("fc", torch::nn::Linear(6, 4))) {}
  at::Tensor forward(const at::Tensor& x) {
    TORCH_CHECK(!(is_training() && x.size(0) == 64), "ThrowsAt64: cannot take a batch of 64");
    return fc(x);
  }
  torch::nn::Linear fc;
};
TORCH_MODULE(ThrowsAt64);

// A TorchScript module (what torch.jit.script saves) computing x W^T + b
// with the given weights, saved at `path`; without weights when empty.
void save_script_linear(const std::string& path, const at::Tensor& w, const at::Tensor& b) {
  torch::jit::Module m("ScriptLinear");
  if (w.defined()) {
    // (as torch.jit.save keeps them: trainable)
    m.register_parameter("weight", w.detach().clone().requires_grad_(true), /*is_buffer=*/false);
    m.register_parameter("bias", b.detach().clone().requires_grad_(true), /*is_buffer=*/false);
    m.define("def forward(self, x):\n    return torch.addmm(self.bias, x.flatten(1), self.weight.t())\n");
  } else {
    m.define("def forward(self, x):\n    return x.flatten(1)\n");
  }
  m.save(path);
}

WorkloadData mixture_data(bool torch_data, std::int64_t train, std::int64_t val) {
  const Mixture t = mixture(train, 11), v = mixture(val, 12);
  WorkloadData d;
  d.classes = 4;
  if (torch_data) {
    d.train = dataset_examples(MixtureDataset(t));
    d.validation = dataset_examples(MixtureDataset(v));
  } else {
    d.train = tensor_examples(t.x, t.y);
    d.validation = tensor_examples(v.x, v.y);
  }
  return d;
}

// The test workloads, registered once for the whole binary.
void register_test_workloads() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const bool torch_data : {false, true}) {
      register_dataset({torch_data ? "test_mixture_torchdata" : "test_mixture_tensors",
                        [](const json& p) {
                          bigbatch::config::JsonReader r(p, "dataset");
                          const json out = {{"train_size", r.integer("train_size", 512)},
                                            {"val_size", r.integer("val_size", 128)}};
                          r.finish();
                          return out;
                        },
                        [torch_data](const json& p) {
                          return mixture_data(torch_data, p.at("train_size").get<std::int64_t>(),
                                              p.at("val_size").get<std::int64_t>());
                        }});
    }
    register_dataset({"test_empty", nullptr, [](const json&) {
                        WorkloadData d = mixture_data(false, 2, 2);
                        d.train = tensor_examples(at::zeros({0, 6}), at::zeros({0}, at::kLong));
                        return d;
                      }});
    register_dataset({"test_with_metrics", nullptr, [](const json&) {
                        WorkloadData d = mixture_data(false, 512, 128);
                        d.metrics.emplace_back("error_again", [](const at::Tensor& out, const at::Tensor& y) {
                          return out.argmax(1).ne(y).to(at::kFloat);
                        });
                        return d;
                      }});
    register_model({"test_user_linear", nullptr, [](const json&, const ModelInput& in) -> Model {
                      return UserLinear(in.example_shape.at(0), in.outputs);
                    }});
    register_model({"test_seven_outputs", nullptr, [](const json&, const ModelInput& in) -> Model {
                      return UserLinear(in.example_shape.at(0), 7);
                    }});
    register_model({"test_throws_at_64", nullptr,
                    [](const json&, const ModelInput&) -> Model { return ThrowsAt64(); }});
  });
}

class Workloads : public ::testing::Test {
 protected:
  void SetUp() override {
    register_test_workloads();
    dir_ = fs::temp_directory_path() / ("bigbatch_workload_test." + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { bigbatch::experiments::remove_tree(dir_); }

  // A sweep of `dataset` x `model` (LARS: two parameter groups, trust ratios).
  static json sweep(const std::string& dataset, const json& model) {
    return {{"name", "w"},
            {"dataset", {{"name", dataset}}},
            {"model", model},
            {"optimizer", {{"name", "lars"}, {"momentum", 0.9}}},
            {"target", {{"metric", "val_error"}, {"threshold", 0.2}, {"eval_every", 5}}},
            {"budget", {{"steps", 40}}},
            {"batch_sizes", {16, 64}},
            {"search", {{"lr", {0.5}}}}};
  }
  static TrialConfig trial(const json& j) { return expand(parse_sweep(j)).front(); }
  static std::string error_of(const json& j) {
    try {
      load_data(parse_sweep(j));
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "(no error)";
  }
  fs::path dir_;
};

// The adapter stacks get(i) in the sampler's order: every loss and every
// evaluation is the in-memory run's, bit for bit.
TEST_F(Workloads, TorchDataDatasetTrainsExactlyAsTheSameTensors) {
  const TrialConfig a = trial(sweep("test_mixture_tensors", {{"type", "mlp"}, {"widths", {16}}}));
  TrialConfig b = a;
  b.data.name = "test_mixture_torchdata";
  const WorkloadData da = load_dataset(a.data), db = load_dataset(b.data);
  Trainer ta(a, da), tb(b, db);
  for (int step = 0; step < 25; ++step) ASSERT_EQ(ta.train_step().front(), tb.train_step().front()) << step;
  EXPECT_EQ(ta.evaluate().front().loss, tb.evaluate().front().loss);
  EXPECT_EQ(ta.evaluate().front().error, tb.evaluate().front().error);
}

// A registered model of the user's own, built under the trial's seed like
// the built-in "linear" (one Linear layer): the same weights, the same run.
TEST_F(Workloads, AUserModelTrainsExactlyAsTheBuiltInWithTheSameLayers) {
  const TrialConfig a = trial(sweep("test_mixture_tensors", {{"type", "linear"}}));
  TrialConfig b = a;
  b.model = {"test_user_linear", json::object()};
  const WorkloadData d = load_dataset(a.data);
  Trainer ta(a, d), tb(b, d);
  for (int step = 0; step < 25; ++step) ASSERT_EQ(ta.train_step().front(), tb.train_step().front()) << step;
  // LARS's two groups come from the shapes: the weight adapted, the bias not.
  EXPECT_EQ(tb.optimizer().param_groups().size(), 2u);
  const auto ratios = tb.layer_scalars();
  ASSERT_EQ(ratios.size(), 1u);
  EXPECT_EQ(ratios[0].first, "trust_ratio/fc.weight");
}

// A TorchScript file with the built-in linear model's initial weights trains
// as that model does: the file's parameters are trained in place, in two
// groups derived from their shapes, under their own names.
TEST_F(Workloads, ATorchScriptFileTrainsAsTheModuleItWasMadeFrom) {
  const TrialConfig a = trial(sweep("test_mixture_tensors", {{"type", "linear"}}));
  const WorkloadData d = load_dataset(a.data);
  Trainer ta(a, d);
  const auto params = ta.module().named_parameters();
  const std::string path = (dir_ / "linear.pt").string();
  save_script_linear(path, params["1.weight"], params["1.bias"]);
  const TrialConfig b = trial(sweep("test_mixture_tensors", {{"type", "torchscript"}, {"path", path}}));
  Trainer tb(b, d);
  for (int step = 0; step < 25; ++step) {
    const double x = ta.train_step().front(), y = tb.train_step().front();
    ASSERT_NEAR(x, y, 1e-6 * std::abs(x)) << step;
  }
  EXPECT_NEAR(ta.evaluate().front().loss, tb.evaluate().front().loss, 1e-5);
  EXPECT_EQ(tb.optimizer().param_groups().size(), 2u);
  const auto ratios = tb.layer_scalars();
  ASSERT_EQ(ratios.size(), 1u);
  EXPECT_EQ(ratios[0].first, "trust_ratio/weight");
  // The optimizer moved the script module's own tensors: a checkpoint
  // restored into a fresh trainer continues the same run.
  Trainer tc(b, d);
  tc.restore(tb.checkpoint());
  EXPECT_EQ(tb.train_step().front(), tc.train_step().front());
}

TEST_F(Workloads, BadInputIsOneLineNamingTheThingAndTheValue) {
  const std::string missing = (dir_ / "missing.pt").string();
  EXPECT_EQ(error_of(sweep("test_mixture_tensors", {{"type", "torchscript"}, {"path", missing}})),
            "model.path: " + missing + ": cannot open (No such file or directory)");
  const std::string garbage = (dir_ / "garbage.pt").string();
  std::ofstream(garbage) << "not a zip archive";
  const std::string not_module = error_of(sweep("test_mixture_tensors", {{"type", "torchscript"}, {"path", garbage}}));
  EXPECT_EQ(not_module.rfind("model.path: " + garbage + ": not a TorchScript module (", 0), 0u) << not_module;
  EXPECT_EQ(not_module.find('\n'), std::string::npos) << not_module;
  const std::string empty = (dir_ / "empty.pt").string();
  save_script_linear(empty, at::Tensor(), at::Tensor());
  EXPECT_EQ(error_of(sweep("test_mixture_tensors", {{"type", "torchscript"}, {"path", empty}})),
            "model.path: " + empty + ": the TorchScript module has no parameters to train");
  EXPECT_EQ(error_of(sweep("test_mixture_tensors", {{"type", "test_seven_outputs"}})),
            "model \"test_seven_outputs\": output [2, 7] for inputs [2, 6] does not fit the targets of dataset "
            "\"test_mixture_tensors\" ([2]; expected [2, 4] for 4 classes)");
  EXPECT_EQ(error_of(sweep("test_empty", {{"type", "linear"}})),
            "dataset \"test_empty\": no training examples (size 0)");
  json small = sweep("test_mixture_tensors", {{"type", "linear"}});
  small["dataset"]["train_size"] = 32;
  EXPECT_EQ(error_of(small), "batch_sizes: 64 is larger than the training set (32 examples)");
  json regression = sweep("linear_regression", {{"type", "linear"}});
  EXPECT_EQ(error_of(regression),
            "target.metric: val_error needs a classification dataset; linear_regression has val_loss");
  json unknown = sweep("test_mixture_tensors", {{"type", "linear"}});
  unknown["dataset"]["name"] = "nope";
  try {
    parse_sweep(unknown);
    ADD_FAILURE() << "an unknown dataset was accepted";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("dataset.name: unknown \"nope\" (registered: cifar10, cifar100, fashion_mnist, ", 0), 0u) << m;
    EXPECT_NE(m.find("test_mixture_torchdata"), std::string::npos) << m;
  }
  EXPECT_THROW(register_model({"linear", nullptr, [](const json&, const ModelInput&) -> Model {
                                 return UserLinear(1, 1);
                               }}),
               std::invalid_argument);
}

// A workload that throws in a trial fails that trial, with its message in
// summary.json; the other batch size's trials run and the table counts it.
TEST_F(Workloads, AThrowingWorkloadFailsItsTrialsAndTheSweepGoesOn) {
  json j = sweep("test_mixture_tensors", {{"type", "test_throws_at_64"}});
  j["search"] = {{"lr", {0.1, 0.5}}};
  j["target"]["threshold"] = 0.9;  // reached at the first evaluation
  SweepOptions options;
  options.out = dir_.string();
  options.jobs = 2;
  const SweepSummary s = run_sweep(parse_sweep(j), options);
  EXPECT_EQ(s.trials, 4);
  const json failed = read_json((dir_ / "w" / "b64_p0_s0" / "summary.json").string());
  EXPECT_EQ(failed["status"], "failed");
  EXPECT_EQ(failed["error"], "ThrowsAt64: cannot take a batch of 64");
  const std::string table = read_file((dir_ / "w" / "steps_to_target.csv").string());
  EXPECT_NE(table.find("\n16,5,80,"), std::string::npos) << table;
  EXPECT_NE(table.find("\n64,,,"), std::string::npos) << table;
  EXPECT_NE(table.find(",0,low,2,"), std::string::npos) << table;  // reached 0, failed 2: both of batch 64's trials
  const std::string text = report((dir_ / "w").string());
  EXPECT_NE(text.find("warning: trials failed (their workload threw) at batch sizes 64 (2)"), std::string::npos)
      << text;
}

// --batch-trials with a model that cannot be stacked: the trials run one by
// one, as the same sweep without it does (the same table).
TEST_F(Workloads, AModelThatCannotBeStackedRunsItsTrialsAlone) {
  json j = sweep("test_mixture_tensors", {{"type", "test_user_linear"}});
  j["search"] = {{"lr", {0.1, 0.5}}};
  j["target"]["threshold"] = 0.5;
  SweepOptions options;
  options.out = (dir_ / "alone").string();
  run_sweep(parse_sweep(j), options);
  j["runner"] = {{"batch_trials", true}};
  options.out = (dir_ / "batched").string();
  run_sweep(parse_sweep(j), options);
  EXPECT_EQ(read_file((dir_ / "alone" / "w" / "steps_to_target.csv").string()),
            read_file((dir_ / "batched" / "w" / "steps_to_target.csv").string()));
}

// The workload's own metric, computed per example by its function, lands in
// metrics.csv as val_<name>; here it is val_error by another route.
TEST_F(Workloads, AWorkloadsOwnMetricsAreRecordedByName) {
  json j = sweep("test_with_metrics", {{"type", "mlp"}, {"widths", {8}}});
  j["batch_sizes"] = {32};
  j["target"]["threshold"] = 0.01;  // not reached: every evaluation is written
  j["budget"]["steps"] = 20;
  SweepOptions options;
  options.out = dir_.string();
  run_sweep(parse_sweep(j), options);
  std::ifstream in(dir_ / "w" / "b32_p0_s0" / "metrics.csv");
  std::string header, row;
  std::getline(in, header);
  EXPECT_EQ(header,
            "step,epoch,examples,train_loss,val_loss,val_error,lr,batch_size,wall_time,gns,bytes_sent,bytes_received,"
            "compress_seconds,comm_seconds,syncs,outer_norm,loss_scale,skipped_steps,state_bytes,peak_rss_bytes,"
            "avg_val_loss,avg_val_error,val_error_again");
  int rows = 0;
  while (std::getline(in, row)) {
    std::vector<std::string> cells;
    std::stringstream cut(row);
    for (std::string c; std::getline(cut, c, ',');) cells.push_back(c);
    ASSERT_EQ(cells.size(), 23u) << row;
    EXPECT_DOUBLE_EQ(std::stod(cells[5]), std::stod(cells[22])) << row;
    ++rows;
  }
  EXPECT_EQ(rows, 4);
}

}  // namespace
