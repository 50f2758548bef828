// The loss-against-horizon table of a sweep whose trials have horizons
// (config.h horizon_trial; trial_folder.h run_one branches them):
//
//   horizons.csv   per batch size and horizon (each of "horizons", then the
//                  budget): the rate with the lowest median final target
//                  metric over its seeds (the metric of the horizon run's
//                  last evaluation, at its budget), whether it is on the
//                  search's edge (search_edge), that median with the
//                  seeds' min, max and bootstrap interval, the same rate's
//                  median final val_loss, its median steps to target within
//                  that run, and the steps a horizon's run trained past its
//                  branch point (its cost, with branching).
//   horizons.json  per batch size, the steps one rate and seed trained for
//                  every horizon with branching (the budget, plus each
//                  branch's own steps) against training each horizon alone
//                  (the sum of their budgets), and their ratio.
#pragma once

#include "../runconfig/config.h"

#include <string>
#include <vector>

namespace bigbatch::experiments {

/// Writes horizons.csv and horizons.json into `sweep_dir` when `trials`
/// have horizons (they all do or none); nothing otherwise. A missing or
/// unfinished horizon folder counts as a seed that did not finish (+inf).
void write_horizon_tables(const std::vector<TrialConfig>& trials, const std::string& sweep_dir);

}  // namespace bigbatch::experiments
