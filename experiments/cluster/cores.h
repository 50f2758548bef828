// Processes on one machine sharing its cores: each sweep worker reserves
// jobs x threads cores in a ledger on the machine's own memory file system
// (/dev/shm), so that workers started side by side (by hand, or as Slurm
// array tasks on one node) divide the cores instead of each spinning a full
// set of OpenMP threads. An entry is a file per process, named by its pid,
// that the process keeps locked (flock) while it lives: the kernel drops the
// lock of a process that dies however it dies, so a dead worker's cores come
// back without anyone cleaning up. Torch-free.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace bigbatch::experiments {

/// The ledger's folder: $BIGBATCH_CORE_LEDGER, else /dev/shm/bigbatch-cores
/// (made world-writable with the sticky bit, like /tmp, so every user's
/// workers count), else the same under /tmp when there is no /dev/shm.
std::string core_ledger_folder();

class CoreLedger {
 public:
  /// The ledger in `folder` (made if missing) of a machine with `cores` cores.
  CoreLedger(std::string folder, int cores);
  /// Gives this process's cores back.
  ~CoreLedger();
  CoreLedger(const CoreLedger&) = delete;
  CoreLedger& operator=(const CoreLedger&) = delete;

  /// Reserves cores for up to `jobs` jobs of `threads` threads each among
  /// the cores the other live processes of the ledger leave free; the jobs
  /// granted, 0 when not even one fits (nothing is then reserved). Throws
  /// std::runtime_error naming the path on an I/O error.
  int reserve(int jobs, int threads);
  /// The other live processes and the cores each reserved, as reserve saw them.
  const std::vector<std::pair<long, int>>& others() const { return others_; }
  int cores() const { return cores_; }

 private:
  std::string folder_;
  int cores_;
  int fd_ = -1;  // this process's entry, locked while it lives
  std::string entry_;  // its name in the folder
  std::vector<std::pair<long, int>> others_;
};

}  // namespace bigbatch::experiments
