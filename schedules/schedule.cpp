// Schedules (schedule.h): docs/formulas.md "Learning-rate scaling", "Warmup",
// "Decays" and "Batch-size increase and regime adaptation", resolved to steps once.
#include "schedule.h"

#include "../config/json_reader.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

namespace bigbatch::schedules {

using config::config_error;
using config::enum_name;
using config::enum_value;
using config::EnumName;
using config::JsonReader;
namespace {

// A number of steps rounded up to an integer (less a small tolerance, so that
// 3 epochs of 60000 at batch 100 is 1800, not 1801). Refused past 2^53, where a
// double no longer holds every integer (and before a cast could overflow).
std::int64_t whole_steps(double steps) {
  TORCH_CHECK(std::fabs(steps) <= 9007199254740992.0, "schedule: a length of ", steps,
              " steps, more than 2^53: is a milestone, warmup, decay or budget length mistyped?");
  return static_cast<std::int64_t>(std::ceil(steps - 1e-9));
}

constexpr double kPi = 3.14159265358979323846;

constexpr EnumName<Scaling> kScalings[] = {
    {Scaling::kNone, "none"}, {Scaling::kLinear, "linear"}, {Scaling::kSqrt, "sqrt"}, {Scaling::kSde, "sde"}};
constexpr EnumName<Unit> kUnits[] = {{Unit::kSteps, "steps"}, {Unit::kEpochs, "epochs"}};
constexpr EnumName<DecayType> kDecays[] = {
    {DecayType::kConstant, "constant"}, {DecayType::kStep, "step"},
    {DecayType::kExponential, "exponential"}, {DecayType::kPolynomial, "polynomial"},
    {DecayType::kCosine, "cosine"}, {DecayType::kLinear, "linear"}, {DecayType::kWsd, "wsd"}};
constexpr EnumName<CooldownShape> kShapes[] = {
    {CooldownShape::kLinear, "linear"}, {CooldownShape::kOneMinusSqrt, "1-sqrt"}, {CooldownShape::kCosine, "cosine"}};

bool uses_length(DecayType d) {
  return d == DecayType::kPolynomial || d == DecayType::kCosine || d == DecayType::kLinear;
}

}  // namespace

std::string to_string(Scaling s) { return enum_name(kScalings, s); }
std::string to_string(Unit u) { return enum_name(kUnits, u); }
std::string to_string(DecayType d) { return enum_name(kDecays, d); }
std::string to_string(CooldownShape c) { return enum_name(kShapes, c); }

double scale_lr(double lr0, Scaling rule, std::int64_t batch, std::int64_t base_batch) {
  TORCH_CHECK(batch > 0, "scale_lr: batch must be > 0, got ", batch);
  TORCH_CHECK(base_batch > 0, "scale_lr: base_batch must be > 0, got ", base_batch);
  const double k = static_cast<double>(batch) / static_cast<double>(base_batch);
  switch (rule) {
    case Scaling::kNone: return lr0;
    case Scaling::kLinear: return lr0 * k;
    case Scaling::kSqrt:
    case Scaling::kSde: return lr0 * std::sqrt(k);
  }
  TORCH_INTERNAL_ASSERT(false, "unknown scaling rule");
}

void ScheduleSpec::validate() const {
  TORCH_CHECK(std::isfinite(base_lr) && base_lr >= 0, "schedule.base_lr: must be >= 0, got ", base_lr);
  TORCH_CHECK(base_batch > 0, "schedule.base_batch: must be > 0, got ", base_batch);
  TORCH_CHECK(warmup.length >= 0, "schedule.warmup.length: must be >= 0, got ", warmup.length);
  if (warmup.start_lr) {
    TORCH_CHECK(*warmup.start_lr >= 0, "schedule.warmup.start_lr: must be >= 0, got ",
                *warmup.start_lr);
    TORCH_CHECK(warmup.length > 0, "schedule.warmup.start_lr: given (", *warmup.start_lr,
                ") but schedule.warmup.length is 0, so there is no warmup to start");
  }
  const auto& d = decay;
  if (d.type == DecayType::kStep || d.type == DecayType::kExponential) {
    TORCH_CHECK(d.gamma > 0 && d.gamma <= 1, "schedule.decay.gamma: must be in (0, 1], got ", d.gamma);
  }
  if (d.type == DecayType::kStep) {
    for (std::size_t i = 0; i < d.milestones.size(); ++i) {
      TORCH_CHECK(d.milestones[i] > 0, "schedule.decay.milestones[", i, "]: must be > 0, got ",
                  d.milestones[i]);
      TORCH_CHECK(i == 0 || d.milestones[i] > d.milestones[i - 1],
                  "schedule.decay.milestones: must be strictly increasing, got ", d.milestones[i - 1],
                  " then ", d.milestones[i]);
    }
  } else {
    TORCH_CHECK(d.milestones.empty(), "schedule.decay.milestones: only a step decay has milestones (",
                "decay type is ", to_string(d.type), ")");
  }
  if (uses_length(d.type)) {
    TORCH_CHECK(d.length > 0, "schedule.decay.length: must be > 0 for a ", to_string(d.type),
                " decay, got ", d.length);
    TORCH_CHECK(d.end_lr >= 0, "schedule.decay.end_lr: must be >= 0, got ", d.end_lr);
  }
  if (d.type == DecayType::kPolynomial) {
    TORCH_CHECK(d.power > 0, "schedule.decay.power: must be > 0, got ", d.power);
  }
  if (d.type == DecayType::kWsd) {
    TORCH_CHECK(d.length == 0, "schedule.decay.length: a wsd decay is given by stable and cooldown, got length ",
                d.length);
    TORCH_CHECK(d.stable >= 0, "schedule.decay.stable: must be >= 0, got ", d.stable);
    TORCH_CHECK(d.cooldown > 0, "schedule.decay.cooldown: must be > 0 for a wsd decay, got ", d.cooldown);
    TORCH_CHECK(d.end_lr >= 0, "schedule.decay.end_lr: must be >= 0, got ", d.end_lr);
  } else {
    TORCH_CHECK(d.stable == 0 && d.cooldown == 0, "schedule.decay.", d.stable != 0 ? "stable" : "cooldown",
                ": only a wsd decay has a stable phase and a cooldown (decay type is ", to_string(d.type), ")");
  }
  if (batch_increase) {
    TORCH_CHECK(d.type == DecayType::kStep,
                "schedule.batch_increase: replaces the milestones of a step decay; decay type is ",
                to_string(d.type));
    TORCH_CHECK(batch_increase->max_batch > 0, "schedule.batch_increase.max_batch: must be > 0, got ",
                batch_increase->max_batch);
    const double factor = batch_increase->factor.value_or(1 / d.gamma);
    TORCH_CHECK(factor > 1, "schedule.batch_increase.factor: must be > 1, got ", factor,
                batch_increase->factor ? "" : " (1 / schedule.decay.gamma)");
    if (batch_increase->lr_factor) {
      TORCH_CHECK(*batch_increase->lr_factor > 0 && *batch_increase->lr_factor <= 1,
                  "schedule.batch_increase.lr_factor: must be in (0, 1], got ", *batch_increase->lr_factor);
    }
  }
  if (weight_decay_timescale) {
    TORCH_CHECK(*weight_decay_timescale > 0 && std::isfinite(*weight_decay_timescale),
                "schedule.weight_decay_timescale: must be > 0 (examples), got ", *weight_decay_timescale);
  }
  if (beta2_half_life) {
    TORCH_CHECK(*beta2_half_life > 0 && std::isfinite(*beta2_half_life),
                "schedule.beta2_half_life: must be > 0 (examples), got ", *beta2_half_life);
    TORCH_CHECK(scaling != Scaling::kSde, "schedule.beta2_half_life: sets beta2, which scaling \"sde\" sets too; "
                "give one of them");
  }
  for (std::size_t i = 0; i < batch_warmup.size(); ++i) {
    const auto& st = batch_warmup[i];
    TORCH_CHECK(st.batch > 0, "schedule.batch_warmup[", i, "].batch: must be > 0, got ", st.batch);
    TORCH_CHECK(st.until_examples > (i == 0 ? 0 : batch_warmup[i - 1].until_examples),
                "schedule.batch_warmup[", i, "].until_examples: must be > ",
                i == 0 ? std::string("0") : "the previous stage's (" + std::to_string(batch_warmup[i - 1].until_examples) + ")",
                ", got ", st.until_examples);
  }
  if (!batch_warmup.empty()) {
    TORCH_CHECK(!batch_increase, "schedule.batch_warmup: cannot be combined with schedule.batch_increase");
    TORCH_CHECK(!regime_adaptation, "schedule.batch_warmup: cannot be combined with schedule.regime_adaptation");
    TORCH_CHECK(d.type != DecayType::kStep,
                "schedule.batch_warmup: cannot be combined with a step decay (schedule.batch_increase is the "
                "milestone-driven batch schedule)");
    TORCH_CHECK(unit == Unit::kSteps, "schedule.batch_warmup: needs schedule.unit \"steps\" (got \"",
                to_string(unit), "\"): an epoch's steps would change with the batch");
  }
}

// ------------------------------------------------------------- resolution ----

Schedule::Schedule(ScheduleSpec spec, std::int64_t batch_size, std::int64_t examples_per_epoch)
    : spec_(std::move(spec)), batch_(batch_size), first_batch_(batch_size), examples_per_epoch_(examples_per_epoch) {
  spec_.validate();
  TORCH_CHECK(batch_size > 0, "Schedule: batch_size must be > 0, got ", batch_size);
  TORCH_CHECK(spec_.unit == Unit::kSteps || examples_per_epoch > 0,
              "Schedule: the schedule counts in epochs, so examples_per_epoch must be > 0, got ",
              examples_per_epoch);
  if (spec_.regime_adaptation) {
    regime_factor_ = (batch_ + spec_.base_batch - 1) / spec_.base_batch;
  }
  peak_lr_ = scale_lr(spec_.base_lr, spec_.scaling, batch_, spec_.base_batch);
  start_lr_ = spec_.warmup.start_lr.value_or(spec_.base_lr);
  warmup_steps_ = steps_for_examples(spec_.warmup.length, batch_);
  const double r = static_cast<double>(regime_factor_);
  decay_length_ = steps_for_examples(spec_.decay.length * r, batch_);
  stable_steps_ = steps_for_examples(spec_.decay.stable * r, batch_);
  cooldown_steps_ = steps_for_examples(spec_.decay.cooldown * r, batch_);
  steps_per_unit_ = r * (spec_.unit == Unit::kSteps
                             ? 1.0
                             : static_cast<double>(examples_per_epoch_) / static_cast<double>(batch_));

  // Batch warmup: each stage ends at the first step at or past its examples.
  if (!spec_.batch_warmup.empty()) {
    first_batch_ = spec_.batch_warmup.front().batch;
    std::int64_t step = 0;
    std::int64_t seen = 0;
    for (std::size_t i = 0; i < spec_.batch_warmup.size(); ++i) {
      const auto& st = spec_.batch_warmup[i];
      const std::int64_t steps = std::max<std::int64_t>(0, (st.until_examples - seen + st.batch - 1) / st.batch);
      step += steps;
      seen += steps * st.batch;
      const std::int64_t next = i + 1 < spec_.batch_warmup.size() ? spec_.batch_warmup[i + 1].batch : batch_;
      events_.push_back({step, true, next});
    }
    return;
  }
  // Step-decay milestones, counted from the end of warmup, become events; with
  // batch increase each is a batch event while the batch stays <= max_batch.
  if (spec_.decay.type != DecayType::kStep) return;
  if (spec_.batch_increase) {
    batch_factor_ = spec_.batch_increase->factor.value_or(1 / spec_.decay.gamma);
    lr_factor_ = spec_.batch_increase->lr_factor.value_or(spec_.batch_increase->seesaw ? 1 / std::sqrt(batch_factor_)
                                                                                         : 1.0);
  }
  std::int64_t step = 0;     // decay time
  double position = 0;       // in units, decay time
  std::int64_t batch = batch_;
  for (const double milestone : spec_.decay.milestones) {
    step += steps_for_examples(milestone * r - position, batch);
    position = milestone * r;
    const double grown = std::round(static_cast<double>(batch) * batch_factor_);
    const bool grow = spec_.batch_increase && grown <= static_cast<double>(spec_.batch_increase->max_batch);
    if (grow) batch = static_cast<std::int64_t>(grown);
    events_.push_back({warmup_steps_ + step, grow, batch});
  }
}

std::int64_t Schedule::steps_for_examples(double length, std::int64_t batch) const {
  if (length <= 0) return 0;
  return whole_steps(spec_.unit == Unit::kSteps
                         ? length
                         : length * static_cast<double>(examples_per_epoch_) / static_cast<double>(batch));
}

double Schedule::lr(std::int64_t step) const {
  TORCH_CHECK(step >= 0, "Schedule::lr: step must be >= 0, got ", step);
  // With batch warmup the scaled rate follows each step's batch.
  const double peak = spec_.batch_warmup.empty()
                          ? peak_lr_
                          : scale_lr(spec_.base_lr, spec_.scaling, batch_size(step), spec_.base_batch);
  if (step < warmup_steps_) {
    return start_lr_ + (peak - start_lr_) * static_cast<double>(step) / static_cast<double>(warmup_steps_);
  }
  const auto s = static_cast<double>(step - warmup_steps_);
  const DecaySpec& d = spec_.decay;
  switch (d.type) {
    case DecayType::kConstant: return peak;
    case DecayType::kStep: {
      int decays = 0;
      int grown = 0;
      for (const auto& e : events_) {
        if (e.step > step) continue;
        (e.batch ? grown : decays) += 1;
      }
      return peak * std::pow(d.gamma, decays) * std::pow(lr_factor_, grown);
    }
    case DecayType::kWsd: {
      if (s < static_cast<double>(stable_steps_)) return peak;
      const double u = std::min(s - static_cast<double>(stable_steps_), static_cast<double>(cooldown_steps_)) /
                       static_cast<double>(cooldown_steps_);
      const double left = d.shape == CooldownShape::kLinear         ? 1 - u
                          : d.shape == CooldownShape::kOneMinusSqrt ? 1 - std::sqrt(u)
                                                                    : 0.5 * (1 + std::cos(kPi * u));
      return d.end_lr + (peak - d.end_lr) * left;
    }
    case DecayType::kExponential: return peak * std::pow(d.gamma, s / steps_per_unit_);
    case DecayType::kPolynomial:
    case DecayType::kLinear:
    case DecayType::kCosine: {
      const double frac = std::min(s, static_cast<double>(decay_length_)) / static_cast<double>(decay_length_);
      if (d.type == DecayType::kCosine) {
        return d.end_lr + (peak - d.end_lr) * 0.5 * (1 + std::cos(kPi * frac));
      }
      const double power = d.type == DecayType::kLinear ? 1.0 : d.power;
      return d.end_lr + (peak - d.end_lr) * std::pow(1 - frac, power);
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unknown decay type");
}

std::int64_t Schedule::batch_size(std::int64_t step) const {
  TORCH_CHECK(step >= 0, "Schedule::batch_size: step must be >= 0, got ", step);
  std::int64_t batch = first_batch_;
  for (const auto& e : events_) {
    if (e.step <= step) batch = e.batch_after;
  }
  return batch;
}

std::int64_t Schedule::examples_seen(std::int64_t step) const {
  TORCH_CHECK(step >= 0, "Schedule::examples_seen: step must be >= 0, got ", step);
  std::int64_t seen = 0;
  std::int64_t from = 0;
  std::int64_t batch = first_batch_;
  for (const auto& e : events_) {
    if (e.step >= step) break;
    seen += (e.step - from) * batch;
    from = e.step;
    batch = e.batch_after;
  }
  return seen + (step - from) * batch;
}

std::int64_t Schedule::steps(double length, Unit unit) const {
  TORCH_CHECK(length >= 0, "Schedule::steps: length must be >= 0, got ", length);
  TORCH_CHECK(unit == Unit::kSteps || examples_per_epoch_ > 0,
              "Schedule::steps: a length in epochs needs examples_per_epoch > 0");
  const double scaled = length * static_cast<double>(regime_factor_);
  if (unit == Unit::kSteps) return whole_steps(scaled);
  // Walk the batch segments until scaled * N examples are seen.
  const double target = scaled * static_cast<double>(examples_per_epoch_);
  std::int64_t from = 0;
  double seen = 0;
  std::int64_t batch = first_batch_;
  for (const auto& e : events_) {
    const double segment = static_cast<double>(e.step - from) * static_cast<double>(batch);
    if (seen + segment >= target) break;
    seen += segment;
    from = e.step;
    batch = e.batch_after;
  }
  return from + whole_steps((target - seen) / static_cast<double>(batch));
}

// ------------------------------------------------------------------- JSON ----

nlohmann::json to_json(const ScheduleSpec& spec) {
  nlohmann::json j;
  j["base_lr"] = spec.base_lr;
  j["base_batch"] = spec.base_batch;
  j["scaling"] = to_string(spec.scaling);
  j["unit"] = to_string(spec.unit);
  j["warmup"] = {{"length", spec.warmup.length}};
  if (spec.warmup.start_lr) j["warmup"]["start_lr"] = *spec.warmup.start_lr;
  nlohmann::json d = {{"type", to_string(spec.decay.type)}};
  switch (spec.decay.type) {
    case DecayType::kConstant: break;
    case DecayType::kStep: d["milestones"] = spec.decay.milestones; d["gamma"] = spec.decay.gamma; break;
    case DecayType::kExponential: d["gamma"] = spec.decay.gamma; break;
    case DecayType::kPolynomial: d["power"] = spec.decay.power; [[fallthrough]];
    case DecayType::kCosine:
    case DecayType::kLinear: d["length"] = spec.decay.length; d["end_lr"] = spec.decay.end_lr; break;
    case DecayType::kWsd:
      d["stable"] = spec.decay.stable;
      d["cooldown"] = spec.decay.cooldown;
      d["shape"] = to_string(spec.decay.shape);
      d["end_lr"] = spec.decay.end_lr;
      break;
  }
  j["decay"] = d;
  if (spec.batch_increase) {
    j["batch_increase"] = {{"max_batch", spec.batch_increase->max_batch}};
    if (spec.batch_increase->factor) j["batch_increase"]["factor"] = *spec.batch_increase->factor;
    if (spec.batch_increase->lr_factor) j["batch_increase"]["lr_factor"] = *spec.batch_increase->lr_factor;
    if (spec.batch_increase->seesaw) j["batch_increase"]["seesaw"] = true;
  }
  if (!spec.batch_warmup.empty()) {
    j["batch_warmup"] = nlohmann::json::array();
    for (const auto& st : spec.batch_warmup) {
      j["batch_warmup"].push_back({{"batch", st.batch}, {"until_examples", st.until_examples}});
    }
  }
  j["regime_adaptation"] = spec.regime_adaptation;
  if (spec.weight_decay_timescale) j["weight_decay_timescale"] = *spec.weight_decay_timescale;
  if (spec.beta2_half_life) j["beta2_half_life"] = *spec.beta2_half_life;
  return j;
}

ScheduleSpec schedule_from_json(const nlohmann::json& j) {
  JsonReader r(j, "schedule");
  ScheduleSpec s;
  s.base_lr = r.number("base_lr");
  s.base_batch = r.integer("base_batch", s.base_batch);
  s.scaling = r.choice("scaling", kScalings, Scaling::kNone);
  s.unit = r.choice("unit", kUnits, Unit::kSteps);
  JsonReader w = r.object("warmup");
  s.warmup.length = w.number("length", 0);
  s.warmup.start_lr = w.optional_number("start_lr");
  w.finish();
  JsonReader d = r.object("decay");
  s.decay.type = d.choice("type", kDecays, DecayType::kConstant);
  s.decay.milestones = d.numbers("milestones", {});
  s.decay.gamma = d.number("gamma", s.decay.gamma);
  s.decay.power = d.number("power", s.decay.power);
  s.decay.end_lr = d.number("end_lr", s.decay.end_lr);
  s.decay.length = d.number("length", s.decay.length);
  s.decay.stable = d.number("stable", s.decay.stable);
  s.decay.cooldown = d.number("cooldown", s.decay.cooldown);
  if (d.has("shape") && s.decay.type != DecayType::kWsd) {
    config_error(d.path_of("shape"), "only a wsd decay has a cooldown shape (decay type is " + to_string(s.decay.type) + ")");
  }
  s.decay.shape = d.choice("shape", kShapes, s.decay.shape);
  d.finish();
  if (r.has("batch_increase") && !j.at("batch_increase").is_null()) {
    JsonReader b = r.object("batch_increase");
    BatchIncreaseSpec bi;
    bi.max_batch = b.integer("max_batch");
    bi.factor = b.optional_number("factor");
    bi.lr_factor = b.optional_number("lr_factor");
    bi.seesaw = b.boolean("seesaw", false);
    b.finish();
    s.batch_increase = bi;
  } else {
    r.raw("batch_increase");
  }
  if (const nlohmann::json* stages = r.raw("batch_warmup"); stages != nullptr && !stages->is_null()) {
    if (!stages->is_array()) config_error(r.path_of("batch_warmup"), "must be an array of {batch, until_examples}");
    for (std::size_t i = 0; i < stages->size(); ++i) {
      JsonReader st((*stages)[i], r.path_of("batch_warmup") + "[" + std::to_string(i) + "]");
      BatchStage stage;
      stage.batch = st.integer("batch");
      stage.until_examples = st.integer("until_examples");
      st.finish();
      s.batch_warmup.push_back(stage);
    }
  }
  s.regime_adaptation = r.boolean("regime_adaptation", false);
  s.weight_decay_timescale = r.optional_number("weight_decay_timescale");
  s.beta2_half_life = r.optional_number("beta2_half_life");
  r.finish();
  s.validate();
  return s;
}

}  // namespace bigbatch::schedules
