// Helpers for the optimizer .cpp files only (not installed): option checks,
// the reference path's finiteness test, and serialize/compare over the one
// list of fields of each options or state type.
#pragma once

#include "layerwise_optimizer.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <type_traits>
#include <vector>

namespace bigbatch::optim::internal {

/// Throws "Invalid LAMB option eps: -1 (must be >= 0)" (an OptionError,
/// whose parts the runner reports at the config key).
template <typename T>
void check_option(bool ok, const char* optimizer, const char* option, const T& value,
                  const char* requirement) {
  if (!ok) throw OptionError(optimizer, option, c10::str(value), requirement);
}

inline void check_nonnegative(const char* optimizer, const char* option, double value) {
  check_option(value >= 0, optimizer, option, value, ">= 0");  // false for NaN too
}

inline void check_betas(const char* optimizer, const std::tuple<double, double>& betas) {
  const auto [b1, b2] = betas;
  check_option(b1 >= 0 && b1 < 1, optimizer, "betas[0]", b1, "in [0, 1)");
  check_option(b2 >= 0 && b2 < 1, optimizer, "betas[1]", b2, "in [0, 1)");
}

/// LARS's and LARC's rule for whether a group's update gets the trust ratio:
/// adapt, and where always_adapt is false only with weight decay (timm's).
template <typename Options>
bool adapts(const Options& o) {
  return o.adapt() && (o.always_adapt() || o.weight_decay() != 0);
}

// The reference paths write products out (x * (a * b)) rather than using
// add_(x, alpha) or addcmul_: ATen's vectorized forms of those fuse a
// multiply-add, which would make the two paths round differently.

/// Reference path: whether every element of a gradient is finite.
inline bool all_finite(const at::Tensor& g) { return at::isfinite(g).all().item<bool>(); }

/// Reference path, for a step without a norm pass: whether each group's
/// gradients are all finite, checked only in the groups that ask for
/// skip_nonfinite (true elsewhere). What LayerwiseOptimizer::skip_nonfinite takes.
template <typename Group>
std::vector<bool> finite_gradients(const std::vector<Group>& groups) {
  std::vector<bool> finite(groups.size(), true);
  for (std::size_t i = 0; i < groups.size(); ++i) {
    if (!groups[i].options->skip_nonfinite()) continue;
    for (const auto& pg : groups[i].params) finite[i] = finite[i] && all_finite(pg.grad);
  }
  return finite;
}

/// Reference path: the L2 norm of a tensor, accumulated in double as the
/// fused kernels do, so a finite gradient never has an infinite norm.
inline double norm_of(const at::Tensor& t) { return t.to(at::kDouble).norm().item<double>(); }

inline bool same_value(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() == b.defined() && (!a.defined() || at::equal(a, b));
}
template <typename T>
bool same_value(const T& a, const T& b) { return a == b; }

/// One option or state field: its archive key and a reference to it; a state
/// tensor that is not shaped like the parameter says how (StateField::Shape:
/// kPerTensor, kOwn).
template <typename T>
struct Field {
  const char* name;
  T& value;
  StateField::Shape tensor_shape = StateField::Shape::kLikeParam;
};
template <typename T>
Field<T> field(const char* name, T& value) {
  return {name, value};
}
/// The tag of a state tensor that holds one number per parameter tensor.
struct PerTensor {};
inline constexpr PerTensor per_tensor{};
template <typename T>
Field<T> field(const char* name, T& value, PerTensor) {
  return {name, value, StateField::Shape::kPerTensor};
}
/// The tag of a state tensor of a shape of its own (StateField::Shape::kOwn).
struct OwnShape {};
inline constexpr OwnShape own_shape{};
template <typename T>
Field<T> field(const char* name, T& value, OwnShape) {
  return {name, value, StateField::Shape::kOwn};
}

/// A state type's fields as StateField says them (integers are counts, doubles numbers).
template <typename Fields>
std::vector<StateField> state_fields_of(const Fields& fields) {
  std::vector<StateField> out;
  std::apply([&](const auto&... f) {
    ((void)[&] {
      using T = std::remove_cv_t<std::remove_reference_t<decltype(f.value)>>;
      const auto shape = std::is_base_of_v<at::Tensor, T> ? f.tensor_shape
                         : std::is_floating_point_v<T>    ? StateField::Shape::kNumber
                                                          : StateField::Shape::kCount;
      out.push_back({f.name, shape});
    }(), ...);
  }, fields);
  return out;
}

/// The fields as (name, value) pairs, in order; an undefined tensor is left out.
template <typename Fields>
NamedState named_values(const Fields& fields) {
  NamedState out;
  std::apply([&](const auto&... f) {
    ((void)[&] {
      c10::IValue value(f.value);
      if (!(value.isTensor() && !value.toTensor().defined())) out.emplace_back(f.name, std::move(value));
    }(), ...);
  }, fields);
  return out;
}

/// Sets every field from (name, value) pairs as named_values gives them; a
/// tensor left out becomes undefined, any other field must be there.
template <typename Fields>
void set_named_values(const Fields& fields, const NamedState& values) {
  std::apply([&](const auto&... f) {
    ((void)[&] {
      using T = std::remove_reference_t<decltype(f.value)>;
      const auto it = std::find_if(values.begin(), values.end(), [&](const auto& v) { return v.first == f.name; });
      if (it != values.end()) {
        f.value = it->second.template to<T>();
      } else {
        TORCH_CHECK((std::is_base_of_v<at::Tensor, T>), "optimizer state: no value for '", f.name, "'");
        f.value = T();
      }
    }(), ...);
  }, fields);
}

/// Writes every field as LibTorch's optimizers do (an undefined tensor is left out).
template <typename Fields>
void write_fields(torch::serialize::OutputArchive& archive, const Fields& fields) {
  for (const auto& [name, value] : named_values(fields)) archive.write(name, value);
}

/// Reads every field back; only a tensor may be missing (it was undefined).
template <typename Fields>
void read_fields(torch::serialize::InputArchive& archive, const Fields& fields) {
  std::apply([&](const auto&... f) {
    ((void)[&] {
      using T = std::remove_reference_t<decltype(f.value)>;
      c10::IValue value;
      if (archive.try_read(f.name, value)) {
        f.value = value.to<T>();
      } else {
        TORCH_CHECK((std::is_base_of_v<at::Tensor, T>), "optimizer archive: no value for '", f.name, "'");
      }
    }(), ...);
  }, fields);
}

/// Whether two objects' fields are equal, field by field (tensors: same definedness and values).
template <typename Fields>
bool same_fields(const Fields& a, const Fields& b) {
  return std::apply([&](const auto&... fa) {
    return std::apply([&](const auto&... fb) { return (same_value(fa.value, fb.value) && ...); }, b);
  }, a);
}

/// Bytes of the defined tensors among the fields.
template <typename Fields>
std::int64_t tensor_bytes(const Fields& fields) {
  std::int64_t bytes = 0;
  std::apply([&](const auto&... f) {
    ((void)[&] {
      using T = std::remove_cv_t<std::remove_reference_t<decltype(f.value)>>;
      if constexpr (std::is_base_of_v<at::Tensor, T>) {
        if (f.value.defined()) bytes += static_cast<std::int64_t>(f.value.nbytes());
      }
    }(), ...);
  }, fields);
  return bytes;
}

}  // namespace bigbatch::optim::internal

// Defines serialize (both directions) and operator== of an options or state
// type from its private static `fields(self)`, which lists every field once
// (a structured binding: a field added to the type and not there does not compile).
#define BIGBATCH_DEFINE_FIELD_IO(Name)                                                                 \
  void Name::serialize(torch::serialize::OutputArchive& archive) const {                              \
    ::bigbatch::optim::internal::write_fields(archive, fields(*this));                                 \
  }                                                                                                    \
  void Name::serialize(torch::serialize::InputArchive& archive) {                                     \
    ::bigbatch::optim::internal::read_fields(archive, fields(*this));                                  \
  }                                                                                                    \
  bool operator==(const Name& lhs, const Name& rhs) {                                                  \
    return ::bigbatch::optim::internal::same_fields(Name::fields(lhs), Name::fields(rhs));              \
  }

// Defines a state type's tensor_bytes(), named(), set_named() and declared()
// from the same fields(self).
#define BIGBATCH_DEFINE_STATE_ACCESS(Name)                                                             \
  std::vector<::bigbatch::optim::StateField> Name::declared() {                                        \
    Name blank;                                                                                        \
    return ::bigbatch::optim::internal::state_fields_of(fields(blank));                                \
  }                                                                                                    \
  std::int64_t Name::tensor_bytes() const { return ::bigbatch::optim::internal::tensor_bytes(fields(*this)); } \
  ::bigbatch::optim::NamedState Name::named() const {                                                  \
    return ::bigbatch::optim::internal::named_values(fields(*this));                                   \
  }                                                                                                    \
  void Name::set_named(const ::bigbatch::optim::NamedState& values) {                                  \
    ::bigbatch::optim::internal::set_named_values(fields(*this), values);                              \
  }
