// The sweep's trial order and the exact-pruning rule (trial_queue.h), on
// hand-made trials: batch sizes 32, 64, 128, each with rates 0.001, 0.01, 0.03.
#include "../../experiments/trial_queue.h"

#include <gtest/gtest.h>

namespace {

using namespace bigbatch::experiments;
using Bound = TrialQueue::Bound;

std::vector<TrialConfig> grid() {
  std::vector<TrialConfig> trials;
  for (const std::int64_t b : {32, 64, 128}) {
    for (const double lr : {0.001, 0.01, 0.03}) {
      TrialConfig t;
      t.batch_size = b;
      t.schedule.base_lr = lr;
      t.name = "b" + std::to_string(b) + "_lr" + std::to_string(lr);
      trials.push_back(t);
    }
  }
  return trials;  // index = 3 * (batch's position) + (rate's position)
}

// The rule: the row is the least (steps, index); a trial whose next
// evaluation e has (e, index) above the bound's cannot become it.
TEST(TrialQueue, BeatenIsTheLexicographicRuleOfTheTable) {
  const std::optional<Bound> bound = Bound{100, 3};
  EXPECT_FALSE(TrialQueue::beaten(bound, 2, 100));  // ties, and comes first: it would be the row
  EXPECT_TRUE(TrialQueue::beaten(bound, 4, 100));   // ties, comes later: never the row
  EXPECT_TRUE(TrialQueue::beaten(bound, 0, 110));
  EXPECT_FALSE(TrialQueue::beaten(bound, 9, 90));
  EXPECT_FALSE(TrialQueue::beaten(std::nullopt, 0, 1000000));
}

TEST(TrialQueue, TheBoundIsTheLeastReachAndPruningFollowsIt) {
  const auto trials = grid();
  TrialQueue queue(trials, /*prune=*/true);
  for (std::size_t i = 0; i < trials.size(); ++i) queue.add(i);
  EXPECT_FALSE(queue.bound(0));
  queue.finished(1, 500);
  queue.finished(2, 500);  // the same steps, a later trial: the bound stays trial 1's
  ASSERT_TRUE(queue.bound(0));
  EXPECT_EQ(queue.bound(0)->index, 1u);
  queue.finished(0, 500);  // an earlier trial at the same step takes it
  EXPECT_EQ(queue.bound(2)->index, 0u);
  queue.finished(2, std::nullopt);
  EXPECT_EQ(queue.bound(1)->steps, 500);
  EXPECT_FALSE(queue.bound(3));  // batch 64 has none
  EXPECT_TRUE(queue.pruned(2, 510));
  EXPECT_TRUE(queue.pruned(2, 500));
  EXPECT_FALSE(queue.pruned(2, 490));
  EXPECT_FALSE(queue.pruned(4, 1000000));
  TrialQueue off(trials, /*prune=*/false);
  off.finished(0, 10);
  EXPECT_FALSE(off.pruned(1, 1000000));
}

TEST(TrialQueue, LikelyWinnersFirstAndParallelJobsSpreadOverBatchSizes) {
  const auto trials = grid();
  TrialQueue queue(trials, true);
  for (std::size_t i = 0; i < trials.size(); ++i) queue.add(i);
  // Nothing known: the rate nearest the geometric middle of 0.001 and 0.03
  // (0.0055) is 0.01. A second job takes the next batch size, not a sibling.
  EXPECT_EQ(queue.next(), 1u);
  EXPECT_EQ(queue.next(), 4u);
  queue.finished(1, 400);
  // Batch 32 has nothing running again: its own best (0.01) predicts, and of
  // 0.001 and 0.03 the nearer in log is 0.03.
  EXPECT_EQ(queue.next(), 2u);
  queue.finished(4, 300);
  queue.finished(2, std::nullopt);
  EXPECT_EQ(queue.next(), 0u);  // batch 32 first: it still has a trial and nothing running
  EXPECT_EQ(queue.next(), 5u);  // batch 64: its own best 0.01; 0.03 (1.1 in log) is nearer than 0.001 (2.3)
}

TEST(TrialQueue, TheLineThroughTheTwoNearestBatchSizesPredictsTheRate) {
  const auto trials = grid();
  TrialQueue queue(trials, true);
  queue.finished(1, 400);  // 32: 0.01
  queue.finished(5, 300);  // 64: 0.03, so the rate triples per doubling: 0.09 at 128
  for (std::size_t i = 6; i < 9; ++i) queue.add(i);
  EXPECT_EQ(queue.next(), 8u);  // 0.03, the nearest to 0.09
  EXPECT_EQ(queue.next(), 7u);  // then 0.01 (nothing else is left to run elsewhere)
  EXPECT_EQ(queue.next(), 6u);
  EXPECT_EQ(queue.next(), std::nullopt);
  TrialQueue one(trials, true);
  one.finished(1, 400);  // one neighbour: its rate
  for (std::size_t i = 6; i < 9; ++i) one.add(i);
  EXPECT_EQ(one.next(), 7u);
}

}  // namespace
