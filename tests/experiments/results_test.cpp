// The result files a sweep leaves: metrics.csv's columns, and the per-batch
// choice in steps_to_target.csv (the fastest trial that reached, else the one
// closest to the target), written from hand-made summaries.
#include <bigbatch/experiments/files.h>
#include <bigbatch/experiments/results.h>

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>

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
    dir_ = fs::temp_directory_path() / ("bigbatch_results_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
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
            "batch_size,steps,examples,best_lr,trial,reached\n"
            "32,300,9600,0.2,b32_p1,1\n"
            "64,,,0.1,b64_p0,0\n");
  // One point cannot fit S(B) = S_min (1 + B_crit / B): the fit says so.
  EXPECT_TRUE(read_json((dir_ / "fit.json").string()).contains("error"));
  const std::string table = report(dir_.string());
  EXPECT_NE(table.find("b32_p1"), std::string::npos) << table;
  EXPECT_NE(table.find("no"), std::string::npos) << table;
}

}  // namespace
