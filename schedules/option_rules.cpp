#include "option_rules.h"

#include <c10/util/Exception.h>

#include <cmath>

namespace bigbatch::schedules {

namespace {

/// keys[name], which the rule `rule` needs, as the optimizer holds it.
nlohmann::json& needed(nlohmann::json& keys, const char* name, const std::string& optimizer, const char* rule) {
  TORCH_CHECK(keys.is_object() && keys.contains(name), "schedule.", rule, ": sets the optimizer's ", name, ", and ",
              optimizer, " has none");
  return keys[name];
}

double beta_at(const nlohmann::json& betas, std::size_t i, const std::string& optimizer) {
  TORCH_CHECK(betas.is_array() && betas.size() == 2 && betas[i].is_number(), "optimizer.betas of ", optimizer,
              ": expected two numbers, got ", betas.dump());
  return betas[i].get<double>();
}

void check_beta(double beta, const char* rule, const char* which, std::int64_t batch, const std::string& how) {
  TORCH_CHECK(std::isfinite(beta) && beta >= 0 && beta < 1, "schedule.", rule, ": at batch ", batch, " ", which, " = ",
              how, " = ", beta, ", not in [0, 1); the rule holds while k (1 - beta) < 1");
}

}  // namespace

bool has_option_rules(const ScheduleSpec& spec) {
  return spec.scaling == Scaling::kSde || spec.weight_decay_timescale.has_value() || spec.beta2_half_life.has_value();
}

nlohmann::json ruled_options(const ScheduleSpec& spec, std::int64_t batch, double base_lr, const std::string& optimizer,
                             nlohmann::json keys) {
  TORCH_CHECK(batch > 0, "ruled_options: batch must be > 0, got ", batch);
  const double k = static_cast<double>(batch) / static_cast<double>(spec.base_batch);
  if (spec.scaling == Scaling::kSde) {
    nlohmann::json& betas = needed(keys, "betas", optimizer, "scaling");
    nlohmann::json& eps = needed(keys, "eps", optimizer, "scaling");
    const double b1 = beta_at(betas, 0, optimizer);
    const double b2 = beta_at(betas, 1, optimizer);
    const double n1 = 1 - k * (1 - b1);
    const double n2 = 1 - k * (1 - b2);
    check_beta(n1, "scaling", "beta1", batch, "1 - " + std::to_string(k) + " * (1 - " + std::to_string(b1) + ")");
    check_beta(n2, "scaling", "beta2", batch, "1 - " + std::to_string(k) + " * (1 - " + std::to_string(b2) + ")");
    betas = {n1, n2};
    TORCH_CHECK(eps.is_number(), "optimizer.eps of ", optimizer, ": expected a number, got ", eps.dump());
    eps = eps.get<double>() / std::sqrt(k);
  }
  if (spec.beta2_half_life) {
    nlohmann::json& betas = needed(keys, "betas", optimizer, "beta2_half_life");
    const double b1 = beta_at(betas, 0, optimizer);
    const double b2 = std::exp2(-static_cast<double>(batch) / *spec.beta2_half_life);
    check_beta(b2, "beta2_half_life", "beta2", batch, "2^(-batch / half_life)");
    betas = {b1, b2};
  }
  if (spec.weight_decay_timescale) {
    nlohmann::json& decay = needed(keys, "weight_decay", optimizer, "weight_decay_timescale");
    const double eta = scale_lr(base_lr, spec.scaling, batch, spec.base_batch);
    TORCH_CHECK(eta > 0, "schedule.weight_decay_timescale: the peak rate at batch ", batch,
                " is 0, so no weight decay gives a timescale");
    decay = static_cast<double>(batch) / (eta * *spec.weight_decay_timescale);
  }
  return keys;
}

}  // namespace bigbatch::schedules
