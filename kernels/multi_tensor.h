// The multi-tensor CUDA step of LARS, LARC, LAMB and NovoGrad (kernels/cuda):
// one launcher for every tensor of an optimizer, state and decisions on the
// device, no host synchronization in a step. Plain C++: no CUDA or LibTorch headers.
#pragma once

#include <bigbatch/kernels/common.h>

#include <cstdint>
#include <memory>
#include <vector>

typedef struct CUstream_st* cudaStream_t;  // as cuda_runtime_api.h declares it

namespace bigbatch::kernels::cuda {

enum class Algorithm : std::uint8_t { kLars, kLarc, kLamb, kNovoGrad };

/// Bits of GroupOptions::flags.
enum GroupFlag : std::uint32_t {
  kAdapt = 1u << 0,          ///< trust ratio on (all four; NovoGrad ignores it)
  kNesterov = 1u << 1,       ///< LARS, LARC
  kClip = 1u << 2,           ///< LARC: min(local / lr, 1)
  kBiasCorrection = 1u << 3, ///< LAMB
  kGradAveraging = 1u << 4,  ///< LAMB, NovoGrad
  kAdamW = 1u << 5,          ///< LAMB: decoupled decay
  kAlwaysAdapt = 1u << 6,    ///< LAMB: NVLAMB
  kTrustClip = 1u << 7,      ///< LAMB: ratio <= 1
  kSkipNonfinite = 1u << 8,  ///< a non-finite gradient in this group skips the step
};

/// One parameter group's options, as FORMULAS.md names them. Doubles, so that
/// the device rounds the per-tensor coefficients exactly as the CPU path does.
struct GroupOptions {
  double lr = 0;
  double momentum = 0;           ///< LARS, LARC
  double beta1 = 0;              ///< LAMB, NovoGrad
  double beta2 = 0;              ///< LAMB, NovoGrad
  double eps = 0;
  double weight_decay = 0;
  double trust_coefficient = 0;  ///< LARS, LARC
  double max_grad_norm = 0;      ///< LAMB; 0: no clipping
  double min_trust = 0;          ///< LAMB
  double max_trust = 0;          ///< LAMB
  std::uint32_t flags = 0;       ///< GroupFlag bits

  friend bool operator==(const GroupOptions& a, const GroupOptions& b);
};

/// One tensor of a step: device pointers to its storage and fp32 state.
struct TensorSlot {
  void* param = nullptr;        ///< numel elements of dtype
  const void* grad = nullptr;   ///< numel elements of dtype
  float* master = nullptr;      ///< fp32 copy of a 16-bit parameter, or null
  float* m = nullptr;           ///< LARS/LARC momentum buffer; LAMB/NovoGrad first moment
  float* v = nullptr;           ///< LAMB second moment (numel floats); NovoGrad one float; else null
  std::int64_t numel = 0;
  std::int64_t step = 0;        ///< LAMB/NovoGrad: steps taken before this one (read on a rebuild)
  std::int32_t group = 0;       ///< index into the GroupOptions
  DType dtype = DType::kFloat32;
};

/// Whether this process sees a CUDA device.
bool device_available();

/// Elements per chunk: the unit of work of one block, and of the norm sums.
constexpr std::int64_t kChunkElements = 1 << 14;

/// Bytes of tensor data one step moves per element of a tensor (docs/cuda.md):
/// the passes of `algorithm` with the options that add one (LAMB's first pass
/// runs with skip_nonfinite or clipping), for its storage dtype, with or
/// without an fp32 master copy.
std::int64_t step_bytes_per_element(Algorithm algorithm, bool skip_nonfinite, bool clip, DType dtype,
                                    bool master);

/// The multi-tensor step of one optimizer. bind() describes the tensors and
/// options; run() enqueues the step on a stream. What lives on the device:
/// the table of tensors (built once, rebuilt only when the tensors change),
/// each tensor's step count, the options, the skip flag and skipped-step
/// counter, and the per-chunk and per-tensor norms. A step launches a fixed
/// number of kernels whatever the number of tensors (launches_per_step()),
/// allocates nothing, never waits for the device, and can be captured in a
/// CUDA graph once bound.
class MultiTensorStep {
 public:
  explicit MultiTensorStep(Algorithm algorithm);
  ~MultiTensorStep();
  MultiTensorStep(const MultiTensorStep&) = delete;
  MultiTensorStep& operator=(const MultiTensorStep&) = delete;

  /// Whether bind(slots, ...) would keep the current table: the same tensors
  /// (parameters, masters, states, sizes, groups, dtypes) in the same order.
  /// Gradient pointers may differ: they are re-sent without a rebuild.
  bool same_tensors(const std::vector<TensorSlot>& slots) const;

  /// Binds the tensors and options of the next steps, on `stream`'s device
  /// (the current device). A rebuild (first call, other tensors, or another
  /// device) allocates the table on the current device and takes each
  /// tensor's step count from its slot; otherwise only
  /// moved gradient pointers and changed options are sent, by small kernels
  /// that carry the bytes as arguments (no pinned memory, no host wait).
  /// Throws std::runtime_error on a CUDA error, or on a rebuild while `stream`
  /// is being captured.
  void bind(const std::vector<TensorSlot>& slots, const std::vector<GroupOptions>& groups,
            cudaStream_t stream);

  /// Enqueues one step of the bound tensors on `stream`.
  void run(cudaStream_t stream);

  /// Each bound tensor's step count, read back: waits for the last bind() or
  /// run(), on whichever stream it was enqueued.
  std::vector<std::int64_t> steps() const;

  /// Steps skipped for non-finite gradients so far, read back (waits as steps()).
  std::int64_t skipped_steps() const;

  /// Throws the std::runtime_error a rebuild under capture would throw, if
  /// `stream` is being captured: a caller that must read back before a
  /// rebuild (the step counts) asks first, so the capture fails with this
  /// message instead of a CUDA error.
  void check_rebuild_allowed(cudaStream_t stream) const;

  /// Kernel launches of one step: those of the last bind() (the uploads of
  /// moved gradients, changed options, or a whole new table) and of run().
  int launches_per_step() const;

  /// Bytes of tensor data one run() reads and writes (the norms and table
  /// add a few bytes per 16384 elements): the numerator of achieved bandwidth.
  std::int64_t bytes_per_step() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bigbatch::kernels::cuda
