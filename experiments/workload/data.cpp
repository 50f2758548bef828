// Datasets (data.h): Fashion-MNIST through the IDX reader, and the synthetic
// tasks drawn from their own generator so a seed fixes them.
#include "data.h"

#include "../io/idx.h"
#include "../../config/fields.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <stdexcept>

namespace bigbatch::experiments {
namespace {

// Fashion-MNIST's 60,000 training images: the first 55,000 train, the rest validate.
constexpr std::int64_t kFashionTrain = 55000;

at::Tensor images(const IdxArray& a, std::int64_t begin, std::int64_t end) {
  const auto n = static_cast<std::int64_t>(a.dims.at(0));
  const at::Tensor all = at::from_blob(const_cast<std::uint8_t*>(a.data.data()), {n, 1, 28, 28}, at::kByte);
  // Scaled to [0, 1], then standardized with Fashion-MNIST's pixel mean/std.
  return (all.slice(0, begin, end).to(at::kFloat).div(255) - 0.2860) / 0.3530;
}

at::Tensor labels(const IdxArray& a, std::int64_t begin, std::int64_t end) {
  const auto n = static_cast<std::int64_t>(a.dims.at(0));
  return at::from_blob(const_cast<std::uint8_t*>(a.data.data()), {n}, at::kByte)
      .slice(0, begin, end)
      .to(at::kLong);
}

WorkloadData fashion_mnist() {
  const FashionMnist f = load_fashion_mnist();
  WorkloadData d;
  d.classes = 10;
  d.train = tensor_examples(images(f.train_images, 0, kFashionTrain), labels(f.train_labels, 0, kFashionTrain));
  d.validation =
      tensor_examples(images(f.train_images, kFashionTrain, 60000), labels(f.train_labels, kFashionTrain, 60000));
  d.test = tensor_examples(images(f.test_images, 0, 10000), labels(f.test_labels, 0, 10000));
  return d;
}

// The splits of a synthetic task, drawn in order (train, validation, test,
// the last two of val_size examples) from the one generator `draw` holds.
template <typename Draw>
WorkloadData synthetic(const DataSpec& s, std::int64_t classes, const Draw& draw) {
  TORCH_CHECK(s.train_size > 1, "dataset.train_size: must be > 1, got ", s.train_size);
  TORCH_CHECK(s.val_size > 0, "dataset.val_size: must be > 0, got ", s.val_size);
  WorkloadData d;
  d.classes = classes;
  const auto split = [&](std::int64_t n) {
    at::Tensor x, y;
    draw(n, x, y);
    return tensor_examples(x, y);
  };
  d.train = split(s.train_size);
  d.validation = split(s.val_size);
  d.test = split(s.val_size);
  return d;
}

// y = 10 (x + e) + 2 with x, e ~ N(0, 1): the noise enters through the input,
// as in the classic GD-vs-SGD lab; the best fit is w = 10, b = 2.
WorkloadData linear_regression(const DataSpec& s) {
  auto gen = at::detail::createCPUGenerator(s.seed);
  const auto draw = [&](std::int64_t n, at::Tensor& x, at::Tensor& y) {
    x = at::randn({n, 1}, gen, at::kFloat);
    y = 10 * (x + at::randn({n, 1}, gen, at::kFloat)) + 2;
  };
  return synthetic(s, 0, draw);
}

// Class k's examples ~ N(mu_k, I) with mu_k ~ N(0, separation^2 I / dim) * sqrt(dim):
// overlapping classes, so the error floor is above zero and batch size matters.
WorkloadData gaussian_mixture(const DataSpec& s) {
  TORCH_CHECK(s.classes >= 2, "dataset.classes: must be >= 2, got ", s.classes);
  TORCH_CHECK(s.dim >= 1, "dataset.dim: must be >= 1, got ", s.dim);
  auto gen = at::detail::createCPUGenerator(s.seed);
  const at::Tensor means = at::randn({s.classes, s.dim}, gen, at::kFloat) * s.separation;
  const auto draw = [&](std::int64_t n, at::Tensor& x, at::Tensor& y) {
    y = at::randint(s.classes, {n}, gen, at::kLong);
    x = means.index_select(0, y) + at::randn({n, s.dim}, gen, at::kFloat);
  };
  return synthetic(s, s.classes, draw);
}

}  // namespace

namespace {

using config::num;

// A built-in dataset's keys: one list, read and written (config/fields.h).
template <typename Io, typename Spec>
void data_fields(Io& io, Spec& d) {
  io.choice("name", d.name, kDatasetNames);
  if (d.name == DatasetName::kFashionMnist) return;
  io.field("train_size", d.train_size);
  io.field("val_size", d.val_size);
  io.field("seed", d.seed);
  io.check("train_size", d.train_size > 1, "must be > 1, got " + std::to_string(d.train_size));
  io.check("val_size", d.val_size > 0, "must be > 0, got " + std::to_string(d.val_size));
  if (d.name != DatasetName::kGaussianMixture) return;
  io.field("classes", d.classes);
  io.field("dim", d.dim);
  io.field("separation", d.separation);
  io.check("classes", d.classes >= 2, "must be >= 2, got " + std::to_string(d.classes));
  io.check("dim", d.dim >= 1, "must be >= 1, got " + std::to_string(d.dim));
  io.check("separation", d.separation > 0, "must be > 0, got " + num(d.separation));
}

}  // namespace

WorkloadPart dataset_part(const DataSpec& spec) {
  return as_part(config::write_fields(spec, [](auto& io, auto& d) { data_fields(io, d); }), "name");
}

DataSpec data_spec(const WorkloadPart& part) {
  return config::read_fields<DataSpec>(part_object(part, "name"), "dataset",
                                       [](auto& io, auto& d) { data_fields(io, d); });
}

WorkloadData load_dataset(const DataSpec& spec) {
  switch (spec.name) {
    case DatasetName::kFashionMnist: return fashion_mnist();
    case DatasetName::kLinearRegression: return linear_regression(spec);
    case DatasetName::kGaussianMixture: return gaussian_mixture(spec);
  }
  TORCH_INTERNAL_ASSERT(false, "dataset ", static_cast<int>(spec.name), " has no loader");
}

WorkloadData load_dataset(const WorkloadPart& part) { return dataset_registration(part.name).load(part.params); }

std::vector<DatasetRegistration> builtin_datasets() {
  std::vector<DatasetRegistration> out;
  for (const auto& [name, text] : kDatasetNames) {
    const std::string key = text;
    out.push_back({key, [key](const nlohmann::json& params) { return dataset_part(data_spec({key, params})).params; },
                   [key](const nlohmann::json& params) { return load_dataset(data_spec({key, params})); }});
  }
  return out;
}

BatchSampler::BatchSampler(std::int64_t size, std::uint64_t seed)
    : size_(size), generator_(at::detail::createCPUGenerator(seed)) {
  TORCH_CHECK(size > 0, "BatchSampler: empty dataset");
}

at::Tensor BatchSampler::next(std::int64_t batch) {
  TORCH_CHECK(batch > 0 && batch <= size_, "batch size ", batch, " is not in [1, ", size_,
              "] (the training set)");
  if (!order_.defined() || position_ + batch > size_) {
    order_ = at::randperm(size_, generator_, at::kLong);
    position_ = 0;
    ++epoch_;
  }
  const at::Tensor out = order_.slice(0, position_, position_ + batch);
  position_ += batch;
  return out;
}

BatchSampler BatchSampler::clone() const {
  BatchSampler out(*this);
  out.generator_ = generator_.clone();
  return out;
}

void BatchSampler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("generator", generator_.get_state());
  archive.write("order", order_.defined() ? order_ : at::empty({0}, at::kLong));
  archive.write("position", at::scalar_tensor(position_, at::kLong));
  archive.write("epoch", at::scalar_tensor(epoch_, at::kLong));
}

void BatchSampler::load(torch::serialize::InputArchive& archive) {
  at::Tensor generator, order, position;
  archive.read("generator", generator);
  archive.read("order", order);
  archive.read("position", position);
  generator_.set_state(generator.cpu());
  order_ = order.numel() == 0 ? at::Tensor() : order.cpu().clone();
  TORCH_CHECK(!order_.defined() || order_.numel() == size_, "BatchSampler: a saved order of ", order_.numel(),
              " indices for a dataset of ", size_);
  position_ = position.item<std::int64_t>();
  // Checkpoints from before augmentation have no epoch: only augmented data
  // reads it, and none existed then.
  at::Tensor epoch;
  epoch_ = archive.try_read("epoch", epoch) ? epoch.item<std::int64_t>() : (order_.defined() ? 0 : -1);
}

}  // namespace bigbatch::experiments
