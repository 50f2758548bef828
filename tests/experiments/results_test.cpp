// The result files a sweep leaves: metrics.csv's columns, and the per-batch
// choice in steps_to_target.csv (the fastest trial that reached, else the one
// closest to the target), written from hand-made summaries.
#include "../../experiments/files.h"
#include "../../experiments/results.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>

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
            "step,epoch,examples,train_loss,val_loss,val_error,lr,batch_size,wall_time,gns\n"
            "50,0.5,3200,1.25,1.5,,0.1,64,2,\n");
}

// A sweep folder with summaries of four trials at two batch sizes.
class Tables : public ::testing::Test {
 protected:
  void SetUp() override {
    // One folder per process: ctest runs these tests side by side (gtest's
    // random seed, from the clock, once gave two of them the same folder).
    dir_ = fs::temp_directory_path() / ("bigbatch_results_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    add("b32_p0", 32, TrialStatus::kReached, 400, 0.1, 0.05);
    add("b32_p1", 32, TrialStatus::kReached, 300, 0.2, 0.08);   // the faster: chosen
    add("b64_p0", 64, TrialStatus::kNotReached, 0, 0.1, 0.21);  // closest: chosen
    add("b64_p1", 64, TrialStatus::kDiverged, 0, 0.4, std::numeric_limits<double>::infinity());
  }
  void TearDown() override { fs::remove_all(dir_); }

  void add(const std::string& name, std::int64_t batch, TrialStatus status, std::int64_t steps, double lr,
           double best) {
    TrialConfig t;
    t.name = name;
    t.batch_size = batch;
    t.schedule.base_lr = lr;
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
            "batch_size,steps,examples,best_lr,trial,reached,edge,failed\n"
            "32,300,9600,0.2,b32_p1,1,high,0\n"
            "64,,,0.1,b64_p0,0,low,0\n");
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
  add("b128_p1", 128, TrialStatus::kPruned, 0, 0.3, 0.2);     // the same rate, another seed
  write_tables(trials_, dir_.string());
  EXPECT_EQ(read_file((dir_ / "steps_to_target.csv").string()),
            "batch_size,steps,examples,best_lr,trial,reached,edge,failed\n"
            "32,300,9600,0.2,b32_p1,1,,0\n"
            "64,,,0.1,b64_p0,0,,0\n"
            "128,90,11520,0.3,b128_p0,1,,0\n");
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
  EXPECT_NE(table.find("90% bootstrap range: B_crit"), std::string::npos) << table;
}

}  // namespace
