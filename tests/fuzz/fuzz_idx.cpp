// Fuzz target: the IDX reader of the datasets, gzipped or plain, through the
// file path the trainer uses (the input is written to a temporary file).
// Rejections must be std::runtime_error naming the file.
#include "../../experiments/io/idx.h"

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = "/tmp/bigbatch_fuzz_idx." + std::to_string(::getpid());
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    const auto a = bigbatch::experiments::read_idx(path);
    std::size_t count = 1;
    for (const auto d : a.dims) count *= static_cast<std::size_t>(d);
    if (count != a.data.size()) __builtin_trap();  // the reader promises dims match the data
  } catch (const std::runtime_error&) {
  }
  std::remove(path.c_str());
  return 0;
}
