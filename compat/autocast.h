// Autocast from C++ (what torch.autocast is in Python): while an
// AutocastGuard lives, the ops ATen lists for it run in a lower precision on
// one device type (matrix products and convolutions in bf16 or fp16; the
// losses, norms and reductions it lists in fp32), and leaf fp32 tensors
// (the parameters) are cast once per region and cached. Apart from
// torch_compat.h because it needs ATen's autocast header; the API differs
// between 1.13 (is_cpu_enabled, set_autocast_cpu_dtype, ...) and 2.x
// (is_autocast_enabled(device), set_autocast_dtype(device, dtype)).
#pragma once

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

namespace bigbatch::compat {

/// Whether this LibTorch autocasts ops on `device` to `dtype`: CUDA to bf16
/// and fp16; the CPU to bf16, and to fp16 from 2.5 on (the first release
/// whose CPU autocast documents fp16; 1.13's to 2.4's take bf16 alone or
/// cast only part of the ops).
inline bool autocast_supports(c10::DeviceType device, at::ScalarType dtype) {
  if (dtype != at::kBFloat16 && dtype != at::kHalf) return false;
  if (device == c10::DeviceType::CUDA) return true;
  constexpr bool cpu_fp16 = TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5);
  return device == c10::DeviceType::CPU && (dtype == at::kBFloat16 || cpu_fp16);
}

/// Autocast on `device` to `dtype` for the guard's lifetime; the previous
/// state comes back after, and the cast weights are dropped when the
/// outermost region ends (the next region casts the updated weights anew).
/// Forward passes run under it; backward runs outside, in the dtypes the
/// forward chose.
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device, at::ScalarType dtype) : device_(device) {
    TORCH_CHECK(autocast_supports(device, dtype), "autocast: this LibTorch (", TORCH_VERSION,
                ") does not autocast ", c10::DeviceTypeName(device), " ops to ", c10::toString(dtype));
    was_enabled_ = enabled(device);
    was_dtype_ = dtype_of(device);
    set(device, true, dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    set(device_, was_enabled_, was_dtype_);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  // 2.4 on: one set of functions for every device type.
  static bool enabled(c10::DeviceType device) { return at::autocast::is_autocast_enabled(device); }
  static at::ScalarType dtype_of(c10::DeviceType device) { return at::autocast::get_autocast_dtype(device); }
  static void set(c10::DeviceType device, bool on, at::ScalarType dtype) {
    at::autocast::set_autocast_dtype(device, dtype);
    at::autocast::set_autocast_enabled(device, on);
  }
#else
  // Before: one set per device type.
  static bool enabled(c10::DeviceType device) {
    return device == c10::DeviceType::CUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
  }
  static at::ScalarType dtype_of(c10::DeviceType device) {
    return device == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                           : at::autocast::get_autocast_cpu_dtype();
  }
  static void set(c10::DeviceType device, bool on, at::ScalarType dtype) {
    if (device == c10::DeviceType::CUDA) {
      at::autocast::set_autocast_gpu_dtype(dtype);
      at::autocast::set_enabled(on);
    } else {
      at::autocast::set_autocast_cpu_dtype(dtype);
      at::autocast::set_cpu_enabled(on);
    }
  }
#endif

  c10::DeviceType device_;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kBFloat16;
};

}  // namespace bigbatch::compat
