// Claims on a shared sweep folder: many workers (threads of one process,
// processes on one machine, processes on many machines over NFS or Lustre)
// run one sweep, each trial by one worker at a time, each trial's result
// recorded once. Torch-free.
//
// Layout: <sweep>/claims/<trial>.<n>, slots n = 1, 2, ... of a trial, each
// created once and never rewritten: "run <worker>" (a worker holds the
// trial), "released <worker>" (it gave it back: preemption), "done <worker>"
// (it committed its result). The trial's state is its highest slot. Every
// change of state creates the next slot, exclusively: a unique temporary file
// linked to the slot's name (link(2) fails with EEXIST when it exists, on
// NFSv2/3/4 and Lustre alike; a retried link whose first reply was lost is
// recognised by the temporary's link count of 2, as open(2)'s NOTES
// describe). So two workers can never both move a trial on from the same
// state: one wins the slot, the other sees it taken.
//
// Liveness: a holder touches its slot (the folder's clock sets its mtime)
// every lease/8 seconds. A "run" slot untouched for the lease is a dead
// worker's: any worker may take the trial (the next slot) and resume it from
// its checkpoint; at once when the holder was a process of this machine
// that no longer exists (a sweep killed by hand and started again). Ages are differences of two mtimes set by the same file
// server (the slot's, and a file this worker has just touched), so the
// workers' own clocks never meet. Attributes are read by open and fstat,
// which NFS's close-to-open consistency revalidates.
//
// Fencing: a result is committed by creating slot n+1 "done", the slot a
// takeover needs too. A slow worker whose trial was taken (it stalled past
// the lease) loses that race: its commit fails, and its results are refused,
// never written. Its heartbeat sees slot n+1 and marks the claim robbed, so
// it stops the trial at its next step without writing. Docs:
// docs/cluster.md.
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace bigbatch::experiments {

/// A number of seconds as a person writes it: 120, 0.5, 1e-05.
std::string seconds_text(double seconds);

/// "<host>:<pid>:<8 hex digits>": unique across machines and restarts.
std::string new_worker_id();

/// A trial's highest slot.
struct ClaimSlot {
  enum class Kind { kRun, kReleased, kDone };
  std::int64_t n = 0;
  Kind kind = Kind::kRun;
  std::string worker;
  double mtime = 0;  ///< its last heartbeat (or creation), by the folder's clock, in seconds
};

class ClaimBoard {
 public:
  /// What try_claim found.
  enum class State {
    kClaimed,  ///< this worker now holds the trial
    kBusy,     ///< a live worker holds it, or is writing its result
    kSettled,  ///< its result was committed by a worker of this generation
  };

  /// Claims under <sweep_dir>/claims (made if missing). `lease` > 0 seconds.
  /// `tick`, if any, runs on the heartbeat thread after each heartbeat.
  ClaimBoard(const std::string& sweep_dir, double lease, std::string worker = new_worker_id(),
             std::function<void()> tick = {});
  /// Stops the heartbeat. Claims still held are left to go stale, as a
  /// crash would leave them.
  ~ClaimBoard();
  ClaimBoard(const ClaimBoard&) = delete;
  ClaimBoard& operator=(const ClaimBoard&) = delete;

  /// Tries to take `trial`, which the caller found unfinished (no summary it
  /// accepts). `has_summary` says whether a summary.json exists at all (one
  /// it does not accept: a failure, or a pruned trial now run without
  /// pruning). A trial is taken when it has no slot, was released, its
  /// holder's lease ran out, or its "done" slot has a summary and is older
  /// than this board (an earlier run's result the caller does not accept),
  /// or has none and is older than the lease (its writer died after
  /// committing).
  State try_claim(const std::string& trial, bool has_summary);
  /// Whether `trial`, held by this worker, has been taken over by another,
  /// as the heartbeat last saw (cheap; late by up to lease/8).
  bool robbed(const std::string& trial) const;
  /// Whether this worker still holds `trial`, looked up now (one access of
  /// the next slot): before the trial's folder is touched.
  bool verify(const std::string& trial);
  /// Commits `trial`'s result: true when this worker still held it (write
  /// the result now); false when another took it over (refuse the result).
  bool commit(const std::string& trial);
  /// Gives `trial` back (preemption): the next worker takes it at once.
  void release(const std::string& trial);
  /// Forgets `trial` without writing (it was robbed).
  void abandon(const std::string& trial);

  /// Whether the claims folder changed since this worker last asked (a slot
  /// made, an announce()): one open and fstat of the folder, which NFS
  /// revalidates on open. True the first time.
  bool changed();
  /// Marks `trial`'s result written (claims/<trial>.finished, which also
  /// changes the folder for the others' changed()): call it once its
  /// summary.json is in place.
  void announce(const std::string& trial);
  /// The trials whose results have been announced: one listing of the
  /// claims folder, however many trials the sweep has.
  std::vector<std::string> announced();

  /// The trial's highest slot, if it has one.
  std::optional<ClaimSlot> last_slot(const std::string& trial);
  /// Now, by the folder's clock (the mtime of a file just touched).
  double folder_now();
  double lease() const { return lease_; }
  const std::string& worker() const { return worker_; }
  const std::string& folder() const { return dir_; }

 private:
  struct Held {
    std::int64_t n;
    bool robbed = false;
  };
  // Creates slot `n` of `trial` holding `kind`; false when it exists.
  bool create(const std::string& trial, std::int64_t n, const char* kind);
  std::string slot_path(const std::string& trial, std::int64_t n) const;
  void heartbeat_loop();
  void beat();

  std::string dir_, worker_, clock_;
  double lease_;
  double born_;  // folder_now() at construction: "done" slots older are an earlier run's
  std::function<void()> tick_;
  std::atomic<std::uint64_t> temporaries_{0};
  mutable std::mutex mutex_;
  std::map<std::string, Held> held_;
  std::map<std::string, std::int64_t> highest_;  // slots seen: tokens only grow
  struct timespec folder_mtime_ {};              // changed()'s last look
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread heartbeat_;
};

}  // namespace bigbatch::experiments
