// Claims on a shared sweep folder (claims.h), the machine's core ledger
// (cores.h), the Slurm batch script and sbatch runner (slurm.h), and the
// decoding of Slurm's node lists (distributed/slurm_env.h). Other workers
// are other ClaimBoards, threads, and forked processes (a worker stopped by
// SIGSTOP is the slow-but-live one).
#include "../../distributed/slurm_env.h"
#include "../../experiments/cluster/claims.h"
#include "../../experiments/cluster/cores.h"
#include "../../experiments/cluster/slurm.h"
#include "scratch_dir.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace bx = bigbatch::experiments;
namespace fs = std::filesystem;
using bigbatch::testing_support::error_of;
using bigbatch::testing_support::ScratchDirTest;
using State = bx::ClaimBoard::State;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Waits (up to 10 s) for `path` to exist.
bool appears(const fs::path& path) {
  const auto start = Clock::now();
  while (!fs::exists(path)) {
    if (seconds_since(start) > 10) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// Waits (up to 10 s) for `path` to hold something: a file is made empty
// and written after, so its existence alone says nothing of its content.
bool filled(const fs::path& path) {
  const auto start = Clock::now();
  while (!fs::exists(path) || fs::file_size(path) == 0) {
    if (seconds_since(start) > 10) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// A board's heartbeats, counted through its tick callback, so that a test
// waits for heartbeats rather than for a time it hopes holds some.
class Ticks {
 public:
  std::function<void()> callback() {
    return [this] {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++count_;
      }
      ready_.notify_all();
    };
  }
  // Waits for `more` heartbeats after now (30 s at most: a watchdog, not a
  // bound the test relies on). A tick counted first may close a heartbeat
  // that began before the call: wait(2) sees one wholly after it.
  bool wait(int more) {
    std::unique_lock<std::mutex> lock(mutex_);
    const int want = count_ + more;
    return ready_.wait_for(lock, std::chrono::seconds(30), [&] { return count_ >= want; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  int count_ = 0;
};

// Sets a slot's last heartbeat `age` seconds before now, by the folder's
// clock, as a worker silent for that long would have left it: the decisions
// under test follow the recorded age against the lease, never how long the
// test happened to wait.
void age_slot(bx::ClaimBoard& board, const fs::path& slot, double age) {
  const double t = board.folder_now() - age;
  timespec times[2];
  times[0].tv_sec = static_cast<time_t>(std::floor(t));
  times[0].tv_nsec = static_cast<long>((t - std::floor(t)) * 1e9);
  times[1] = times[0];
  ASSERT_EQ(::utimensat(AT_FDCWD, slot.c_str(), times, 0), 0) << slot;
}

// The age a takeover's "silent for X s, lease L s" line gives, NaN without one.
double silent_for(const std::string& said) {
  const auto at = said.find("(silent for ");
  return at == std::string::npos ? std::nan("") : std::strtod(said.c_str() + at + 12, nullptr);
}

class Claims : public ScratchDirTest {};

TEST_F(Claims, OneWorkerWinsATrialAndTheOthersSeeItBusy) {
  bx::ClaimBoard a(dir_.string(), 60), b(dir_.string(), 60);
  EXPECT_EQ(a.try_claim("b8_p0_s0", false), State::kClaimed);
  EXPECT_EQ(b.try_claim("b8_p0_s0", false), State::kBusy);
  EXPECT_EQ(a.try_claim("b8_p0_s0", false), State::kBusy);  // its own: not twice
  EXPECT_EQ(b.try_claim("b8_p0_s1", false), State::kClaimed);
  EXPECT_EQ(slurp(dir_ / "claims" / "b8_p0_s0.1"), "run " + a.worker() + "\n");
  EXPECT_FALSE(fs::exists(dir_ / "claims" / "b8_p0_s0.2"));
}

TEST_F(Claims, ManyWorkersRacingForTheSameTrialsClaimEachOnce) {
  constexpr int kWorkers = 6, kTrials = 60;
  std::vector<std::unique_ptr<bx::ClaimBoard>> boards;
  for (int w = 0; w < kWorkers; ++w) boards.push_back(std::make_unique<bx::ClaimBoard>(dir_.string(), 60));
  std::mutex mutex;
  std::map<int, std::vector<int>> owners;
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      while (!go) std::this_thread::yield();
      for (int t = 0; t < kTrials; ++t) {
        // Every worker walks the trials from a different place.
        const int trial = (t + w * 7) % kTrials;
        if (boards[w]->try_claim("t" + std::to_string(trial), false) == State::kClaimed) {
          std::lock_guard<std::mutex> lock(mutex);
          owners[trial].push_back(w);
        }
      }
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  ASSERT_EQ(owners.size(), static_cast<std::size_t>(kTrials));
  for (const auto& [trial, who] : owners) EXPECT_EQ(who.size(), 1u) << "trial " << trial;
  for (int t = 0; t < kTrials; ++t) EXPECT_FALSE(fs::exists(dir_ / "claims" / ("t" + std::to_string(t) + ".2")));
}

TEST_F(Claims, ADeadWorkersTrialIsTakenOverOnceItsLeaseRunsOut) {
  constexpr double kLease = 8;
  const fs::path slot = dir_ / "claims" / "t.1";
  auto a = std::make_unique<bx::ClaimBoard>(dir_.string(), kLease);
  ASSERT_EQ(a->try_claim("t", false), State::kClaimed);
  a.reset();  // dies holding it: no release, no more heartbeats (its process lives on: no shortcut)
  bx::ClaimBoard b(dir_.string(), kLease);
  EXPECT_EQ(b.try_claim("t", false), State::kBusy);
  age_slot(b, slot, kLease / 2);  // silent for half its lease: still its holder's
  EXPECT_EQ(b.try_claim("t", false), State::kBusy);
  age_slot(b, slot, 1.5 * kLease);  // silent past its lease: taken over, and said so
  testing::internal::CaptureStderr();
  EXPECT_EQ(b.try_claim("t", false), State::kClaimed);
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("taking over trial t from worker "), std::string::npos) << said;
  EXPECT_GE(silent_for(said), 1.5 * kLease - 0.05) << said;
  EXPECT_NE(said.find(", lease 8 s)"), std::string::npos) << said;
  EXPECT_EQ(slurp(dir_ / "claims" / "t.2"), "run " + b.worker() + "\n");
  EXPECT_TRUE(b.commit("t"));
}

// A sweep killed by hand and started again on the same machine does not wait
// out the lease: the old holder's process is gone.
TEST_F(Claims, AGoneProcessOfThisMachineIsTakenOverAtOnce) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    bx::ClaimBoard mine(dir_.string(), 3600);
    ::_exit(mine.try_claim("t", false) == State::kClaimed ? 0 : 1);  // dies holding it
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  bx::ClaimBoard b(dir_.string(), 3600);
  EXPECT_EQ(b.try_claim("t", false), State::kClaimed);
  EXPECT_EQ(slurp(dir_ / "claims" / "t.2"), "run " + b.worker() + "\n");
}

// A live worker's heartbeats keep its slot younger than the lease: a slot
// left as a silent worker's would be is touched anew at the next heartbeat
// (counted, not timed), and the others find the trial busy each time.
TEST_F(Claims, ALiveWorkerIsNeverRobbed) {
  constexpr double kLease = 2;  // a heartbeat every 0.25 s
  const fs::path slot = dir_ / "claims" / "t.1";
  Ticks ticks;
  bx::ClaimBoard a(dir_.string(), kLease, bx::new_worker_id(), ticks.callback()), b(dir_.string(), kLease);
  ASSERT_EQ(a.try_claim("t", false), State::kClaimed);
  for (int round = 0; round < 3; ++round) {
    age_slot(b, slot, 2 * kLease);
    ASSERT_TRUE(ticks.wait(2)) << "no heartbeat in 30 s";
    const std::optional<bx::ClaimSlot> last = b.last_slot("t");
    ASSERT_TRUE(last);
    EXPECT_LT(b.folder_now() - last->mtime, kLease) << "round " << round;
    EXPECT_EQ(b.try_claim("t", false), State::kBusy) << "round " << round;
  }
  EXPECT_FALSE(a.robbed("t"));
  EXPECT_TRUE(a.commit("t"));
  EXPECT_EQ(slurp(dir_ / "claims" / "t.2"), "done " + a.worker() + "\n");
}

// A worker that stalls past its lease (SIGSTOP here; a swap storm or a hung
// NFS server in life) loses its trial, learns so at its next heartbeat, and
// cannot commit: its late result is refused.
TEST_F(Claims, AStalledWorkersLateResultIsRefused) {
  constexpr double kLease = 0.5;
  const fs::path claimed = dir_ / "child_claimed";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int code = 10;
    {
      Ticks ticks;
      bx::ClaimBoard mine(dir_.string(), kLease, bx::new_worker_id(), ticks.callback());
      if (mine.try_claim("t", false) == State::kClaimed) {
        std::ofstream(claimed.string()) << "1";
        ::raise(SIGSTOP);  // stalled here until the parent continues it
        // A heartbeat after the stall: it sees the next slot taken. Then, in
        // this order, what the worker learns before touching its trial's
        // folder, and its commit.
        const bool beat = ticks.wait(2);
        const bool seen = mine.robbed("t");
        const bool held = mine.verify("t");
        const bool committed = mine.commit("t");
        code = beat ? (held ? 4 : 0) + (seen ? 1 : 0) + (committed ? 0 : 2) : 8;
      }
    }
    ::_exit(code);
  }
  ASSERT_TRUE(appears(claimed));
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(status));
  bx::ClaimBoard taker(dir_.string(), kLease);
  State s = State::kBusy;
  const auto start = Clock::now();
  while (s == State::kBusy && seconds_since(start) < 5) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    s = taker.try_claim("t", false);
  }
  EXPECT_EQ(s, State::kClaimed);
  ::kill(child, SIGCONT);
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  // 3: robbed, seen so, and refused (1 alone: committed anyway; 2 alone: not
  // seen robbed; 4: verify() said it still held the trial; 8: no heartbeat).
  EXPECT_EQ(WEXITSTATUS(status), 3);
  EXPECT_FALSE(taker.robbed("t"));
  EXPECT_TRUE(taker.commit("t"));  // slot 3: the taker's result stands
  EXPECT_EQ(slurp(dir_ / "claims" / "t.3"), "done " + taker.worker() + "\n");
}

TEST_F(Claims, AReleasedTrialIsTakenAtOnce) {
  bx::ClaimBoard a(dir_.string(), 60), b(dir_.string(), 60);
  ASSERT_EQ(a.try_claim("t", false), State::kClaimed);
  a.release("t");
  EXPECT_EQ(slurp(dir_ / "claims" / "t.2"), "released " + a.worker() + "\n");
  EXPECT_EQ(b.try_claim("t", false), State::kClaimed);
  EXPECT_EQ(slurp(dir_ / "claims" / "t.3"), "run " + b.worker() + "\n");
}

TEST_F(Claims, ACommittedTrialIsSettledForThisRunAndRedoneByALaterOne) {
  bx::ClaimBoard a(dir_.string(), 60), b(dir_.string(), 60);
  ASSERT_EQ(a.try_claim("t", false), State::kClaimed);
  ASSERT_TRUE(a.commit("t"));
  // A summary the caller does not accept (a failure) of this run: settled.
  EXPECT_EQ(b.try_claim("t", true), State::kSettled);
  // No summary yet: its writer is writing it.
  EXPECT_EQ(b.try_claim("t", false), State::kBusy);
  // A later run (a board made after the commit) redoes what it does not accept.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  bx::ClaimBoard later(dir_.string(), 60);
  EXPECT_EQ(later.try_claim("t", true), State::kClaimed);
  EXPECT_EQ(slurp(dir_ / "claims" / "t.3"), "run " + later.worker() + "\n");
}

// A "done" slot whose trial has no summary yet: its writer is writing it.
// Only one silent for the lease (or a process of this machine that is gone)
// died before it had: then the trial is taken over.
TEST_F(Claims, AResultBeingWrittenIsWaitedForUpToTheLease) {
  constexpr double kLease = 8;
  bx::ClaimBoard a(dir_.string(), kLease), b(dir_.string(), kLease);
  ASSERT_EQ(a.try_claim("t", false), State::kClaimed);
  ASSERT_TRUE(a.commit("t"));  // its writer lives on, and sends no more heartbeats for it
  const fs::path done = dir_ / "claims" / "t.2";
  age_slot(b, done, kLease / 2);  // within the lease: still being written
  EXPECT_EQ(b.try_claim("t", false), State::kBusy);
  age_slot(b, done, 1.5 * kLease);  // past it: its writer died before the summary
  EXPECT_EQ(b.try_claim("t", false), State::kClaimed);
  EXPECT_EQ(slurp(dir_ / "claims" / "t.3"), "run " + b.worker() + "\n");
}

TEST_F(Claims, ADamagedSlotIsNamed) {
  bx::ClaimBoard a(dir_.string(), 60);
  std::ofstream((dir_ / "claims" / "t.1").string()) << "mine!";
  EXPECT_EQ(error_of([&] { a.try_claim("t", false); }),
            (dir_ / "claims" / "t.1").string() +
                ": not a claim slot (\"mine!\"); remove the sweep's claims/ folder when no worker runs");
  EXPECT_EQ(error_of([&] { bx::ClaimBoard(dir_.string(), 0); }), "claim lease must be > 0 seconds, got 0");
}

class Cores : public ScratchDirTest {};

// A second process on the machine gets the cores the first left; a process
// that dies (kill -9) gives its cores back without anyone cleaning up.
TEST_F(Cores, ProcessesSideBySideDivideTheCores) {
  const std::string ledger = (dir_ / "ledger").string();
  const fs::path ready = dir_ / "child_ready";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    bx::CoreLedger mine(ledger, 4);
    const int granted = mine.reserve(3, 1);
    std::ofstream(ready.string()) << granted;
    ::pause();
    ::_exit(0);
  }
  ASSERT_TRUE(filled(ready));
  EXPECT_EQ(slurp(ready), "3");
  {
    bx::CoreLedger mine(ledger, 4);
    EXPECT_EQ(mine.reserve(2, 1), 1);
    ASSERT_EQ(mine.others().size(), 1u);
    EXPECT_EQ(mine.others()[0], std::make_pair(static_cast<long>(child), 3));
    EXPECT_EQ(mine.reserve(1, 2), 0);  // a trial of 2 threads does not fit the one core left
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  bx::CoreLedger mine(ledger, 4);
  EXPECT_EQ(mine.reserve(8, 1), 4);
  EXPECT_TRUE(mine.others().empty());
  EXPECT_FALSE(fs::exists(fs::path(ledger) / std::to_string(child)));
}

class SlurmScript : public ScratchDirTest {};

bx::SlurmJob example_job(const std::string& program, const std::string& logs) {
  bx::SlurmJob job;
  job.program = program;
  job.workdir = "/tmp";
  job.name = "bigbatch-quickstart";
  job.log_folder = logs;
  job.worker_args = {"sweep", "/configs/it's.json", "--out", "/shared/runs"};
  job.workers = 5;
  job.throttle = 2;
  job.cpus_per_worker = 4;
  job.gpus_per_worker = 1;
  job.time = "1:00:00";
  job.partition = "gpu";
  job.signal_seconds = 90;
  job.requeue = true;
  return job;
}

TEST_F(SlurmScript, AsksForTheArrayItsThrottleCoresGpusAndTheSignal) {
  const std::string script = bx::batch_script(example_job("/opt/bin/bigbatch", "/shared/runs/q/slurm"));
  for (const char* line : {"#SBATCH --array=0-4%2\n", "#SBATCH --cpus-per-task=4\n", "#SBATCH --gres=gpu:1\n",
                           "#SBATCH --time=1:00:00\n", "#SBATCH --partition=gpu\n", "#SBATCH --signal=B:USR1@90\n",
                           "#SBATCH --output=/shared/runs/q/slurm/%A_%a.out\n", "#SBATCH --requeue\n",
                           "'/opt/bin/bigbatch' 'sweep' '/configs/it'\\''s.json' '--out' '/shared/runs' &\n"}) {
    EXPECT_NE(script.find(line), std::string::npos) << line << " not in\n" << script;
  }
  EXPECT_EQ(bx::shell_quote("a'b c"), "'a'\\''b c'");
  const std::string path = write("job.sbatch", script);
  EXPECT_EQ(bx::run_program({"bash", "-n", path}).status, 0);
}

// The script run by bash as Slurm would: the signal before the time limit
// (USR1, to the batch shell only) reaches the worker, its exit code 75 comes
// back, and with --requeue the task asks scontrol to requeue it. SIGTERM,
// which Slurm sends to every process of the job, is not sent on a second
// time: the worker stops once, on its own SIGTERM.
TEST_F(SlurmScript, PassesTheSignalOnAndRequeuesAStoppedWorker) {
  const std::string worker = write("worker.sh",
                                   "#!/bin/bash\n"
                                   "trap 'echo \"$1\" >> " + (dir_ / "stopped").string() + "; exit 75' USR1\n"
                                   "trap 'echo TERM >> " + (dir_ / "stopped").string() + "; exit 75' TERM\n"
                                   "echo \"$@\" > " + (dir_ / "started").string() + "\n"
                                   "while :; do sleep 0.05; done\n");
  const std::string scontrol = write("scontrol", "#!/bin/bash\necho \"$@\" >> " + (dir_ / "scontrol.log").string() + "\n");
  fs::permissions(worker, fs::perms::owner_all);
  fs::permissions(scontrol, fs::perms::owner_all);
  const std::string script = write("job.sbatch", bx::batch_script(example_job(worker, dir_.string())));
  const std::string path = dir_.string() + ":" + std::getenv("PATH");
  const pid_t shell = ::fork();
  ASSERT_GE(shell, 0);
  if (shell == 0) {
    ::setenv("PATH", path.c_str(), 1);
    ::setenv("SLURM_ARRAY_JOB_ID", "7", 1);
    ::setenv("SLURM_ARRAY_TASK_ID", "2", 1);
    ::execl("/bin/bash", "bash", script.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // The script sets its traps before it starts the worker, which writes
  // this file once its own are set: the signal may come at once.
  ASSERT_TRUE(filled(dir_ / "started"));
  EXPECT_EQ(slurp(dir_ / "started"), "sweep /configs/it's.json --out /shared/runs\n");
  ::kill(shell, SIGUSR1);
  int status = 0;
  ASSERT_EQ(::waitpid(shell, &status, 0), shell);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), bx::kExitInterrupted);
  EXPECT_EQ(slurp(dir_ / "stopped"), "sweep\n");  // USR1, once
  EXPECT_EQ(slurp(dir_ / "scontrol.log"), "requeue 7_2\n");
}

// scancel's SIGTERM goes to the shell and the worker (one process group, as
// Slurm signals a job): the worker is stopped once, not twice, and its 75
// comes back.
TEST_F(SlurmScript, ASigtermToTheWholeJobStopsTheWorkerOnce) {
  const std::string worker = write("worker.sh",
                                   "#!/bin/bash\n"
                                   "trap 'echo TERM >> " + (dir_ / "stopped").string() + "; sleep 0.3; exit 75' TERM\n"
                                   "echo started > " + (dir_ / "started").string() + "\n"
                                   "while :; do sleep 0.05; done\n");
  fs::permissions(worker, fs::perms::owner_all);
  bx::SlurmJob job = example_job(worker, dir_.string());
  job.requeue = false;
  const std::string script = write("job.sbatch", bx::batch_script(job));
  const pid_t shell = ::fork();
  ASSERT_GE(shell, 0);
  if (shell == 0) {
    ::setpgid(0, 0);
    ::execl("/bin/bash", "bash", script.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ASSERT_TRUE(filled(dir_ / "started"));
  ::kill(-shell, SIGTERM);  // the whole process group
  int status = 0;
  ASSERT_EQ(::waitpid(shell, &status, 0), shell);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), bx::kExitInterrupted);
  EXPECT_EQ(slurp(dir_ / "stopped"), "TERM\n");
}

TEST(RunProgram, ReturnsTheStatusAndBothStreams) {
  const bx::ProgramRun r = bx::run_program({"sh", "-c", "echo out; echo err >&2; exit 3"});
  EXPECT_EQ(r.status, 3);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
  EXPECT_EQ(error_of([] { bx::run_program({"no-such-program-bigbatch"}); }),
            "no-such-program-bigbatch: cannot start: No such file or directory");
  EXPECT_FALSE(bx::find_on_path("no-such-program-bigbatch"));
  EXPECT_TRUE(bx::find_on_path("sh"));
}

TEST(SlurmEnv, TheFirstHostOfANodeList) {
  using bigbatch::distributed::first_slurm_host;
  EXPECT_EQ(first_slurm_host("node[07-09,12],gpu1"), "node07");
  EXPECT_EQ(first_slurm_host("gpu1,node[07-09]"), "gpu1");
  EXPECT_EQ(first_slurm_host("rack[3,1]-n[010-011]"), "rack3-n010");
  EXPECT_EQ(first_slurm_host("solo"), "solo");
  EXPECT_EQ(error_of([] { first_slurm_host("node[1-2"); }), "node list \"node[1-2\": unclosed '['");
  EXPECT_EQ(error_of([] { first_slurm_host(""); }), "node list \"\": no host");
}

TEST(SlurmEnv, TheTasksOfANode) {
  using bigbatch::distributed::slurm_tasks_on_node;
  EXPECT_EQ(slurm_tasks_on_node("2", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(slurm_tasks_on_node("4,1(x2),3", 2), 1);
  EXPECT_EQ(slurm_tasks_on_node("4,1(x2),3", 3), 3);
  EXPECT_EQ(error_of([] { slurm_tasks_on_node("2(x3),1", 4); }), "tasks per node \"2(x3),1\": no entry for node 4");
  EXPECT_EQ(error_of([] { slurm_tasks_on_node("2(3)", 0); }), "tasks per node \"2(3)\": cannot read it");
}

}  // namespace
