// What this process computes with, for a bug report and beside every
// result: bigbatch's and LibTorch's versions, the math libraries (BLAS, MKL,
// oneDNN), the CPU and its vector instructions, threads, CUDA, NCCL and the
// GPUs (`bigbatch env`); and a measured check that matrix products run near
// what the CPU allows (sweep.json's and summary.json's "machine", and one
// warning when they do not). docs/experiments.md "Is the math fast on this
// machine?" says what the numbers mean.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace bigbatch::experiments {

/// Below this fraction of the measured multiply-add peak, one thread's fp32
/// matrix product counts as slow. A BLAS with kernels for the CPU gets
/// 0.35-0.9 of it on a 512^3 product (MKL's AVX2 path on an AVX-512 AMD
/// EPYC: 0.38; OpenBLAS's Haswell kernels there: 0.39, its SkylakeX ones
/// 0.70); one running generic SSE3 kernels on an AVX-512 core gets 0.1-0.17
/// (OpenBLAS's Prescott kernels: 0.16 on the AMD EPYC, 0.09 on an AVX-512
/// Xeon: 15.9 of about 170 GFLOP/s). docs/experiments.md has the runs.
inline constexpr double kSlowMathFraction = 0.25;

/// The fraction below which the math counts as slow: kSlowMathFraction, or
/// the environment's BIGBATCH_SLOW_MATH_BELOW (0 never warns; above 1 always
/// does, no product reaching the multiply-add peak). Throws ConfigError
/// naming the variable and its value when that is not a number >= 0.
double slow_math_fraction();

/// One thread's fp32 matrix-product rate against the fp32 multiply-add rate
/// one core reaches with the widest vector instructions it has, both
/// measured in this process.
struct MathCheck {
  double sgemm_gflops = 0;    ///< at::mm of two n x n fp32 matrices, one intra-op thread, best of 5
  std::int64_t sgemm_n = 0;
  double peak_gflops = 0;     ///< independent fp32 FMAs in registers, best of 3; 0 where not measured
  std::string peak_isa;       ///< "avx512f", "avx2+fma", "sse2"; "" where not measured (not x86-64)
  double seconds = 0;         ///< what measuring both took
  /// sgemm_gflops / peak_gflops; NaN where the peak was not measured.
  double fraction() const;
  /// fraction() < slow_math_fraction() (false where not measured).
  bool slow() const;
};

/// The machine as this process sees it.
struct MachineInfo {
  std::string bigbatch_version;
  std::string libtorch_version;
  std::string cpu;                ///< the model name, as /proc/cpuinfo gives it
  int logical_cores = 0;
  std::vector<std::string> isa;   ///< the vector extensions of note the CPU reports, widest last
  std::string blas;               ///< the BLAS LibTorch calls, with its version and kernels where known
  std::string onednn;             ///< oneDNN (MKL-DNN) and its version, "" where not built in
  std::string aten_capability;    ///< the vector level of ATen's own kernels ("AVX512"), "" where not said
  /// The process's LibTorch threads when first asked (its default, or
  /// OMP_NUM_THREADS): what a user's own loop would get. A sweep's trials run
  /// with runner.threads_per_trial each, which its resolved config records.
  int intra_op_threads = 0;
  int inter_op_threads = 0;
  bool cuda = false;              ///< LibTorch has CUDA and sees a device
  int cuda_devices = 0;
  std::string cuda_config;        ///< LibTorch's CUDA build: runtime, cuDNN ("" without CUDA)
  std::vector<std::string> gpus;  ///< "name, driver version", one per GPU, from nvidia-smi where present
  bool nccl = false;              ///< this bigbatch build has c10d's NCCL backend
  MathCheck math;
};

/// Measures the check now: about 0.1 s on a fast BLAS, under a second on
/// a generic one. Runs on the calling thread with one intra-op thread
/// (restored after).
MathCheck measure_math();

/// This process's machine, its math measured on the first call and kept
/// (every later call is free). The runner calls it before its trials start,
/// so that the measurement has the cores to itself.
const MachineInfo& this_machine();

/// The one line that says the math is slow and what to do about it
/// ("" when it is not slow): the rate, the fraction, the BLAS and its
/// kernels, the remedy that fits (OPENBLAS_CORETYPE for OpenBLAS running
/// generic kernels, MKL_ENABLE_INSTRUCTIONS when it narrows MKL, else the
/// current LibTorch build).
std::string slow_math_warning(const MachineInfo& machine);

/// Prints slow_math_warning(this_machine()) to stderr, once per process,
/// when there is one (the runner's commands call it at their start).
void warn_if_slow_math();

/// A resolved config (sweep.json, cbs.json) with "machine":
/// machine_record(this_machine()), measured now if not yet (the runner asks
/// before its first trial, so that the measurement has the cores to itself);
/// with `warn`, warn_if_slow_math() too.
nlohmann::json with_machine(nlohmann::json resolved, bool warn);

/// The whole report (bigbatch env --json), and the part every result
/// records (sweep.json's and summary.json's "machine": versions, CPU, BLAS,
/// threads and the check).
nlohmann::json to_json(const MathCheck& math);
nlohmann::json to_json(const MachineInfo& machine);
nlohmann::json machine_record(const MachineInfo& machine);

/// `bigbatch env`'s text: one "key: value" line per item.
std::string env_report(const MachineInfo& machine);

}  // namespace bigbatch::experiments
