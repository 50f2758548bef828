// Fuzz target: the checkpoint reader, Trainer::restore, as a resumed trial
// reads checkpoint.pt (a small LAMB trial on synthetic data; a fresh trainer
// per input). Any rejection must be an exception: run_one turns it into one
// warning and a restart. With BIGBATCH_FUZZ_WRITE_SEED=FILE the first call
// also writes a real checkpoint there, the corpus's seed.
#include "../../experiments/runconfig/config.h"
#include "../../experiments/workload/data.h"
#include "../../experiments/train/trial.h"

#include <ATen/Parallel.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>

namespace {

namespace bx = bigbatch::experiments;

bx::TrialConfig trial() {
  bx::TrialConfig t;
  t.sweep = "fuzz";
  t.name = "checkpoint";
  t.data.name = "gaussian_mixture";
  t.data.params["train_size"] = 256;
  t.data.params["val_size"] = 64;
  t.data.params["classes"] = 3;
  t.data.params["dim"] = 4;
  t.model.params["widths"] = std::vector<std::int64_t>{8};
  t.optimizer = bx::resolve_optimizer("lamb");
  t.schedule.base_lr = 0.01;
  t.schedule.base_batch = 16;
  t.target.eval_every = 2;
  t.target.threshold = 0;
  t.budget.length = 1000;
  t.gns.micro_batches = 2;
  t.batch_size = 16;
  t.checkpoint_every = 2;
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bx::TrialConfig config = trial();
  static const bx::WorkloadData dataset = [] {
    at::set_num_threads(1);
    return bx::load_dataset(config.data);
  }();
  static bool seeded = false;
  if (!seeded) {
    seeded = true;
    if (const char* seed = std::getenv("BIGBATCH_FUZZ_WRITE_SEED")) {
      bx::Trainer t(config, dataset);
      for (int i = 0; i < 4; ++i) t.train_step();
      const std::string bytes = t.checkpoint();
      std::ofstream(seed, std::ios::binary) << bytes;
      bx::Trainer(config, dataset).restore(bytes);  // the seed must restore (it throws otherwise)
    }
  }
  bx::Trainer trainer(config, dataset);
  try {
    trainer.restore(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const std::exception&) {
  }
  return 0;
}
