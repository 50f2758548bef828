// Helpers for the optimizer .cpp files only (not installed): option checks,
// the reference path's finiteness test, and the serialize/compare functions
// generated from one list of fields per options or state type.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>

#include <cmath>
#include <tuple>

namespace bigbatch::optim::internal {

/// Throws "Invalid LAMB option eps: -1 (must be >= 0)" style errors.
template <typename T>
void check_option(bool ok, const char* optimizer, const char* option, const T& value,
                  const char* requirement) {
  TORCH_CHECK(ok, "Invalid ", optimizer, " option ", option, ": ", value, " (must be ",
              requirement, ")");
}

inline void check_nonnegative(const char* optimizer, const char* option, double value) {
  check_option(value >= 0, optimizer, option, value, ">= 0");  // false for NaN too
}

inline void check_betas(const char* optimizer, const std::tuple<double, double>& betas) {
  const auto [b1, b2] = betas;
  check_option(b1 >= 0 && b1 < 1, optimizer, "betas[0]", b1, "in [0, 1)");
  check_option(b2 >= 0 && b2 < 1, optimizer, "betas[1]", b2, "in [0, 1)");
}

// The reference paths write products out (x * (a * b)) rather than using
// add_(x, alpha) or addcmul_: ATen's vectorized forms of those fuse a
// multiply-add, which would make the two paths round differently.

/// Reference path: whether every element of a gradient is finite.
inline bool all_finite(const at::Tensor& g) { return at::isfinite(g).all().item<bool>(); }

/// Reference path: the L2 norm of a tensor, accumulated in double as the
/// fused kernels do, so a finite gradient never has an infinite norm.
inline double norm_of(const at::Tensor& t) { return t.to(at::kDouble).norm().item<double>(); }

inline bool same_value(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() == b.defined() && (!a.defined() || at::equal(a, b));
}
template <typename T>
bool same_value(const T& a, const T& b) { return a == b; }

}  // namespace bigbatch::optim::internal

#define BIGBATCH_WRITE_FIELD(T, name) _TORCH_OPTIM_SERIALIZE_TORCH_ARG(name)
#define BIGBATCH_READ_FIELD(T, name) _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(T, name)
#define BIGBATCH_SAME_FIELD(T, name) &&::bigbatch::optim::internal::same_value(lhs.name(), rhs.name())

// Defines serialize (both directions) and operator== of an options or state
// type from FIELDS(X), a macro calling X(type, name) once per field.
#define BIGBATCH_DEFINE_FIELD_IO(Name, FIELDS)                                    \
  void Name::serialize(torch::serialize::OutputArchive& archive) const {         \
    FIELDS(BIGBATCH_WRITE_FIELD)                                                  \
  }                                                                               \
  void Name::serialize(torch::serialize::InputArchive& archive) {                \
    FIELDS(BIGBATCH_READ_FIELD)                                                   \
  }                                                                               \
  bool operator==(const Name& lhs, const Name& rhs) { return true FIELDS(BIGBATCH_SAME_FIELD); }
