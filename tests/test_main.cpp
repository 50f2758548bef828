// main() of the GoogleTest binaries that bring none of their own (test_main.h).
#include "test_main.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return bigbatch::testing_support::run_all_tests();
}
