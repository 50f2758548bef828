// The image workloads (images.h) and the data pipeline (loader.h) against
// hand-made files and hand-computed geometry: CIFAR records with known bytes
// in both layouts, the refusals naming file, record and value, the padded
// crop and flip pixel by pixel, the random resized crop's window, and
// training that is the same whatever the loader's threads and across a
// checkpoint; the ResNets against their known sizes. The image folders are
// image_folder_test.cpp's.
#include "../../experiments/train/batched.h"
#include "../../experiments/runconfig/config.h"
#include "../../experiments/workload/data.h"
#include "../../experiments/workload/images.h"
#include "../../experiments/workload/models.h"
#include "../../experiments/train/trial.h"
#include "../../experiments/sweep/trial_folder.h"
#include "../../experiments/io/files.h"
#include "scratch_dir.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

using namespace bigbatch::experiments;
namespace fs = std::filesystem;
using nlohmann::json;

using ImagesTest = bigbatch::testing_support::ScratchDirTest;

// The byte of record r's channel c at (y, x) in the files written below.
std::uint8_t pixel(std::int64_t r, std::int64_t c, std::int64_t y, std::int64_t x) {
  return static_cast<std::uint8_t>((r * 7 + c * 50 + y * 3 + x) % 256);
}

void write_records(const fs::path& path, std::int64_t first, std::int64_t count,
                   const std::function<std::vector<std::uint8_t>(std::int64_t)>& labels) {
  std::ofstream out(path, std::ios::binary);
  for (std::int64_t r = first; r < first + count; ++r) {
    for (const std::uint8_t l : labels(r)) out.put(static_cast<char>(l));
    for (std::int64_t c = 0; c < 3; ++c) {
      for (std::int64_t y = 0; y < 32; ++y) {
        for (std::int64_t x = 0; x < 32; ++x) out.put(static_cast<char>(pixel(r, c, y, x)));
      }
    }
  }
}

// CIFAR-10's six files: record r (numbered through the training files) has
// label r % 10; the test file's records continue the numbering from 100.
void write_cifar10(const fs::path& dir, std::int64_t per_file) {
  const auto label = [](std::int64_t r) { return std::vector<std::uint8_t>{static_cast<std::uint8_t>(r % 10)}; };
  for (int k = 0; k < 5; ++k) {
    write_records(dir / ("data_batch_" + std::to_string(k + 1) + ".bin"), k * per_file, per_file, label);
  }
  write_records(dir / "test_batch.bin", 100, 3, label);
}

// (byte / 255 - mean) / std in double: the normalization re-derived.
double normalized(std::uint8_t byte, double mean, double std) { return (byte / 255.0 - mean) / std; }

TEST_F(ImagesTest, Cifar10RecordsAreReadAsLaidOut) {
  write_cifar10(dir_, 2);
  CifarSpec spec;
  spec.path = dir_.string();
  spec.validation = 0;
  const WorkloadData d = load_cifar(spec);
  ASSERT_EQ(d.classes, 10);
  ASSERT_EQ(d.train->size(), 10);
  ASSERT_EQ(d.test->size(), 3);
  const Batch all = d.train->range(0, 10);
  ASSERT_EQ(all.input.sizes(), (std::vector<std::int64_t>{10, 3, 32, 32}));
  const double mean[] = {0.4914, 0.4822, 0.4465}, std[] = {0.2470, 0.2435, 0.2616};
  for (std::int64_t r : {0, 3, 9}) {
    EXPECT_EQ(all.target[r].item<std::int64_t>(), r % 10);
    for (std::int64_t c = 0; c < 3; ++c) {
      for (auto [y, x] : {std::pair<std::int64_t, std::int64_t>{0, 0}, {5, 31}, {31, 2}}) {
        EXPECT_NEAR(all.input[r][c][y][x].item<double>(), normalized(pixel(r, c, y, x), mean[c], std[c]), 1e-5)
            << "record " << r << " channel " << c << " (" << y << ", " << x << ")";
      }
    }
  }
  const Batch test = d.test->range(0, 3);
  EXPECT_EQ(test.target[1].item<std::int64_t>(), 101 % 10);
  EXPECT_NEAR(test.input[1][2][4][4].item<double>(), normalized(pixel(101, 2, 4, 4), mean[2], std[2]), 1e-5);
}

TEST_F(ImagesTest, CifarValidationIsAFixedSeededHoldOut) {
  write_cifar10(dir_, 4);  // 20 training records
  CifarSpec spec;
  spec.path = dir_.string();
  spec.validation = 5;
  const WorkloadData a = load_cifar(spec), b = load_cifar(spec);
  ASSERT_EQ(a.train->size(), 15);
  ASSERT_EQ(a.validation->size(), 5);
  EXPECT_TRUE(at::equal(a.validation->range(0, 5).input, b.validation->range(0, 5).input));
  // Every record lands in exactly one part: the labels r % 10 of the first
  // pixel's record r, recovered from its red (0, 0) byte (r * 7 % 256).
  std::vector<int> seen(20, 0);
  for (const auto& part : {a.train, a.validation}) {
    const Batch x = part->range(0, part->size());
    for (std::int64_t i = 0; i < part->size(); ++i) {
      const auto byte = static_cast<int>(std::lround((x.input[i][0][0][0].item<double>() * 0.2470 + 0.4914) * 255));
      ASSERT_EQ(byte % 7, 0);
      ++seen[static_cast<std::size_t>(byte / 7)];
    }
  }
  for (int r = 0; r < 20; ++r) EXPECT_EQ(seen[static_cast<std::size_t>(r)], 1) << "record " << r;
  spec.split_seed = 1;
  EXPECT_FALSE(at::equal(load_cifar(spec).validation->range(0, 5).input, a.validation->range(0, 5).input));
}

TEST_F(ImagesTest, Cifar100ReadsCoarseAndFineLabels) {
  const auto labels = [](std::int64_t r) {
    return std::vector<std::uint8_t>{static_cast<std::uint8_t>(r % 20), static_cast<std::uint8_t>((r * 11) % 100)};
  };
  write_records(dir_ / "train.bin", 0, 12, labels);
  write_records(dir_ / "test.bin", 50, 2, labels);
  CifarSpec spec;
  spec.classes = 100;
  spec.path = dir_.string();
  spec.validation = 0;
  const WorkloadData fine = load_cifar(spec);
  EXPECT_EQ(fine.classes, 100);
  EXPECT_EQ(fine.train->range(7, 8).target.item<std::int64_t>(), 77);
  EXPECT_EQ(fine.test->range(1, 2).target.item<std::int64_t>(), (51 * 11) % 100);
  const double mean = 0.5071, std = 0.2673;
  EXPECT_NEAR(fine.train->range(7, 8).input[0][0][3][9].item<double>(), normalized(pixel(7, 0, 3, 9), mean, std), 1e-5);
  spec.fine_labels = false;
  const WorkloadData coarse = load_cifar(spec);
  EXPECT_EQ(coarse.classes, 20);
  EXPECT_EQ(coarse.train->range(7, 8).target.item<std::int64_t>(), 7);
}

std::string load_error(const CifarSpec& spec) {
  try {
    load_cifar(spec);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_F(ImagesTest, CifarRefusesBadFilesNamingFileRecordAndValue) {
  CifarSpec spec;
  spec.path = (dir_ / "nowhere").string();
  EXPECT_EQ(load_error(spec), "dataset.path: " + spec.path + ": cannot open (No such file or directory)");
  write_cifar10(dir_, 2);
  spec.path = dir_.string();
  spec.validation = 10;
  EXPECT_EQ(load_error(spec), "dataset.validation: 10 is not in [0, 10) (the training records in " + spec.path + ")");
  spec.validation = 0;
  {  // truncated: a byte short
    const fs::path f = dir_ / "data_batch_3.bin";
    fs::resize_file(f, fs::file_size(f) - 1);
  }
  EXPECT_EQ(load_error(spec), "dataset.path: " + (dir_ / "data_batch_3.bin").string() +
                                  ": 6145 bytes is not a whole number of 3073-byte records (truncated, or not this "
                                  "CIFAR's binary version)");
  write_cifar10(dir_, 2);
  {  // record 1 of data_batch_2 labelled 10
    std::fstream f(dir_ / "data_batch_2.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3073);
    f.put(10);
  }
  EXPECT_EQ(load_error(spec),
            "dataset.path: " + (dir_ / "data_batch_2.bin").string() + ": record 1: label 10 is not in [0, 10)");
  fs::remove(dir_ / "data_batch_2.bin");
  EXPECT_EQ(load_error(spec), "dataset.path: " + (dir_ / "data_batch_2.bin").string() +
                                  ": cannot read: No such file or directory");
}

TEST(ImageAugment, PadCropFlipMovesPixelsAsHandComputed) {
  // One channel, 3 x 3, values 1..9.
  const at::Tensor img = at::arange(1, 10, at::kByte).view({1, 3, 3});
  // Pad 1, window at (0, 0) of the padded 5 x 5: shifted down-right by one.
  const at::Tensor a = pad_crop_flip(img, 1, 0, 0, false);
  const std::vector<std::uint8_t> want_a{0, 0, 0, 0, 1, 2, 0, 4, 5};
  // Window at (2, 1): shifted up by one; then mirrored.
  const at::Tensor b = pad_crop_flip(img, 1, 2, 1, true);
  const std::vector<std::uint8_t> want_b{6, 5, 4, 9, 8, 7, 0, 0, 0};
  for (std::int64_t i = 0; i < 9; ++i) {
    EXPECT_EQ(a.view(-1)[i].item<int>(), want_a[static_cast<std::size_t>(i)]) << i;
    EXPECT_EQ(b.view(-1)[i].item<int>(), want_b[static_cast<std::size_t>(i)]) << i;
  }
  // The centre window without flip is the image itself.
  EXPECT_TRUE(at::equal(pad_crop_flip(img, 4, 4, 4, false), img));
}

TEST_F(ImagesTest, CifarAugmentationIsACropAndFlipDrawnPerExample) {
  write_cifar10(dir_, 4);
  CifarSpec spec;
  spec.path = dir_.string();
  spec.validation = 0;
  const WorkloadData d = load_cifar(spec);
  ASSERT_TRUE(d.train->costly());
  const at::Tensor index = at::tensor(std::vector<std::int64_t>{3, 11, 0, 17}, at::kLong);
  const Batch x = d.train->augmented(index, Draw{5, 2});
  EXPECT_TRUE(at::equal(x.input, d.train->augmented(index, Draw{5, 2}).input));
  // The same example in another batch, at another position: the same draw.
  const Batch y = d.train->augmented(at::tensor(std::vector<std::int64_t>{17, 3}, at::kLong), Draw{5, 2});
  EXPECT_TRUE(at::equal(y.input[0], x.input[3]));
  EXPECT_TRUE(at::equal(y.input[1], x.input[0]));
  // Each output is one of the 9 x 9 x 2 windows of its raw image.
  const std::vector<double> mean{0.4914, 0.4822, 0.4465}, std{0.2470, 0.2435, 0.2616};
  int other_than_centre = 0;
  for (std::int64_t k = 0; k < 4; ++k) {
    const std::int64_t r = index[k].item<std::int64_t>();
    at::Tensor raw = at::empty({3, 32, 32}, at::kByte);
    for (std::int64_t c = 0; c < 3; ++c) {
      for (std::int64_t yy = 0; yy < 32; ++yy) {
        for (std::int64_t xx = 0; xx < 32; ++xx) raw[c][yy][xx] = pixel(r, c, yy, xx);
      }
    }
    int matches = 0;
    for (std::int64_t dy = 0; dy <= 8; ++dy) {
      for (std::int64_t dx = 0; dx <= 8; ++dx) {
        for (const bool flip : {false, true}) {
          const at::Tensor want = normalize_images(pad_crop_flip(raw, 4, dy, dx, flip).unsqueeze(0), mean, std)[0];
          if (at::allclose(want, x.input[k], 0, 1e-6)) {
            ++matches;
            other_than_centre += dy != 4 || dx != 4 || flip;
          }
        }
      }
    }
    EXPECT_GE(matches, 1) << "example " << r;
    EXPECT_TRUE(at::allclose(d.train->get(index).input[k], normalize_images(raw.unsqueeze(0), mean, std)[0], 0, 1e-6))
        << "evaluation's view of example " << r;
  }
  EXPECT_GT(other_than_centre, 0);
  // Another epoch, other windows; evaluation (get) is not augmented.
  EXPECT_FALSE(at::equal(x.input, d.train->augmented(index, Draw{5, 3}).input));
}

TEST(ImageAugment, SerialNormalizationIsTheSameBits) {
  // The loader threads' normalization against the evaluation's (ATen's ops).
  auto gen = at::detail::createCPUGenerator(3);
  const at::Tensor bytes = at::randint(256, {5, 3, 7, 9}, gen, at::kByte);
  const std::vector<double> mean{0.4914, 0.4822, 0.4465}, std{0.2470, 0.2435, 0.2616};
  EXPECT_TRUE(at::equal(normalize_images_serial(bytes, mean, std), normalize_images(bytes, mean, std)));
}

TEST(ImageAugment, RandomResizedBoxStaysInsideAndFallsBackToTheCentre) {
  for (std::int64_t e = 0; e < 200; ++e) {
    ExampleRandom random(Draw{1, 0}, e);
    const CropBox b = random_resized_box(40, 60, random);
    ASSERT_GE(b.top, 0);
    ASSERT_GE(b.left, 0);
    ASSERT_LE(b.top + b.height, 40);
    ASSERT_LE(b.left + b.width, 60);
    const double area = static_cast<double>(b.height * b.width) / (40.0 * 60.0);
    const double ratio = static_cast<double>(b.width) / static_cast<double>(b.height);
    // The drawn area fraction and ratio, give or take the rounding to whole pixels.
    EXPECT_GE(area, 0.08 * 0.8) << e;
    EXPECT_GE(ratio, 0.75 * 0.85) << e;
    EXPECT_LE(ratio, 4.0 / 3.0 * 1.15) << e;
  }
  // 10 x 100 at full area never fits a ratio <= 4/3: the centre 10 x 13.
  ExampleRandom random(Draw{}, 0);
  const CropBox c = random_resized_box(10, 100, random, 1.0, 1.0);
  EXPECT_EQ(c.height, 10);
  EXPECT_EQ(c.width, 13);
  EXPECT_EQ(c.top, 0);
  EXPECT_EQ(c.left, 43);
}

// A trial on CIFAR-format data with a tiny ResNet-8.
TrialConfig cifar_trial(const fs::path& data, std::int64_t threads) {
  TrialConfig t;
  t.sweep = "images";
  t.name = "t";
  t.data = {"cifar10", {{"path", data.string()}, {"validation", 4}, {"split_seed", 0}, {"augment", true}}};
  ModelSpec m;
  m.type = ModelType::kResnet;
  m.width = 4;
  t.model = model_part(m);
  t.batch_size = 4;
  t.schedule.base_lr = 0.05;
  t.schedule.base_batch = 4;
  t.budget = {7, bigbatch::schedules::Unit::kSteps};
  t.target = {Metric::kValError, -1, 100};
  t.loader.threads = threads;
  t.loader.prefetch = 3;
  return t;
}

std::vector<at::Tensor> weights(Trainer& t) {
  std::vector<at::Tensor> out;
  for (const auto& p : t.module().parameters()) out.push_back(p.detach().clone());
  return out;
}

void expect_same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << what << ": parameter " << i;
}

TEST_F(ImagesTest, TrainingIsTheSameWhateverTheLoaderThreads) {
  write_cifar10(dir_, 3);  // 15 records, 11 train: an epoch is 2 steps of 4 (the tail dropped)
  std::vector<std::vector<at::Tensor>> runs;
  for (const std::int64_t threads : {0, 1, 3}) {
    const TrialConfig t = cifar_trial(dir_, threads);
    const WorkloadData data = load_dataset(t.data);
    Trainer trainer(t, data);
    for (int s = 0; s < 7; ++s) trainer.train_step();
    runs.push_back(weights(trainer));
  }
  expect_same(runs[0], runs[1], "1 loader thread against none");
  expect_same(runs[0], runs[2], "3 loader threads against none");
}

TEST_F(ImagesTest, ResumeContinuesTheSameAugmentedStream) {
  write_cifar10(dir_, 3);
  const TrialConfig t = cifar_trial(dir_, 1);
  const WorkloadData data = load_dataset(t.data);
  Trainer straight(t, data);
  std::string saved;
  for (int s = 0; s < 7; ++s) {
    straight.train_step();
    if (s == 2) saved = straight.checkpoint();  // after 3 steps: mid-epoch 2
  }
  Trainer resumed(t, data);
  resumed.train_step();  // (its loader has asked ahead from the start: restore must drop that)
  resumed.restore(saved);
  for (int s = 3; s < 7; ++s) resumed.train_step();
  expect_same(weights(straight), weights(resumed), "resumed at step 3");
  // Without augmentation the run differs: the test can tell the streams apart.
  TrialConfig plain = t;
  plain.data.params["augment"] = false;
  const WorkloadData plain_data = load_dataset(plain.data);
  Trainer other(plain, plain_data);
  for (int s = 0; s < 7; ++s) other.train_step();
  EXPECT_FALSE(at::equal(weights(other)[0], weights(straight)[0]));
}

TEST_F(ImagesTest, SummaryRecordsTheLoaderAndItsWait) {
  write_cifar10(dir_, 3);
  const TrialConfig t = cifar_trial(dir_, -1);
  const WorkloadData data = load_dataset(t.data);
  const fs::path folder = dir_ / "trial";
  const TrialResult r = run_one(t, data, folder.string());
  EXPECT_EQ(r.loader_threads, 1);  // auto: augmented data is costly
  const json summary = read_json((folder / "summary.json").string());
  EXPECT_EQ(summary["data"]["loader_threads"], 1);
  const double wait = summary["data"]["wait_fraction"].get<double>();
  EXPECT_GE(wait, 0.0);
  EXPECT_LE(wait, 1.0);
}

std::int64_t parameter_count(torch::nn::Module& m) {
  std::int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

TEST(ImageModels, ResnetsHaveTheirPublishedSizes) {
  ModelSpec s;
  s.type = ModelType::kResnet;
  s.norm = Norm::kBatch;  // (the configs' default for the ResNets)
  s.depth = 20;
  auto net = make_model(s, {3, 32, 32}, 10);
  // Hand-counted: stem 432 + 32; stage 1: 3 x (2 x 2304 + 64); stage 2:
  // 4608 + 9216 + 128 + 512 + 64, then 2 x (2 x 9216 + 128); stage 3: 18432 +
  // 36864 + 256 + 2048 + 128, then 2 x (2 x 36864 + 256); fc 650 (He et al.: 0.27M).
  EXPECT_EQ(parameter_count(*net), 272474);
  int weighted = 0;  // 6n + 2 layers on the main path: 3x3 convs and the fc
  for (const auto& m : net->modules(false)) {
    if (auto* c = m->as<torch::nn::Conv2d>()) weighted += c->options.kernel_size()->at(0) == 3;
    if (m->as<torch::nn::Linear>() != nullptr) ++weighted;
  }
  EXPECT_EQ(weighted, 20);
  s.depth = 56;
  int convs56 = 0;
  for (const auto& m : make_model(s, {3, 32, 32}, 10)->modules(false)) {
    if (auto* c = m->as<torch::nn::Conv2d>()) convs56 += c->options.kernel_size()->at(0) == 3;
  }
  EXPECT_EQ(convs56 + 1, 56);
  EXPECT_EQ(make_model(s, {3, 32, 32}, 10)->forward(at::zeros({2, 3, 32, 32})).sizes(),
            (std::vector<std::int64_t>{2, 10}));
  // ResNet-18 for CIFAR (3x3 stem, no max pool, projection shortcuts):
  // 11,173,962 parameters for 10 classes, the count of the common PyTorch one.
  ModelSpec r18;
  r18.type = ModelType::kResnet18;
  r18.norm = Norm::kBatch;
  r18.width = 64;
  auto net18 = make_model(r18, {3, 32, 32}, 10);
  EXPECT_EQ(parameter_count(*net18), 11173962);
  EXPECT_EQ(net18->forward(at::zeros({2, 3, 32, 32})).sizes(), (std::vector<std::int64_t>{2, 10}));
  // Deeper ResNets stack for batched trials like ResNet-8.
  EXPECT_EQ(stack_refusal(Model(make_model(s, {3, 32, 32}, 10))), "");
}

TEST(ImageModels, ConfigResolvesDepthAndResnet18Width) {
  const ModelSpec r = model_spec({"resnet18", json::object()});
  EXPECT_EQ(r.width, 64);
  EXPECT_EQ(model_part(r).params["width"], 64);
  try {
    model_spec({"resnet", {{"depth", 9}}});
    ADD_FAILURE() << "depth 9 accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("model.depth: must be 6n + 2 with n >= 1"), std::string::npos) << e.what();
  }
}

}  // namespace
