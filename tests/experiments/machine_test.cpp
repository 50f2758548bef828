// The machine report and the math check (experiments/sweep/machine.h): the two
// measured rates against each other and the CPU's own flags, the verdict and
// the remedy it names on machines described by hand, and the threshold's
// environment variable.
#include "../../experiments/runconfig/config.h"
#include "../../experiments/sweep/machine.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>

namespace {

using namespace bigbatch::experiments;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// No matrix product on one core beats the multiply-adds it is made of: the
// measured sgemm rate stays under the measured peak (10% for the timers'
// noise). A peak measured too low (a narrower instruction set than the CPU
// has, a loop the compiler shortened) breaks it in every measurement; so does
// a peak measured at the wrong width, which the CPU's own flags give away.
// Another process's load can slow a peak loop and not the products that
// follow it: a measured peak is at most the true one, so the products are
// held to the best peak of up to five measurements (a run in CI met a loaded
// core in three in a row). No check here depends on how fast this CPU is.
TEST(MathCheck, TheMatrixProductStaysUnderTheMeasuredMultiplyAddPeak) {
  const int threads = at::get_num_threads();
  MathCheck m;
  double best_peak = 0;
  for (int attempt = 0; attempt < 5; ++attempt) {
    const auto start = std::chrono::steady_clock::now();
    m = measure_math();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(at::get_num_threads(), threads) << "the check must give the intra-op threads back";
    EXPECT_EQ(m.sgemm_n, 512);
    EXPECT_GT(m.sgemm_gflops, 0);
    EXPECT_GT(m.seconds, 0);
    EXPECT_LE(m.seconds, wall) << "the check's own time is part of the call's";
    best_peak = std::max(best_peak, m.peak_gflops);
    if (!(m.peak_gflops > 0) || m.sgemm_gflops <= 1.1 * best_peak) break;
  }
#if defined(__x86_64__)
  __builtin_cpu_init();
  const std::string widest = __builtin_cpu_supports("avx512f")                                   ? "avx512f"
                             : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "avx2+fma"
                                                                                                : "sse2";
  EXPECT_EQ(m.peak_isa, widest);
  ASSERT_GT(m.peak_gflops, 0);
  EXPECT_LE(m.sgemm_gflops, 1.1 * best_peak) << "sgemm " << m.sgemm_gflops << " GFLOP/s, best peak " << best_peak
                                             << " of five measurements";
  EXPECT_NEAR(m.fraction(), m.sgemm_gflops / m.peak_gflops, 1e-12);
#else
  EXPECT_EQ(m.peak_gflops, 0);
  EXPECT_TRUE(std::isnan(m.fraction()));
  EXPECT_FALSE(m.slow());
#endif
}

MachineInfo described(const std::string& blas, double sgemm, double peak) {
  MachineInfo m;
  m.bigbatch_version = "test";
  m.libtorch_version = "x";
  m.cpu = "a CPU";
  m.isa = {"sse4_2", "avx", "fma", "avx2", "avx512f"};
  m.blas = blas;
  m.math.sgemm_gflops = sgemm;
  m.math.sgemm_n = 512;
  m.math.peak_gflops = peak;
  m.math.peak_isa = "avx512f";
  return m;
}

// The verdict and the remedy, on machines described by hand: the numbers of
// an AVX-512 Xeon whose OpenBLAS runs its generic Prescott kernels (15.9 of
// about 170 GFLOP/s), of MKL's own kernels there, and of MKL narrowed by its
// environment variable.
TEST(MathCheck, SaysWhenTheMathIsSlowAndWhatToDo) {
  const ScopedEnv no_threshold("BIGBATCH_SLOW_MATH_BELOW", nullptr);
  const ScopedEnv no_core("OPENBLAS_CORETYPE", nullptr);
  const ScopedEnv no_mkl("MKL_ENABLE_INSTRUCTIONS", nullptr);
  const MachineInfo generic = described("OpenBLAS 0.3.21 (Prescott kernels)", 15.9, 170);
  EXPECT_TRUE(generic.math.slow());
  const std::string w = slow_math_warning(generic);
  EXPECT_TRUE(contains(w, "15.9 GFLOP/s on one thread, 9% of the 170 GFLOP/s")) << w;
  EXPECT_TRUE(contains(w, "set OPENBLAS_CORETYPE=SkylakeX")) << w;
  EXPECT_TRUE(contains(w, "scripts/setup.sh")) << w;
  EXPECT_EQ(w.find('\n'), std::string::npos) << "one line";
  EXPECT_TRUE(contains(env_report(generic), "SLOW (below 25%)"));

  MachineInfo avx2 = generic;  // an AVX2 machine's OpenBLAS gets the Haswell kernels
  avx2.isa = {"sse4_2", "avx", "fma", "avx2"};
  EXPECT_TRUE(contains(slow_math_warning(avx2), "set OPENBLAS_CORETYPE=Haswell"));
  {
    const ScopedEnv forced("OPENBLAS_CORETYPE", "Prescott");
    EXPECT_TRUE(contains(slow_math_warning(generic), "OPENBLAS_CORETYPE=Prescott is set: unset it"));
  }

  const MachineInfo mkl = described("MKL 2024.2 (Intel oneAPI, built into LibTorch)", 97.6, 170);
  EXPECT_FALSE(mkl.math.slow());
  EXPECT_EQ(slow_math_warning(mkl), "");
  EXPECT_TRUE(contains(env_report(mkl), "math check: 57% of the peak: ok"));
  {
    const ScopedEnv narrowed("MKL_ENABLE_INSTRUCTIONS", "SSE4_2");
    const MachineInfo slow_mkl = described("MKL 2024.2 (Intel oneAPI, built into LibTorch)", 20, 170);
    EXPECT_TRUE(contains(slow_math_warning(slow_mkl), "MKL_ENABLE_INSTRUCTIONS=SSE4_2 is set: unset it"));
  }
  // Where no peak was measured (not x86-64) there is no verdict.
  MachineInfo arm = mkl;
  arm.math.peak_gflops = 0;
  EXPECT_FALSE(arm.math.slow());
  EXPECT_TRUE(contains(env_report(arm), "no multiply-add peak measured"));
}

TEST(MathCheck, TheThresholdComesFromTheEnvironment) {
  const MachineInfo mkl = described("MKL", 97.6, 170);
  {
    const ScopedEnv always("BIGBATCH_SLOW_MATH_BELOW", "2");  // no product reaches twice the peak
    EXPECT_TRUE(mkl.math.slow());
    EXPECT_TRUE(contains(slow_math_warning(mkl), "57% of the 170 GFLOP/s"));
  }
  {
    const ScopedEnv never("BIGBATCH_SLOW_MATH_BELOW", "0");
    EXPECT_FALSE(described("OpenBLAS 0.3.21 (Prescott kernels)", 15.9, 170).math.slow());
  }
  for (const char* bad : {"fast", "-1", "0.5x", ""}) {
    const ScopedEnv wrong("BIGBATCH_SLOW_MATH_BELOW", bad);
    try {
      (void)mkl.math.slow();
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()), std::string("BIGBATCH_SLOW_MATH_BELOW: expected a fraction >= 0, got \"") + bad + "\"");
    }
  }
}

// The report names what it found: versions, the BLAS, the threads; and the
// record every result carries has the check's numbers.
TEST(MachineInfo, ThisMachineIsMeasuredOnceAndReported) {
  const MachineInfo& m = this_machine();
  const double rate = m.math.sgemm_gflops, seconds = m.math.seconds;
  // A second measurement would time differently (to the nanosecond): the same
  // numbers mean the first one's record.
  const MachineInfo& again = this_machine();
  EXPECT_EQ(again.math.sgemm_gflops, rate);
  EXPECT_EQ(again.math.seconds, seconds);
  EXPECT_FALSE(m.blas.empty());
  EXPECT_FALSE(m.libtorch_version.empty());
  EXPECT_GT(m.logical_cores, 0);
  EXPECT_GT(m.intra_op_threads, 0);
  EXPECT_GT(m.math.sgemm_gflops, 0);
  const std::string report = env_report(m);
  for (const char* line : {"bigbatch: ", "LibTorch: ", "CPU: ", "BLAS: ", "oneDNN: ", "threads: ", "CUDA: ", "NCCL: ",
                           "matrix product, 1 thread: "}) {
    EXPECT_TRUE(contains(report, std::string("\n") + line) || report.rfind(line, 0) == 0) << line << "\n" << report;
  }
  const nlohmann::json r = machine_record(m);
  EXPECT_EQ(r["math"]["sgemm_gflops_1_thread"].get<double>(), m.math.sgemm_gflops);
  EXPECT_EQ(r["blas"].get<std::string>(), m.blas);
  // The verdict and the threshold it was judged against, so that a reader
  // (and a test) can check the one against the other.
  EXPECT_EQ(r["math"]["slow_below"].get<double>(), slow_math_fraction());
  EXPECT_EQ(r["math"]["slow"].get<bool>(), m.math.slow());
  EXPECT_EQ(to_json(m)["nccl"].get<bool>(), m.nccl);
}

}  // namespace
