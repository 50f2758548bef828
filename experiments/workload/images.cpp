// The image workloads (images.h): the augmentation's geometry, CIFAR's
// binary records read whole into uint8 tensors (150 MB for CIFAR-10's
// 50,000 training images) and augmented per batch on the loader's threads,
// and the three registrations. The image folders are image_folder.cpp's.
#include "images.h"

#include "../io/files.h"
#include "../../config/json_reader.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>

namespace bigbatch::experiments {
namespace fs = std::filesystem;
using nlohmann::json;

// ------------------------------------------------------------ geometry --

namespace {

// The padded-crop-flip of one [C, H, W] image into `dst` (see pad_crop_flip).
void crop_into(const std::uint8_t* src, std::int64_t c, std::int64_t h, std::int64_t w, std::int64_t pad,
               std::int64_t dy, std::int64_t dx, bool flip, std::uint8_t* dst) {
  for (std::int64_t ch = 0; ch < c; ++ch) {
    for (std::int64_t y = 0; y < h; ++y) {
      const std::int64_t sy = y + dy - pad;
      std::uint8_t* row = dst + (ch * h + y) * w;
      if (sy < 0 || sy >= h) {
        std::fill(row, row + w, std::uint8_t{0});
        continue;
      }
      const std::uint8_t* from = src + (ch * h + sy) * w;
      for (std::int64_t x = 0; x < w; ++x) {
        const std::int64_t sx = (flip ? w - 1 - x : x) + dx - pad;
        row[x] = sx >= 0 && sx < w ? from[sx] : std::uint8_t{0};
      }
    }
  }
}

}  // namespace

std::int64_t round_half_even(double x) { return static_cast<std::int64_t>(std::nearbyint(x)); }

at::Tensor pad_crop_flip(const at::Tensor& image, std::int64_t pad, std::int64_t dy, std::int64_t dx, bool flip) {
  TORCH_CHECK(image.dim() == 3 && image.scalar_type() == at::kByte, "pad_crop_flip: needs a uint8 image [C, H, W], got ",
              image.scalar_type(), " ", image.sizes());
  TORCH_CHECK(pad >= 0 && dy >= 0 && dy <= 2 * pad && dx >= 0 && dx <= 2 * pad, "pad_crop_flip: offsets (", dy, ", ",
              dx, ") outside [0, ", 2 * pad, "]");
  const at::Tensor src = image.contiguous();
  at::Tensor out = at::empty_like(src);
  crop_into(src.data_ptr<std::uint8_t>(), src.size(0), src.size(1), src.size(2), pad, dy, dx, flip,
            out.data_ptr<std::uint8_t>());
  return out;
}

CropBox random_resized_box(std::int64_t height, std::int64_t width, ExampleRandom& random, double scale_min,
                           double scale_max, double ratio_min, double ratio_max) {
  const double area = static_cast<double>(height) * static_cast<double>(width);
  const double log_min = std::log(ratio_min), log_max = std::log(ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * (scale_min + (scale_max - scale_min) * random.uniform());
    const double aspect = std::exp(log_min + (log_max - log_min) * random.uniform());
    const std::int64_t w = round_half_even(std::sqrt(target * aspect)), h = round_half_even(std::sqrt(target / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const std::int64_t top = random.below(height - h + 1);
      const std::int64_t left = random.below(width - w + 1);
      return {top, left, h, w};
    }
  }
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  std::int64_t w = width, h = height;
  if (in_ratio < ratio_min) {
    h = round_half_even(static_cast<double>(w) / ratio_min);
  } else if (in_ratio > ratio_max) {
    w = round_half_even(static_cast<double>(h) * ratio_max);
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

at::Tensor normalize_images(const at::Tensor& images, const std::vector<double>& mean, const std::vector<double>& std) {
  TORCH_CHECK(images.dim() == 4 && images.size(1) == static_cast<std::int64_t>(mean.size()) &&
                  mean.size() == std.size(),
              "normalize_images: images ", images.sizes(), " and ", mean.size(), " channel means");
  const auto channels = static_cast<std::int64_t>(mean.size());
  const at::Tensor m = at::tensor(mean, at::kDouble).to(at::kFloat).view({1, channels, 1, 1});
  const at::Tensor s = at::tensor(std, at::kDouble).to(at::kFloat).view({1, channels, 1, 1});
  return images.to(at::kFloat).div_(255).sub_(m).div_(s);
}

at::Tensor normalize_images_serial(const at::Tensor& images, const std::vector<double>& mean,
                                   const std::vector<double>& std) {
  TORCH_CHECK(images.dim() == 4 && images.scalar_type() == at::kByte &&
                  images.size(1) == static_cast<std::int64_t>(mean.size()) && mean.size() == std.size(),
              "normalize_images_serial: uint8 images ", images.sizes(), " and ", mean.size(), " channel means");
  const at::Tensor src = images.contiguous();
  at::Tensor out = at::empty(src.sizes(), at::kFloat);
  const std::int64_t n = src.size(0), channels = src.size(1), plane = src.size(2) * src.size(3);
  const std::uint8_t* from = src.data_ptr<std::uint8_t>();
  float* to = out.data_ptr<float>();
  std::vector<float> table(256);
  for (std::int64_t c = 0; c < channels; ++c) {
    // The float operations normalize_images does, in its order: the same bits.
    const auto m = static_cast<float>(mean[static_cast<std::size_t>(c)]);
    const auto s = static_cast<float>(std[static_cast<std::size_t>(c)]);
    for (int b = 0; b < 256; ++b) table[static_cast<std::size_t>(b)] = (static_cast<float>(b) / 255.0f - m) / s;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t at = (i * channels + c) * plane;
      for (std::int64_t k = 0; k < plane; ++k) to[at + k] = table[from[at + k]];
    }
  }
  return out;
}

void require_folder(const std::string& path, const char* key) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return;
  throw std::runtime_error(std::string(key) + ": " + path + ": " +
                           (fs::exists(path, ec) ? std::string("not a folder")
                                                 : "cannot open (" + std::string(std::strerror(ENOENT)) + ")"));
}

// --------------------------------------------------------------- CIFAR --

namespace {

// The commonly used per-channel statistics of the training images (pixels in [0, 1]).
const std::vector<double> kCifar10Mean{0.4914, 0.4822, 0.4465}, kCifar10Std{0.2470, 0.2435, 0.2616};
const std::vector<double> kCifar100Mean{0.5071, 0.4865, 0.4409}, kCifar100Std{0.2673, 0.2564, 0.2762};

constexpr std::int64_t kCifarPixels = 3 * 32 * 32;

[[noreturn]] void data_error(const std::string& message) { throw std::runtime_error(message); }

// Images [N, 3, 32, 32] uint8 and labels [N] int64 of CIFAR binary files:
// records of `label_bytes` label bytes then 3072 pixel bytes (the red,
// green and blue planes, rows top to bottom), the label at `label_at`.
struct Records {
  at::Tensor images, labels;
};

Records read_records(const std::vector<std::string>& paths, std::int64_t label_bytes, std::int64_t label_at,
                     const std::vector<std::int64_t>& label_limits) {
  const std::int64_t record = label_bytes + kCifarPixels;
  std::vector<std::string> files;
  std::int64_t total = 0;
  for (const auto& p : paths) {
    try {
      files.push_back(read_file(p));  // ("<path>: cannot read: <reason>")
    } catch (const std::runtime_error& e) {
      data_error(std::string("dataset.path: ") + e.what());
    }
    const auto size = static_cast<std::int64_t>(files.back().size());
    if (size == 0 || size % record != 0) {
      data_error("dataset.path: " + p + ": " + std::to_string(size) + " bytes is not a whole number of " +
                 std::to_string(record) + "-byte records (truncated, or not this CIFAR's binary version)");
    }
    total += size / record;
  }
  Records r{at::empty({total, 3, 32, 32}, at::kByte), at::empty({total}, at::kLong)};
  std::uint8_t* image = r.images.data_ptr<std::uint8_t>();
  std::int64_t* label = r.labels.data_ptr<std::int64_t>();
  for (std::size_t f = 0; f < files.size(); ++f) {
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(files[f].data());
    const auto n = static_cast<std::int64_t>(files[f].size()) / record;
    for (std::int64_t i = 0; i < n; ++i, image += kCifarPixels) {
      const std::uint8_t* rec = bytes + i * record;
      for (std::int64_t b = 0; b < label_bytes; ++b) {
        if (rec[b] >= label_limits[static_cast<std::size_t>(b)]) {
          data_error("dataset.path: " + paths[f] + ": record " + std::to_string(i) + ": label " +
                     std::to_string(rec[b]) + " is not in [0, " + std::to_string(label_limits[static_cast<std::size_t>(b)]) +
                     ")");
        }
      }
      *label++ = rec[label_at];
      std::memcpy(image, rec + label_bytes, kCifarPixels);
    }
  }
  return r;
}

// In-memory uint8 images, normalized as fetched; with augmentation, the
// padded crop and flip of each training example drawn from (draw, example).
class ImageTensorExamples final : public Examples {
 public:
  ImageTensorExamples(at::Tensor images, at::Tensor labels, std::vector<double> mean, std::vector<double> std,
                      std::int64_t pad, bool flip)
      : images_(std::move(images)), labels_(std::move(labels)), mean_(std::move(mean)), std_(std::move(std)),
        pad_(pad), flip_(flip) {}
  std::int64_t size() const override { return images_.size(0); }
  Batch get(const at::Tensor& index) const override {
    return {normalize_images(images_.index_select(0, index), mean_, std_), labels_.index_select(0, index)};
  }
  Batch range(std::int64_t begin, std::int64_t end) const override {
    return {normalize_images(images_.slice(0, begin, end), mean_, std_), labels_.slice(0, begin, end)};
  }
  Batch augmented(const at::Tensor& index, const Draw& draw) const override {
    if (!costly()) return get(index);
    const at::Tensor i = index.to(at::kLong).contiguous();
    const std::int64_t n = i.numel(), c = images_.size(1), h = images_.size(2), w = images_.size(3);
    at::Tensor out = at::empty({n, c, h, w}, at::kByte);
    const std::int64_t* p = i.data_ptr<std::int64_t>();
    const std::uint8_t* src = images_.data_ptr<std::uint8_t>();
    std::uint8_t* dst = out.data_ptr<std::uint8_t>();
    for (std::int64_t k = 0; k < n; ++k) {
      TORCH_CHECK(p[k] >= 0 && p[k] < size(), "image examples: index ", p[k], " outside [0, ", size(), ")");
      ExampleRandom random(draw, p[k]);
      const std::int64_t dy = random.below(2 * pad_ + 1), dx = random.below(2 * pad_ + 1);
      const bool flip = flip_ && random.below(2) == 1;
      crop_into(src + p[k] * c * h * w, c, h, w, pad_, dy, dx, flip, dst + k * c * h * w);
    }
    return {normalize_images_serial(out, mean_, std_), labels_.index_select(0, i)};
  }
  bool costly() const override { return pad_ > 0 || flip_; }

 private:
  at::Tensor images_, labels_;
  std::vector<double> mean_, std_;
  std::int64_t pad_;
  bool flip_;
};

}  // namespace

WorkloadData load_cifar(const CifarSpec& s) {
  TORCH_CHECK(s.classes == 10 || s.classes == 100, "CIFAR: classes must be 10 or 100, got ", s.classes);
  require_folder(s.path, "dataset.path");
  const fs::path dir(s.path);
  Records train, test;
  std::int64_t classes = s.classes;
  if (s.classes == 10) {
    std::vector<std::string> batches;
    for (int k = 1; k <= 5; ++k) batches.push_back((dir / ("data_batch_" + std::to_string(k) + ".bin")).string());
    train = read_records(batches, 1, 0, {10});
    test = read_records({(dir / "test_batch.bin").string()}, 1, 0, {10});
  } else {
    const std::int64_t at = s.fine_labels ? 1 : 0;
    classes = s.fine_labels ? 100 : 20;
    train = read_records({(dir / "train.bin").string()}, 2, at, {20, 100});
    test = read_records({(dir / "test.bin").string()}, 2, at, {20, 100});
  }
  const std::int64_t n = train.images.size(0);
  if (s.validation < 0 || s.validation >= n) {
    data_error("dataset.validation: " + std::to_string(s.validation) + " is not in [0, " + std::to_string(n) +
               ") (the training records in " + s.path + ")");
  }
  // Held out: the first `validation` of a permutation drawn from split_seed;
  // both parts keep the files' order.
  const at::Tensor order = at::randperm(n, at::detail::createCPUGenerator(s.split_seed), at::kLong);
  const at::Tensor held = std::get<0>(order.slice(0, 0, s.validation).sort());
  const at::Tensor kept = std::get<0>(order.slice(0, s.validation, n).sort());
  const auto& mean = s.classes == 10 ? kCifar10Mean : kCifar100Mean;
  const auto& std = s.classes == 10 ? kCifar10Std : kCifar100Std;
  const std::int64_t pad = s.augment ? 4 : 0;
  WorkloadData d;
  d.classes = classes;
  d.train = std::make_shared<ImageTensorExamples>(train.images.index_select(0, kept), train.labels.index_select(0, kept),
                                                  mean, std, pad, s.augment);
  // (with no records held out, the test files validate: say so in the docs)
  d.validation = s.validation > 0 ? std::make_shared<ImageTensorExamples>(train.images.index_select(0, held),
                                                                         train.labels.index_select(0, held), mean, std,
                                                                         0, false)
                                  : std::make_shared<ImageTensorExamples>(test.images, test.labels, mean, std, 0, false);
  d.test = std::make_shared<ImageTensorExamples>(test.images, test.labels, mean, std, 0, false);
  return d;
}

// -------------------------------------------------------- registrations --

namespace {

CifarSpec cifar_spec(std::int64_t classes, const json& params) {
  config::JsonReader r(params, "dataset");
  CifarSpec s;
  s.classes = classes;
  s.path = r.string("path");
  s.validation = r.integer("validation", s.validation);
  if (s.validation < 0) config::config_error(r.path_of("validation"), "must be >= 0, got " + std::to_string(s.validation));
  s.split_seed = static_cast<std::uint64_t>(r.integer("split_seed", 0));
  s.augment = r.boolean("augment", s.augment);
  if (classes == 100) {
    const std::string labels = r.string("labels", "fine");
    if (labels != "fine" && labels != "coarse") {
      config::config_error(r.path_of("labels"), "unknown value \"" + labels + "\" (one of: fine, coarse)");
    }
    s.fine_labels = labels == "fine";
  }
  r.finish();
  return s;
}

json cifar_json(const CifarSpec& s) {
  json j = {{"path", s.path}, {"validation", s.validation}, {"split_seed", s.split_seed}, {"augment", s.augment}};
  if (s.classes == 100) j["labels"] = s.fine_labels ? "fine" : "coarse";
  return j;
}

ImageFolderSpec folder_spec(const json& params) {
  config::JsonReader r(params, "dataset");
  ImageFolderSpec s;
  s.path = r.string("path");
  s.validation_path = r.string("validation_path", "");
  s.test_path = r.string("test_path", "");
  s.validation_fraction = r.number("validation_fraction", s.validation_fraction);
  if (!(s.validation_fraction > 0 && s.validation_fraction < 1)) {
    config::config_error(r.path_of("validation_fraction"), "must be in (0, 1), got " + std::to_string(s.validation_fraction));
  }
  s.split_seed = static_cast<std::uint64_t>(r.integer("split_seed", 0));
  s.size = r.integer("size", s.size);
  if (s.size < 1) config::config_error(r.path_of("size"), "must be >= 1, got " + std::to_string(s.size));
  s.resize = r.integer("resize", round_half_even(static_cast<double>(s.size) / 0.875));
  if (s.resize < s.size) {
    config::config_error(r.path_of("resize"), "must be >= size (" + std::to_string(s.size) + "), got " +
                                                  std::to_string(s.resize));
  }
  s.augment = r.boolean("augment", s.augment);
  s.verify = r.boolean("verify", s.verify);
  const auto three = [&](const char* key, std::array<double, 3>& to, bool positive) {
    const auto v = r.numbers(key, {to.begin(), to.end()});
    if (v.size() != 3) config::config_error(r.path_of(key), "needs 3 values (R, G, B), got " + std::to_string(v.size()));
    for (std::size_t c = 0; c < 3; ++c) {
      if (positive && !(v[c] > 0)) config::config_error(r.path_of(key), "values must be > 0, got " + std::to_string(v[c]));
      to[c] = v[c];
    }
  };
  three("mean", s.mean, false);
  three("std", s.std, true);
  r.finish();
  return s;
}

json folder_json(const ImageFolderSpec& s) {
  return {{"path", s.path},
          {"validation_path", s.validation_path},
          {"test_path", s.test_path},
          {"validation_fraction", s.validation_fraction},
          {"split_seed", s.split_seed},
          {"size", s.size},
          {"resize", s.resize},
          {"augment", s.augment},
          {"verify", s.verify},
          {"mean", s.mean},
          {"std", s.std}};
}

}  // namespace

std::vector<DatasetRegistration> image_datasets() {
  std::vector<DatasetRegistration> out;
  for (const std::int64_t classes : {10, 100}) {
    out.push_back({"cifar" + std::to_string(classes),
                   [classes](const json& p) { return cifar_json(cifar_spec(classes, p)); },
                   [classes](const json& p) { return load_cifar(cifar_spec(classes, p)); }});
  }
  out.push_back({"image_folder", [](const json& p) { return folder_json(folder_spec(p)); },
                 [](const json& p) { return load_image_folder(folder_spec(p)); }});
  return out;
}

}  // namespace bigbatch::experiments
