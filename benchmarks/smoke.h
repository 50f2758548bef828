// A benchmark's smoke run: ctest's Benchmarks.* set BIGBATCH_BENCH_SMOKE=1
// (benchmarks/CMakeLists.txt) to show that every benchmark runs, which is
// all they check: each case runs its fewest iterations on inputs cut down to
// the same structure (as many tensors, of the same ranks), and its numbers
// mean nothing. A run without the variable measures.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace bigbatch::bench {

/// Whether this is a smoke run (BIGBATCH_BENCH_SMOKE set, and not to 0).
inline bool smoke() {
  const char* v = std::getenv("BIGBATCH_BENCH_SMOKE");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

/// `n` fixed iterations (the ranks of a benchmark run as ranks stay in step
/// by them), or 2 in a smoke run: a first and a second step.
inline int iterations(int n) { return smoke() ? std::min(n, 2) : n; }

/// A tensor dimension, or in a smoke run the dimension cut down by 16 (at
/// least 1).
inline std::int64_t dimension(std::int64_t d) { return smoke() ? std::max<std::int64_t>(1, d / 16) : d; }

}  // namespace bigbatch::bench
