// The image-folder dataset (images.h): folders listed at load and each
// image decoded for every batch by OpenCV's imgcodecs (over libjpeg-turbo
// and libpng) on the loader's threads. Built with OpenCV when CMake finds
// its codecs (BIGBATCH_HAVE_OPENCV); without them "image_folder" says so
// in one line.
#include "images.h"

#include "../io/files.h"

#include <c10/util/Exception.h>

#include <stdexcept>

#if BIGBATCH_HAVE_OPENCV

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

namespace bigbatch::experiments {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

[[noreturn]] void data_error(const std::string& message) { throw std::runtime_error(message); }

}  // namespace

// ------------------------------------------------------- image folders --

namespace {

bool image_file(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

// The class folders of `root` (sorted) and their images (sorted within each).
struct Listing {
  std::vector<std::string> classes;
  std::vector<std::string> files;
  std::vector<std::int64_t> labels;
};

Listing list_folder(const std::string& root, const char* key) {
  require_folder(root, key);
  Listing l;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (entry.is_directory()) l.classes.push_back(entry.path().filename().string());
  }
  std::sort(l.classes.begin(), l.classes.end());
  if (l.classes.empty()) data_error(std::string(key) + ": " + root + ": no class folders (expected <path>/<class>/<image>)");
  for (std::size_t c = 0; c < l.classes.size(); ++c) {
    for (auto& f : files_under((fs::path(root) / l.classes[c]).string())) {
      if (!image_file(f)) continue;
      l.files.push_back(std::move(f));
      l.labels.push_back(static_cast<std::int64_t>(c));
    }
  }
  if (l.files.empty()) data_error(std::string(key) + ": " + root + ": no .jpg, .jpeg or .png images in its class folders");
  return l;
}

// An RGB image (8-bit, 3 channels) decoded from `path`; empty when the file
// cannot be read or decoded. EXIF orientation is ignored, as PIL does.
cv::Mat decode(const std::string& path) {
  std::string bytes;
  try {
    bytes = read_file(path);
  } catch (const std::runtime_error&) {
    return {};
  }
  if (bytes.empty()) return {};
  const cv::Mat raw(1, static_cast<int>(bytes.size()), CV_8U, const_cast<char*>(bytes.data()));
  cv::Mat bgr;
  try {
    bgr = cv::imdecode(raw, cv::IMREAD_COLOR | cv::IMREAD_IGNORE_ORIENTATION);
  } catch (const cv::Exception&) {
    return {};
  }
  if (bgr.empty()) return {};
  cv::Mat rgb;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  return rgb;
}

// The images skipped as corrupt, shared by a dataset's splits: each warned
// about once, counted in every trial's summary.json.
struct SkipLog {
  std::mutex mutex;
  std::set<std::string> skipped;
  std::int64_t images = 0;
  void skip(const std::string& path) {
    std::lock_guard<std::mutex> lock(mutex);
    if (skipped.insert(path).second) {
      std::cerr << "warning: dataset: skipping " << path << ": not a decodable JPEG or PNG image\n";
    }
  }
  json report() {
    std::lock_guard<std::mutex> lock(mutex);
    json names = json::array();
    for (const auto& s : skipped) {
      if (names.size() < 20) names.push_back(s);
    }
    return {{"images", images}, {"skipped_images", skipped.size()}, {"skipped", names}};
  }
};

// HWC RGB 8-bit `image` into dst as CHW.
void to_chw(const cv::Mat& image, std::uint8_t* dst) {
  const std::int64_t h = image.rows, w = image.cols;
  for (std::int64_t y = 0; y < h; ++y) {
    const auto* row = image.ptr<std::uint8_t>(static_cast<int>(y));
    for (std::int64_t x = 0; x < w; ++x) {
      for (std::int64_t c = 0; c < 3; ++c) dst[(c * h + y) * w + x] = row[x * 3 + c];
    }
  }
}

cv::Mat resized(const cv::Mat& image, int width, int height) {
  cv::Mat out;
  const bool shrinking = width < image.cols && height < image.rows;
  cv::resize(image, out, cv::Size(width, height), 0, 0, shrinking ? cv::INTER_AREA : cv::INTER_LINEAR);
  return out;
}

class FolderExamples final : public Examples {
 public:
  FolderExamples(std::vector<std::string> files, std::vector<std::int64_t> labels, const ImageFolderSpec& spec,
                 bool augment, std::shared_ptr<SkipLog> log)
      : files_(std::move(files)), labels_(std::move(labels)), spec_(spec), augment_(augment), log_(std::move(log)) {}
  std::int64_t size() const override { return static_cast<std::int64_t>(files_.size()); }
  Batch get(const at::Tensor& index) const override { return fetch(index, nullptr); }
  Batch range(std::int64_t begin, std::int64_t end) const override {
    // Evaluation runs in the trial's thread: its intra-op pool decodes.
    const std::int64_t n = end - begin, side = spec_.size;
    at::Tensor out = at::empty({n, 3, side, side}, at::kByte);
    at::Tensor labels = at::empty({n}, at::kLong);
    std::uint8_t* dst = out.data_ptr<std::uint8_t>();
    std::int64_t* label = labels.data_ptr<std::int64_t>();
    at::parallel_for(0, n, 1, [&](std::int64_t from, std::int64_t to) {
      for (std::int64_t k = from; k < to; ++k) label[k] = make(begin + k, nullptr, dst + k * 3 * side * side);
    });
    return {normalize_images(out, mean(), stdev()), labels};
  }
  Batch augmented(const at::Tensor& index, const Draw& draw) const override {
    return augment_ ? fetch(index, &draw) : get(index);
  }
  bool costly() const override { return true; }  // decoding, whether augmented or not

 private:
  std::vector<double> mean() const { return {spec_.mean.begin(), spec_.mean.end()}; }
  std::vector<double> stdev() const { return {spec_.std.begin(), spec_.std.end()}; }

  Batch fetch(const at::Tensor& index, const Draw* draw) const {
    const at::Tensor i = index.to(at::kLong).contiguous();
    const std::int64_t n = i.numel(), side = spec_.size;
    at::Tensor out = at::empty({n, 3, side, side}, at::kByte);
    at::Tensor labels = at::empty({n}, at::kLong);
    const std::int64_t* p = i.data_ptr<std::int64_t>();
    std::uint8_t* dst = out.data_ptr<std::uint8_t>();
    std::int64_t* label = labels.data_ptr<std::int64_t>();
    for (std::int64_t k = 0; k < n; ++k) {
      TORCH_CHECK(p[k] >= 0 && p[k] < size(), "image_folder: index ", p[k], " outside [0, ", size(), ")");
      std::optional<ExampleRandom> random;
      if (draw != nullptr) random.emplace(*draw, p[k]);
      label[k] = make(p[k], random ? &*random : nullptr, dst + k * 3 * side * side);
    }
    return {normalize_images_serial(out, mean(), stdev()), labels};  // (on a loader thread)
  }

  // Example k into dst (3 x size x size): a random resized crop and flip
  // with `random`, else the evaluation's resize and center crop. A file that
  // does not decode is skipped: the next one that does stands in. Its label.
  std::int64_t make(std::int64_t k, ExampleRandom* random, std::uint8_t* dst) const {
    const std::int64_t n = size();
    cv::Mat image;
    std::int64_t used = k;
    for (std::int64_t tries = 0; tries < n; ++tries, used = (used + 1) % n) {
      image = decode(files_[static_cast<std::size_t>(used)]);
      if (!image.empty()) break;
      log_->skip(files_[static_cast<std::size_t>(used)]);
    }
    TORCH_CHECK(!image.empty(), "image_folder: none of the ", n, " images decodes");
    const int side = static_cast<int>(spec_.size);
    cv::Mat out;
    if (random != nullptr) {
      const CropBox box = random_resized_box(image.rows, image.cols, *random);
      const cv::Rect roi(static_cast<int>(box.left), static_cast<int>(box.top), static_cast<int>(box.width),
                         static_cast<int>(box.height));
      out = resized(image(roi), side, side);
      if (random->below(2) == 1) cv::flip(out, out, 1);
    } else {
      const double scale = static_cast<double>(spec_.resize) / std::min(image.rows, image.cols);
      const int w = std::max(side, static_cast<int>(round_half_even(image.cols * scale)));
      const int h = std::max(side, static_cast<int>(round_half_even(image.rows * scale)));
      const cv::Mat r = resized(image, w, h);
      const int top = static_cast<int>(round_half_even((h - side) / 2.0)), left = static_cast<int>(round_half_even((w - side) / 2.0));
      out = r(cv::Rect(left, top, side, side)).clone();
    }
    to_chw(out, dst);
    return labels_[static_cast<std::size_t>(used)];
  }

  std::vector<std::string> files_;
  std::vector<std::int64_t> labels_;
  ImageFolderSpec spec_;
  bool augment_;
  std::shared_ptr<SkipLog> log_;
};

// Keeps the images that decode (all of them decoded once, on every core)
// with verify, else those whose first bytes are a JPEG's or a PNG's.
void keep_readable(Listing& l, bool verify, SkipLog& log) {
  const std::size_t n = l.files.size();
  std::vector<char> good(n, 0);
  std::atomic<std::size_t> next{0};
  const auto check = [&] {
    for (std::size_t i = next++; i < n; i = next++) {
      if (verify) {
        good[i] = !decode(l.files[i]).empty();
      } else {
        std::ifstream in(l.files[i], std::ios::binary);
        unsigned char head[4] = {0, 0, 0, 0};
        in.read(reinterpret_cast<char*>(head), 4);
        good[i] = (head[0] == 0xFF && head[1] == 0xD8 && head[2] == 0xFF) ||
                  (head[0] == 0x89 && head[1] == 'P' && head[2] == 'N' && head[3] == 'G');
      }
    }
  };
  std::vector<std::thread> threads;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned t = 1; t < cores; ++t) threads.emplace_back(check);
  check();
  for (auto& t : threads) t.join();
  Listing kept{l.classes, {}, {}};
  for (std::size_t i = 0; i < n; ++i) {
    if (good[i]) {
      kept.files.push_back(l.files[i]);
      kept.labels.push_back(l.labels[i]);
    } else {
      log.skip(l.files[i]);
    }
  }
  std::lock_guard<std::mutex> lock(log.mutex);
  log.images += static_cast<std::int64_t>(n);
  l = std::move(kept);
}

}  // namespace

WorkloadData load_image_folder(const ImageFolderSpec& s) {
  TORCH_CHECK(s.size > 0 && s.resize >= s.size, "image_folder: size ", s.size, " and resize ", s.resize,
              " must be > 0 with resize >= size");
  cv::setNumThreads(0);  // the runner's threads are the parallelism: OpenCV's own pool would oversubscribe
  auto log = std::make_shared<SkipLog>();
  Listing train = list_folder(s.path, "dataset.path");
  keep_readable(train, s.verify, *log);
  if (train.files.empty()) data_error("dataset.path: " + s.path + ": none of its images decodes");
  const auto split = [&](const std::string& path, const char* key) {
    Listing l = list_folder(path, key);
    if (l.classes != train.classes) {
      data_error(std::string(key) + ": " + path + ": its class folders differ from dataset.path's (" +
                 std::to_string(l.classes.size()) + " against " + std::to_string(train.classes.size()) + ")");
    }
    keep_readable(l, s.verify, *log);
    return l;
  };
  WorkloadData d;
  d.classes = static_cast<std::int64_t>(train.classes.size());
  Listing validation;
  if (!s.validation_path.empty()) {
    validation = split(s.validation_path, "dataset.validation_path");
  } else {
    const auto n = static_cast<std::int64_t>(train.files.size());
    const auto held = static_cast<std::int64_t>(std::llround(s.validation_fraction * static_cast<double>(n)));
    if (held < 1 || held >= n) {
      data_error("dataset.validation_fraction: " + std::to_string(s.validation_fraction) + " of " +
                 std::to_string(n) + " images holds out " + std::to_string(held) + " (needs 1 to " +
                 std::to_string(n - 1) + ")");
    }
    const at::Tensor order = at::randperm(n, at::detail::createCPUGenerator(s.split_seed), at::kLong);
    std::vector<char> is_held(static_cast<std::size_t>(n), 0);
    for (std::int64_t k = 0; k < held; ++k) is_held[static_cast<std::size_t>(order[k].item<std::int64_t>())] = 1;
    Listing kept{train.classes, {}, {}};
    validation.classes = train.classes;
    for (std::size_t i = 0; i < train.files.size(); ++i) {
      Listing& to = is_held[i] ? validation : kept;
      to.files.push_back(train.files[i]);
      to.labels.push_back(train.labels[i]);
    }
    train = std::move(kept);
  }
  d.train = std::make_shared<FolderExamples>(train.files, train.labels, s, s.augment, log);
  d.validation = std::make_shared<FolderExamples>(validation.files, validation.labels, s, false, log);
  if (!s.test_path.empty()) {
    const Listing test = split(s.test_path, "dataset.test_path");
    d.test = std::make_shared<FolderExamples>(test.files, test.labels, s, false, log);
  }
  d.report = [log] { return log->report(); };
  return d;
}

}  // namespace bigbatch::experiments

#else  // no OpenCV

namespace bigbatch::experiments {

WorkloadData load_image_folder(const ImageFolderSpec&) {
  throw std::runtime_error(
      "dataset.name: \"image_folder\" needs OpenCV's image codecs, which this build was made without "
      "(Debian: libopencv-imgcodecs-dev libopencv-imgproc-dev; then reconfigure)");
}

}  // namespace bigbatch::experiments

#endif
