// The image-folder dataset (images.h, image_folder.cpp) against PNG and
// JPEG files written here with OpenCV: classes in sorted folder order, PNG
// pixels exact through the evaluation's resize and crop, a JPEG within its
// quantization, corrupt files skipped with one warning each and counted,
// augmentation drawn per (seed, epoch, example). Built where OpenCV is.
#include "../../experiments/workload/images.h"
#include "scratch_dir.h"

#include <gtest/gtest.h>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

using namespace bigbatch::experiments;
namespace fs = std::filesystem;
using nlohmann::json;

using ImageFolderTest = bigbatch::testing_support::ScratchDirTest;

// A 3-channel BGR image whose RGB pixel (y, x) is (base + y, base + 2x, base + 3).
cv::Mat ramp(int h, int w, int base) {
  cv::Mat m(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) m.at<cv::Vec3b>(y, x) = cv::Vec3b(base + 3, base + 2 * x, base + y);
  }
  return m;
}

TEST_F(ImageFolderTest, ClassesInSortedOrderAndPngPixelsExact) {
  fs::create_directories(dir_ / "zebra");
  fs::create_directories(dir_ / "ant" / "nested");
  ASSERT_TRUE(cv::imwrite((dir_ / "zebra" / "a.png").string(), ramp(8, 8, 10)));
  ASSERT_TRUE(cv::imwrite((dir_ / "zebra" / "b.png").string(), ramp(8, 8, 60)));
  ASSERT_TRUE(cv::imwrite((dir_ / "ant" / "nested" / "c.png").string(), ramp(8, 8, 100)));
  ASSERT_TRUE(cv::imwrite((dir_ / "ant" / "d.jpg").string(), cv::Mat(8, 8, CV_8UC3, cv::Scalar(30, 90, 200)),
                          {cv::IMWRITE_JPEG_QUALITY, 100}));
  std::ofstream(dir_ / "ant" / "notes.txt") << "not an image";
  ImageFolderSpec spec;
  spec.path = dir_.string();
  spec.validation_path = dir_.string();  // (the same images validate: the split is not what is tested)
  spec.size = 8;
  spec.resize = 8;
  spec.mean = {0, 0, 0};
  spec.std = {1, 1, 1};
  const WorkloadData d = load_image_folder(spec);
  EXPECT_EQ(d.classes, 2);
  ASSERT_EQ(d.validation->size(), 4);
  // Sorted: ant/d.jpg, ant/nested/c.png (class 0), zebra/a.png, zebra/b.png (1).
  const Batch v = d.validation->range(0, 4);
  EXPECT_EQ(v.target[0].item<std::int64_t>(), 0);
  EXPECT_EQ(v.target[1].item<std::int64_t>(), 0);
  EXPECT_EQ(v.target[2].item<std::int64_t>(), 1);
  for (const auto& [row, base] : {std::pair<std::int64_t, int>{1, 100}, {2, 10}, {3, 60}}) {
    for (int y = 0; y < 8; ++y) {
      for (int x = 0; x < 8; ++x) {
        ASSERT_NEAR(v.input[row][0][y][x].item<double>(), (base + y) / 255.0, 1e-6);
        ASSERT_NEAR(v.input[row][1][y][x].item<double>(), (base + 2 * x) / 255.0, 1e-6);
        ASSERT_NEAR(v.input[row][2][y][x].item<double>(), (base + 3) / 255.0, 1e-6);
      }
    }
  }
  // The JPEG of a flat colour, RGB (200, 90, 30), within its quantization.
  EXPECT_NEAR(v.input[0][0].mean().item<double>(), 200 / 255.0, 3 / 255.0);
  EXPECT_NEAR(v.input[0][1].mean().item<double>(), 90 / 255.0, 3 / 255.0);
  EXPECT_NEAR(v.input[0][2].mean().item<double>(), 30 / 255.0, 3 / 255.0);
  EXPECT_EQ(d.report()["skipped_images"], 0);
}

TEST_F(ImageFolderTest, SkipsCorruptImagesCountsThemAndAugmentsDeterministically) {
  for (const char* c : {"a", "b"}) {
    fs::create_directories(dir_ / c);
    for (int i = 0; i < 5; ++i) {
      ASSERT_TRUE(cv::imwrite((dir_ / c / ("img" + std::to_string(i) + ".png")).string(), ramp(20, 30, 10 * i)));
    }
  }
  // A JPEG header and then nothing; a PNG cut in half.
  std::ofstream(dir_ / "a" / "broken.jpg", std::ios::binary) << "\xFF\xD8\xFF\xE0 and then garbage";
  {
    const fs::path p = dir_ / "b" / "img4.png";
    fs::resize_file(p, fs::file_size(p) / 2);
  }
  ImageFolderSpec spec;
  spec.path = dir_.string();
  spec.size = 12;
  spec.resize = 14;
  spec.validation_fraction = 0.25;
  testing::internal::CaptureStderr();
  const WorkloadData d = load_image_folder(spec);
  const std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_NE(warnings.find("warning: dataset: skipping " + (dir_ / "a" / "broken.jpg").string()), std::string::npos)
      << warnings;
  EXPECT_NE(warnings.find((dir_ / "b" / "img4.png").string()), std::string::npos) << warnings;
  const json report = d.report();
  EXPECT_EQ(report["images"], 11);
  EXPECT_EQ(report["skipped_images"], 2);
  EXPECT_EQ(d.train->size() + d.validation->size(), 9);
  EXPECT_EQ(d.validation->size(), 2);  // round(0.25 * 9)
  const at::Tensor index = at::tensor(std::vector<std::int64_t>{0, 4, 6}, at::kLong);
  const Batch x = d.train->augmented(index, Draw{3, 1});
  EXPECT_EQ(x.input.sizes(), (std::vector<std::int64_t>{3, 3, 12, 12}));
  EXPECT_TRUE(at::equal(x.input, d.train->augmented(index, Draw{3, 1}).input));
  EXPECT_FALSE(at::equal(x.input, d.train->augmented(index, Draw{3, 2}).input));
  const Batch one = d.train->augmented(at::tensor(std::vector<std::int64_t>{6}, at::kLong), Draw{3, 1});
  EXPECT_TRUE(at::equal(one.input[0], x.input[2]));
}

}  // namespace
