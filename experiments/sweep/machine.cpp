// The machine report and the math check (machine.h). The check's two rates:
// at::mm of two 512 x 512 fp32 matrices on one thread (2 n^3 FLOPs a
// product), and a loop of independent fp32 fused multiply-adds held in
// registers at the widest vector width the CPU has, which no BLAS can beat
// on one core (2 FLOPs a lane a multiply-add).
#include "machine.h"

#include "../runconfig/config.h"
#include "results.h"
#include "../cluster/slurm.h"
#include "../../distributed/process_group.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <mutex>
#include <sstream>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace bigbatch::experiments {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// ------------------------------------------------- the multiply-add peak --
// Each loop keeps K independent accumulators, acc = acc * a + b, enough to
// cover the multiply-add latency on every port (4 cycles x 2 ports needs 8);
// K leaves registers for a and b (32 vector registers with AVX-512, 16
// below it). The sum at the end keeps the compiler from dropping the loop.

#if defined(__x86_64__)
constexpr long kPeakIterations = 2'000'000;

__attribute__((target("avx512f"))) double fma_rate_avx512() {
  constexpr int K = 16;
  __m512 acc[K];
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-6f);
  for (int i = 0; i < K; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const auto start = Clock::now();
  for (long n = 0; n < kPeakIterations; ++n) {
#pragma GCC unroll 16
    for (int i = 0; i < K; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  const double s = seconds_since(start);
  __m512 sum = acc[0];
  for (int i = 1; i < K; ++i) sum = _mm512_add_ps(sum, acc[i]);
  volatile float sink = _mm512_reduce_add_ps(sum);
  (void)sink;
  return 2.0 * 16 * K * static_cast<double>(kPeakIterations) / s / 1e9;
}

__attribute__((target("avx2,fma"))) double fma_rate_avx2() {
  constexpr int K = 12;
  __m256 acc[K];
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-6f);
  for (int i = 0; i < K; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const auto start = Clock::now();
  for (long n = 0; n < kPeakIterations; ++n) {
#pragma GCC unroll 12
    for (int i = 0; i < K; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  const double s = seconds_since(start);
  __m256 sum = acc[0];
  for (int i = 1; i < K; ++i) sum = _mm256_add_ps(sum, acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  volatile float sink = lanes[0];
  (void)sink;
  return 2.0 * 8 * K * static_cast<double>(kPeakIterations) / s / 1e9;
}

// Without FMA: a multiply and an add, on separate ports.
double fma_rate_sse2() {
  constexpr int K = 12;
  __m128 acc[K];
  const __m128 a = _mm_set1_ps(0.999999f), b = _mm_set1_ps(1e-6f);
  for (int i = 0; i < K; ++i) acc[i] = _mm_set1_ps(static_cast<float>(i));
  const auto start = Clock::now();
  for (long n = 0; n < kPeakIterations; ++n) {
#pragma GCC unroll 12
    for (int i = 0; i < K; ++i) acc[i] = _mm_add_ps(_mm_mul_ps(acc[i], a), b);
  }
  const double s = seconds_since(start);
  __m128 sum = acc[0];
  for (int i = 1; i < K; ++i) sum = _mm_add_ps(sum, acc[i]);
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, sum);
  volatile float sink = lanes[0];
  (void)sink;
  return 2.0 * 4 * K * static_cast<double>(kPeakIterations) / s / 1e9;
}
#endif

// The widest vector multiply-add this CPU runs, and its rate (best of 3).
std::pair<std::string, double> fma_peak() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  std::string isa = "sse2";
  double (*rate)() = fma_rate_sse2;
  if (__builtin_cpu_supports("avx512f")) {
    isa = "avx512f";
    rate = fma_rate_avx512;
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    isa = "avx2+fma";
    rate = fma_rate_avx2;
  }
  double best = 0;
  for (int r = 0; r < 3; ++r) best = std::max(best, rate());
  return {isa, best};
#else
  return {"", 0.0};
#endif
}

// One thread's at::mm of two n x n fp32 matrices, best of 5 after a warm-up.
double sgemm_rate(std::int64_t n) {
  const at::Tensor a = at::randn({n, n}), b = at::randn({n, n});
  at::Tensor c = at::mm(a, b);
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < 5; ++r) {
    const auto start = Clock::now();
    c = at::mm(a, b);
    best = std::min(best, seconds_since(start));
  }
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / best / 1e9;
}

// ------------------------------------------------------------ the report --

// The value of the first "key : value" line of /proc/cpuinfo with this key.
std::string cpuinfo(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string k = line.substr(0, colon);
    while (!k.empty() && (k.back() == ' ' || k.back() == '\t')) k.pop_back();
    if (k != key) continue;
    std::string v = line.substr(colon + 1);
    v.erase(0, v.find_first_not_of(' '));
    return v;
  }
  return "";
}

// The vector extensions of note among the CPU's flags, narrowest first.
std::vector<std::string> vector_extensions() {
  static const char* const x86[] = {"sse4_2",      "avx",         "fma",         "avx2",     "avx512f",
                                    "avx512bw",    "avx512vl",    "avx512_vnni", "avx512_bf16", "avx512_fp16",
                                    "amx_tile",    "amx_bf16",    "amx_int8"};
  static const char* const arm[] = {"asimd", "asimdhp", "bf16", "i8mm", "sve", "sve2"};
  std::string flags = cpuinfo("flags");
  const bool is_x86 = !flags.empty();
  if (!is_x86) flags = cpuinfo("Features");
  std::istringstream words(flags);
  std::vector<std::string> have{std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
  std::vector<std::string> out;
  const auto pick = [&](const auto& list) {
    for (const char* f : list) {
      if (std::find(have.begin(), have.end(), f) != have.end()) out.emplace_back(f);
    }
  };
  if (is_x86) {
    pick(x86);
  } else {
    pick(arm);
  }
  return out;
}

// The line of LibTorch's build configuration that contains `what`, trimmed
// of its "  - " (empty when none does).
std::string config_line(const std::string& config, const std::string& what) {
  std::istringstream lines(config);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.find(what) == std::string::npos) continue;
    line.erase(0, line.find_first_not_of(" -"));
    return line;
  }
  return "";
}

// The value of KEY=value in the build settings line ("" when absent).
std::string build_setting(const std::string& config, const std::string& key) {
  const auto at = config.find(key + "=");
  if (at == std::string::npos) return "";
  const auto begin = at + key.size() + 1;
  return config.substr(begin, config.find_first_of(", \n", begin) - begin);
}

// OpenBLAS, when it is loaded into this process: its configuration line
// and the kernels it chose for this CPU.
std::string openblas() {
  using Text = const char* (*)();
  const auto config = reinterpret_cast<Text>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
  const auto core = reinterpret_cast<Text>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (config == nullptr) return "";
  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ... Haswell MAX_THREADS=64": its version, and the core.
  std::istringstream words(config());
  std::string name, version;
  words >> name >> version;
  return "OpenBLAS " + version + (core != nullptr ? " (" + std::string(core()) + " kernels)" : std::string());
}

// The BLAS LibTorch calls: MKL (built in), else the system BLAS, named by
// OpenBLAS itself where it is the one loaded.
std::string blas_in_use(const std::string& config) {
  const std::string info = build_setting(config, "BLAS_INFO");
  if (info == "mkl") {  // "Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build ..."
    const std::string line = config_line(config, "Math Kernel Library");
    const auto at = line.find("Version ");
    if (at == std::string::npos) return "MKL";
    const std::string version = line.substr(at + 8, line.find_first_of("- ", at + 8) - at - 8);
    return "MKL " + version + " (Intel oneAPI, built into LibTorch)";
  }
  const std::string open = openblas();
  if (!open.empty()) return open;
  return info.empty() ? "unknown" : "BLAS_INFO=" + info + " (the system's libblas.so.3)";
}

bool has(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

std::string number(double x, int precision) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(precision) << x;
  return s.str();
}

// What to do about slow math on this machine.
std::string remedy(const MachineInfo& m) {
  const std::string rebuild = "build bigbatch against current LibTorch (scripts/setup.sh), whose MKL and oneDNN "
                              "choose kernels for the CPU they find";
  if (m.blas.rfind("OpenBLAS", 0) == 0) {
    if (const char* forced = std::getenv("OPENBLAS_CORETYPE")) {
      return "OPENBLAS_CORETYPE=" + std::string(forced) + " is set: unset it, or " + rebuild;
    }
    const std::string core = has(m.isa, "avx512f") ? "SkylakeX" : has(m.isa, "avx2") ? "Haswell" : "";
    if (!core.empty()) return "set OPENBLAS_CORETYPE=" + core + " (OpenBLAS does not know this CPU), or " + rebuild;
  }
  if (const char* narrowed = std::getenv("MKL_ENABLE_INSTRUCTIONS"); narrowed && m.blas.rfind("MKL", 0) == 0) {
    return "MKL_ENABLE_INSTRUCTIONS=" + std::string(narrowed) + " is set: unset it";
  }
  return rebuild;
}

}  // namespace

double MathCheck::fraction() const {
  return peak_gflops > 0 ? sgemm_gflops / peak_gflops : std::numeric_limits<double>::quiet_NaN();
}

double slow_math_fraction() {
  const char* given = std::getenv("BIGBATCH_SLOW_MATH_BELOW");
  if (given == nullptr) return kSlowMathFraction;
  char* end = nullptr;
  const double value = std::strtod(given, &end);
  if (end == given || *end != '\0' || !(value >= 0) || !std::isfinite(value)) {
    throw ConfigError(std::string("BIGBATCH_SLOW_MATH_BELOW: expected a fraction >= 0, got \"") + given + "\"");
  }
  return value;
}

bool MathCheck::slow() const { return peak_gflops > 0 && fraction() < slow_math_fraction(); }

MathCheck measure_math() {
  const auto start = Clock::now();
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  MathCheck m;
  m.sgemm_n = 512;
  try {
    m.sgemm_gflops = sgemm_rate(m.sgemm_n);
    std::tie(m.peak_isa, m.peak_gflops) = fma_peak();
  } catch (...) {
    at::set_num_threads(threads);
    throw;
  }
  at::set_num_threads(threads);
  m.seconds = seconds_since(start);
  return m;
}

const MachineInfo& this_machine() {
  static MachineInfo machine;
  static std::once_flag once;
  std::call_once(once, [] {
    MachineInfo& m = machine;
    const std::string config = at::show_config();
    m.bigbatch_version = code_version();
    m.libtorch_version = libtorch_version();
    m.cpu = cpuinfo("model name");
    if (m.cpu.empty()) m.cpu = "unknown";
    m.logical_cores = static_cast<int>(std::thread::hardware_concurrency());
    m.isa = vector_extensions();
    m.blas = blas_in_use(config);
    const std::string dnn = config_line(config, "MKL-DNN");
    m.onednn = dnn.empty() ? "" : "oneDNN " + dnn.substr(dnn.find(" v") + 1, dnn.find(" (") - dnn.find(" v") - 1);
    const std::string capability = config_line(config, "CPU capability usage:");
    m.aten_capability = capability.empty() ? "" : capability.substr(capability.find(':') + 2);
    m.intra_op_threads = at::get_num_threads();
    m.inter_op_threads = at::get_num_interop_threads();
    const auto& hooks = at::detail::getCUDAHooks();
    m.cuda_devices = hooks.hasCUDA() ? hooks.getNumGPUs() : 0;
    m.cuda = m.cuda_devices > 0;
    if (hooks.hasCUDA()) {  // libtorch_cuda is loaded (a BIGBATCH_CUDA build)
      const std::string cudnn = build_setting(config, "CUDNN_VERSION");
      m.cuda_config = "CUDA " + build_setting(config, "CUDA_VERSION") + (cudnn.empty() ? "" : ", cuDNN " + cudnn);
    }
    if (m.cuda) {
      if (const auto smi = find_on_path("nvidia-smi")) {
        const ProgramRun r = run_program({*smi, "--query-gpu=name,driver_version", "--format=csv,noheader"});
        std::istringstream lines(r.out);
        std::string line;
        while (r.status == 0 && std::getline(lines, line)) {
          if (!line.empty()) m.gpus.push_back(line);
        }
      }
    }
    m.nccl = distributed::nccl_available();
    m.math = measure_math();
  });
  return machine;
}

std::string slow_math_warning(const MachineInfo& m) {
  if (!m.math.slow()) return "";
  return "warning: matrix products run at " + number(m.math.sgemm_gflops, 1) + " GFLOP/s on one thread, " +
         number(100 * m.math.fraction(), 0) + "% of the " + number(m.math.peak_gflops, 0) + " GFLOP/s this CPU's " +
         m.math.peak_isa + " multiply-adds reach (BLAS: " + m.blas + "): " + remedy(m) +
         "; every trial runs slower for it (bigbatch env says more)";
}

void warn_if_slow_math() {
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string warning = slow_math_warning(this_machine());
    if (!warning.empty()) std::cerr << "bigbatch: " << warning << "\n";
  });
}

nlohmann::json with_machine(nlohmann::json resolved, bool warn) {
  resolved["machine"] = machine_record(this_machine());
  if (warn) warn_if_slow_math();
  return resolved;
}

nlohmann::json to_json(const MathCheck& m) {
  const double f = m.fraction();
  return {{"sgemm_gflops_1_thread", m.sgemm_gflops},
          {"sgemm_n", m.sgemm_n},
          {"fma_peak_gflops_1_thread", m.peak_gflops > 0 ? nlohmann::json(m.peak_gflops) : nlohmann::json(nullptr)},
          {"fma_peak_isa", m.peak_isa},
          {"fraction_of_peak", std::isfinite(f) ? nlohmann::json(f) : nlohmann::json(nullptr)},
          {"slow_below", slow_math_fraction()},
          {"slow", m.slow()},
          {"seconds", m.seconds}};
}

nlohmann::json machine_record(const MachineInfo& m) {
  return {{"bigbatch", m.bigbatch_version},  {"libtorch", m.libtorch_version}, {"cpu", m.cpu},
          {"logical_cores", m.logical_cores}, {"blas", m.blas},                 {"intra_op_threads", m.intra_op_threads},
          {"cuda_devices", m.cuda_devices},   {"math", to_json(m.math)}};
}

nlohmann::json to_json(const MachineInfo& m) {
  nlohmann::json j = machine_record(m);
  j["isa"] = m.isa;
  j["onednn"] = m.onednn;
  j["aten_capability"] = m.aten_capability;
  j["inter_op_threads"] = m.inter_op_threads;
  j["cuda"] = m.cuda;
  j["cuda_config"] = m.cuda_config;
  j["gpus"] = m.gpus;
  j["nccl"] = m.nccl;
  return j;
}

std::string env_report(const MachineInfo& m) {
  std::ostringstream s;
  const auto join = [](const std::vector<std::string>& items, const char* none) {
    std::string out;
    for (const auto& i : items) out += (out.empty() ? "" : " ") + i;
    return out.empty() ? std::string(none) : out;
  };
  s << "bigbatch: " << m.bigbatch_version << "\n"
    << "LibTorch: " << m.libtorch_version << "\n"
    << "CPU: " << m.cpu << ", " << m.logical_cores << " logical cores\n"
    << "vector instructions: " << join(m.isa, "none of note") << "\n"
    << "BLAS: " << m.blas << "\n"
    << "oneDNN: " << (m.onednn.empty() ? "not built in" : m.onednn) << "\n"
    << "ATen's kernels: " << (m.aten_capability.empty() ? "(not said)" : m.aten_capability) << "\n"
    << "threads: " << m.intra_op_threads << " intra-op, " << m.inter_op_threads << " inter-op\n"
    << "CUDA: "
    << (m.cuda ? std::to_string(m.cuda_devices) + " device(s)" : std::string("no device"))
    << (m.cuda_config.empty() ? ", this build has no CUDA" : ", LibTorch's " + m.cuda_config) << "\n";
  for (std::size_t i = 0; i < m.gpus.size(); ++i) s << "GPU " << i << ": " << m.gpus[i] << "\n";
  s << "NCCL: " << (m.nccl ? "built in" : "not built in (a BIGBATCH_CUDA build has it)") << "\n";
  const MathCheck& c = m.math;
  s << "matrix product, 1 thread: " << number(c.sgemm_gflops, 1) << " GFLOP/s (fp32, " << c.sgemm_n << "^3)\n";
  if (c.peak_gflops > 0) {
    s << "multiply-add peak, 1 thread: " << number(c.peak_gflops, 1) << " GFLOP/s (fp32, " << c.peak_isa << ")\n"
      << "math check: " << number(100 * c.fraction(), 0) << "% of the peak: "
      << (c.slow() ? "SLOW (below " + number(100 * slow_math_fraction(), 0) + "%)" : "ok") << "\n";
  } else {
    s << "math check: no multiply-add peak measured on this CPU architecture\n";
  }
  if (c.slow()) s << slow_math_warning(m) << "\n";
  return s.str();
}

}  // namespace bigbatch::experiments
