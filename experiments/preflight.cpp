// Pre-training checks (preflight.h).
#include <bigbatch/experiments/preflight.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <string>

namespace bigbatch::experiments {

void check_world(const SweepConfig& sweep, int world_size) {
  for (const auto b : sweep.batch_sizes) {
    if (b % world_size != 0) {
      throw ConfigError("batch_sizes: " + std::to_string(b) + " is not divisible by the world size " +
                        std::to_string(world_size));
    }
  }
}

Dataset load_data(const SweepConfig& sweep) {
  Dataset data;
  try {
    data = load_dataset(sweep.base.data);
  } catch (const c10::Error& e) {
    throw ConfigError(std::string("dataset: ") + e.what_without_backtrace());
  } catch (const std::runtime_error& e) {
    throw ConfigError(std::string("dataset: ") + e.what());
  }
  for (const auto b : sweep.batch_sizes) {
    if (b > data.train_size()) {
      throw ConfigError("batch_sizes: " + std::to_string(b) + " is larger than the training set (" +
                        std::to_string(data.train_size()) + " examples)");
    }
    // With batch-size increase the batch grows: its largest must fit too.
    const schedules::Schedule schedule(sweep.base.schedule, b, data.train_size());
    const std::int64_t last = schedule.steps(sweep.base.budget.length, sweep.base.budget.unit);
    const std::int64_t grown = schedule.batch_size(std::max<std::int64_t>(0, last - 1));
    if (grown > data.train_size()) {
      throw ConfigError("schedule.batch_increase: batch " + std::to_string(b) + " grows to " + std::to_string(grown) +
                        ", larger than the training set (" + std::to_string(data.train_size()) + " examples)");
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
  return data;
}

}  // namespace bigbatch::experiments
