// `bigbatch slurm`: a sweep as a Slurm job array of workers on one sweep
// folder (claims.h), its batch script and its submission through sbatch.
// Torch-free. Docs: docs/cluster.md.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace bigbatch::experiments {

/// What the batch script runs and asks of Slurm.
struct SlurmJob {
  std::string program;     ///< the bigbatch program, an absolute path
  std::string workdir;     ///< the folder the workers start in
  std::string name;        ///< the job's name
  std::string log_folder;  ///< where each task's output goes (%A_%a.out)
  std::vector<std::string> worker_args;  ///< after `bigbatch`: sweep CONFIG --out ... (absolute paths)
  int workers = 1;          ///< array tasks
  int throttle = 0;         ///< at most this many at once (0: all)
  int cpus_per_worker = 1;
  int gpus_per_worker = 0;
  std::optional<std::string> time, partition;
  int signal_seconds = 90;  ///< USR1 to the batch shell this long before the time limit
  bool requeue = false;     ///< a worker stopped by the signal requeues its array task
};

/// The exit code of a sweep stopped by a signal after checkpointing and
/// giving back its trials (EX_TEMPFAIL: try again later).
inline constexpr int kExitInterrupted = 75;

/// `s` single-quoted for a POSIX shell.
std::string shell_quote(const std::string& s);

/// The batch script: #SBATCH lines for the array, its throttle, cores,
/// GPUs, time, partition, signal and output; the worker started in the
/// background with the signal passed on to it (SIGTERM, which Slurm sends
/// to every process of the job, reaches it directly), then waited for; with `requeue`, a worker that exits kExitInterrupted requeues its
/// task (scontrol requeue), which resumes from the trials' checkpoints.
std::string batch_script(const SlurmJob& job);

/// A program's run: its exit status (or 128 + the signal that ended it),
/// what it wrote to stdout and to stderr.
struct ProgramRun {
  int status = 0;
  std::string out, err;
};
/// Runs argv (argv[0] looked up on PATH) and waits; throws
/// std::runtime_error naming it when it cannot be started.
ProgramRun run_program(const std::vector<std::string>& argv);
/// The absolute path of `name` on PATH, if it is there and executable.
std::optional<std::string> find_on_path(const std::string& name);

}  // namespace bigbatch::experiments
