// The compressed gradient exchange (compression.h). Selection, norms and
// PowerSGD's products are ATen's; the packing and unpacking loops are
// kernels/compress.h's (the CPU loops, or the CUDA kernels for CUDA tensors in
// a CUDA build).
#include "compression.h"

#include "../kernels/compress.h"
#include "../noise/noise_scale.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#if defined(BIGBATCH_WITH_CUDA)
#include "../kernels/cuda/compress.cuh"

#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>

namespace bigbatch::distributed {
namespace {

namespace kc = kernels::compress;

#if defined(BIGBATCH_WITH_CUDA)
cudaStream_t stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }
// A pack or unpack loop on the tensor's device.
#define BIGBATCH_COMPRESS(tensor, loop, ...)                                      \
  do {                                                                            \
    if ((tensor).is_cuda()) {                                                     \
      kc::cuda::loop(__VA_ARGS__, stream_of(tensor));                             \
    } else {                                                                      \
      kc::cpu::loop(__VA_ARGS__);                                                 \
    }                                                                             \
  } while (false)
#else
#define BIGBATCH_COMPRESS(tensor, loop, ...)                                                      \
  do {                                                                                            \
    TORCH_CHECK((tensor).is_cpu(), "gradient compression: ", (tensor).device(),                  \
                " tensors need a CUDA build of bigbatch (-DBIGBATCH_CUDA=ON)");                   \
    kc::cpu::loop(__VA_ARGS__);                                                                   \
  } while (false)
#endif

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A stream of draws for (seed, step, bucket, rank): rank -1 for one the ranks share.
std::uint64_t stream_seed(std::uint64_t seed, std::int64_t step, std::size_t bucket, int rank) {
  std::uint64_t h = kc::mix64(seed + 0x632BE59BD9B4E019ull);
  h = kc::mix64(h ^ static_cast<std::uint64_t>(step));
  h = kc::mix64(h ^ (static_cast<std::uint64_t>(bucket) << 20));
  return kc::mix64(h ^ static_cast<std::uint64_t>(static_cast<std::int64_t>(rank) + 1));
}

std::uint32_t* words(at::Tensor& t) { return reinterpret_cast<std::uint32_t*>(t.data_ptr<std::int32_t>()); }
const std::uint32_t* words(const at::Tensor& t) {
  return reinterpret_cast<const std::uint32_t*>(t.data_ptr<std::int32_t>());
}

// The fraction DGC sends at `step`: geometric from 0.25 down to ratio over warmup steps.
double dgc_ratio(const CompressionSpec& s, std::int64_t step) {
  if (s.ratio >= 0.25 || step >= s.warmup_steps) return s.ratio;
  const double t = static_cast<double>(step) / static_cast<double>(s.warmup_steps);
  return 0.25 * std::pow(s.ratio / 0.25, t);
}

// k distinct coordinates of [0, n), each k-subset equally likely (Floyd's
// algorithm: O(k) draws, where a permutation of n costs O(n)); int32, on the CPU.
at::Tensor draw_subset(std::int64_t n, std::int64_t k, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<bool> taken(static_cast<std::size_t>(n), false);
  at::Tensor out = at::empty({k}, at::kInt);
  std::int32_t* p = out.data_ptr<std::int32_t>();
  std::int64_t m = 0;
  for (std::int64_t j = n - k; j < n; ++j) {
    const auto t = static_cast<std::int64_t>(std::uniform_int_distribution<std::int64_t>(0, j)(gen));
    const std::int64_t pick = taken[static_cast<std::size_t>(t)] ? j : t;
    taken[static_cast<std::size_t>(pick)] = true;
    p[m++] = static_cast<std::int32_t>(pick);
  }
  return out;
}

std::int64_t kept(double ratio, std::int64_t n) {
  if (n <= 0) return 0;
  return std::clamp<std::int64_t>(static_cast<std::int64_t>(std::llround(ratio * static_cast<double>(n))), 1, n);
}

// Orthonormal columns of p (in place), by Gram-Schmidt; a column that falls to
// zero stays zero.
void orthogonalize(at::Tensor& p) {
  for (std::int64_t j = 0; j < p.size(1); ++j) {
    at::Tensor col = p.select(1, j);
    for (std::int64_t i = 0; i < j; ++i) {
      const at::Tensor prev = p.select(1, i);
      col.sub_(prev * (col * prev).sum());
    }
    col.div_(col.norm().add_(1e-8));
  }
}

}  // namespace

const char* compression_name(Compression method) {
  for (const auto& n : kCompressionNames) {
    if (n.value == method) return n.name;
  }
  return "?";
}

std::optional<Compression> compression_from_name(const std::string& name) {
  for (const auto& n : kCompressionNames) {
    if (name == n.name) return n.value;
  }
  return std::nullopt;
}

bool carries_gradients(const CompressionSpec& spec) {
  switch (spec.method) {
    case Compression::kDgc:
    case Compression::kPowerSgd:
      return true;
    case Compression::kTopK:
    case Compression::kRandomK:
    case Compression::kSign:
      return spec.error_feedback;
    default:
      return false;
  }
}

void check_spec(const CompressionSpec& s) {
  const char* name = compression_name(s.method);
  TORCH_CHECK(s.bucket_bytes > 0, "compression ", name, ": bucket_bytes must be > 0, got ", s.bucket_bytes);
  TORCH_CHECK(s.start_steps >= 0, "compression ", name, ": start_steps must be >= 0, got ", s.start_steps);
  switch (s.method) {
    case Compression::kTopK:
    case Compression::kRandomK:
    case Compression::kDgc:
      TORCH_CHECK(s.ratio > 0 && s.ratio <= 1, "compression ", name, ": ratio must be in (0, 1], got ", s.ratio);
      break;
    case Compression::kQsgd:
      TORCH_CHECK(s.levels >= 1 && s.levels <= 127, "compression ", name, ": levels must be in [1, 127], got ",
                  s.levels);
      TORCH_CHECK(s.chunk >= 1, "compression ", name, ": chunk must be >= 1, got ", s.chunk);
      break;
    case Compression::kPowerSgd:
      TORCH_CHECK(s.rank >= 1, "compression ", name, ": rank must be >= 1, got ", s.rank);
      break;
    default:
      break;
  }
  TORCH_CHECK(!s.overlap || s.method == Compression::kNone || s.method == Compression::kFp16, "compression ", name,
              ": overlap is for the all-reduce exchanges (none, fp16); ", name, " exchanges after backward");
  if (s.method == Compression::kDgc) {
    TORCH_CHECK(s.momentum >= 0 && s.momentum < 1, "compression dgc: momentum must be in [0, 1), got ", s.momentum);
    TORCH_CHECK(s.warmup_steps >= 0, "compression dgc: warmup_steps must be >= 0, got ", s.warmup_steps);
  }
}

GradientExchange::GradientExchange(CompressionSpec spec) : spec_(spec) { check_spec(spec_); }

GradientExchange::~GradientExchange() {
  for (auto& [param, hook] : hooks_) param.remove_hook(hook);
}

void GradientExchange::allreduce(ProcessGroup& group, at::Tensor& t) {
  const double w = group.size();
  const double bytes = static_cast<double>(t.numel() * t.element_size()) * 2 * (w - 1) / w;
  last_.bytes_sent += bytes;
  last_.bytes_received += bytes;
  const auto start = Clock::now();
  std::vector<at::Tensor> one{t};
  group.allreduce_sum(one);  // a world of one too: a group asked for runs its backend
  last_.communicate_seconds += seconds_since(start);
}

std::vector<at::Tensor> GradientExchange::allgather(ProcessGroup& group, const at::Tensor& t) {
  const double bytes = static_cast<double>(t.numel() * t.element_size()) * (group.size() - 1);
  last_.bytes_sent += bytes;
  last_.bytes_received += bytes;
  const auto start = Clock::now();
  auto out = group.allgather(t);
  last_.communicate_seconds += seconds_since(start);
  return out;
}

void GradientExchange::plan(const std::vector<at::Tensor>& grads, bool reverse) {
  std::vector<std::vector<std::int64_t>> shapes;
  for (const auto& g : grads) shapes.push_back(g.sizes().vec());
  if (planned_) {
    TORCH_CHECK(shapes == shapes_, "gradient compression: the gradients changed since the first exchange (",
                shapes_.size(), " tensors then, ", shapes.size(),
                " now, or other shapes); a GradientExchange serves one set of parameters");
    return;
  }
  shapes_ = shapes;
  planned_ = true;
  if (!grads.empty()) device_ = grads[0].device();
  // PowerSGD: the matrices whose rank-r factors are smaller than they are.
  std::vector<bool> dense(grads.size(), true);
  if (spec_.method == Compression::kPowerSgd) {
    for (std::size_t i = 0; i < grads.size(); ++i) {
      if (grads[i].dim() < 2) continue;
      const std::int64_t rows = grads[i].size(0), cols = grads[i].numel() / std::max<std::int64_t>(rows, 1);
      const std::int64_t r = std::min({spec_.rank, rows, cols});
      if ((rows + cols) * r >= rows * cols) continue;
      matrices_.push_back(Matrix{i, rows, cols, r, {}, {}});
      dense[i] = false;
    }
  }
  // Consecutive gradients up to bucket_bytes of fp32 (at least one each),
  // from the last when overlapping (backward produces them in that order).
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < grads.size(); ++i) order.push_back(reverse ? grads.size() - 1 - i : i);
  std::size_t begin = 0;
  while (begin < order.size()) {
    Bucket b;
    std::int64_t bytes = 0;
    std::size_t end = begin;
    for (; end < order.size(); ++end) {
      const std::size_t i = order[end];
      if (!dense[i] || grads[i].numel() == 0) continue;  // (an empty gradient has nothing to exchange)
      const std::int64_t add = grads[i].numel() * 4;
      if (!b.members.empty() && bytes + add > spec_.bucket_bytes) break;
      b.members.push_back(i);
      b.sizes.push_back(grads[i].numel());
      bytes += add;
      b.numel += grads[i].numel();
    }
    if (!b.members.empty()) {
      TORCH_CHECK(b.numel <= std::numeric_limits<std::int32_t>::max(), "gradient compression: a bucket of ", b.numel,
                  " elements (one tensor alone) is past the int32 indices and counts of the codes");
      buckets_.push_back(std::move(b));
    }
    begin = end;
  }
}

GradientNorms GradientExchange::exchange(ProcessGroup& group, const std::vector<at::Tensor>& params) {
  at::NoGradGuard no_grad;
  GradientNorms norms;
  std::vector<at::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  norms.local_sq = noise::grad_sq_norm(params);
  const auto start = Clock::now();
  if (overlap_group_) {
    TORCH_CHECK(overlap_group_ == &group, "gradient compression: exchange() on another group than begin()'s");
    finish_overlap(grads);
    ++steps_;
    norms.global_sq = noise::grad_sq_norm(params);
    return norms;
  }
  plan(grads);
  if (!pending_.empty()) apply_state();
  last_ = ExchangeStats{};
  last_.steps = 1;
  const bool dense = spec_.method == Compression::kNone || steps_ < spec_.start_steps;
  last_average_ = dense || spec_.method == Compression::kFp16 || spec_.method == Compression::kBf16;
  const double w = group.size();
  for (const auto& g : grads) last_.dense_bytes += static_cast<double>(g.numel()) * 4 * 2 * (w - 1) / w;
  if (spec_.method == Compression::kPowerSgd && !dense && !matrices_.empty()) exchange_powersgd(group, grads);
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    std::vector<at::Tensor> parts;
    for (const std::size_t i : bucket.members) parts.push_back(grads[i].reshape({-1}).to(at::kFloat));
    at::Tensor flat = at::cat(parts);
    exchange_bucket(group, bucket, b, flat, dense || spec_.method == Compression::kPowerSgd);
    std::int64_t offset = 0;
    for (const std::size_t i : bucket.members) {
      const std::int64_t n = grads[i].numel();
      grads[i].copy_(flat.slice(0, offset, offset + n).view(grads[i].sizes()));
      offset += n;
    }
  }
  if (dense && spec_.method == Compression::kPowerSgd) {
    for (const Matrix& m : matrices_) {  // the compressed matrices, uncompressed during the start
      at::Tensor flat = grads[m.member].reshape({-1}).to(at::kFloat);
      allreduce(group, flat);
      flat.div_(w);
      grads[m.member].copy_(flat.view(grads[m.member].sizes()));
    }
  }
  last_.compress_seconds = std::max(0.0, seconds_since(start) - last_.communicate_seconds);
  ++steps_;
  add_to_totals();
  norms.global_sq = noise::grad_sq_norm(params);
  return norms;
}

void GradientExchange::add_to_totals() {
  totals_.steps += 1;
  totals_.bytes_sent += last_.bytes_sent;
  totals_.bytes_received += last_.bytes_received;
  totals_.dense_bytes += last_.dense_bytes;
  totals_.compress_seconds += last_.compress_seconds;
  totals_.communicate_seconds += last_.communicate_seconds;
}

void GradientExchange::begin(ProcessGroup& group, const std::vector<at::Tensor>& params) {
  TORCH_CHECK(spec_.method == Compression::kNone || spec_.method == Compression::kFp16, "gradient compression: ",
              compression_name(spec_.method), " cannot overlap with backward (none and fp16 can)");
  TORCH_CHECK(!overlap_group_, "gradient compression: begin() twice without exchange() between");
  if (!planned_) plan(params, /*reverse=*/true);
  if (!pending_.empty()) apply_state();
  if (hooks_.empty()) {
    bucket_of_.assign(params.size(), 0);
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      for (const std::size_t i : buckets_[b].members) bucket_of_[i] = b;
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      at::Tensor p = params[i];
      const unsigned hook = p.register_hook([this, i](const at::Tensor& grad) { on_gradient(i, grad); });
      hooks_.emplace_back(p, hook);
    }
  }
  TORCH_CHECK(hooks_.size() == params.size(), "gradient compression: begin() over ", params.size(),
              " parameters, the hooks are on ", hooks_.size());
  missing_.assign(buckets_.size(), 0);
  for (std::size_t b = 0; b < buckets_.size(); ++b) missing_[b] = buckets_[b].members.size();
  incoming_.assign(params.size(), at::Tensor());
  fired_.assign(params.size(), false);
  next_bucket_ = 0;
  launched_.clear();
  last_ = ExchangeStats{};
  last_.steps = 1;
  last_average_ = true;
  overlap_group_ = &group;
}

void GradientExchange::on_gradient(std::size_t i, const at::Tensor& grad) {
  if (!overlap_group_ || i >= incoming_.size()) return;
  TORCH_CHECK(!fired_[i], "gradient compression: parameter ", i, " got a second gradient in one backward (a "
              "second backward or reentrant checkpointing before exchange()): with overlap, its bucket was sent "
              "with the first; call begin() and exchange() around each backward");
  fired_[i] = true;
  incoming_[i] = grad;
  const std::size_t b = bucket_of_[i];
  if (b < missing_.size() && missing_[b] > 0) --missing_[b];
  // Buckets start in their order only, whatever order backward finishes
  // them in, so that every rank issues the same collectives in the same order.
  const auto start = Clock::now();
  while (next_bucket_ < buckets_.size() && missing_[next_bucket_] == 0) launch(next_bucket_++, incoming_);
  last_.compress_seconds += seconds_since(start);
}

void GradientExchange::launch(std::size_t b, const std::vector<at::Tensor>& grads) {
  ProcessGroup& group = *overlap_group_;
  std::vector<at::Tensor> parts;
  for (const std::size_t i : buckets_[b].members) parts.push_back(grads[i].reshape({-1}).to(at::kFloat));
  at::Tensor data = at::cat(parts);
  const bool dense = spec_.method == Compression::kNone || steps_ < spec_.start_steps;
  if (!dense) {  // fp16
    at::Tensor half = at::empty({data.numel()}, data.options().dtype(at::kHalf));
    at::mul_out(half, data, at::scalar_tensor(1.0 / group.size(), data.options()));
    data = half;
  }
  const double w = group.size();
  const double bytes = static_cast<double>(data.numel() * data.element_size()) * 2 * (w - 1) / w;
  last_.bytes_sent += bytes;
  last_.bytes_received += bytes;
  last_.dense_bytes += static_cast<double>(buckets_[b].numel) * 4 * 2 * (w - 1) / w;
  launched_.push_back(Launched{b, data, group.allreduce_sum_async({data})});
  missing_[b] = 0;
  for (const std::size_t i : buckets_[b].members) {
    if (i < incoming_.size()) incoming_[i] = at::Tensor();  // copied into the bucket: backward may free it
  }
}

void GradientExchange::finish_overlap(const std::vector<at::Tensor>& grads) {
  ProcessGroup& group = *overlap_group_;
  overlap_group_ = nullptr;  // whatever happens below, the next step starts afresh
  TORCH_CHECK(grads.size() == incoming_.size(), "gradient compression: ", incoming_.size(),
              " parameters at begin(), ", grads.size(), " with a gradient after backward (with overlap, every "
              "parameter needs one)");
  plan(grads);  // the shapes must not have changed
  overlap_group_ = &group;
  const auto start = Clock::now();
  last_overlapped_ = launched_.size();
  // The buckets backward did not finish (no hook fired for some member): from .grad, in order.
  while (next_bucket_ < buckets_.size()) launch(next_bucket_++, grads);
  overlap_group_ = nullptr;
  const double w = group.size();
  for (Launched& l : launched_) {
    const auto waited = Clock::now();
    l.wait();
    last_.communicate_seconds += seconds_since(waited);
    at::Tensor data = l.data.scalar_type() == at::kFloat ? l.data.div_(w) : l.data.to(at::kFloat);
    std::int64_t offset = 0;
    for (const std::size_t i : buckets_[l.bucket].members) {
      const std::int64_t n = grads[i].numel();
      grads[i].copy_(data.slice(0, offset, offset + n).view(grads[i].sizes()));
      offset += n;
    }
  }
  launched_.clear();
  incoming_.assign(incoming_.size(), at::Tensor());
  fired_.assign(fired_.size(), false);
  last_.compress_seconds += std::max(0.0, seconds_since(start) - last_.communicate_seconds);
  add_to_totals();
}

void GradientExchange::exchange_bucket(ProcessGroup& group, Bucket& bucket, std::size_t index, at::Tensor& flat,
                                       bool dense) {
  if (dense) {  // allreduce_gradients' exchange, operation for operation
    allreduce(group, flat);
    flat.div_(static_cast<double>(group.size()));
    return;
  }
  switch (spec_.method) {
    case Compression::kFp16:
    case Compression::kBf16:
      return exchange_half(group, flat);
    case Compression::kTopK:
    case Compression::kDgc:
      return exchange_largest(group, bucket, flat);
    case Compression::kRandomK:
      return exchange_random(group, bucket, index, flat);
    case Compression::kSign:
    case Compression::kTernGrad:
      return exchange_codes(group, bucket, index, flat);
    case Compression::kQsgd:
      return exchange_qsgd(group, index, flat);
    default:
      TORCH_CHECK(false, "gradient compression: ", compression_name(spec_.method), " has no bucket exchange");
  }
}

at::Tensor& GradientExchange::memory_of(Bucket& bucket, const at::Tensor& flat) {
  if (!bucket.memory.defined()) bucket.memory = at::zeros({flat.numel()}, flat.options());
  return bucket.memory;
}

void GradientExchange::exchange_half(ProcessGroup& group, at::Tensor& flat) {
  const double w = group.size();
  const std::int64_t n = flat.numel();
  const auto opts = flat.options();
  const auto type = spec_.method == Compression::kFp16 ? at::kHalf : at::kBFloat16;
  // g / W cast to 16 bits in one pass (the product in fp32, then rounded once).
  at::Tensor half = at::empty({n}, opts.dtype(type));
  at::mul_out(half, flat, at::scalar_tensor(1.0 / w, opts));
  // Gloo (LibTorch 1.13 at least) has no bf16 collectives: bf16 travels
  // there as the bits of fp16 values (copied, never added), all-gathered,
  // and is added in fp32 (for 2 ranks the bytes of an all-reduce).
  if (spec_.method == Compression::kBf16 && group.backend() == Backend::kGloo) {
    at::Tensor sum = at::zeros({n}, opts);
    for (const auto& part : allgather(group, half.view(at::kHalf))) sum.add_(part.view(at::kBFloat16).to(at::kFloat));
    flat.copy_(sum);
  } else {
    allreduce(group, half);
    flat.copy_(half);
  }
}

void GradientExchange::exchange_largest(ProcessGroup& group, Bucket& bucket, at::Tensor& flat) {
  const double w = group.size();
  const std::int64_t n = flat.numel();
  const auto opts = flat.options();
  at::Tensor& acc = memory_of(bucket, flat);
  double ratio = spec_.ratio;
  if (spec_.method == Compression::kDgc) {
    // Momentum correction: u = m u + g; v = v + u; v is what is selected and sent.
    if (!bucket.velocity.defined()) bucket.velocity = at::zeros({n}, opts);
    bucket.velocity.mul_(spec_.momentum).add_(flat);
    acc.add_(bucket.velocity);
    ratio = dgc_ratio(spec_, steps_);
  } else {
    acc.add_(flat);
  }
  const std::int64_t k = kept(ratio, n);
  at::Tensor index = std::get<1>(acc.abs().topk(k, 0, true, false)).to(at::kInt);
  at::Tensor values = at::empty({k}, opts);
  const bool clear = spec_.method == Compression::kDgc || spec_.error_feedback;
  BIGBATCH_COMPRESS(acc, sparse_pack, acc.data_ptr<float>(), index.data_ptr<std::int32_t>(), k, clear,
                    values.data_ptr<float>());
  if (spec_.method == Compression::kDgc) {
    bucket.velocity.index_fill_(0, index.to(at::kLong), 0.0);  // momentum-factor masking
  } else if (!spec_.error_feedback) {
    acc.zero_();
  }
  const auto all_values = allgather(group, values);
  const auto all_index = allgather(group, index);
  flat.zero_();
  for (std::size_t r = 0; r < all_values.size(); ++r) {
    BIGBATCH_COMPRESS(flat, sparse_unpack_add, all_index[r].data_ptr<std::int32_t>(), all_values[r].data_ptr<float>(),
                      k, static_cast<float>(1.0 / w), flat.data_ptr<float>());
  }
}

void GradientExchange::exchange_random(ProcessGroup& group, Bucket& bucket, std::size_t index, at::Tensor& flat) {
  const double w = group.size();
  const std::int64_t n = flat.numel();
  const std::int64_t k = kept(spec_.ratio, n);
  at::Tensor coords = draw_subset(n, k, stream_seed(spec_.seed, steps_, index, -1)).to(flat.device());
  at::Tensor values = at::empty({k}, flat.options());
  at::Tensor& source = spec_.error_feedback ? memory_of(bucket, flat) : flat;
  if (spec_.error_feedback) source.add_(flat);
  BIGBATCH_COMPRESS(source, sparse_pack, source.data_ptr<float>(), coords.data_ptr<std::int32_t>(), k,
                    spec_.error_feedback, values.data_ptr<float>());
  allreduce(group, values);  // the same coordinates on every rank: the values add up
  const double scale = spec_.error_feedback ? 1.0 / w : static_cast<double>(n) / static_cast<double>(k) / w;
  flat.zero_();
  BIGBATCH_COMPRESS(flat, sparse_unpack_add, coords.data_ptr<std::int32_t>(), values.data_ptr<float>(), k,
                    static_cast<float>(scale), flat.data_ptr<float>());
}

// One code per tensor of the bucket, each with its own scale (the papers'
// layer-wise scales): the tensors' words, then their scales.
void GradientExchange::exchange_codes(ProcessGroup& group, Bucket& bucket, std::size_t index, at::Tensor& flat) {
  const bool sign = spec_.method == Compression::kSign;
  at::Tensor& x = sign && spec_.error_feedback ? memory_of(bucket, flat) : flat;
  if (sign && spec_.error_feedback) x.add_(flat);
  const at::Tensor packed = pack_codes(group, bucket, index, x);
  flat.zero_();
  for (const auto& received : allgather(group, packed)) add_codes(bucket, received, group.size(), flat);
}

at::Tensor GradientExchange::pack_codes(ProcessGroup& group, const Bucket& bucket, std::size_t index, at::Tensor& x) {
  const bool sign = spec_.method == Compression::kSign;
  const std::int64_t per_word = sign ? kc::kSignPerWord : kc::kTernaryPerWord;
  std::int64_t words_total = 0;
  for (const std::int64_t size : bucket.sizes) words_total += kc::words_for(size, per_word);
  const auto segments = static_cast<std::int64_t>(bucket.sizes.size());
  at::Tensor packed = at::empty({words_total + segments}, x.options().dtype(at::kInt));
  const at::Tensor scales = at::empty({segments}, x.options());
  std::int64_t begin = 0, word = 0;
  for (std::int64_t j = 0; j < segments; ++j) {
    const std::int64_t size = bucket.sizes[static_cast<std::size_t>(j)];
    at::Tensor part = x.slice(0, begin, begin + size);
    std::uint32_t* out = words(packed) + word;
    if (sign) {
      // The scale that brings c sign(x) closest to x: the mean magnitude.
      const float scale = static_cast<float>(part.norm(1).item<double>() / static_cast<double>(size));
      scales[j].fill_(scale);
      BIGBATCH_COMPRESS(part, sign_pack, part.data_ptr<float>(), size, scale, spec_.error_feedback, out);
    } else {
      const float scale = part.abs().max().item<float>();
      scales[j].fill_(scale);
      const std::uint64_t seed = kc::mix64(stream_seed(spec_.seed, steps_, index, group.rank()) + j);
      BIGBATCH_COMPRESS(part, ternary_pack, part.data_ptr<float>(), size, scale, seed, out);
    }
    begin += size;
    word += kc::words_for(size, per_word);
  }
  packed.slice(0, words_total).copy_(scales.view(at::kInt));
  return packed;
}

void GradientExchange::add_codes(const Bucket& bucket, const at::Tensor& received, double w, at::Tensor& flat) {
  const bool sign = spec_.method == Compression::kSign;
  const std::int64_t per_word = sign ? kc::kSignPerWord : kc::kTernaryPerWord;
  const auto segments = static_cast<std::int64_t>(bucket.sizes.size());
  const std::int64_t words_total = received.numel() - segments;
  const at::Tensor their_scales = received.slice(0, words_total).view(at::kFloat).cpu();
  std::int64_t begin = 0, word = 0;
  for (std::int64_t j = 0; j < segments; ++j) {
    const std::int64_t size = bucket.sizes[static_cast<std::size_t>(j)];
    at::Tensor part = flat.slice(0, begin, begin + size);
    const float scale = static_cast<float>(their_scales[j].item<float>() / w);
    const std::uint32_t* in = words(received) + word;
    if (sign) {
      BIGBATCH_COMPRESS(part, sign_unpack_add, in, size, scale, part.data_ptr<float>());
    } else {
      BIGBATCH_COMPRESS(part, ternary_unpack_add, in, size, scale, part.data_ptr<float>());
    }
    begin += size;
    word += kc::words_for(size, per_word);
  }
}

// The norm of each chunk of `chunk` elements (QSGD's buckets), then n levels as bytes.
void GradientExchange::exchange_qsgd(ProcessGroup& group, std::size_t index, at::Tensor& flat) {
  const double w = group.size();
  const std::int64_t n = flat.numel();
  const auto opts = flat.options();
  const std::int64_t chunk = std::min(spec_.chunk, n);  // one norm for the bucket at most
  const std::int64_t chunks = (n + chunk - 1) / chunk;
  at::Tensor padded = at::zeros({chunks * chunk}, opts);
  padded.slice(0, 0, n).copy_(flat);
  const at::Tensor norms = padded.view({chunks, chunk}).norm(2, 1).contiguous();
  at::Tensor packed = at::empty({4 * chunks + n}, opts.dtype(at::kChar));
  packed.slice(0, 0, 4 * chunks).copy_(norms.view(at::kChar));
  BIGBATCH_COMPRESS(flat, qsgd_pack, flat.data_ptr<float>(), n, norms.data_ptr<float>(), chunk,
                    static_cast<int>(spec_.levels), stream_seed(spec_.seed, steps_, index, group.rank()),
                    packed.data_ptr<std::int8_t>() + 4 * chunks);
  flat.zero_();
  const float scale = static_cast<float>(1.0 / static_cast<double>(spec_.levels) / w);
  for (const auto& received : allgather(group, packed)) {
    const at::Tensor their_norms = received.slice(0, 0, 4 * chunks).view(at::kFloat);
    BIGBATCH_COMPRESS(flat, qsgd_unpack_add, received.data_ptr<std::int8_t>() + 4 * chunks, n,
                      their_norms.data_ptr<float>(), chunk, scale, flat.data_ptr<float>());
  }
}

void GradientExchange::exchange_powersgd(ProcessGroup& group, const std::vector<at::Tensor>& grads) {
  const double w = group.size();
  std::vector<at::Tensor> m(matrices_.size()), p(matrices_.size());
  std::int64_t p_size = 0, q_size = 0;
  for (std::size_t i = 0; i < matrices_.size(); ++i) {
    Matrix& x = matrices_[i];
    const at::Tensor& g = grads[x.member];
    m[i] = g.reshape({x.rows, x.cols}).to(at::kFloat);
    if (spec_.error_feedback) {
      if (!x.error.defined()) x.error = at::zeros_like(m[i]);
      m[i] = m[i] + x.error;
    }
    if (!x.q.defined()) {  // the same first Q on every rank: drawn from the shared seed
      auto gen = at::detail::createCPUGenerator(stream_seed(spec_.seed, 0, (1u << 20) + i, -1));
      x.q = at::randn({x.cols, x.r}, gen, at::kFloat).to(g.device());
    }
    p_size += x.rows * x.r;
    q_size += x.cols * x.r;
  }
  // P = M Q, summed over the ranks, orthonormalized.
  at::Tensor ps = at::empty({p_size}, m[0].options());
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < matrices_.size(); ++i) {
    const Matrix& x = matrices_[i];
    p[i] = ps.slice(0, offset, offset + x.rows * x.r).view({x.rows, x.r});
    at::mm_out(p[i], m[i], x.q);
    offset += x.rows * x.r;
  }
  allreduce(group, ps);
  for (auto& pi : p) orthogonalize(pi);
  // Q = M^T P, averaged over the ranks: P Q^T is the mean of the ranks' projections.
  at::Tensor qs = at::empty({q_size}, m[0].options());
  offset = 0;
  for (std::size_t i = 0; i < matrices_.size(); ++i) {
    Matrix& x = matrices_[i];
    at::Tensor qi = qs.slice(0, offset, offset + x.cols * x.r).view({x.cols, x.r});
    at::mm_out(qi, m[i].t(), p[i]);
    offset += x.cols * x.r;
  }
  allreduce(group, qs);
  qs.div_(w);
  offset = 0;
  for (std::size_t i = 0; i < matrices_.size(); ++i) {
    Matrix& x = matrices_[i];
    x.q = qs.slice(0, offset, offset + x.cols * x.r).view({x.cols, x.r}).clone();
    offset += x.cols * x.r;
    const at::Tensor approx = at::mm(p[i], x.q.t());
    if (spec_.error_feedback) x.error = m[i] - approx;
    grads[x.member].copy_(approx.view(grads[x.member].sizes()));
  }
}

std::vector<at::Tensor> GradientExchange::state(bool shared_only) const {
  if (!pending_.empty()) return pending_;  // loaded, not yet applied: still the state
  // The step and the compressor, the totals, then per bucket (memory, velocity) and per matrix (q, error),
  // each an empty tensor where not yet made (or, shared_only, where it is this rank's own).
  std::vector<at::Tensor> out{at::tensor({steps_, static_cast<std::int64_t>(spec_.method)}, at::kLong),
                              at::tensor({static_cast<double>(totals_.steps), totals_.bytes_sent,
                                          totals_.bytes_received, totals_.dense_bytes, totals_.compress_seconds,
                                          totals_.communicate_seconds},
                                         at::kDouble)};
  const auto cpu = [](const at::Tensor& t) { return t.defined() ? t.to(at::kCPU, false, true) : at::empty({0}, at::kFloat); };
  const at::Tensor none = at::empty({0}, at::kFloat);
  for (const auto& b : buckets_) {
    out.push_back(shared_only ? none : cpu(b.memory));
    out.push_back(shared_only ? none : cpu(b.velocity));
  }
  for (const auto& x : matrices_) {
    out.push_back(cpu(x.q));  // all-reduced: the same on every rank
    out.push_back(shared_only ? none : cpu(x.error));
  }
  return out;
}

void GradientExchange::load_state(const std::vector<at::Tensor>& state) {
  TORCH_CHECK(!state.empty() && state[0].numel() == 2 && state[0].scalar_type() == at::kLong,
              "gradient compression: a state without its step count and compressor");
  const auto method = static_cast<Compression>(state[0][1].item<std::int64_t>());
  TORCH_CHECK(method == spec_.method, "gradient compression: a state of ", compression_name(method), " given to ",
              compression_name(spec_.method));
  pending_ = state;
  if (planned_) apply_state();
}

void GradientExchange::apply_state() {
  const std::vector<at::Tensor> state = std::move(pending_);
  pending_.clear();
  const std::int64_t steps = state[0][0].item<std::int64_t>();
  const std::size_t expected = 2 + 2 * (buckets_.size() + matrices_.size());
  TORCH_CHECK(state.size() == expected || (steps == 0 && state.size() == 2), "gradient compression: a state of ",
              state.size(), " tensors for ", expected, " (another compressor or other parameters)");
  const at::Device device = device_;
  const auto restore = [&](at::Tensor& into, const at::Tensor& from) {
    into = from.numel() == 0 ? at::Tensor() : from.to(device).clone();
  };
  TORCH_CHECK(state[1].numel() == 6, "gradient compression: a state whose totals have ", state[1].numel(),
              " values, not 6");
  const at::Tensor t = state[1].to(at::kDouble).contiguous();
  const double* v = t.data_ptr<double>();
  totals_ = ExchangeStats{static_cast<std::int64_t>(v[0]), v[1], v[2], v[3], v[4], v[5]};
  std::size_t k = 2;
  for (auto& b : buckets_) {
    if (k >= state.size()) break;
    restore(b.memory, state[k++]);
    restore(b.velocity, state[k++]);
  }
  for (auto& x : matrices_) {
    if (k >= state.size()) break;
    restore(x.q, state[k++]);
    restore(x.error, state[k++]);
  }
  steps_ = steps;
}

GradientNorms allreduce_gradients(ProcessGroup& group, const std::vector<at::Tensor>& params,
                                  std::int64_t bucket_bytes) {
  TORCH_CHECK(bucket_bytes > 0, "allreduce_gradients: bucket_bytes must be > 0, got ", bucket_bytes);
  CompressionSpec spec;
  spec.bucket_bytes = bucket_bytes;
  GradientExchange exchange(spec);
  return exchange.exchange(group, params);
}

}  // namespace bigbatch::distributed
