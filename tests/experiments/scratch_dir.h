// Test support: a test's own empty folder under the system's temporary one,
// named after the binary's process and the test, removed after the test, and
// files written into it; and the message of what a call throws.
#pragma once

#include "../../experiments/io/files.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

namespace bigbatch::testing_support {

class ScratchDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("bigbatch_test." + std::to_string(::getpid()) + "." +
            ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name() + "." +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    bigbatch::experiments::remove_tree(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { bigbatch::experiments::remove_tree(dir_); }
  /// Writes `bytes` to the file `name` in the folder; returns its path.
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  std::filesystem::path dir_;
};

/// The message of the exception `f` throws, or "(no error)".
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace bigbatch::testing_support
