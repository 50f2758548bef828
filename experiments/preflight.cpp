// Pre-training checks (preflight.h).
#include "preflight.h"

#include "files.h"

#include <c10/util/Exception.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>

namespace bigbatch::experiments {

void check_world(const SweepConfig& sweep, int world_size) {
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

namespace {

// Each batch size, and the largest batch-size increase grows it to, against
// the training set's size and gns.micro_batches.
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

}  // namespace

Dataset load_data(const SweepConfig& sweep) {
  check_batches(sweep, training_examples(sweep.base.data));
  Dataset data;
  try {
    data = load_dataset(sweep.base.data);
  } catch (const c10::Error& e) {
    throw ConfigError(std::string("dataset: ") + e.what_without_backtrace());
  } catch (const std::runtime_error& e) {
    throw ConfigError(std::string("dataset: ") + e.what());
  }
  TORCH_INTERNAL_ASSERT(data.train_size() == training_examples(sweep.base.data), "dataset: ", data.train_size(),
                        " training examples, expected ", training_examples(sweep.base.data));
  return data;
}

}  // namespace bigbatch::experiments
