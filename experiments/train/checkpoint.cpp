// A one-trial run's checkpoint (trial.h: checkpoint, restore, branch_from).
// Every value under its own name: scalars as 0-dim tensors, the evaluations as
// one column per EvalRow field ("rows/<field>"), the model, optimizer and
// sampler as nested archives. "format" changes when a key changes meaning.
// The archive is framed as one record (records.h: its length and CRC32C)
// after a header line, so that a cut or damaged file is refused before
// LibTorch's archive reader sees it (which can crash on damaged bytes:
// tests/fuzz).
#include "trial.h"

#include "lane.h"
#include "lane_model.h"
#include "loader.h"
#include "../io/records.h"

#include <c10/util/Exception.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <map>
#include <sstream>
#include <string_view>
#include <type_traits>

namespace bigbatch::experiments {

namespace {

using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

// 3 adds the training losses since the last evaluation (a checkpoint taken
// between two, on a stop): a version that reads only 2 refuses it and starts
// the trial over rather than resume it with those losses lost. 2 is still
// read (taken at an evaluation, it has none since).
constexpr std::int64_t kCheckpointFormat = 3;
constexpr std::int64_t kOldestCheckpointFormat = 2;
constexpr std::string_view kCheckpointHeader = "bigbatch checkpoint\n";

template <typename T>
void put(OutputArchive& archive, const std::string& key, T value) {
  archive.write(key, at::scalar_tensor(value, std::is_integral_v<T> ? at::kLong : at::kDouble));
}

template <typename T>
void get(InputArchive& archive, const std::string& key, T& value) {
  at::Tensor t;
  archive.read(key, t);
  value = t.item<T>();
}

// The evaluations by column: integer fields as int64, the others as double.
struct Columns {
  std::map<std::string, std::vector<std::int64_t>> counts;
  std::map<std::string, std::vector<double>> reals;

  template <typename T>
  std::vector<T>& of(const char* name) {
    if constexpr (std::is_integral_v<T>) {
      return counts[name];
    } else {
      return reals[name];
    }
  }
};

void put_rows(OutputArchive& archive, const std::vector<EvalRow>& rows) {
  Columns columns;
  for_each_field(EvalRow{}, [&](const char* name, const auto& field) {
    columns.of<std::decay_t<decltype(field)>>(name);  // every column, also with no rows
  });
  for (const EvalRow& r : rows) {
    for_each_field(r, [&](const char* name, const auto& value) {
      columns.of<std::decay_t<decltype(value)>>(name).push_back(value);
    });
  }
  for (const auto& [name, values] : columns.counts) archive.write("rows/" + name, at::tensor(values, at::kLong));
  for (const auto& [name, values] : columns.reals) archive.write("rows/" + name, at::tensor(values, at::kDouble));
  // The workload's own metrics: [rows, metrics], when it reports any.
  if (!rows.empty() && !rows.front().extra.empty()) {
    std::vector<double> extra;
    for (const EvalRow& r : rows) extra.insert(extra.end(), r.extra.begin(), r.extra.end());
    const auto n = static_cast<std::int64_t>(rows.size());
    archive.write("rows/extra", at::tensor(extra, at::kDouble).view({n, -1}));
  }
}

std::vector<EvalRow> get_rows(InputArchive& archive) {
  Columns columns;
  std::int64_t count = -1;
  std::vector<const char*> missing;
  for_each_field(EvalRow{}, [&](const char* name, const auto& field) {
    using T = std::decay_t<decltype(field)>;
    at::Tensor t;
    if constexpr (std::is_floating_point_v<T>) {
      // A column newer than the checkpoint (the exchange's counts): not measured then.
      if (count >= 0 && !archive.try_read(std::string("rows/") + name, t)) {
        missing.push_back(name);
        return;
      }
    }
    if (!t.defined()) archive.read(std::string("rows/") + name, t);
    t = t.cpu().contiguous();
    TORCH_CHECK(count < 0 || t.numel() == count, "checkpoint: rows/", name, " has ", t.numel(),
                " values, rows/step has ", count);
    count = t.numel();
    columns.of<T>(name).assign(t.data_ptr<T>(), t.data_ptr<T>() + count);
  });
  for (const char* name : missing) columns.reals[name].assign(static_cast<std::size_t>(count), kNaN);
  std::vector<EvalRow> rows(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    for_each_field(rows[i], [&](const char* name, auto& value) {
      value = columns.of<std::decay_t<decltype(value)>>(name)[i];
    });
  }
  at::Tensor extra;
  if (!rows.empty() && archive.try_read("rows/extra", extra)) {
    extra = extra.cpu().to(at::kDouble).contiguous();
    TORCH_CHECK(extra.dim() == 2 && extra.size(0) == count, "checkpoint: rows/extra is ", extra.sizes(), " for ",
                count, " rows");
    for (std::int64_t i = 0; i < count; ++i) {
      const double* p = extra[i].data_ptr<double>();
      rows[static_cast<std::size_t>(i)].extra.assign(p, p + extra.size(1));
    }
  }
  return rows;
}

// The archive inside checkpoint() bytes, checked (header, framing, format)
// before LibTorch reads it.
void open_checkpoint(const std::string& bytes, const at::Device& device, InputArchive& archive) {
  TORCH_CHECK(bytes.compare(0, kCheckpointHeader.size(), kCheckpointHeader) == 0,
              "checkpoint: not a bigbatch checkpoint of this version (no \"bigbatch checkpoint\" header)");
  const std::string_view body = std::string_view(bytes).substr(kCheckpointHeader.size());
  const records::Records framed = records::read_records(body);
  TORCH_CHECK(framed.payloads.size() == 1 && framed.whole_bytes == body.size(),
              "checkpoint: cut short or damaged (its length or CRC32C does not match)");
  std::istringstream in(framed.payloads.front());
  archive.load_from(in, device);
  at::Tensor format;
  TORCH_CHECK(archive.try_read("format", format) && format.item<std::int64_t>() >= kOldestCheckpointFormat &&
                  format.item<std::int64_t>() <= kCheckpointFormat,
              "checkpoint: not of format ", kOldestCheckpointFormat, " to ", kCheckpointFormat,
              " (written by another version of bigbatch)");
}

// The optimizer of a lane sharded across the ranks (distributed.shard): every
// rank's shard, which rank 0's file holds in rank order ("optimizer/shard/R",
// each an archive's bytes), so that every rank resumes its own from the bytes
// rank 0 broadcasts. A collective: every rank takes its checkpoint together.
void put_shards(OutputArchive& archive, distributed::ProcessGroup& group, const distributed::ShardedOptimizer& sharded) {
  OutputArchive own;
  sharded.save(own);
  std::ostringstream bytes;
  own.save_to(bytes);
  put(archive, "optimizer/shards", static_cast<std::int64_t>(group.size()));
  for (int r = 0; r < group.size(); ++r) {
    std::string shard = distributed::broadcast_bytes(group, bytes.str(), r);
    archive.write("optimizer/shard/" + std::to_string(r),
                  at::from_blob(shard.data(), {static_cast<std::int64_t>(shard.size())}, at::kByte).clone());
  }
}

void load_shard(InputArchive& archive, const distributed::ProcessGroup& group, distributed::ShardedOptimizer& sharded) {
  at::Tensor count;
  TORCH_CHECK(archive.try_read("optimizer/shards", count),
              "checkpoint: holds an unsharded optimizer; this trial shards it (distributed.shard) and resumes only "
              "a sharded checkpoint");
  TORCH_CHECK(count.item<std::int64_t>() == group.size(), "checkpoint: holds the optimizer shards of ",
              count.item<std::int64_t>(), " ranks; this trial runs on ", group.size());
  at::Tensor shard;
  archive.read("optimizer/shard/" + std::to_string(group.rank()), shard);
  std::istringstream in(std::string(static_cast<const char*>(shard.data_ptr()), static_cast<std::size_t>(shard.numel())));
  InputArchive own;
  own.load_from(in);
  sharded.load(own);
}

}  // namespace

std::string Trainer::checkpoint() const {
  check_one_lane("checkpoint");
  const Lane& lane = *lanes_.front();
  OutputArchive archive, model, optimizer, sampler;
  put(archive, "format", kCheckpointFormat);
  model_->lane(0).save(model);
  sampler_.save(sampler);
  archive.write("model", model);
  if (lane.sharded != nullptr) {
    put_shards(archive, *group_, *lane.sharded);
  } else {
    lane.optimizer->save(optimizer);
    archive.write("optimizer", optimizer);
  }
  archive.write("sampler", sampler);
  put(archive, "step", step_);
  put(archive, "examples", examples_);
  put(archive, "last_lr", lane.last_lr);
  put(archive, "best_metric", lane.best_metric);
  put(archive, "elapsed", elapsed_);
  // The training losses since the last evaluation: a checkpoint taken
  // between two (preemption) resumes their mean exactly.
  put(archive, "loss_sum", lane.loss_sum);
  put(archive, "losses", static_cast<std::int64_t>(lane.losses));
  const auto g = lane.gns.state();
  put(archive, "gns/grad_sq", g.grad_sq);
  put(archive, "gns/trace", g.trace);
  put(archive, "gns/correction", g.correction);
  put(archive, "gns/updates", g.updates);
  put_rows(archive, lane.rows);
  if (lane.average) {  // "average": its count and tensors (WeightAverage::state)
    const std::vector<at::Tensor> state = lane.average->state();
    put(archive, "average/count", static_cast<std::int64_t>(state.size()));
    for (std::size_t k = 0; k < state.size(); ++k) archive.write("average/" + std::to_string(k), state[k]);
  }
  if (lane.scaler) {  // fp16: the loss scale, its run of finite steps, the steps it skipped
    const auto s = lane.scaler->state();
    put(archive, "loss_scaler/scale", s.scale);
    put(archive, "loss_scaler/run", s.run);
    put(archive, "loss_scaler/skipped", s.skipped);
  }
  if (const distributed::GradientExchange* exchange = model_->exchange()) {
    // The compressor's step, counts and PowerSGD's Q: what is the same on
    // every rank. Only rank 0 writes, and every rank restores its bytes, so
    // the ranks' own error memories are left out (they restart at zero).
    const auto state = exchange->state(/*shared_only=*/true);
    put(archive, "exchange/count", static_cast<std::int64_t>(state.size()));
    for (std::size_t k = 0; k < state.size(); ++k) archive.write("exchange/" + std::to_string(k), state[k]);
  }
  std::ostringstream out;
  archive.save_to(out);
  return std::string(kCheckpointHeader) + records::frame(out.str());
}

void Trainer::restore(const std::string& bytes) {
  check_one_lane("restore");
  Lane& lane = *lanes_.front();
  InputArchive archive;
  open_checkpoint(bytes, device_, archive);
  load_run(archive);
  get(archive, "step", step_);
  get(archive, "last_lr", lane.last_lr);
  get(archive, "best_metric", lane.best_metric);
  get(archive, "elapsed", elapsed_);
  // Absent from checkpoints of older versions, taken at an evaluation: none
  // since. (One tensor each: try_read into a defined tensor keeps its dtype.)
  at::Tensor sum, count;
  lane.loss_sum = archive.try_read("loss_sum", sum) ? sum.item<double>() : 0.0;
  lane.losses = archive.try_read("losses", count) ? static_cast<decltype(lane.losses)>(count.item<std::int64_t>()) : 0;
  noise::GradientNoiseScale::State g;
  get(archive, "gns/grad_sq", g.grad_sq);
  get(archive, "gns/trace", g.trace);
  get(archive, "gns/correction", g.correction);
  get(archive, "gns/updates", g.updates);
  lane.gns.restore(g);
  lane.rows = get_rows(archive);
  // The first evaluation that reached the target: a run that trains past it
  // (Hooks::past_target, a trial with horizons) keeps it.
  for (const EvalRow& row : lane.rows) {
    if (target_metric(lane.config, row) <= lane.config.target.threshold) {
      lane.result.steps_to_target = row.step;
      lane.result.examples_to_target = row.examples;
      break;
    }
  }
  if (lane.average) {
    at::Tensor count;
    TORCH_CHECK(archive.try_read("average/count", count),
                "checkpoint: holds no weight average, and this trial averages its weights (average)");
    std::vector<at::Tensor> state(static_cast<std::size_t>(count.item<std::int64_t>()));
    for (std::size_t k = 0; k < state.size(); ++k) archive.read("average/" + std::to_string(k), state[k]);
    lane.average->load_state(state);
  }
  at::Tensor skipped;
  if (lane.scaler && archive.try_read("loss_scaler/skipped", skipped)) {
    auto s = lane.scaler->state();
    s.skipped = skipped.item<std::int64_t>();
    lane.scaler->restore(s);
  }
  at::Tensor count_of_state;
  if (distributed::GradientExchange* exchange = model_->exchange();
      exchange && archive.try_read("exchange/count", count_of_state)) {
    std::vector<at::Tensor> state(static_cast<std::size_t>(count_of_state.item<std::int64_t>()));
    for (std::size_t k = 0; k < state.size(); ++k) archive.read("exchange/" + std::to_string(k), state[k]);
    exchange->load_state(state);
  }
  TORCH_CHECK(step_ <= budget_, "checkpoint: step ", step_, " is past this trial's budget of ", budget_, " steps");
}

void Trainer::branch_from(const std::string& bytes) {
  check_one_lane("branch_from");
  InputArchive archive;
  open_checkpoint(bytes, device_, archive);
  load_run(archive);
}

void Trainer::load_run(torch::serialize::InputArchive& archive) {
  InputArchive model, optimizer, sampler;
  archive.read("model", model);
  archive.read("sampler", sampler);
  model_->lane(0).load(model);
  if (lanes_.front()->sharded != nullptr) {
    load_shard(archive, *group_, *lanes_.front()->sharded);
  } else {
    TORCH_CHECK(archive.try_read("optimizer", optimizer), "checkpoint: holds a sharded optimizer "
                "(distributed.shard); this trial does not shard it");
    lanes_.front()->optimizer->load(optimizer);
  }
  sampler_.load(sampler);
  // fp16: the run's loss scale and its run of finite steps (a cbs branch
  // goes on with its reference's scale, counting its own skipped steps).
  at::Tensor scale, run;
  if (auto& scaler = lanes_.front()->scaler;
      scaler && archive.try_read("loss_scaler/scale", scale) && archive.try_read("loss_scaler/run", run)) {
    scaler->restore({scale.item<double>(), run.item<std::int64_t>(), 0});
  }
  ahead_.reset();  // the batches asked for ahead were the old position's
  if (loader_) loader_->clear();
  get(archive, "examples", examples_);
}

}  // namespace bigbatch::experiments
