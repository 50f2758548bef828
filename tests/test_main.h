// The test binaries' main: RUN_ALL_TESTS, with one exit code more. When every
// test that ran was skipped (the _CUDA tests on a machine without a GPU), it
// exits with kAllSkipped, which ctest's SKIP_RETURN_CODE reports as skipped;
// a failure still exits 1 and a run where any test passed exits 0.
#pragma once

#include <gtest/gtest.h>

namespace bigbatch::testing_support {

constexpr int kAllSkipped = 77;

inline int run_all_tests() {
  const int rc = RUN_ALL_TESTS();
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  if (rc == 0 && unit.skipped_test_count() > 0 && unit.successful_test_count() == 0) return kAllSkipped;
  return rc;
}

}  // namespace bigbatch::testing_support
