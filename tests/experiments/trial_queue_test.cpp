// The sweep's trial order and the exact-pruning rule (trial_queue.h), on
// hand-made trials: batch sizes 32, 64, 128, each with rates 0.001, 0.01,
// 0.03 (one seed), and one batch size with two rates of three seeds.
#include "../../experiments/sweep/trial_queue.h"

#include <gtest/gtest.h>

namespace {

using namespace bigbatch::experiments;

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

using Outcome = TrialQueue::Outcome;

// Three seeds of each of two rates at one batch size: trial = 3 * rate + seed.
std::vector<TrialConfig> seeded() {
  std::vector<TrialConfig> trials;
  for (const double lr : {0.01, 0.03}) {
    for (std::uint64_t seed = 0; seed < 3; ++seed) {
      TrialConfig t;
      t.batch_size = 64;
      t.schedule.base_lr = lr;
      t.seed = seed;
      t.name = "lr" + std::to_string(lr) + "_s" + std::to_string(seed);
      trials.push_back(t);
    }
  }
  return trials;
}

TEST(TrialQueue, RatesAreTrialsThatDifferOnlyInTheirSeed) {
  auto trials = seeded();
  trials[5].optimizer.params["momentum"] = 0.5;  // another momentum: a rate of its own (only grouped here)
  const auto rates = rates_of(trials);
  ASSERT_EQ(rates.size(), 3u);
  EXPECT_EQ(rates[0], (std::vector<std::size_t>{0, 1, 2}));
  EXPECT_EQ(rates[1], (std::vector<std::size_t>{3, 4}));
  EXPECT_EQ(rates[2], (std::vector<std::size_t>{5}));
}

// One seed per rate: the row is the least (steps, rate); a trial whose next
// evaluation e has (e, its rate) above the best reach's cannot become it.
TEST(TrialQueue, OneSeedTheBoundIsTheLeastReach) {
  const auto trials = grid();
  TrialQueue queue(trials, /*prune=*/true);
  for (std::size_t i = 0; i < trials.size(); ++i) queue.add(i);
  EXPECT_FALSE(queue.pruned(2, 1000000));  // nothing reached yet
  queue.finished(1, Outcome::kReached, 500);
  EXPECT_TRUE(queue.pruned(2, 500));   // ties, a later rate: never the row
  EXPECT_TRUE(queue.pruned(2, 510));
  EXPECT_FALSE(queue.pruned(0, 500));  // ties, an earlier rate: it would be the row
  EXPECT_FALSE(queue.pruned(0, 490));
  EXPECT_FALSE(queue.pruned(4, 1000000));  // batch 64 has no reach
  EXPECT_EQ(queue.prune_from(0), 501);
  EXPECT_EQ(queue.prune_from(8), std::nullopt);
  TrialQueue off(trials, /*prune=*/false);
  off.finished(0, Outcome::kReached, 10);
  EXPECT_FALSE(off.pruned(1, 1000000));
  EXPECT_EQ(off.prune_from(1), std::nullopt);
}

// Three seeds: the bound is the least median of upper bounds (unfinished
// seeds count as +inf), and a trial falls to it only once the median of its
// rate's lower bounds passes it.
TEST(TrialQueue, SeedsBoundByMediansOfBounds) {
  const auto trials = seeded();
  TrialQueue queue(trials, true);
  for (std::size_t i = 0; i < trials.size(); ++i) queue.add(i);
  queue.finished(0, Outcome::kReached, 300);
  EXPECT_FALSE(queue.pruned(3, 100000));  // rate 0's median may still be +inf: no bound
  queue.finished(1, Outcome::kReached, 200);
  // Rate 0: at most median(300, 200, inf) = 300. Rate 1's lower bounds
  // (100000, 0, 0) have median 0: no seed of it can be stopped alone...
  EXPECT_FALSE(queue.pruned(3, 100000));
  // ...until a second seed reaches 300 too: median(100000, 300, 0) = 300
  // ties rate 0's bound, and a tie goes to the earlier rate.
  EXPECT_EQ(queue.prune_from(4), 300);
  EXPECT_FALSE(queue.pruned(4, 299));
  EXPECT_TRUE(queue.pruned(4, 300));
  EXPECT_TRUE(queue.pruned(3, 100000));
  // The third seed falls at once: two of three lie beyond the bound.
  EXPECT_EQ(queue.prune_from(5), 0);
  // A pruned seed keeps its lower bound (steps + 1); one that did not reach is +inf.
  TrialQueue again(trials, true);
  again.finished(0, Outcome::kReached, 300);
  again.finished(1, Outcome::kReached, 200);
  again.finished(3, Outcome::kPruned, 400);
  EXPECT_EQ(again.prune_from(4), 300);  // median(401, e, 0) = e
  EXPECT_EQ(again.prune_from(5), 300);
  again.finished(3, Outcome::kNotReached, 0);
  EXPECT_EQ(again.prune_from(4), 300);
  // The bound's own rate is never pruned: its every seed runs to its end.
  EXPECT_EQ(again.prune_from(2), std::nullopt);
  EXPECT_FALSE(again.pruned(2, 100000));
}

TEST(TrialQueue, LikelyWinnersFirstAndParallelJobsSpreadOverBatchSizes) {
  const auto trials = grid();
  TrialQueue queue(trials, true);
  for (std::size_t i = 0; i < trials.size(); ++i) queue.add(i);
  // Nothing known: the rate nearest the geometric middle of 0.001 and 0.03
  // (0.0055) is 0.01. A second job takes the next batch size, not a sibling.
  EXPECT_EQ(queue.next(), 1u);
  EXPECT_EQ(queue.next(), 4u);
  queue.finished(1, Outcome::kReached, 400);
  // Batch 32 has nothing running again: its own best (0.01) predicts, and of
  // 0.001 and 0.03 the nearer in log is 0.03.
  EXPECT_EQ(queue.next(), 2u);
  queue.finished(4, Outcome::kReached, 300);
  queue.finished(2, Outcome::kNotReached, 0);
  EXPECT_EQ(queue.next(), 0u);  // batch 32 first: it still has a trial and nothing running
  EXPECT_EQ(queue.next(), 5u);  // batch 64: its own best 0.01; 0.03 (1.1 in log) is nearer than 0.001 (2.3)
}

TEST(TrialQueue, TheLineThroughTheTwoNearestBatchSizesPredictsTheRate) {
  const auto trials = grid();
  TrialQueue queue(trials, true);
  queue.finished(1, Outcome::kReached, 400);  // 32: 0.01
  queue.finished(5, Outcome::kReached, 300);  // 64: 0.03, so the rate triples per doubling: 0.09 at 128
  for (std::size_t i = 6; i < 9; ++i) queue.add(i);
  EXPECT_EQ(queue.next(), 8u);  // 0.03, the nearest to 0.09
  EXPECT_EQ(queue.next(), 7u);  // then 0.01 (nothing else is left to run elsewhere)
  EXPECT_EQ(queue.next(), 6u);
  EXPECT_EQ(queue.next(), std::nullopt);
  TrialQueue one(trials, true);
  one.finished(1, Outcome::kReached, 400);  // one neighbour: its rate
  for (std::size_t i = 6; i < 9; ++i) one.add(i);
  EXPECT_EQ(one.next(), 7u);
}

}  // namespace
