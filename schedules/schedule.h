// Learning-rate and batch-size schedules as pure functions of the global step
// (docs/formulas.md: scaling rules, gradual warmup of Goyal et al. 2017, decays,
// batch-size increase of Smith et al. 2017, regime adaptation of Hoffer et al. 2017).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace bigbatch::schedules {

/// How the base rate lr0 (tuned at base_batch B0) scales to batch B. kSde
/// scales the rate as kSqrt and the optimizer's betas and eps with it
/// (Malladi et al. 2022; option_rules.h).
enum class Scaling { kNone, kLinear, kSqrt, kSde };

/// lr0, lr0 * B/B0 or lr0 * sqrt(B/B0) (kSqrt and kSde).
double scale_lr(double lr0, Scaling rule, std::int64_t batch, std::int64_t base_batch);

/// The unit of every length in a spec (warmup, milestones, decay length,
/// budgets): optimizer steps, or epochs of `examples_per_epoch` examples.
enum class Unit { kSteps, kEpochs };

enum class DecayType { kConstant, kStep, kExponential, kPolynomial, kCosine, kLinear, kWsd };

/// The shape of a warmup-stable-decay cooldown: "linear", "1-sqrt"
/// (Hägele et al. 2024's best) or "cosine".
enum class CooldownShape { kLinear, kOneMinusSqrt, kCosine };

/// Gradual warmup: over `length` units the rate rises linearly from
/// `start_lr` (default: the unscaled lr0; 0 allowed) to the scaled rate.
struct WarmupSpec {
  double length = 0;
  std::optional<double> start_lr;
};

/// The decay that follows warmup, counted from its own step 0.
///   step:        lr * gamma^(milestones passed)
///   exponential: lr * gamma^(s / unit)            (gamma per unit)
///   polynomial:  end_lr + (lr - end_lr) * (1 - s/T)^power, s <= T = length
///   cosine:      end_lr + (lr - end_lr) * (1 + cos(pi s/T)) / 2
///   linear:      polynomial with power 1
///   wsd:         lr for s < S (stable), then over the cooldown C with u = (s - S)/C:
///                end_lr + (lr - end_lr) * (1 - u)             linear
///                end_lr + (lr - end_lr) * (1 - sqrt(u))       1-sqrt
///                end_lr + (lr - end_lr) * (1 + cos(pi u)) / 2 cosine
///                and end_lr past S + C
struct DecaySpec {
  DecayType type = DecayType::kConstant;
  std::vector<double> milestones;  ///< step: increasing positions
  double gamma = 0.1;              ///< step, exponential: factor in (0, 1]
  double power = 2;                ///< polynomial
  double end_lr = 0;               ///< polynomial, cosine, linear, wsd
  double length = 0;               ///< polynomial, cosine, linear: T > 0
  double stable = 0;               ///< wsd: S >= 0, the constant phase after warmup
  double cooldown = 0;             ///< wsd: C > 0
  CooldownShape shape = CooldownShape::kOneMinusSqrt;  ///< wsd
};

/// Batch-size increase instead of decay: at each step-decay milestone the
/// batch is multiplied by `factor` (default 1/gamma) and the rate by
/// `lr_factor` (default 1: Smith et al. 2017) while the batch stays <=
/// max_batch; past that the rate decays as usual. `seesaw` makes lr_factor's
/// default 1/sqrt(factor) (Seesaw, arXiv 2510.14717: each halving of the
/// rate becomes rate / sqrt(2) and batch x 2, keeping lr / sqrt(B) the decay's).
struct BatchIncreaseSpec {
  std::int64_t max_batch = 0;
  std::optional<double> factor;
  std::optional<double> lr_factor;
  bool seesaw = false;
};

/// One stage of a batch-size warmup: train at `batch` until `until_examples`
/// examples have been seen (counted from the run's start).
struct BatchStage {
  std::int64_t batch = 0;
  std::int64_t until_examples = 0;
};

/// A whole schedule as a config holds it. `base_lr` is lr0, tuned at
/// `base_batch`; the batch a run uses is given when the schedule is resolved.
struct ScheduleSpec {
  double base_lr = 0.1;
  std::int64_t base_batch = 256;
  Scaling scaling = Scaling::kNone;
  Unit unit = Unit::kSteps;
  WarmupSpec warmup;
  DecaySpec decay;
  std::optional<BatchIncreaseSpec> batch_increase;
  /// Batch-size warmup (Merrill et al. 2025; bigbatch cbs derives one): the
  /// stages in order, then the run's own batch size. A stage ends at the
  /// first step boundary at or past its until_examples. The rate follows
  /// `scaling` at each step's batch (warmup and decay apply on top).
  /// Steps unit only, with a constant, exponential, polynomial, cosine or
  /// linear decay (a step decay is batch_increase's; regime adaptation needs
  /// one batch).
  std::vector<BatchStage> batch_warmup;
  /// Hoffer et al.: milestones, decay length (and budgets through
  /// Schedule::steps()) multiplied by ceil(B / B0).
  bool regime_adaptation = false;
  /// Rules for options beyond the rate (option_rules.h), in examples: the
  /// AdamW timescale B / (eta * weight_decay) held at this many examples,
  /// and beta2 set by its half-life in examples.
  std::optional<double> weight_decay_timescale;
  std::optional<double> beta2_half_life;

  /// Throws c10::Error naming the parameter and its value.
  void validate() const;
};

/// A spec resolved for one run: its batch size and epoch length fixed, every
/// position converted to steps. lr(t) and batch_size(t) depend on t only.
class Schedule {
 public:
  /// examples_per_epoch is required (> 0) where spec.unit is epochs.
  Schedule(ScheduleSpec spec, std::int64_t batch_size, std::int64_t examples_per_epoch = 0);

  /// The rate of optimizer step t (0-based).
  double lr(std::int64_t step) const;
  /// The batch size of step t.
  std::int64_t batch_size(std::int64_t step) const;
  /// Examples consumed by steps 0 .. t-1.
  std::int64_t examples_seen(std::int64_t step) const;
  /// A length in the spec's unit (e.g. a budget) in steps, after regime
  /// adaptation, counting epochs at the batch sizes the schedule uses.
  std::int64_t steps(double length) const { return steps(length, spec_.unit); }
  /// The same for a length in `unit` (epochs need examples_per_epoch > 0).
  std::int64_t steps(double length, Unit unit) const;

  double peak_lr() const { return peak_lr_; }
  std::int64_t warmup_steps() const { return warmup_steps_; }
  /// ceil(B / B0) with regime adaptation, else 1.
  std::int64_t regime_factor() const { return regime_factor_; }
  const ScheduleSpec& spec() const { return spec_; }

 private:
  struct Event {
    std::int64_t step;         // global step from which it applies
    bool batch;                // the batch changes (increase, warmup stage), else lr *= gamma
    std::int64_t batch_after;  // the batch size from this step on
  };
  // Steps a length in the spec's unit takes at a constant batch (rounded up).
  std::int64_t steps_for_examples(double length, std::int64_t batch) const;

  ScheduleSpec spec_;
  std::int64_t batch_;
  std::int64_t first_batch_;  // the batch of step 0: batch_warmup's first stage, else batch_
  std::int64_t examples_per_epoch_;
  std::int64_t regime_factor_ = 1;
  double peak_lr_ = 0;
  double start_lr_ = 0;
  std::int64_t warmup_steps_ = 0;
  std::int64_t decay_length_ = 0;  // polynomial, cosine, linear
  std::int64_t stable_steps_ = 0;  // wsd
  std::int64_t cooldown_steps_ = 0;  // wsd
  double steps_per_unit_ = 1;      // exponential
  double batch_factor_ = 1;
  double lr_factor_ = 1;           // at each batch increase
  std::vector<Event> events_;      // step decay, in order
};

// JSON, for configs. Every key is optional except "base_lr"; unknown keys,
// wrong types and impossible values throw c10::Error naming the key.
nlohmann::json to_json(const ScheduleSpec& spec);
ScheduleSpec schedule_from_json(const nlohmann::json& j);

std::string to_string(Scaling s);
std::string to_string(Unit u);
std::string to_string(DecayType d);
std::string to_string(CooldownShape c);

}  // namespace bigbatch::schedules
