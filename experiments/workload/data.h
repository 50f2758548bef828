// The built-in datasets, held in memory as tensors and registered as any
// user's (workload.h): Fashion-MNIST (55k/5k/10k from Debian's
// dataset-fashion-mnist), the linear regression y = 10(x + N(0,1)) + 2, and
// a Gaussian-mixture classification task; and the runner's batch sampler.
#pragma once

#include "workload.h"
#include "../../config/json_reader.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize

namespace bigbatch::experiments {


enum class DatasetName { kFashionMnist, kLinearRegression, kGaussianMixture };

/// How configs spell them, in the order error messages list them.
inline constexpr config::EnumName<DatasetName> kDatasetNames[] = {
    {DatasetName::kFashionMnist, "fashion_mnist"},
    {DatasetName::kLinearRegression, "linear_regression"},
    {DatasetName::kGaussianMixture, "gaussian_mixture"}};

/// A built-in dataset's parameters ("dataset" in a sweep config).
struct DataSpec {
  DatasetName name = DatasetName::kFashionMnist;
  std::int64_t train_size = 8192;       ///< synthetic: training examples (Fashion-MNIST: 55000)
  std::int64_t val_size = 2048;         ///< synthetic: validation and test examples each
  std::int64_t classes = 10;            ///< gaussian_mixture
  std::int64_t dim = 20;                ///< gaussian_mixture: input dimension
  double separation = 2.0;              ///< gaussian_mixture: distance scale of the means
  std::uint64_t seed = 0;               ///< synthetic data
};

/// A built-in dataset's spec as a config's part (every key written out), and
/// back (ConfigError naming "dataset.<key>"), for a program that builds
/// configs in C++ (the tests do).
WorkloadPart dataset_part(const DataSpec& spec);
DataSpec data_spec(const WorkloadPart& part);

/// The built-in datasets, registered under their config names (workload.h).
std::vector<DatasetRegistration> builtin_datasets();

/// The data a config's "dataset" names, loaded through its registration
/// (workload.h). Errors are the registration's (std::runtime_error,
/// c10::Error); preflight.h's load_data() turns them into ConfigError.
WorkloadData load_dataset(const WorkloadPart& part);
/// A built-in dataset, loaded directly.
WorkloadData load_dataset(const DataSpec& spec);

/// Draws batches without replacement within an epoch: a fresh permutation per
/// epoch from the sampler's own generator; a batch never spans two epochs
/// (the tail that does not fill a batch is dropped).
class BatchSampler {
 public:
  BatchSampler(std::int64_t size, std::uint64_t seed);
  /// Indices of the next batch (int64, size `batch`). batch <= size.
  at::Tensor next(std::int64_t batch);
  /// The epoch of the last batch next() gave (0 for the first permutation).
  std::int64_t epoch() const { return epoch_; }
  /// An independent copy (its own generator), to look ahead with.
  BatchSampler clone() const;

  /// Where the sampler is, under the keys "generator", "order", "position"
  /// and "epoch", to checkpoint and restore a run exactly.
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  std::int64_t size_;
  at::Generator generator_;
  at::Tensor order_;
  std::int64_t position_ = 0;
  std::int64_t epoch_ = -1;  // permutations drawn, less one
};

}  // namespace bigbatch::experiments
