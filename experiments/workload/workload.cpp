// The workload interface (workload.h): in-memory examples, the task's loss,
// the model handle, and the two registries with the built-ins in them.
#include "workload.h"

#include "data.h"
#include "gpt.h"
#include "python.h"
#include "images.h"
#include "models.h"
#include "text.h"

#include <c10/util/Exception.h>
#include <torch/nn/functional/loss.h>

#include <map>
#include <mutex>
#include <stdexcept>

namespace bigbatch::experiments {

Batch Examples::range(std::int64_t begin, std::int64_t end) const { return get(at::arange(begin, end, at::kLong)); }

Batch Examples::augmented(const at::Tensor& index, const Draw&) const { return get(index); }

namespace {

// SplitMix64's output function (Steele, Lea and Flood 2014): a bijection of
// 64-bit words whose outputs pass BigCrush for consecutive inputs.
std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

ExampleRandom::ExampleRandom(const Draw& draw, std::int64_t example)
    : state_(mix64(mix64(mix64(draw.seed) ^ static_cast<std::uint64_t>(draw.epoch)) ^
                   static_cast<std::uint64_t>(example))) {}

std::uint64_t ExampleRandom::next() {
  state_ += 0x9e3779b97f4a7c15ULL;
  return mix64(state_);
}

double ExampleRandom::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

std::int64_t ExampleRandom::below(std::int64_t n) {
  TORCH_CHECK(n >= 1, "ExampleRandom::below: n must be >= 1, got ", n);
  return static_cast<std::int64_t>(uniform() * static_cast<double>(n)) % n;
}

namespace {

class TensorExamples final : public Examples {
 public:
  TensorExamples(at::Tensor input, at::Tensor target) : input_(std::move(input)), target_(std::move(target)) {
    TORCH_CHECK(input_.dim() >= 1 && target_.dim() >= 1 && input_.size(0) == target_.size(0),
                "tensor_examples: inputs ", input_.sizes(), " and targets ", target_.sizes(),
                " must have one row per example");
  }
  std::int64_t size() const override { return input_.size(0); }
  Batch get(const at::Tensor& index) const override {
    return {input_.index_select(0, index), target_.index_select(0, index)};
  }
  Batch range(std::int64_t begin, std::int64_t end) const override {
    return {input_.slice(0, begin, end), target_.slice(0, begin, end)};
  }

 private:
  at::Tensor input_, target_;
};

}  // namespace

std::shared_ptr<const Examples> tensor_examples(at::Tensor input, at::Tensor target) {
  return std::make_shared<TensorExamples>(std::move(input), std::move(target));
}

std::vector<std::int64_t> WorkloadData::example_shape() const {
  TORCH_CHECK(train && train->size() > 0, "dataset: no training examples");
  const at::Tensor first = train->range(0, 1).input;  // (held: sizes() points into it)
  return {first.sizes().begin() + 1, first.sizes().end()};
}

at::Tensor WorkloadData::example_loss(const at::Tensor& output, const at::Tensor& target) const {
  if (loss) return loss(output, target);
  namespace F = torch::nn::functional;
  if (classes > 0 && output.dim() > 2) {  // a sequence: each position's loss, averaged over the example's positions
    const at::Tensor each = F::cross_entropy(output.reshape({-1, output.size(-1)}), target.reshape({-1}),
                                             F::CrossEntropyFuncOptions().reduction(torch::kNone));
    return each.view({output.size(0), -1}).mean(1);
  }
  if (classes > 0) return F::cross_entropy(output, target, F::CrossEntropyFuncOptions().reduction(torch::kNone));
  return (output - target).pow(2).reshape({output.size(0), -1}).sum(1);
}

at::Tensor WorkloadData::example_error(const at::Tensor& output, const at::Tensor& target) const {
  TORCH_CHECK(classes > 0, "example_error: a regression task has no error rate");
  const at::Tensor wrong = output.argmax(-1).ne(target).to(at::kFloat);
  return wrong.dim() > 1 ? wrong.view({wrong.size(0), -1}).mean(1) : wrong;
}

Model::Model(std::shared_ptr<torch::nn::Module> module, std::function<at::Tensor(const at::Tensor&)> forward)
    : module_(std::move(module)), forward_(std::move(forward)) {
  TORCH_CHECK(module_ != nullptr && forward_, "Model: needs a module and a forward function");
}

torch::nn::Sequential Model::sequential() const {
  auto seq = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(module_);
  return seq ? torch::nn::Sequential(seq) : torch::nn::Sequential(nullptr);
}

WorkloadPart as_part(nlohmann::json resolved, const char* name_key) {
  const std::string name = resolved.at(name_key).get<std::string>();
  resolved.erase(name_key);
  return {name, std::move(resolved)};
}

nlohmann::json part_object(const WorkloadPart& part, const char* name_key) {
  nlohmann::json j = part.params;
  j[name_key] = part.name;
  return j;
}

std::string error_line(const std::exception& e) {
  const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
  const std::string text = torch_error != nullptr ? torch_error->what_without_backtrace() : e.what();
  return text.substr(0, text.find('\n'));
}

// ------------------------------------------------------------ registries --

namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, DatasetRegistration> datasets;
  std::map<std::string, ModelRegistration> models;
};

template <typename Entry>
void add(std::map<std::string, Entry>& to, const std::string& name, Entry entry, const char* what) {
  if (name.empty()) throw std::invalid_argument(std::string("register_") + what + ": an empty name");
  if (!to.emplace(name, std::move(entry)).second) {
    throw std::invalid_argument(std::string("register_") + what + ": \"" + name + "\" is registered already");
  }
}

// The registries, with the built-ins added on first use (not by static
// initializers, which a static library's linker may drop).
Registry& registry() {
  static Registry* r = [] {
    auto* out = new Registry;  // never destroyed: registrations may be read at exit
    for (auto& d : builtin_datasets()) add(out->datasets, d.name, d, "dataset");
    for (auto& d : image_datasets()) add(out->datasets, d.name, d, "dataset");
    const DatasetRegistration text = text_dataset();
    add(out->datasets, text.name, text, "dataset");
    for (auto& m : builtin_models()) add(out->models, m.type, m, "model");
    const ModelRegistration gpt = gpt_model();
    add(out->models, gpt.type, gpt, "model");
    const DatasetRegistration python_data = python_dataset();  // the Python executor's (python.h)
    add(out->datasets, python_data.name, python_data, "dataset");
    const ModelRegistration python_module = python_model();
    add(out->models, python_module.type, python_module, "model");
    return out;
  }();
  return *r;
}

template <typename Entry>
std::vector<std::string> names(const std::map<std::string, Entry>& from) {
  std::vector<std::string> out;
  for (const auto& item : from) out.push_back(item.first);
  return out;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

namespace {

template <typename Entry>
void register_in(std::map<std::string, Entry> Registry::*table, std::string name, Entry entry, const char* what) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  add(r.*table, name, std::move(entry), what);
}

template <typename Entry>
std::vector<std::string> names_in(std::map<std::string, Entry> Registry::*table) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return names(r.*table);
}

// The entry of `name`, or ConfigError "<key>: unknown ..." listing the names.
template <typename Entry>
Entry find_in(std::map<std::string, Entry> Registry::*table, const std::string& name, const char* key) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto& entries = r.*table;
  const auto it = entries.find(name);
  if (it == entries.end()) {
    throw ConfigError(std::string(key) + ": unknown \"" + name + "\" (registered: " + joined(names(entries)) + ")");
  }
  return it->second;
}

}  // namespace

void register_dataset(DatasetRegistration registration) {
  TORCH_CHECK(registration.load, "register_dataset(\"", registration.name, "\"): no load function");
  const std::string name = registration.name;
  register_in(&Registry::datasets, name, std::move(registration), "dataset");
}

void register_model(ModelRegistration registration) {
  TORCH_CHECK(registration.build, "register_model(\"", registration.type, "\"): no build function");
  const std::string type = registration.type;
  register_in(&Registry::models, type, std::move(registration), "model");
}

std::vector<std::string> registered_datasets() { return names_in(&Registry::datasets); }
std::vector<std::string> registered_models() { return names_in(&Registry::models); }

DatasetRegistration dataset_registration(const std::string& name) {
  return find_in(&Registry::datasets, name, "dataset.name");
}

ModelRegistration model_registration(const std::string& type) {
  return find_in(&Registry::models, type, "model.type");
}

}  // namespace bigbatch::experiments
