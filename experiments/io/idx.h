// Reading the IDX files of MNIST and Fashion-MNIST (LeCun's format), gzipped
// as Debian's dataset-fashion-mnist ships them. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bigbatch::experiments {

/// An unsigned-byte IDX array: its dimensions and its elements in row-major order.
struct IdxArray {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> data;
};

/// Reads a gzipped (or plain) IDX file of unsigned bytes. Throws
/// std::runtime_error naming the file and what is wrong with it.
IdxArray read_idx(const std::string& path);

/// Where Fashion-MNIST lives: $BIGBATCH_FASHION_MNIST_DIR, else
/// /usr/share/datasets/fashion-mnist (Debian package dataset-fashion-mnist).
std::string fashion_mnist_dir();

/// The four Fashion-MNIST arrays: train/test images (N x 28 x 28) and labels.
struct FashionMnist {
  IdxArray train_images, train_labels, test_images, test_labels;
};

/// Loads Fashion-MNIST from `dir`. A missing file is an error that names the
/// file and the Debian package that provides it.
FashionMnist load_fashion_mnist(const std::string& dir = fashion_mnist_dir());

}  // namespace bigbatch::experiments
