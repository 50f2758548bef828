// The workload interface: what the runner (sweep, train, cbs) needs from a
// model and its data, and the registries a config names them from. A
// workload is a dataset ("dataset": {"name": ...}) and a model ("model":
// {"type": ...}); the built-in ones (Fashion-MNIST, the synthetic tasks; the
// linear, MLP, CNN and ResNet models; TorchScript files) are registered
// through the same functions a user program calls. docs/workloads.md walks
// through it.
//
// The runner keeps what makes runs comparable for itself: the seeded,
// resumable sampler over the training examples (shared by every lane and
// sharded across data-parallel ranks by index), the optimizer and its
// schedule, evaluation cadence, stop rules, checkpoints and result files.
// A workload supplies:
//   - the examples of each split, fetched by index (Examples);
//   - the task: classification (cross-entropy, val_error) or regression
//     (squared error), or a loss of its own, and further validation metrics
//     by name (WorkloadData);
//   - a model per trial, built after the runner seeds LibTorch's generator
//     with the trial's seed (Model).
// Capabilities are read off what is given: a model that is a
// torch::nn::Sequential of the layers batched.h knows can be stacked for
// --batch-trials; any model trains data-parallel (the runner shards the
// batch); ghost batch norm is a layer (normalization/ghost_batch_norm.h) a
// model contains, as the built-in "norm": "ghost" does.
#pragma once

#include "../io/config_error.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/data/datasets/base.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace bigbatch::experiments {

/// Examples as the model and the loss take them: inputs [N, ...] and targets
/// [N] (class indices, int64) or [N, ...] (regression), on the CPU.
struct Batch {
  at::Tensor input, target;
};

/// Which draw of the training stream a batch is: the trial's data seed and
/// the epoch (a batch never spans two). Random augmentation derives each
/// example's randomness from (seed, epoch, example index) alone (see
/// example_stream), so the same trial gets the same batches whatever the
/// number of loader threads and the order they finish in, and a resumed run
/// continues the same stream.
struct Draw {
  std::uint64_t seed = 0;
  std::int64_t epoch = 0;
};

/// A small counter-based generator for one example's augmentation: the
/// same (draw, example) gives the same numbers on any thread (SplitMix64
/// over a key mixed from the three).
class ExampleRandom {
 public:
  ExampleRandom(const Draw& draw, std::int64_t example);
  std::uint64_t next();
  /// Uniform in [0, 1).
  double uniform();
  /// Uniform integer in [0, n), n >= 1.
  std::int64_t below(std::int64_t n);

 private:
  std::uint64_t state_;
};

/// One split's examples, fetched by index (a map-style dataset).
class Examples {
 public:
  virtual ~Examples() = default;
  virtual std::int64_t size() const = 0;
  /// The examples at `index` (1-D int64, CPU, each in [0, size())), stacked
  /// along dimension 0 in that order: as evaluation sees them (no random
  /// augmentation).
  virtual Batch get(const at::Tensor& index) const = 0;
  /// Examples [begin, end), for evaluation: get() of that range unless a
  /// source has a cheaper way.
  virtual Batch range(std::int64_t begin, std::int64_t end) const;
  /// A training batch: the examples at `index` with their random
  /// augmentation for `draw` applied (ExampleRandom(draw, index[i]) per
  /// example). Default: get(index), for data without augmentation. Called
  /// from the runner's loader threads, several at once.
  virtual Batch augmented(const at::Tensor& index, const Draw& draw) const;
  /// Whether fetching a batch costs real work (decoding, augmentation): the
  /// runner then gives the loader a thread of its own by default
  /// (runner.loader_threads) and the intra-op pool one fewer.
  virtual bool costly() const { return false; }
};

/// Examples held in memory as two tensors whose first dimension is the example.
std::shared_ptr<const Examples> tensor_examples(at::Tensor input, at::Tensor target);

/// Any map-style LibTorch dataset (torch::data::datasets::Dataset<Self,
/// Example<>>: get(i) and size()) as Examples: the runner's sampler picks the
/// indices, get() is called for each and the examples stacked. The dataset
/// must give the same example for the same index every time (what a seeded,
/// resumable run needs) and be safe to read from several threads (--jobs).
template <typename TorchDataset>
class TorchDataExamples final : public Examples {
 public:
  explicit TorchDataExamples(TorchDataset dataset) : dataset_(std::move(dataset)) {
    const auto n = dataset_.size();
    TORCH_CHECK(n.has_value(), "torch::data dataset: size() gave no size (a map-style dataset must know it)");
    size_ = static_cast<std::int64_t>(*n);
  }
  std::int64_t size() const override { return size_; }
  Batch get(const at::Tensor& index) const override {
    const at::Tensor i = index.to(at::kLong).contiguous();
    const std::int64_t* p = i.data_ptr<std::int64_t>();
    std::vector<at::Tensor> inputs, targets;
    inputs.reserve(static_cast<std::size_t>(i.numel()));
    targets.reserve(static_cast<std::size_t>(i.numel()));
    for (std::int64_t k = 0; k < i.numel(); ++k) {
      TORCH_CHECK(p[k] >= 0 && p[k] < size_, "torch::data dataset: index ", p[k], " outside [0, ", size_, ")");
      auto example = const_cast<TorchDataset&>(dataset_).get(static_cast<std::size_t>(p[k]));
      inputs.push_back(std::move(example.data));
      targets.push_back(std::move(example.target));
    }
    return {at::stack(inputs), at::stack(targets)};
  }

 private:
  TorchDataset dataset_;
  std::int64_t size_ = 0;
};

template <typename TorchDataset>
std::shared_ptr<const Examples> dataset_examples(TorchDataset dataset) {
  return std::make_shared<TorchDataExamples<TorchDataset>>(std::move(dataset));
}

/// A per-example score of model outputs against targets: a tensor [N].
using ExampleScore = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

/// What a dataset gives the runner.
struct WorkloadData {
  std::shared_ptr<const Examples> train;       ///< what the sampler draws batches from
  std::shared_ptr<const Examples> validation;  ///< what each evaluation measures (the target's split)
  std::shared_ptr<const Examples> test;        ///< optional; held out (not used in training)
  /// > 0: classification over this many classes: outputs [N, classes],
  /// targets int64 [N], cross-entropy loss, and val_error (the fraction
  /// misclassified) reported. Sequences too: outputs [N, T, classes] and
  /// targets [N, T] (a language model's next tokens), an example's loss and
  /// error being the means over its T positions. 0: regression: outputs shaped as the targets,
  /// loss the squared error summed over an example's values, no val_error.
  std::int64_t classes = 0;
  /// Optional: a loss of its own, per example (the training loss is its mean
  /// over the batch; val_loss its mean over the validation split).
  ExampleScore loss;
  /// Optional: further validation metrics, each averaged over the split and
  /// recorded by name (metrics.csv column "val_<name>", TensorBoard).
  std::vector<std::pair<std::string, ExampleScore>> metrics;
  /// Optional: what the data has to say in each trial's summary.json (under
  /// "data"), read when the trial ends: e.g. the images skipped as corrupt.
  std::function<nlohmann::json()> report;

  std::int64_t train_size() const { return train ? train->size() : 0; }
  /// Shape of one input example, e.g. {1, 28, 28}: from training example 0.
  std::vector<std::int64_t> example_shape() const;
  /// The per-example loss: `loss` if set, else the task's (see classes).
  at::Tensor example_loss(const at::Tensor& output, const at::Tensor& target) const;
  /// Classification: the fraction of each example's positions whose
  /// largest output is not the target, [N] (0 or 1 for one position).
  at::Tensor example_error(const at::Tensor& output, const at::Tensor& target) const;
};

/// A trial's model: a module (its parameters and buffers, train/eval, device,
/// checkpoints) and its forward function, inputs [N, ...] -> outputs [N, ...].
class Model {
 public:
  /// Any module with `at::Tensor forward(at::Tensor)`, e.g. a
  /// std::shared_ptr<MyNetImpl>, or a TORCH_MODULE holder: Model(MyNet(...)).
  template <typename Module>
  Model(std::shared_ptr<Module> module)  // NOLINT(google-explicit-constructor): a model is its module
      : module_(module), forward_([m = module.get()](const at::Tensor& x) -> at::Tensor { return m->forward(x); }) {}
  template <typename Module>
  Model(torch::nn::ModuleHolder<Module> holder) : Model(holder.ptr()) {}  // NOLINT(google-explicit-constructor)
  /// A module and a forward function of your own.
  Model(std::shared_ptr<torch::nn::Module> module, std::function<at::Tensor(const at::Tensor&)> forward);

  at::Tensor forward(const at::Tensor& x) const { return forward_(x); }
  torch::nn::Module& module() const { return *module_; }
  const std::shared_ptr<torch::nn::Module>& ptr() const { return module_; }
  /// The model as a torch::nn::Sequential (the built-in models are), which
  /// batched trials can stack; empty otherwise.
  torch::nn::Sequential sequential() const;

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::function<at::Tensor(const at::Tensor&)> forward_;
};

/// What a model builder is told about the data.
struct ModelInput {
  std::vector<std::int64_t> example_shape;  ///< one input example's shape
  std::int64_t outputs = 1;                 ///< classes, or a regression target's width
};

/// A config's "dataset" or "model": the name it is registered under (the
/// "name" or "type" key) and its parameters, as the registration resolved
/// them (every default written out).
struct WorkloadPart {
  std::string name;
  nlohmann::json params = nlohmann::json::object();
};

/// A resolved object of keys as a part: `resolved` less its `name_key`
/// ("name", "type"), whose value is the part's name; and back.
WorkloadPart as_part(nlohmann::json resolved, const char* name_key);
nlohmann::json part_object(const WorkloadPart& part, const char* name_key);

/// What `e` says, as one line: a c10::Error's message without LibTorch's
/// backtrace, cut at its first line break (a message a workload or LibTorch
/// threw, shown where one line is the rule).
std::string error_line(const std::exception& e);

/// A dataset a config can name: "dataset": {"name": NAME, ...parameters}.
struct DatasetRegistration {
  std::string name;
  /// Checks the config's parameters (the "dataset" object without "name") and
  /// returns them with every default written out: what sweep.json records
  /// and a resumed sweep compares. Throw ConfigError (config.h) or use
  /// config::JsonReader(params, "dataset") for messages naming the key.
  /// Empty: any object is taken as it is.
  std::function<nlohmann::json(const nlohmann::json& params)> resolve;
  /// Loads (or generates) the splits from the resolved parameters. An error
  /// (a missing file, ...) is reported as "dataset: <message>", exit 2.
  std::function<WorkloadData(const nlohmann::json& params)> load;
};

/// A model a config can name: "model": {"type": TYPE, ...parameters}.
struct ModelRegistration {
  std::string type;
  /// As DatasetRegistration::resolve, for the "model" object without "type".
  std::function<nlohmann::json(const nlohmann::json& params)> resolve;
  /// Builds one trial's model. The runner has seeded LibTorch's global
  /// generator with the trial's seed (and holds a lock), so a model
  /// initialized from it is the same for the same seed.
  std::function<Model(const nlohmann::json& params, const ModelInput& input)> build;
};

/// Adds to the registries (thread-safe). A name already taken is an error
/// (std::invalid_argument), the built-in ones included. Register before
/// parsing a config or calling cli_main.
void register_dataset(DatasetRegistration registration);
void register_model(ModelRegistration registration);
/// The registered names, sorted (the built-ins included).
std::vector<std::string> registered_datasets();
std::vector<std::string> registered_models();
/// The registration of `name`; ConfigError "dataset.name: unknown ..."
/// (model.type) listing the registered ones when there is none.
DatasetRegistration dataset_registration(const std::string& name);
ModelRegistration model_registration(const std::string& type);

}  // namespace bigbatch::experiments
