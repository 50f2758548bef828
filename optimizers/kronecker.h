// The batched products of the Kronecker-factored optimizers (SOAP, Shampoo):
// a batch of same-shape tensors x (k, s_1, ..., s_n), contiguous, contracted
// along one dimension against a batch of square matrices, and the factor
// products G_(d) G_(d)^T. The first and the last dimension are one batched
// product on x as it lies; another is moved last first. Internal to
// optimizers/.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/bmm.h>

#include <cstdint>
#include <vector>

namespace bigbatch::optim::kronecker {

/// x with dimension d (of the tensors) contracted against the batch q
/// (k, s, s): Q^T along d forward (into SOAP's eigenbasis), Q back; for a
/// symmetric Q (Shampoo's inverse roots) the two agree.
inline at::Tensor rotate_along(const at::Tensor& x, std::int64_t d, const at::Tensor& q, bool forward) {
  const std::int64_t k = x.size(0), s = q.size(-1), last = x.dim() - 2;
  const at::Tensor qt = q.transpose(1, 2);
  if (d == 0) return at::bmm(forward ? qt : q, x.view({k, s, -1})).view(x.sizes());
  if (d == last) return at::bmm(x.view({k, -1, s}), forward ? q : qt).view(x.sizes());
  const at::Tensor moved = x.movedim(d + 1, -1).contiguous();
  return at::bmm(moved.view({k, -1, s}), forward ? q : qt).view(moved.sizes()).movedim(-1, d + 1).contiguous();
}

/// rotate_along over every dimension that has a matrix (undefined: skipped).
inline at::Tensor rotate_batch(at::Tensor x, const std::vector<at::Tensor>& bases, bool forward) {
  for (std::size_t d = 0; d < bases.size(); ++d) {
    if (bases[d].defined()) x = rotate_along(x, static_cast<std::int64_t>(d), bases[d], forward);
  }
  return x;
}

/// G_(d) G_(d)^T of each tensor of a batch (G unfolded along d times its
/// transpose): (k, s_d, s_d).
inline at::Tensor outer_along_batch(const at::Tensor& g, std::int64_t d) {
  const std::int64_t k = g.size(0), s = g.size(d + 1), last = g.dim() - 2;
  if (d == 0) {
    const at::Tensor x = g.view({k, s, -1});
    return at::bmm(x, x.transpose(1, 2));
  }
  if (d == last) {
    const at::Tensor x = g.view({k, -1, s});
    return at::bmm(x.transpose(1, 2), x);
  }
  const at::Tensor x = g.movedim(d + 1, 1).reshape({k, s, -1});
  return at::bmm(x, x.transpose(1, 2));
}

}  // namespace bigbatch::optim::kronecker
