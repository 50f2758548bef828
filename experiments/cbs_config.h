// The config of bigbatch cbs (cbs.h): a sweep config's workload plus "cbs",
// read strictly and written back (cbs.json) from one field list, as a sweep's
// is (config_io.h).
#pragma once

#include "config.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace bigbatch::experiments {

/// How far a branch's loss may be above a smaller branch's: loss_b <=
/// loss_a + value (absolute, the paper's 0.01) or loss_a * (1 + value).
struct CbsTolerance {
  bool relative = false;
  double value = 0.01;
};

struct CbsSpec {
  std::int64_t reference_batch = 0;
  double reference_lr = 0;  ///< the rate at reference_batch; branches scale it by schedule.scaling
  /// Examples the reference has seen at each checkpoint (multiples of
  /// reference_batch, increasing; 0 is the initialization).
  std::vector<std::int64_t> checkpoints;
  std::vector<std::int64_t> branch_batches;  ///< increasing, including reference_batch
  std::int64_t window = 0;                   ///< examples each branch trains (a multiple of every branch batch)
  CbsTolerance tolerance;
  /// The branch rate rule: the scaled rate times each factor; a branch's loss
  /// is its best factor's (mean over seeds). {1}: the scaling rule alone.
  std::vector<double> lr_factors{1.0};
};

/// A cbs config: a sweep config's workload (dataset, model, optimizer,
/// schedule, noise, gns, target and budget for --compare, seeds, device)
/// without batch_sizes and search, plus "cbs". `sweep.batch_sizes` holds the
/// branch batches (checked against the data like a sweep's) and
/// `sweep.search.lr` the reference rate.
struct CbsConfig {
  SweepConfig sweep;
  CbsSpec cbs;
};

/// Parses a cbs config; ConfigError "<key>: <problem>" (exit 2 in the CLI).
CbsConfig parse_cbs(const nlohmann::json& j);
CbsConfig load_cbs(const std::string& path);
/// The resolved config (cbs.json): every default written out, the
/// checkpoints as a list.
nlohmann::json to_json(const CbsConfig& config);

}  // namespace bigbatch::experiments
