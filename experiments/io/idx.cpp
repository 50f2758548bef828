// IDX reader (idx.h): header "0 0 type ndims", big-endian dimensions, bytes.
#include "idx.h"

#include <zlib.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <system_error>

namespace bigbatch::experiments {
namespace {

// Reads the whole file, inflating it if it is gzipped (gzread passes plain files through).
std::vector<std::uint8_t> read_all(const std::string& path) {
  errno = 0;
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path.c_str(), "rb"), gzclose);
  if (!file) {
    throw std::runtime_error(path + ": cannot open" +
                             (errno != 0 ? ": " + std::generic_category().message(errno) : std::string()));
  }
  std::vector<std::uint8_t> bytes;
  std::uint8_t buffer[1 << 16];
  for (;;) {
    const int n = gzread(file.get(), buffer, sizeof buffer);
    if (n < 0) throw std::runtime_error(path + ": not a readable gzip or IDX file");
    if (n == 0) break;
    bytes.insert(bytes.end(), buffer, buffer + n);
  }
  return bytes;
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  const auto bytes = read_all(path);
  if (bytes.size() < 4 || bytes[0] != 0 || bytes[1] != 0) {
    throw std::runtime_error(path + ": not an IDX file (bad magic number)");
  }
  if (bytes[2] != 0x08) throw std::runtime_error(path + ": IDX element type is not unsigned byte");
  const std::size_t ndims = bytes[3];
  if (bytes.size() < 4 + 4 * ndims) throw std::runtime_error(path + ": truncated IDX header");
  IdxArray out;
  const std::size_t offset = 4 + 4 * ndims;
  const std::size_t held = bytes.size() - offset;
  // The product of the dimensions, which can exceed 64 bits (up to 255 of
  // them, each < 2^32): only whether it equals `held` matters.
  std::size_t count = 1;
  bool more = false;  // the product exceeds `held`, unless a later dimension is 0
  for (std::size_t d = 0; d < ndims; ++d) {
    const std::uint8_t* p = &bytes[4 + 4 * d];
    const std::uint32_t dim =
        (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
    out.dims.push_back(dim);
    if (dim == 0) {
      count = 0;
      more = false;
    } else if (count != 0 && (more || count > held / dim)) {
      more = true;
    } else {
      count *= dim;
    }
  }
  if (more || count != held) {
    throw std::runtime_error(path + ": holds " + std::to_string(held) + " elements, its header says " +
                             (more ? "more" : std::to_string(count)));
  }
  out.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(offset), bytes.end());
  return out;
}

std::string fashion_mnist_dir() {
  const char* env = std::getenv("BIGBATCH_FASHION_MNIST_DIR");
  return env != nullptr && *env != '\0' ? env : "/usr/share/datasets/fashion-mnist";
}

FashionMnist load_fashion_mnist(const std::string& dir) {
  const auto load = [&](const char* name) {
    const std::string path = dir + "/" + name;
    if (!std::filesystem::exists(path)) {
      throw std::runtime_error("Fashion-MNIST file " + path +
                               " is missing: install the Debian package dataset-fashion-mnist "
                               "or set BIGBATCH_FASHION_MNIST_DIR");
    }
    return read_idx(path);
  };
  FashionMnist d{load("train-images-idx3-ubyte.gz"), load("train-labels-idx1-ubyte.gz"),
                 load("t10k-images-idx3-ubyte.gz"), load("t10k-labels-idx1-ubyte.gz")};
  if (d.train_images.dims.size() != 3 || d.train_images.dims[0] != d.train_labels.dims.at(0) ||
      d.test_images.dims.size() != 3 || d.test_images.dims[0] != d.test_labels.dims.at(0)) {
    throw std::runtime_error("Fashion-MNIST in " + dir + ": image and label counts disagree");
  }
  return d;
}

}  // namespace bigbatch::experiments
