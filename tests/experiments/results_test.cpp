// The result files a sweep leaves: metrics.csv's columns, and the per-batch
// choice in steps_to_target.csv (the rate with the least median over its
// seeds, else the trial closest to the target), written from hand-made
// summaries; and horizons.csv from a sweep whose trials branch horizons.
#include "../../experiments/io/csv.h"
#include "../../experiments/io/files.h"
#include "../../experiments/sweep/results.h"
#include "../../experiments/sweep/sweep.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

using namespace bigbatch::experiments;
namespace fs = std::filesystem;

TEST(Results, MetricsCsvHasTheDocumentedColumnsAndEmptyCellsForNaN) {
  EvalRow row;
  row.step = 50;
  row.epoch = 0.5;
  row.examples = 3200;
  row.train_loss = 1.25;
  row.val_loss = 1.5;
  row.val_error = std::numeric_limits<double>::quiet_NaN();
  row.lr = 0.1;
  row.batch_size = 64;
  row.wall_time = 2;
  row.gns = std::numeric_limits<double>::infinity();
  EXPECT_EQ(metrics_csv({row}),
            "step,epoch,examples,train_loss,val_loss,val_error,lr,batch_size,wall_time,gns,bytes_sent,bytes_received,"
            "compress_seconds,comm_seconds,syncs,outer_norm,loss_scale,skipped_steps,state_bytes,peak_rss_bytes,avg_val_loss,"
            "avg_val_error\n"
            "50,0.5,3200,1.25,1.5,,0.1,64,2,,,,,,,,,,,,,\n");
}

// A sweep folder with summaries of four trials at two batch sizes.
class Tables : public ::testing::Test {
 protected:
  void SetUp() override {
    // One folder per process: ctest runs these tests side by side (gtest's
    // random seed, from the clock, once gave two of them the same folder).
    dir_ = fs::temp_directory_path() / ("bigbatch_results_test_" + std::to_string(::getpid()));
    bigbatch::experiments::remove_tree(dir_);
    add("b32_p0", 32, TrialStatus::kReached, 400, 0.1, 0.05);
    add("b32_p1", 32, TrialStatus::kReached, 300, 0.2, 0.08);   // the faster: chosen
    add("b64_p0", 64, TrialStatus::kNotReached, 0, 0.1, 0.21);  // closest: chosen
    add("b64_p1", 64, TrialStatus::kDiverged, 0, 0.4, std::numeric_limits<double>::infinity());
  }
  void TearDown() override { bigbatch::experiments::remove_tree(dir_); }

  void add(const std::string& name, std::int64_t batch, TrialStatus status, std::int64_t steps, double lr,
           double best, std::uint64_t seed = 0) {
    TrialConfig t;
    t.name = name;
    t.batch_size = batch;
    t.schedule.base_lr = lr;
    t.seed = seed;
    TrialResult r;
    r.status = status;
    if (status == TrialStatus::kReached) {
      r.steps_to_target = steps;
      r.examples_to_target = steps * batch;
    }
    r.best_metric = best;
    r.peak_lr = lr;
    fs::create_directories(dir_ / name);
    write_file_atomic((dir_ / name / "summary.json").string(), summary_json(t, r).dump());
    trials_.push_back(t);
  }

  fs::path dir_;
  std::vector<TrialConfig> trials_;
};

TEST_F(Tables, FastestReachedElseClosest) {
  EXPECT_EQ(write_tables(trials_, dir_.string()), 2);
  EXPECT_EQ(read_file((dir_ / "steps_to_target.csv").string()),
            "batch_size,steps,examples,best_lr,trial,reached,edge,failed,seeds,seeds_reached,steps_min,steps_max,steps_low,steps_high,seed_steps,bytes,syncs\n"
            "32,300,9600,0.2,b32_p1,1,high,0,1,1,300,300,,,300,,\n"
            "64,,,0.1,b64_p0,0,low,0,1,0,,,,,inf,,\n");
  // One point cannot fit S(B) = S_min (1 + B_crit / B): the fit says so.
  EXPECT_NE(read_json((dir_ / "fit.json").string()).value("error", "").find("too few batch sizes: 1 reached"),
            std::string::npos);
  const std::string table = report(dir_.string());
  EXPECT_NE(table.find("b32_p1"), std::string::npos) << table;
  EXPECT_NE(table.find("no"), std::string::npos) << table;
}

// The edge marks: a row's rate is on the edge when it is the lowest or the
// highest its batch size tried; with a rate on either side it is bracketed.
TEST_F(Tables, RowsWhoseRateIsOnTheEdgeOfTheSearchAreMarked) {
  add("b32_p2", 32, TrialStatus::kReached, 350, 0.4, 0.09);  // a higher rate, slower: 0.2 is bracketed
  add("b64_p2", 64, TrialStatus::kNotReached, 0, 0.05, 0.3);  // a lower rate: 0.1 is bracketed too
  add("b128_p0", 128, TrialStatus::kReached, 90, 0.3, 0.1);   // one rate only: no edge to speak of
  add("b128_p1", 128, TrialStatus::kReached, 100, 0.3, 0.2, 1);  // the same rate, another seed
  write_tables(trials_, dir_.string());
  EXPECT_EQ(read_file((dir_ / "steps_to_target.csv").string()),
            "batch_size,steps,examples,best_lr,trial,reached,edge,failed,seeds,seeds_reached,steps_min,steps_max,steps_low,steps_high,seed_steps,bytes,syncs\n"
            "32,300,9600,0.2,b32_p1,1,,0,1,1,300,300,,,300,,\n"
            "64,,,0.1,b64_p0,0,,0,1,0,,,,,inf,,\n"
            "128,95,12160,0.3,b128_p0,1,,0,2,2,90,100,90,100,90 100,,\n");
  EXPECT_EQ(search_edge(trials_, "b32_p2"), "high");
  EXPECT_EQ(search_edge(trials_, "b64_p2"), "low");
  EXPECT_EQ(search_edge(trials_, "b128_p0"), "");
  EXPECT_EQ(search_edge(trials_, "nonesuch"), "");
  const std::vector<TargetRow> rows = read_steps_to_target(dir_.string());
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].edge, "");
}

TEST_F(Tables, ReportWarnsOfEdgesAndFitsFromThreeBatchSizesWithARange) {
  add("b128_p0", 128, TrialStatus::kReached, 150, 0.1, 0.05);
  // Two reached batch sizes: two points for two parameters, no fit.
  write_tables(trials_, dir_.string());
  EXPECT_NE(read_json((dir_ / "fit.json").string()).value("error", "").find("too few batch sizes: 2 reached"),
            std::string::npos);
  std::string table = report(dir_.string());
  EXPECT_NE(table.find("too few batch sizes"), std::string::npos) << table;
  EXPECT_NE(table.find("warning: the best rate is on the edge of the search at batch sizes 32 (high), 64 (low)"),
            std::string::npos)
      << table;
  // Three on S = 100 + 6400 / B: S_min 100, B_crit 6400 / 100 = 64.
  add("b64_p1x", 64, TrialStatus::kReached, 200, 0.2, 0.05);
  write_tables(trials_, dir_.string());
  const nlohmann::json fit = read_json((dir_ / "fit.json").string());
  ASSERT_FALSE(fit.contains("error")) << fit.dump();
  EXPECT_NEAR(fit["s_min"].get<double>(), 100, 1e-9);
  EXPECT_NEAR(fit["b_crit"].get<double>(), 64, 1e-9);
  EXPECT_NEAR(fit["rms_relative_error"].get<double>(), 0, 1e-12);
  // No residual: every resample is the same curve, the range a point.
  EXPECT_NEAR(fit["range"]["b_crit"][0].get<double>(), 64, 1e-6);
  EXPECT_NEAR(fit["range"]["b_crit"][1].get<double>(), 64, 1e-6);
  table = report(dir_.string());
  EXPECT_NE(table.find("90% bootstrap range (over residuals: one seed): B_crit"), std::string::npos) << table;
  EXPECT_NE(table.find("one seed per rate: the rows carry no spread"), std::string::npos) << table;
}

// Three seeds per rate (docs/experiments.md "Seeds"), the rule re-derived by
// hand: a rate's steps are its seeds' median, not reached counting as +inf.
TEST_F(Tables, SeedsTheBestMedianIsTheRowWithItsSpread) {
  trials_.clear();
  const auto rate = [&](const std::string& p, double lr, std::vector<std::int64_t> steps) {
    for (std::uint64_t s = 0; s < steps.size(); ++s) {
      const std::string name = "b16_" + p + "_s" + std::to_string(s);
      if (steps[s] > 0) {
        add(name, 16, TrialStatus::kReached, steps[s], lr, 0.1, s);
      } else {  // 0: stopped by the budget; -1: pruned
        add(name, 16, steps[s] == 0 ? TrialStatus::kNotReached : TrialStatus::kPruned, 0, lr, 0.3, s);
      }
    }
  };
  rate("p0", 0.1, {100, 300, 0});    // 2 of 3 reached: median 300
  rate("p1", 0.2, {90, 0, -1});      // 1 of 3: not reached, despite the fastest seed of all
  rate("p2", 0.4, {400, 280, 290});  // median 290: the row
  rate("p3", 0.8, {290, 290, 500});  // median 290 too: a tie goes to the earlier rate
  EXPECT_EQ(write_tables(trials_, dir_.string()), 9);
  // The median seed is s2 (290); with 3 seeds the 90% interval is the range
  // (a resample's median is the minimum with probability 7/27 > 5%).
  EXPECT_EQ(read_file((dir_ / "steps_to_target.csv").string()),
            "batch_size,steps,examples,best_lr,trial,reached,edge,failed,seeds,seeds_reached,steps_min,steps_max,steps_low,steps_high,seed_steps,bytes,syncs\n"
            "16,290,4640,0.4,b16_p2_s2,1,,0,3,3,280,400,280,400,400 280 290,,\n");
  const std::vector<TargetRow> rows = read_steps_to_target(dir_.string());
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].steps, 290);
  EXPECT_EQ(rows[0].seed_steps, (std::vector<double>{400, 280, 290}));
  EXPECT_EQ(rows[0].steps_high, 400);
  // Two seeds not reached of three: the rate does not reach, and if no rate
  // does, the row is the closest trial and says how many of its seeds reached.
  trials_.clear();
  rate("p0", 0.1, {100, 0, 0});
  rate("p1", 0.2, {0, 0, 0});
  EXPECT_EQ(write_tables(trials_, dir_.string()), 1);
  EXPECT_EQ(read_file((dir_ / "steps_to_target.csv").string()),
            "batch_size,steps,examples,best_lr,trial,reached,edge,failed,seeds,seeds_reached,steps_min,steps_max,steps_low,steps_high,seed_steps,bytes,syncs\n"
            "16,,,0.1,b16_p0_s0,0,low,0,3,1,,,,,100 inf inf,,\n");
  const std::string table = report(dir_.string());
  EXPECT_NE(table.find("1/3"), std::string::npos) << table;
}

// The fit's range with seeds is bootstrapped over them: seeds that agree on
// S = 100 + 6400 / B leave no range; seeds that spread widen it.
TEST_F(Tables, SeedsTheFitsRangeIsDrawnOverSeeds) {
  trials_.clear();
  for (const std::int64_t b : {16, 64, 256, 6400}) {
    for (std::uint64_t s = 0; s < 3; ++s) {
      const auto steps = static_cast<std::int64_t>(100 + 6400 / b);
      add("b" + std::to_string(b) + "_p0_s" + std::to_string(s), b, TrialStatus::kReached, steps, 0.1, 0.1, s);
    }
  }
  write_tables(trials_, dir_.string());
  nlohmann::json fit = read_json((dir_ / "fit.json").string());
  EXPECT_EQ(fit["range"]["method"], "seeds");
  EXPECT_NEAR(fit["range"]["b_crit"][0].get<double>(), 64, 1e-6);
  EXPECT_NEAR(fit["range"]["b_crit"][1].get<double>(), 64, 1e-6);
  // One seed of batch 64 at 350 instead of 200: the median stays, the range opens.
  add("b64_p0_s1", 64, TrialStatus::kReached, 350, 0.1, 0.1, 1);
  trials_.erase(trials_.begin() + 4);  // the old b64_p0_s1 (its folder is rewritten)
  write_tables(trials_, dir_.string());
  fit = read_json((dir_ / "fit.json").string());
  EXPECT_NEAR(fit["b_crit"].get<double>(), 64, 1e-6);
  // (a resample's median at 64 is 350 with probability 7/27: both curves are in the range)
  const double low = fit["range"]["b_crit"][0].get<double>(), high = fit["range"]["b_crit"][1].get<double>();
  EXPECT_LE(low, 64 + 1e-6);
  EXPECT_GE(high, 64 - 1e-6);
  EXPECT_GT(high - low, 1);
  EXPECT_NE(report(dir_.string()).find("(over seeds)"), std::string::npos);
}

}  // namespace

namespace {

// horizons.csv, re-derived from the folders: per batch size and horizon,
// the rate whose median final val_error over 3 seeds is lowest, that
// median, and each horizon's steps past its branch point (a wsd cooldown
// of a fifth of the run: horizon 20 parts at step 17, 40 at 33); and
// horizons.json's steps with branching against each horizon alone.
TEST(Horizons, TheTableIsEachRunsFinalMetricAndTheStepsBranchingSaved) {
  const fs::path dir = fs::temp_directory_path() / ("bigbatch_horizons_table." + std::to_string(::getpid()));
  remove_tree(dir);
  const nlohmann::json j = nlohmann::json::parse(R"({
    "name": "h", "dataset": {"name": "gaussian_mixture", "train_size": 1024, "val_size": 256, "classes": 3,
                             "dim": 5, "separation": 1.0},
    "model": {"type": "mlp", "widths": [16]}, "optimizer": {"name": "sgd", "momentum": 0.9},
    "schedule": {"decay": {"type": "wsd", "stable": 48, "cooldown": 12}},
    "horizons": [20, 40],
    "target": {"threshold": 0.3, "eval_every": 10}, "budget": {"steps": 60},
    "batch_sizes": [32, 128], "search": {"lr": [0.02, 0.1]}, "seeds": [0, 1, 2]})");
  SweepOptions options;
  options.out = dir.string();
  run_sweep(parse_sweep(j), options);
  const fs::path sweep = dir / "h";
  const CsvTable table = CsvTable::read((sweep / "horizons.csv").string());
  ASSERT_EQ(table.rows(), 6u);
  const auto last_error = [&](const fs::path& folder) {
    const CsvTable m = CsvTable::read((folder / "metrics.csv").string());
    return *m.number(m.rows() - 1, "val_error");
  };
  const std::vector<double> horizons{20, 40, 60};
  const std::map<double, std::int64_t> branch_steps{{20, 3}, {40, 7}, {60, 60}};
  std::size_t row = 0;
  for (const int batch : {32, 128}) {
    for (std::size_t h = 0; h < 3; ++h, ++row) {
      double best = std::numeric_limits<double>::infinity();
      for (const int p : {0, 1}) {
        std::vector<double> finals;
        for (const int seed : {0, 1, 2}) {
          fs::path folder = sweep / ("b" + std::to_string(batch) + "_p" + std::to_string(p) + "_s" + std::to_string(seed));
          if (h < 2) folder /= "horizon_" + std::to_string(h + 1);
          finals.push_back(last_error(folder));
        }
        std::sort(finals.begin(), finals.end());
        best = std::min(best, finals[1]);
      }
      EXPECT_EQ(*table.integer(row, "batch_size"), batch);
      EXPECT_EQ(*table.number(row, "horizon"), horizons[h]);
      EXPECT_EQ(*table.integer(row, "steps"), static_cast<std::int64_t>(horizons[h]));
      EXPECT_NEAR(*table.number(row, "final"), best, 1e-9) << batch << " " << horizons[h];
      EXPECT_LE(*table.number(row, "final_low"), best);
      EXPECT_GE(*table.number(row, "final_high"), best);
      EXPECT_EQ(*table.integer(row, "branch_steps"), branch_steps.at(horizons[h]));
      EXPECT_EQ(table.at(row, "metric"), "val_error");
    }
  }
  const nlohmann::json cost = read_json((sweep / "horizons.json").string())["cost"];
  for (const char* batch : {"32", "128"}) {
    EXPECT_EQ(cost[batch]["branched_steps"], 70);
    EXPECT_EQ(cost[batch]["separate_steps"], 120);
    EXPECT_DOUBLE_EQ(cost[batch]["ratio"].get<double>(), 70.0 / 120.0);
  }
  remove_tree(dir);
}

}  // namespace
