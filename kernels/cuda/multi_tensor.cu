// What the CUDA runner's instantiations share (runner.cuh): CUDA errors as
// exceptions, the capture check, and uploads by kernel arguments.
#include "runner.cuh"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace bigbatch::kernels::cuda {

void check(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  throw std::runtime_error(std::string("CUDA error ") + cudaGetErrorName(err) + " (" +
                           cudaGetErrorString(err) + ") in " + call + " at " + file + ":" +
                           std::to_string(line));
}

bool device_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

void check_not_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  BIGBATCH_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    throw std::runtime_error(
        "bigbatch: a CUDA graph captured an optimizer step whose tensors changed since the last "
        "step; run one step outside the capture first (its table is built then)");
  }
}

namespace {
// ----------------------------------------------------------------- upload ----
// Host data reaches the device as kernel arguments: the launch copies them,
// so the host buffer is free at once, nothing is pinned, and the upload is
// ordered on the stream (and captured into a graph like any kernel).

constexpr std::size_t kUploadBytes = 3968;  // with the other arguments, under the 4 KiB limit

struct UploadPayload {
  unsigned char bytes[kUploadBytes];
};

__global__ void upload_kernel(unsigned char* dst, UploadPayload payload, unsigned size) {
  for (unsigned i = threadIdx.x; i < size; i += blockDim.x) dst[i] = payload.bytes[i];
}

}  // namespace

int upload(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  int launches = 0;
  auto* out = static_cast<unsigned char*>(dst);
  const auto* in = static_cast<const unsigned char*>(src);
  for (std::size_t done = 0; done < bytes; done += kUploadBytes) {
    const std::size_t n = std::min(kUploadBytes, bytes - done);
    UploadPayload payload;
    std::memcpy(payload.bytes, in + done, n);
    launch_kernel(upload_kernel, dim3(1), dim3(kThreads), stream, out + done, payload, static_cast<unsigned>(n));
    BIGBATCH_CUDA_CHECK(cudaGetLastError());
    ++launches;
  }
  return launches;
}

}  // namespace bigbatch::kernels::cuda
