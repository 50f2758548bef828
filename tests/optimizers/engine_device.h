// The device the fused multi-tensor CUDA step runs on in this test binary:
// a GPU in the optimizers_tests of a BIGBATCH_CUDA build (the _CUDA tests
// skip without one), the CPU in simt_optimizers_tests, where the same device
// code runs on the SIMT executor with CPU tensors as device memory.
#pragma once

#include <c10/core/Device.h>

#if defined(BIGBATCH_SIMT)
inline bool engine_available() { return true; }
inline c10::Device engine_device() { return c10::Device(c10::kCPU); }
#else
#include <torch/cuda.h>
inline bool engine_available() { return torch::cuda::is_available(); }
inline c10::Device engine_device() { return c10::Device(c10::kCUDA); }
#endif
