// Helpers of the tests that run ranks as processes: the test binary
// re-executes itself as each rank (BIGBATCH_DIST_WORKER=scenario, torchrun's
// variables), and the parent waits for them.
#pragma once

#include "../free_port.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace bigbatch::test {

/// The rank side of compression_test.cpp's scenarios (BIGBATCH_DIST_WORKER=compress:NAME).
int compression_worker(const std::string& name);
/// The rank side of sharded_test.cpp's scenarios (BIGBATCH_DIST_WORKER=shard:OPTIMIZER:DTYPE).
int sharded_worker(const std::string& scenario);
/// The rank side of local_sgd_test.cpp's scenarios (BIGBATCH_DIST_WORKER=local_sgd:...).
int local_sgd_worker(const std::string& scenario);

inline void write_tensor(const std::string& path, const at::Tensor& t) {
  std::ofstream out(path, std::ios::binary);
  const at::Tensor c = t.contiguous();
  out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.numel() * sizeof(float)));
}

inline at::Tensor read_tensor(const std::string& path, std::int64_t n) {
  std::ifstream in(path, std::ios::binary);
  at::Tensor t = at::empty({n});
  in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(n * sizeof(float)));
  EXPECT_TRUE(in.good()) << path;
  return t;
}

struct Ranks {
  std::vector<int> status;  // exit codes, -1 when killed for time
  std::vector<std::string> logs;
  std::vector<double> exited;  // when each rank ended, in seconds from the launch
  double seconds;
};

// Starts `world` copies of this binary as ranks of `scenario` and waits for them.
inline Ranks launch(const std::string& scenario, const std::string& out, int world = 2, double limit = 60) {
  const int port = bigbatch::testing_support::free_port();
  Ranks r;
  std::vector<pid_t> pids;
  const auto start = std::chrono::steady_clock::now();
  for (int rank = 0; rank < world; ++rank) {
    std::vector<std::string> vars;
    for (char** e = environ; *e; ++e) vars.emplace_back(*e);
    vars.push_back("BIGBATCH_DIST_WORKER=" + scenario);
    vars.push_back("BIGBATCH_DIST_OUT=" + out);
    vars.push_back("RANK=" + std::to_string(rank));
    vars.push_back("LOCAL_RANK=" + std::to_string(rank));
    vars.push_back("WORLD_SIZE=" + std::to_string(world));
    vars.push_back("MASTER_ADDR=127.0.0.1");
    vars.push_back("MASTER_PORT=" + std::to_string(port));
    vars.push_back("OMP_NUM_THREADS=1");
    const std::string log = out + ".log." + std::to_string(rank);
    r.logs.push_back(log);
    std::vector<char*> envp;
    for (auto& v : vars) envp.push_back(v.data());
    envp.push_back(nullptr);
    char* argv[] = {const_cast<char*>("/proc/self/exe"), nullptr};
    const pid_t pid = fork();
    if (pid == 0) {
      if (!std::freopen(log.c_str(), "w", stderr)) std::_Exit(126);
      execve("/proc/self/exe", argv, envp.data());
      std::_Exit(127);
    }
    pids.push_back(pid);
  }
  r.status.assign(world, -2);
  r.exited.assign(world, limit);
  int left = world;
  while (left > 0) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (int i = 0; i < world; ++i) {
      int st = 0;
      if (r.status[i] != -2 || waitpid(pids[i], &st, WNOHANG) != pids[i]) continue;
      r.status[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      r.exited[i] = elapsed;
      --left;
    }
    if (elapsed > limit) {
      for (int i = 0; i < world; ++i) {
        if (r.status[i] == -2) {
          kill(pids[i], SIGKILL);
          waitpid(pids[i], nullptr, 0);
          r.status[i] = -1;
        }
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The files tmp() names (the ranks' outputs and logs), removed when the test
/// program that named them ends: by that process only, not by a rank.
struct TmpFiles {
  std::string dir, prefix;
  pid_t owner;
  TmpFiles()
      : dir(testing::TempDir().empty() ? std::string("/tmp/") : testing::TempDir()),
        prefix("bigbatch_dist_" + std::to_string(getpid()) + "_"),
        owner(getpid()) {}
  ~TmpFiles() {
    if (getpid() != owner) return;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      if (e.path().filename().string().rfind(prefix, 0) == 0) std::filesystem::remove(e.path(), ec);
    }
  }
};

inline std::string tmp(const std::string& name) {
  static const TmpFiles files;
  return files.dir + files.prefix + name;
}

}  // namespace bigbatch::test
