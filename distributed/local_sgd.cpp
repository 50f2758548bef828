// Local SGD, DiLoCo and streaming fragments (local_sgd.h).
#include "local_sgd.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

namespace bigbatch::distributed {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The parameters, flattened and joined, cut into `parts` runs of equal
// elements: each run's pieces of the tensors it covers.
std::vector<std::vector<LocalSgd::Piece>> cut_fragments(const std::vector<at::Tensor>& params, std::int64_t parts) {
  std::int64_t total = 0;
  for (const auto& p : params) total += p.numel();
  std::vector<std::vector<LocalSgd::Piece>> out(static_cast<std::size_t>(parts));
  std::int64_t start = 0;  // the first element of params[i] in the joined vector
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::int64_t n = params[i].numel();
    for (std::int64_t f = 0; f < parts; ++f) {
      const std::int64_t lo = std::max(f * total / parts, start), hi = std::min((f + 1) * total / parts, start + n);
      if (lo < hi) out[static_cast<std::size_t>(f)].push_back({i, lo - start, hi - start});
    }
    start += n;
  }
  return out;
}

// A piece of `t` (the whole tensor, in its shape, where the piece is all of it).
at::Tensor piece_of(const at::Tensor& t, const LocalSgd::Piece& p) {
  if (p.begin == 0 && p.end == t.numel()) return t;
  return t.view({-1}).slice(0, p.begin, p.end);
}

// Every tensor replaced by its average over the ranks: one all-reduce per
// dtype, in that dtype. Adds the ring bytes and the seconds to `totals`.
void average(ProcessGroup& group, std::vector<at::Tensor>& tensors, SyncStats& totals) {
  const double w = group.size();
  std::vector<std::vector<std::size_t>> by_dtype;
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    auto same = std::find_if(by_dtype.begin(), by_dtype.end(), [&](const auto& run) {
      return tensors[run.front()].scalar_type() == tensors[k].scalar_type();
    });
    if (same == by_dtype.end()) {
      by_dtype.push_back({k});
    } else {
      same->push_back(k);
    }
  }
  for (const auto& run : by_dtype) {
    std::vector<at::Tensor> parts;
    for (const std::size_t k : run) parts.push_back(tensors[k].reshape({-1}));
    std::vector<at::Tensor> flat{at::cat(parts)};
    const double bytes = static_cast<double>(flat[0].numel() * flat[0].element_size()) * 2 * (w - 1) / w;
    const auto start = Clock::now();
    group.allreduce_sum(flat);
    totals.communicate_seconds += seconds_since(start);
    totals.bytes_sent += bytes;
    totals.bytes_received += bytes;
    flat[0].div_(w);
    std::int64_t offset = 0;
    for (const std::size_t k : run) {
      const std::int64_t m = tensors[k].numel();
      tensors[k].copy_(flat[0].slice(0, offset, offset + m).view(tensors[k].sizes()));
      offset += m;
    }
  }
}

}  // namespace

const char* sync_type_name(SyncType type) {
  for (const auto& n : kSyncTypeNames) {
    if (n.value == type) return n.name;
  }
  return "?";
}

void check_spec(const LocalSgdSpec& s) {
  TORCH_CHECK(s.type == SyncType::kLocalSgd || s.type == SyncType::kDiloco,
              "local SGD: type must be local_sgd or diloco, got ", sync_type_name(s.type));
  TORCH_CHECK(s.every >= 1, "local SGD: every must be >= 1 (steps), got ", s.every);
  TORCH_CHECK(s.fragments >= 1, "local SGD: fragments must be >= 1, got ", s.fragments);
  TORCH_CHECK(s.every % s.fragments == 0, "local SGD: every (", s.every, ") must divide by fragments (", s.fragments,
              ")");
  TORCH_CHECK(s.outer.lr > 0 && std::isfinite(s.outer.lr), "local SGD: outer.lr must be > 0, got ", s.outer.lr);
  TORCH_CHECK(s.outer.momentum >= 0 && s.outer.momentum < 1, "local SGD: outer.momentum must be in [0, 1), got ",
              s.outer.momentum);
  TORCH_CHECK(!s.outer.nesterov || s.outer.momentum > 0, "local SGD: outer.nesterov needs outer.momentum > 0");
  TORCH_CHECK(s.type != SyncType::kLocalSgd || (s.outer.lr == 1 && s.outer.momentum == 0),
              "local SGD: local_sgd averages the models (outer lr 1, momentum 0), got outer lr ", s.outer.lr,
              ", momentum ", s.outer.momentum, "; an outer step is diloco's");
  TORCH_CHECK(!s.compression.overlap, "local SGD: the pseudo-gradients are exchanged between steps; overlap must be false");
  check_spec(s.compression);
}

LocalSgd::LocalSgd(LocalSgdSpec spec, std::vector<at::Tensor> params, const std::vector<at::Tensor>& buffers)
    : spec_(spec), params_(std::move(params)) {
  check_spec(spec_);
  TORCH_CHECK(!params_.empty(), "local SGD: no parameters");
  at::NoGradGuard no_grad;
  for (const auto& b : buffers) {
    if (!b.defined() || !b.is_floating_point()) continue;  // (BatchNorm's count: an integer, the same on every rank)
    buffers_.push_back(b);
    buffer_anchors_.push_back(b.detach().clone());
  }
  std::int64_t total = 0;
  for (const auto& p : params_) {
    TORCH_CHECK(p.is_contiguous(), "local SGD: parameters must be contiguous (a fragment is a view of their elements)");
    total += p.numel();
    anchors_.push_back(p.detach().clone());
    if (spec_.outer.momentum > 0) momenta_.push_back(at::zeros_like(p));
  }
  TORCH_CHECK(spec_.fragments <= total, "local SGD: fragments (", spec_.fragments,
              ") must not exceed the parameters' elements (", total, ")");
  fragments_ = cut_fragments(params_, spec_.fragments);
  for (std::size_t f = 0; f < fragments_.size(); ++f) {
    Views v;
    for (const Piece& piece : fragments_[f]) {
      v.param.push_back(piece_of(params_[piece.param].detach(), piece));
      v.anchor.push_back(piece_of(anchors_[piece.param], piece));
      if (!momenta_.empty()) v.momentum.push_back(piece_of(momenta_[piece.param], piece));
      if (spec_.compression.method != Compression::kNone) v.carrier.push_back(at::zeros_like(v.param.back()));
    }
    views_.push_back(std::move(v));
    if (spec_.compression.method == Compression::kNone) {
      exchanges_.emplace_back();
      continue;
    }
    CompressionSpec c = spec_.compression;
    c.seed = spec_.compression.seed + 0x9E3779B97F4A7C15ull * (f + 1);  // the fragments' draws apart
    exchanges_.push_back(std::make_unique<GradientExchange>(c));
  }
  last_synced_.assign(fragments_.size(), 0);
}

LocalSgd::~LocalSgd() = default;

bool LocalSgd::due(std::size_t f, std::int64_t steps) const {
  const std::int64_t offset = static_cast<std::int64_t>(f) * spec_.every / spec_.fragments;
  return steps % spec_.every == offset;
}

bool LocalSgd::after_step(ProcessGroup* group, std::int64_t steps) {
  TORCH_CHECK(steps >= 1, "local SGD: after_step needs the steps taken (>= 1), got ", steps);
  return round(group, steps, /*all=*/false);
}

bool LocalSgd::finish(ProcessGroup* group, std::int64_t steps) { return round(group, steps, /*all=*/true); }

bool LocalSgd::round(ProcessGroup* group, std::int64_t steps, bool all) {
  const double sent_before = totals_.bytes_sent;
  if (last_round_ != steps) round_outer_sq_ = 0;  // (finish() after after_step() at one step: one round)
  bool any = false;
  for (std::size_t f = 0; f < fragments_.size(); ++f) {
    if (last_synced_[f] == steps || !(all || due(f, steps))) continue;
    sync(group, f, round_outer_sq_);
    last_synced_[f] = steps;
    any = true;
  }
  if (!any) return false;
  // The buffers (BatchNorm's running statistics) averaged too, with every round.
  if (!buffers_.empty()) {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> mean;
    for (const auto& b : buffers_) mean.push_back(b.detach().clone());
    if (group != nullptr && group->size() > 1) average(*group, mean, totals_);
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      buffers_[i].detach().copy_(mean[i]);
      buffer_anchors_[i].copy_(mean[i]);
    }
  }
  if (last_round_ != steps) ++totals_.rounds;
  last_round_ = steps;
  if (!all) totals_.peak_round_bytes = std::max(totals_.peak_round_bytes, totals_.bytes_sent - sent_before);
  totals_.last_outer_norm = std::sqrt(round_outer_sq_);
  return true;
}

void LocalSgd::sync(ProcessGroup* group, std::size_t f, double& outer_sq) {
  at::NoGradGuard no_grad;
  Views& v = views_[f];
  const std::size_t n = v.param.size();
  const double w = group != nullptr ? group->size() : 1;
  // This rank's pseudo-gradient, anchor - parameter, then its average over the ranks.
  std::vector<at::Tensor> delta;
  for (std::size_t k = 0; k < n; ++k) {
    delta.push_back(v.anchor[k] - v.param[k]);
    totals_.dense_bytes += static_cast<double>(delta.back().numel()) * 4 * 2 * (w - 1) / w;
  }
  if (group != nullptr && group->size() > 1) {
    if (spec_.compression.method == Compression::kNone) {
      average(*group, delta, totals_);
    } else {
      for (std::size_t k = 0; k < n; ++k) v.carrier[k].mutable_grad() = delta[k];
      GradientExchange& x = *exchanges_[f];
      x.exchange(*group, v.carrier);  // each holder's gradient (delta[k]) becomes the ranks' average
      const ExchangeStats& last = x.last();
      totals_.bytes_sent += last.bytes_sent;
      totals_.bytes_received += last.bytes_received;
      totals_.compress_seconds += last.compress_seconds;
      totals_.communicate_seconds += last.communicate_seconds;
    }
  }
  // The outer step from the anchor; every rank starts its next steps from it.
  const OuterSpec& o = spec_.outer;
  for (std::size_t k = 0; k < n; ++k) {
    at::Tensor update = delta[k];
    if (o.momentum > 0) {
      at::Tensor& b = v.momentum[k];
      b.mul_(o.momentum).add_(delta[k]);
      update = o.nesterov ? delta[k].add(b, o.momentum) : b;
    }
    v.anchor[k].add_(update, -o.lr);
    outer_sq += o.lr * o.lr * update.to(at::kDouble).pow(2).sum().item<double>();
    v.param[k].copy_(v.anchor[k]);
  }
  ++totals_.fragment_syncs;
}

namespace {

std::vector<at::Tensor> joined(std::vector<at::Tensor> a, const std::vector<at::Tensor>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

LocalSgd::Global::Global(LocalSgd& sync)
    : swap_(joined(sync.params_, sync.buffers_), joined(sync.anchors_, sync.buffer_anchors_)) {}

}  // namespace bigbatch::distributed
