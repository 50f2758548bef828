// The LibTorch API differences between Debian's 1.13 and the 2.x shipped with
// PyTorch, isolated here so that nothing else in bigbatch tests versions.
// Built and tested against 1.13.1 (Debian), 2.11.0 and 2.15.0 (PyPI wheels;
// scripts/check_torch.sh). What bigbatch uses of c10d (TCPStore and its
// options, ProcessGroupGloo::Options and createDeviceForHostname,
// ProcessGroupNCCL::Options, Work::wait) compiles unchanged on all three, so
// nothing of c10d is here; neither is c10::optional (bigbatch uses std::optional
// throughout, which 2.x's c10::optional is an alias of).
#pragma once

#include <ATen/Functions.h>
#include <torch/expanding_array.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>

#include <cstdint>
#include <optional>
#include <variant>
#include <vector>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace bigbatch::compat {

/// Key type of `torch::optim::Optimizer::state()`: the TensorImpl address
/// printed as a string in 1.13, the address itself (`void*`) in 2.x.
using OptimizerStateKey = typename std::decay_t<
    decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

/// The key under which LibTorch's optimizers (and its serialize helpers)
/// store the state of parameter `p`.
/// (A template so that only the branch of the installed version is compiled.)
template <typename Key = OptimizerStateKey>
Key optimizer_state_key(const at::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;  // as c10::guts::to_string(TensorImpl*) in 1.13
    key << p.unsafeGetTensorImpl();
    return key.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

/// The explicit padding of convolution options (a c10::variant in 1.13, a
/// std::variant in 2.x, of ExpandingArray, kValid and kSame); nullopt for
/// "valid" and "same". (The unqualified get_if finds either through ADL.)
template <std::size_t D, typename Padding>
std::optional<std::vector<std::int64_t>> explicit_padding(const Padding& padding) {
  using std::get_if;
  if (const auto* a = get_if<torch::ExpandingArray<D>>(&padding)) return c10::IntArrayRef(*a).vec();
  return std::nullopt;
}

/// self[i] = lerp(self[i], end[i], weight), in place: torch._foreach_lerp_
/// (what torch.optim.swa_utils' EMA calls) in 2.x; tensor by tensor in 1.13,
/// which has no foreach lerp (2.x's CPU foreach runs the same per-tensor
/// kernel, so the bits agree there).
inline void foreach_lerp_(at::TensorList self, at::TensorList end, const at::Scalar& weight) {
#if TORCH_VERSION_MAJOR >= 2
  at::_foreach_lerp_(self, end, weight);
#else
  for (std::size_t i = 0; i < self.size(); ++i) self[i].lerp_(end[i], weight);
#endif
}

}  // namespace bigbatch::compat
