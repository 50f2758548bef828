// The local launcher (launch.h): fork + execve of /proc/self/exe per rank.
#include "launch.h"

#include "../io/config_error.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

extern char** environ;

namespace bigbatch::experiments {

bool launched_by_bigbatch() { return std::getenv("BIGBATCH_LAUNCHED") != nullptr; }

void check_launch(const LaunchOptions& o) {
  if (o.nproc < 1) throw ConfigError("--nproc: must be >= 1, got " + std::to_string(o.nproc));
  if (o.nnodes < 1) throw ConfigError("--nnodes: must be >= 1, got " + std::to_string(o.nnodes));
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) {
    throw ConfigError("--node-rank: must be in [0, " + std::to_string(o.nnodes) + "), got " +
                      std::to_string(o.node_rank));
  }
  if (o.master_port <= 0 || o.master_port > 65535) {
    throw ConfigError("--master-port: not a port number: " + std::to_string(o.master_port));
  }
}

namespace {

// Starts local rank `local` of the world: this program again, with the
// torchrun variables in its environment.
pid_t start_rank(const LaunchOptions& o, int local, int world, int argc, char** argv) {
  std::vector<std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) vars.emplace_back(*e);
  const int rank = o.node_rank * o.nproc + local;
  vars.push_back("RANK=" + std::to_string(rank));
  vars.push_back("WORLD_SIZE=" + std::to_string(world));
  vars.push_back("LOCAL_RANK=" + std::to_string(local));
  vars.push_back("LOCAL_WORLD_SIZE=" + std::to_string(o.nproc));
  vars.push_back("MASTER_ADDR=" + o.master_addr);
  vars.push_back("MASTER_PORT=" + std::to_string(o.master_port));
  vars.push_back("BIGBATCH_LAUNCHED=1");
  std::vector<char*> envp;
  for (auto& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  std::vector<char*> args(argv, argv + argc);
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("launcher: cannot start rank " + std::to_string(local) + ": " +
                                        std::generic_category().message(errno));
  if (pid == 0) {
    execve("/proc/self/exe", args.data(), envp.data());
    // Between fork and exec only async-signal-safe calls (no allocation):
    // the message and errno's number, written into a fixed buffer.
    char why[96] = "bigbatch: /proc/self/exe: cannot run a rank (errno ";
    std::size_t n = std::strlen(why);
    char digits[12];
    int k = 0;
    for (int e = errno; k == 0 || e > 0; e /= 10) digits[k++] = static_cast<char>('0' + e % 10);
    while (k > 0) why[n++] = digits[--k];
    why[n++] = ')';
    why[n++] = '\n';
    [[maybe_unused]] const ssize_t written = ::write(2, why, n);
    std::_Exit(127);
  }
  return pid;
}

// Waits for the ranks; the first to fail stops the others (SIGTERM, then
// SIGKILL after 10 s). The first failure's status, else 0.
int wait_ranks(const LaunchOptions& o, const std::vector<pid_t>& pids) {
  int result = 0;
  std::size_t left = pids.size();
  std::vector<bool> done(pids.size(), false);
  std::chrono::steady_clock::time_point stopping{};
  while (left > 0) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      int status = 0;
      if (done[i] || waitpid(pids[i], &status, WNOHANG) != pids[i]) continue;
      done[i] = true;
      --left;
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (code != 0 && result == 0) {
        result = code;
        std::cerr << "bigbatch: rank " << o.node_rank * o.nproc + static_cast<int>(i) << " exited with status "
                  << code << "; stopping the other ranks\n";
        for (std::size_t j = 0; j < pids.size(); ++j) {
          if (!done[j]) kill(pids[j], SIGTERM);
        }
        stopping = std::chrono::steady_clock::now();
      }
    }
    if (result != 0 && std::chrono::steady_clock::now() - stopping > std::chrono::seconds(10)) {
      for (std::size_t j = 0; j < pids.size(); ++j) {
        if (!done[j]) kill(pids[j], SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return result;
}

}  // namespace

int launch_local(const LaunchOptions& o, int argc, char** argv) {
  check_launch(o);
  const int world = o.nproc * o.nnodes;
  std::vector<pid_t> pids;
  for (int local = 0; local < o.nproc; ++local) pids.push_back(start_rank(o, local, world, argc, argv));
  return wait_ranks(o, pids);
}

}  // namespace bigbatch::experiments
