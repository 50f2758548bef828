// Pre-training checks (preflight.h).
#include "preflight.h"

#include "../io/files.h"
#include "../workload/models.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>
#include <system_error>

namespace bigbatch::experiments {

void check_world(const SweepConfig& sweep, int world_size) {
  const auto method = sweep.base.distributed.compression.method;
  if (method != distributed::Compression::kNone && world_size < 2) {
    throw ConfigError(std::string("distributed.compression: ") + distributed::compression_name(method) +
                      " compresses the gradient exchange of a data-parallel run, and this run has a world of "
                      "one; run it with --nproc 2 or more (or under torchrun, mpirun, srun)");
  }
  const auto shard = sweep.base.distributed.shard;
  if (shard != distributed::ShardStage::kNone && world_size < 2) {
    throw ConfigError(std::string("distributed.shard: \"") + distributed::shard_stage_name(shard) +
                      "\" shards the optimizer across the ranks of a data-parallel run, and this run has a world "
                      "of one; run it with --nproc 2 or more (or under torchrun, mpirun, srun)");
  }
  for (const auto b : sweep.batch_sizes) {
    if (b % world_size != 0) {
      throw ConfigError("batch_sizes: " + std::to_string(b) + " is not divisible by the world size " +
                        std::to_string(world_size));
    }
  }
}

void check_jobs(int jobs, bool data_parallel, const std::string& runs_one) {
  if (jobs < 1) throw ConfigError("--jobs: must be >= 1, got " + std::to_string(jobs));
  if (data_parallel && jobs != 1) {
    throw ConfigError("--jobs: a data-parallel " + runs_one + " at a time on all ranks; got --jobs " +
                      std::to_string(jobs));
  }
}

void check_folder(const std::string& dir, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw ConfigError(what + ": " + dir + ": cannot make this folder (" + ec.message() + ")");
  const std::filesystem::path probe = std::filesystem::path(dir) / (".bigbatch_write_test." + std::to_string(::getpid()));
  try {
    write_file_atomic(probe.string(), "ok");
  } catch (const std::runtime_error& e) {
    throw ConfigError(what + ": " + dir + ": cannot write here (" + e.what() + ")");
  }
  std::filesystem::remove(probe, ec);
}

void check_batches(const SweepConfig& sweep, std::int64_t train_size) {
  for (const auto b : sweep.batch_sizes) {
    if (b > train_size) {
      throw ConfigError("batch_sizes: " + std::to_string(b) + " is larger than the training set (" +
                        std::to_string(train_size) + " examples)");
    }
    const schedules::Schedule schedule(sweep.base.schedule, b, train_size);
    const std::int64_t last = schedule.steps(sweep.base.budget.length, sweep.base.budget.unit);
    const std::int64_t grown = schedule.batch_size(std::max<std::int64_t>(0, last - 1));
    if (grown > train_size) {
      throw ConfigError("schedule.batch_increase: batch " + std::to_string(b) + " grows to " + std::to_string(grown) +
                        ", larger than the training set (" + std::to_string(train_size) + " examples)");
    }
    const std::int64_t k = sweep.base.gns.micro_batches;
    if (k > 0 && b % k != 0) {
      throw ConfigError("batch_sizes: " + std::to_string(b) + " is not divisible by gns.micro_batches " +
                        std::to_string(k));
    }
    if (k > 0 && grown % k != 0) {
      throw ConfigError("schedule.batch_increase: batch " + std::to_string(b) + " grows to " + std::to_string(grown) +
                        ", not divisible by gns.micro_batches " + std::to_string(k));
    }
  }
}

namespace {

// The data's splits, and the target's metric against the task.
void check_data(const SweepConfig& sweep, const WorkloadData& data) {
  const std::string name = "dataset \"" + sweep.base.data.name + "\"";
  if (!data.train || data.train->size() == 0) throw ConfigError(name + ": no training examples (size 0)");
  if (!data.validation || data.validation->size() == 0) {
    throw ConfigError(name + ": no validation examples (size 0): evaluation has nothing to measure");
  }
  if (sweep.base.target.metric == Metric::kValError && data.classes == 0) {
    throw ConfigError("target.metric: val_error needs a classification dataset; " + sweep.base.data.name +
                      " has val_loss");
  }
}

// One model of the sweep, built as a trial builds it, on two training
// examples: its output must fit the task (shapes named), and the loss must
// take it.
void check_model(const SweepConfig& sweep, const WorkloadData& data) {
  const std::string model = "model \"" + sweep.base.model.name + "\"";
  try {
    const Model m = build_model(sweep.base.model, data, sweep.seeds.front());
    const Batch b = data.train->range(0, std::min<std::int64_t>(2, data.train->size()));
    at::NoGradGuard no_grad;
    m.module().eval();
    const at::Tensor out = m.forward(b.input);
    m.module().train();
    // Classification: outputs [targets' shape..., classes] (one target per
    // example, or one per position of a sequence).
    const bool fits = data.classes > 0 ? out.dim() == b.target.dim() + 1 && out.size(-1) == data.classes &&
                                             out.sizes().slice(0, out.dim() - 1) == b.target.sizes()
                                       : out.sizes() == b.target.sizes();
    if (!fits) {
      std::ostringstream why;
      why << model << ": output " << out.sizes() << " for inputs " << b.input.sizes()
          << " does not fit the targets of dataset \"" << sweep.base.data.name << "\" (" << b.target.sizes()
          << "; expected ";
      if (data.classes > 0) {
        std::vector<std::int64_t> shape = b.target.sizes().vec();
        shape.push_back(data.classes);
        why << c10::IntArrayRef(shape) << " for " << data.classes << " classes)";
      } else {
        why << "the targets' shape: regression)";
      }
      throw ConfigError(why.str());
    }
    (void)data.example_loss(out, b.target);
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    throw ConfigError(model + ": " + error_line(e));
  }
}

}  // namespace

WorkloadData load_data(const SweepConfig& sweep) {
  WorkloadData data;
  try {
    data = load_dataset(sweep.base.data);
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    // One "dataset" prefix: a loader's message may name its key already ("dataset.path: ...").
    const std::string line = error_line(e);
    throw ConfigError(line.rfind("dataset", 0) == 0 ? line : "dataset: " + line);
  }
  check_data(sweep, data);
  check_batches(sweep, data.train->size());
  if (sweep.base.model.name != "python") check_model(sweep, data);  // (a Python module is the executor's)
  return data;
}

}  // namespace bigbatch::experiments
