// main() of the GoogleTest binaries that bring none of their own (test_main.h).
#include "test_main.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace {

// Each test process its own core ledger (experiments/cluster/cores.h): ctest runs
// two tests at once, and their sweeps must not divide this machine's cores
// between them. Removed at exit (its lock file, then the folder).
std::string ledger;

void remove_ledger() {
  ::unlink((ledger + "/.lock").c_str());
  ::rmdir(ledger.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (std::getenv("BIGBATCH_CORE_LEDGER") == nullptr) {
    const char* tmp = std::getenv("TMPDIR");
    ledger = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/bigbatch_cores." + std::to_string(::getpid());
    ::setenv("BIGBATCH_CORE_LEDGER", ledger.c_str(), 1);
    std::atexit(remove_ledger);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return bigbatch::testing_support::run_all_tests();
}
