// Batch-size rules for the optimizer's options beyond the rate, each a pure
// function of the batch (docs/formulas.md "Scaling rules beyond the rate"):
// the SDE rule for adaptive methods (Malladi et al. 2022), the AdamW
// timescale (Wang and Aitchison 2024) and beta2 by its half-life in examples
// (Marek et al. 2025). A sweep applies them to each trial's optimizer keys
// when it makes the trial, so the trial's config holds the options it trains with.
#pragma once

#include "schedule.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace bigbatch::schedules {

/// `keys` (an optimizer's resolved keys, tuned at spec.base_batch) with the
/// options `spec`'s rules set at batch `batch`, for a trial whose base rate
/// is `base_lr`; k = batch / base_batch and eta the peak rate at `batch`:
///   scaling "sde":            betas (1 - k (1 - b1), 1 - k (1 - b2)), eps / sqrt(k)
///   weight_decay_timescale T: weight_decay = batch / (eta * T)      (T in examples)
///   beta2_half_life h:        betas[1] = 2^(-batch / h)            (h in examples)
/// Keys no rule sets are returned as they are. Throws c10::Error naming the
/// schedule key where `optimizer` lacks the option a rule sets, or where a
/// rule's result is not a valid option (a beta outside [0, 1)).
nlohmann::json ruled_options(const ScheduleSpec& spec, std::int64_t batch, double base_lr,
                             const std::string& optimizer, nlohmann::json keys);

/// Whether `spec` has a rule that sets options beyond the rate.
bool has_option_rules(const ScheduleSpec& spec);

}  // namespace bigbatch::schedules
