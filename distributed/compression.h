// The gradient exchange of data-parallel training: allreduce_gradients (fp32,
// in buckets) and the same exchange with a compressor in it (GradientExchange),
// of which allreduce_gradients is the uncompressed case. Each step the ranks' gradients
// (flattened into fp32 buckets, as allreduce_gradients does) are compressed,
// exchanged in compressed form, decompressed and averaged, so that every rank
// ends the step with the same averaged gradient. The math of each compressor,
// with its paper, is in docs/formulas.md ("Gradient compression"); how to
// use it and what it does to steps-to-target, in docs/distributed.md.
//
//   none      fp32 all-reduce (allreduce_gradients, bit for bit)
//   fp16,bf16 divided by the world size, cast, all-reduced in 16 bits (bf16
//             over Gloo: all-gathered, added in fp32)
//   topk      the k = ratio * n largest |g + e| with error feedback; values
//             and int32 indices all-gathered
//   randomk   k = ratio * n coordinates drawn from a seed shared by the ranks
//             (the same on every rank, so the values are all-reduced and no
//             index is sent); with error feedback, or unbiased (scaled by
//             n / k) without
//   dgc       Deep Gradient Compression: top-k of the accumulated velocity
//             with momentum correction, momentum-factor masking and a
//             sparsity warmup
//   sign      EF-signSGD: sign(g + e) scaled by |g + e|_1 / n per tensor,
//             1 bit per element and one fp32 scale per tensor, error feedback
//   terngrad  TernGrad: {-s, 0, +s} with s = max|g| per tensor, unbiased, 2 bits
//   qsgd      QSGD with `levels` levels and stochastic rounding, unbiased,
//             one byte per element and one fp32 norm per `chunk` elements
//   powersgd  PowerSGD of rank r: one power iteration per step (warm start),
//             P and Q all-reduced, error feedback; matrices where rank r
//             saves nothing, and vectors, are all-reduced uncompressed
//
// Every compressor can start with `start_steps` steps of plain fp32
// all-reduce (PowerSGD's recommended start). The random draws (randomk's
// coordinates, TernGrad's and QSGD's rounding, PowerSGD's first Q) come from
// (seed, step, bucket): reproducible, and the same on every rank where the
// ranks must agree (randomk, PowerSGD), independent across ranks where they
// must not (TernGrad, QSGD).
#pragma once

#include "process_group.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace bigbatch::distributed {

/// Squared L2 norms of the gradient before and after averaging: the per-rank
/// (small batch b) and the global (batch b x world) norms the gradient noise
/// scale needs, at no extra cost.
struct GradientNorms {
  double local_sq = 0;
  double global_sq = 0;
};

/// Averages the gradients of `params` over the ranks: flattened into fp32
/// buckets of at most `bucket_bytes`, one all-reduce per bucket, divided by
/// the world size and copied back. Parameters without a gradient on every rank
/// must be the same parameters (as with DDP).
GradientNorms allreduce_gradients(ProcessGroup& group, const std::vector<at::Tensor>& params,
                                  std::int64_t bucket_bytes = 25 << 20);

enum class Compression { kNone, kFp16, kBf16, kTopK, kRandomK, kDgc, kSign, kTernGrad, kQsgd, kPowerSgd };

/// How configs and result files spell each compressor, in the order error
/// messages list them (a table config::enum_value reads).
struct CompressionName {
  Compression value;
  const char* name;
};
inline constexpr CompressionName kCompressionNames[] = {
    {Compression::kNone, "none"},         {Compression::kFp16, "fp16"},   {Compression::kBf16, "bf16"},
    {Compression::kTopK, "topk"},         {Compression::kRandomK, "randomk"}, {Compression::kDgc, "dgc"},
    {Compression::kSign, "sign"},         {Compression::kTernGrad, "terngrad"}, {Compression::kQsgd, "qsgd"},
    {Compression::kPowerSgd, "powersgd"}};

/// The config name of a compressor.
const char* compression_name(Compression method);
/// The compressor of a config name; nullopt for an unknown one.
std::optional<Compression> compression_from_name(const std::string& name);

struct CompressionSpec {
  Compression method = Compression::kNone;
  /// topk, randomk, dgc: the fraction of each bucket's elements sent, in (0, 1].
  double ratio = 0.01;
  /// topk, randomk, sign, powersgd: keep what was not sent and add it to the
  /// next step's gradient. randomk without it is scaled by n / k (unbiased).
  bool error_feedback = true;
  /// dgc: the momentum of the momentum correction, in [0, 1). Use the
  /// optimizer without momentum: DGC's exchange carries it.
  double momentum = 0.9;
  /// dgc: steps of sparsity warmup: the fraction sent falls geometrically
  /// from 0.25 to `ratio` over them (none when ratio >= 0.25).
  std::int64_t warmup_steps = 0;
  /// qsgd: the number of levels s, in [1, 127].
  std::int64_t levels = 16;
  /// qsgd: elements per norm (the paper's bucket size d): each chunk of a
  /// bucket is quantized against its own norm.
  std::int64_t chunk = 512;
  /// powersgd: the rank r, >= 1.
  std::int64_t rank = 2;
  /// Steps of plain fp32 all-reduce before compressing.
  std::int64_t start_steps = 0;
  /// The size of the fp32 buckets the gradients are flattened into (DDP's 25 MB).
  std::int64_t bucket_bytes = 25 << 20;
  /// none and fp16: start each bucket's all-reduce during backward, as soon
  /// as its gradients exist (GradientExchange::begin), instead of after it.
  bool overlap = false;
  /// The random draws' seed (bigbatch's trials use the trial's seed).
  std::uint64_t seed = 0;
};

/// Whether the exchange carries gradients from one step to the next (the
/// error memories of topk, randomk and sign with error feedback, DGC's
/// velocity, PowerSGD's warm-started Q): a loss scale that changes between
/// steps would leave them at the old scale, and an overflow's inf in them.
bool carries_gradients(const CompressionSpec& spec);

/// Checks every field the method uses; throws c10::Error naming the field
/// and its value ("compression topk: ratio must be in (0, 1], got 0").
void check_spec(const CompressionSpec& spec);

/// Bytes and seconds of the exchange, summed over steps. Bytes are counted
/// from the tensors handed to the collectives, as a ring algorithm moves
/// them: an all-reduce of N bytes sends and receives 2 (W - 1) / W * N per
/// rank, an all-gather of N bytes a rank sends and receives (W - 1) * N.
struct ExchangeStats {
  std::int64_t steps = 0;
  double bytes_sent = 0;
  double bytes_received = 0;
  /// What the fp32 all-reduce of the same gradients would have sent.
  double dense_bytes = 0;
  /// Wall time compressing and decompressing (everything but the collectives),
  /// and in the collectives. On CUDA tensors: host time (launches and waits).
  double compress_seconds = 0;
  double communicate_seconds = 0;
  /// dense_bytes / bytes_sent (1 before any exchange).
  double ratio() const { return bytes_sent > 0 ? dense_bytes / bytes_sent : 1.0; }
};

/// The gradient exchange of a data-parallel run with its compressor's state
/// (error memories, DGC's velocities, PowerSGD's Q). Construct one per run
/// and call exchange() after every backward, on every rank, with the same
/// parameters in the same order.
class GradientExchange {
 public:
  explicit GradientExchange(CompressionSpec spec = {});
  ~GradientExchange();
  GradientExchange(const GradientExchange&) = delete;  // its hooks point at it
  GradientExchange& operator=(const GradientExchange&) = delete;

  /// Overlap with backward (none and fp16; throws for the others): call
  /// before backward. The first call registers a hook on each parameter;
  /// from then on, during each backward that follows a begin(), a bucket's
  /// all-reduce starts as soon as backward has produced all its gradients
  /// (the buckets are made in reverse parameter order, the order backward
  /// produces them), and exchange() after backward waits for them. The
  /// gradients must have been zeroed (or set to none) before backward, and
  /// every parameter must get one.
  void begin(ProcessGroup& group, const std::vector<at::Tensor>& params);

  /// Replaces each parameter's gradient by the average over the ranks as the
  /// compressor transmits it (the exact average for none). Returns the
  /// squared gradient norms before and after (the noise scale's two batch
  /// sizes). Parameters without a gradient on every rank must be the same
  /// parameters; their shapes may not change between calls.
  GradientNorms exchange(ProcessGroup& group, const std::vector<at::Tensor>& params);

  const CompressionSpec& spec() const { return spec_; }
  std::int64_t steps() const { return steps_; }
  const ExchangeStats& totals() const { return totals_; }
  const ExchangeStats& last() const { return last_; }
  /// Whether the last exchange gave the ranks' average itself (fp32, or
  /// rounded to 16 bits) rather than a compressed estimate of it: what the
  /// noise scale's big-batch norm needs.
  bool last_was_average() const { return last_average_; }
  /// With overlap: how many of the last step's buckets started their
  /// all-reduce during backward (the rest started after it), and how many there are.
  std::size_t last_overlapped() const { return last_overlapped_; }
  std::size_t buckets() const { return buckets_.size(); }

  /// The compressor's state, for a checkpoint: the step count, the totals
  /// and every memory tensor, on the CPU. load_state() of the same spec over
  /// the same parameters continues where it was taken (applied at the next
  /// begin() or exchange() when none ran yet; a state that does not fit
  /// throws there). shared_only leaves out what differs between ranks (the
  /// error memories, DGC's velocities), keeping the step, the totals and
  /// PowerSGD's Q: what one rank's checkpoint can give every rank; the
  /// memories left out restart at zero.
  std::vector<at::Tensor> state(bool shared_only = false) const;
  void load_state(const std::vector<at::Tensor>& state);

 private:
  struct Bucket {
    std::vector<std::size_t> members;  ///< indices into the gradient list
    std::vector<std::int64_t> sizes;   ///< each member's elements
    std::int64_t numel = 0;
    at::Tensor memory;    ///< error feedback (topk, randomk, sign), DGC's accumulated velocity
    at::Tensor velocity;  ///< DGC's momentum
  };
  struct Matrix {  ///< PowerSGD: a gradient compressed as rows x cols at rank r
    std::size_t member;
    std::int64_t rows, cols, r;
    at::Tensor q, error;
  };

  void plan(const std::vector<at::Tensor>& grads, bool reverse = false);
  void apply_state();
  void on_gradient(std::size_t i, const at::Tensor& grad);
  void launch(std::size_t bucket, const std::vector<at::Tensor>& grads);
  void finish_overlap(const std::vector<at::Tensor>& grads);
  void add_to_totals();
  // One bucket's exchange (`index` seeds the random ones), by compressor.
  void exchange_bucket(ProcessGroup& group, Bucket& bucket, std::size_t index, at::Tensor& flat, bool dense);
  static at::Tensor& memory_of(Bucket& bucket, const at::Tensor& flat);  ///< zeros on first use
  void exchange_half(ProcessGroup& group, at::Tensor& flat);                    // fp16, bf16
  void exchange_largest(ProcessGroup& group, Bucket& bucket, at::Tensor& flat);  // topk, dgc
  void exchange_random(ProcessGroup& group, Bucket& bucket, std::size_t index, at::Tensor& flat);  // randomk
  void exchange_codes(ProcessGroup& group, Bucket& bucket, std::size_t index, at::Tensor& flat);   // sign, terngrad
  at::Tensor pack_codes(ProcessGroup& group, const Bucket& bucket, std::size_t index, at::Tensor& x);
  void add_codes(const Bucket& bucket, const at::Tensor& received, double w, at::Tensor& flat);  ///< / w ranks
  void exchange_qsgd(ProcessGroup& group, std::size_t index, at::Tensor& flat);
  void exchange_powersgd(ProcessGroup& group, const std::vector<at::Tensor>& grads);
  void allreduce(ProcessGroup& group, at::Tensor& t);
  std::vector<at::Tensor> allgather(ProcessGroup& group, const at::Tensor& t);

  CompressionSpec spec_;
  std::int64_t steps_ = 0;
  bool planned_ = false;
  at::Device device_{at::kCPU};
  std::vector<at::Tensor> pending_;                 ///< a loaded state not yet applied
  std::vector<std::vector<std::int64_t>> shapes_;  ///< the gradients' shapes, fixed at the first call
  std::vector<Bucket> buckets_;                     ///< over the gradients PowerSGD leaves dense (all, otherwise)
  std::vector<Matrix> matrices_;                    ///< powersgd
  ExchangeStats totals_, last_;
  bool last_average_ = true;
  // Overlap: the hooks, each gradient's bucket, what backward has produced
  // since begin(), and the all-reduces under way.
  struct Launched {
    std::size_t bucket;
    at::Tensor data;
    std::function<void()> wait;
  };
  std::vector<std::pair<at::Tensor, unsigned>> hooks_;
  std::vector<std::size_t> bucket_of_;
  std::vector<std::size_t> missing_;
  std::vector<at::Tensor> incoming_;
  std::vector<bool> fired_;
  std::size_t next_bucket_ = 0;  ///< the next bucket to start: they start in order
  std::vector<Launched> launched_;
  ProcessGroup* overlap_group_ = nullptr;  ///< set between begin() and exchange()
  std::size_t last_overlapped_ = 0;
};

}  // namespace bigbatch::distributed
