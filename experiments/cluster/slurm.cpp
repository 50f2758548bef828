// The Slurm batch script and sbatch (slurm.h).
#include "slurm.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <system_error>

extern char** environ;

namespace bigbatch::experiments {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string batch_script(const SlurmJob& job) {
  std::ostringstream s;
  s << "#!/bin/bash\n"
    << "# A bigbatch sweep worker, one per array task; every task works on the same sweep\n"
    << "# folder (docs/cluster.md). Written by `bigbatch slurm`.\n"
    << "#SBATCH --job-name=" << job.name << "\n"
    << "#SBATCH --array=0-" << job.workers - 1;
  if (job.throttle > 0 && job.throttle < job.workers) s << "%" << job.throttle;
  s << "\n#SBATCH --ntasks=1\n"
    << "#SBATCH --cpus-per-task=" << job.cpus_per_worker << "\n";
  if (job.gpus_per_worker > 0) s << "#SBATCH --gres=gpu:" << job.gpus_per_worker << "\n";
  if (job.time) s << "#SBATCH --time=" << *job.time << "\n";
  if (job.partition) s << "#SBATCH --partition=" << *job.partition << "\n";
  if (job.signal_seconds > 0) s << "#SBATCH --signal=B:USR1@" << job.signal_seconds << "\n";
  s << "#SBATCH --output=" << job.log_folder << "/%A_%a.out\n"
    << "#SBATCH --open-mode=append\n"
    << (job.requeue ? "#SBATCH --requeue\n" : "#SBATCH --no-requeue\n")
    << "cd " << shell_quote(job.workdir) << " || exit 1\n"
    << "echo \"bigbatch worker: task ${SLURM_ARRAY_TASK_ID} of job ${SLURM_ARRAY_JOB_ID} on $(hostname), "
       "$(date -u +%FT%TZ)\"\n"
    << "# --signal=B:USR1 reaches this shell only: it is passed on. SIGTERM (scancel, the\n"
    << "# time limit, a preemption) reaches every process of the job, the worker too:\n"
    << "# this shell only keeps waiting. Either way the worker checkpoints its trials,\n"
    << "# gives them back and exits " << kExitInterrupted << ". The traps are set before the worker\n"
    << "# starts (a signal in between would end this shell); a USR1 that comes before\n"
    << "# the worker's pid is known is passed on once it is.\n"
    << "worker= early=\n"
    << "trap 'if [ -n \"$worker\" ]; then kill -USR1 \"$worker\" 2>/dev/null; else early=1; fi' USR1\n"
    << "trap ':' TERM\n"
    << shell_quote(job.program);
  for (const auto& a : job.worker_args) s << " " << shell_quote(a);
  s << " &\n"
    << "worker=$!\n"
    << "[ -z \"$early\" ] || kill -USR1 \"$worker\" 2>/dev/null\n"
    << "echo \"bigbatch worker: pid $worker\"\n"
    << "wait \"$worker\"; status=$?\n"
    << "while kill -0 \"$worker\" 2>/dev/null; do wait \"$worker\"; status=$?; done\n"
    << "wait \"$worker\"; status=$?  # its own status, had a trap cut the last wait short\n";
  if (job.requeue) {
    s << "if [ \"$status\" -eq " << kExitInterrupted << " ]; then\n"
      << "  scontrol requeue \"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}\" && echo \"bigbatch worker: requeued\"\n"
      << "fi\n";
  }
  s << "exit \"$status\"\n";
  return s.str();
}

std::optional<std::string> find_on_path(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    return ::access(name.c_str(), X_OK) == 0 ? std::optional<std::string>(name) : std::nullopt;
  }
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return std::nullopt;
}

ProgramRun run_program(const std::vector<std::string>& argv) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error(argv.at(0) + ": cannot start: pipe failed");
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    throw std::runtime_error(argv.at(0) + ": cannot start: pipe failed");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  ::close(err[1]);
  ProgramRun run;
  if (spawned != 0) {
    ::close(out[0]);
    ::close(err[0]);
    throw std::runtime_error(argv[0] + ": cannot start: " + std::generic_category().message(spawned));
  }
  // Both pipes at once: a child that fills one while this reads the other
  // would otherwise wait forever.
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* sinks[2] = {&run.out, &run.err};
  int open_pipes = 2;
  while (open_pipes > 0) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_pipes;
      }
    }
  }
  for (auto& f : fds) {
    if (f.fd >= 0) ::close(f.fd);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return run;
}

}  // namespace bigbatch::experiments
