// Plumbing of the CPU runner (kernels/cpu/runner.h): dtype dispatch and
// the fp32 loads and stores of 16-bit storage.
#pragma once

#include "../common.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace bigbatch::kernels::cpu {

/// Calls f(T{}) with T the storage type of dtype.
template <typename F>
void dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: f(float{}); return;
    case DType::kBFloat16: f(c10::BFloat16{}); return;
    case DType::kFloat16: f(c10::Half{}); return;
  }
  TORCH_INTERNAL_ASSERT(false, "unknown kernels::DType ", static_cast<int>(dtype));
}

template <typename T>
inline float load(const T* p, std::int64_t i) { return static_cast<float>(p[i]); }
template <typename T>
inline void store(T* p, std::int64_t i, float x) { p[i] = static_cast<T>(x); }

}  // namespace bigbatch::kernels::cpu
