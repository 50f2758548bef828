// The error of a bad config or argument, torch-free: whatever reads a config,
// a command line or a workload's keys throws it, and only the CLI's main maps
// it to exit code 2 and one line (cli/cli.h).
#pragma once

#include <stdexcept>

namespace bigbatch::experiments {

/// A bad config or argument: the CLI prints it as one line and exits 2.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace bigbatch::experiments
