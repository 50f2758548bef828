// The image workloads' data pipelines (images.h, loader.h) against the step
// that consumes them: CIFAR batches (crop + flip + normalize) and image-
// folder batches (JPEG decode, random resized crop to 224, flip, normalize)
// in examples/s through the loader with 1 and 2 threads; JPEG decoding
// alone in images/s (OpenCV's imdecode over libjpeg-turbo); and ResNet-8
// training on CIFAR-format data at batch 128 and 1024 with one loader
// thread beside one intra-op thread (the runner's split of 2 cores), the
// fraction of the step time spent waiting for data as a counter.
#include "../experiments/runconfig/config.h"
#include "../experiments/io/files.h"
#include "../experiments/workload/images.h"
#include "../experiments/train/loader.h"
#include "../experiments/workload/models.h"
#include "../experiments/train/trial.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace bx = bigbatch::experiments;
namespace fs = std::filesystem;

const fs::path& scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("bigbatch_bm_image_data." + std::to_string(::getpid()));
    fs::create_directories(d);
    std::atexit([] {
      try {  // (not fs::remove_all: files.h says why)
        bigbatch::experiments::remove_tree(fs::temp_directory_path() / ("bigbatch_bm_image_data." + std::to_string(::getpid())));
      } catch (const std::exception&) {
      }
    });
    return d;
  }();
  return dir;
}

// CIFAR-10 binary files of 12,000 random records (2,000 held out).
const bx::WorkloadData& cifar() {
  static const bx::WorkloadData data = [] {
    const fs::path dir = scratch() / "cifar";
    fs::create_directories(dir);
    auto gen = at::detail::createCPUGenerator(0);
    for (int k = 0; k <= 5; ++k) {
      const at::Tensor bytes = at::randint(256, {2000, 3073}, gen, at::kByte);
      bytes.select(1, 0).random_(0, 10, gen);
      std::ofstream out(dir / (k < 5 ? "data_batch_" + std::to_string(k + 1) + ".bin" : "test_batch.bin"),
                        std::ios::binary);
      out.write(reinterpret_cast<const char*>(bytes.data_ptr<std::uint8_t>()), bytes.numel());
    }
    bx::CifarSpec s;
    s.path = dir.string();
    s.validation = 2000;
    return bx::load_cifar(s);
  }();
  return data;
}

// A 500 x 375 photo-like JPEG (smooth colour fields plus grain), as its bytes.
std::vector<unsigned char> jpeg(int seed) {
  cv::Mat small(6, 8, CV_8UC3), image;
  cv::randu(small, cv::Scalar::all(0), cv::Scalar::all(255));
  cv::resize(small, image, cv::Size(500, 375), 0, 0, cv::INTER_CUBIC);
  cv::Mat grain(image.size(), CV_8UC3);
  cv::theRNG().state = static_cast<std::uint64_t>(seed) + 1;
  cv::randn(grain, cv::Scalar::all(0), cv::Scalar::all(12));
  image += grain;
  std::vector<unsigned char> out;
  cv::imencode(".jpg", image, out, {cv::IMWRITE_JPEG_QUALITY, 90});
  return out;
}

// 10 classes of 16 such JPEGs each.
const bx::WorkloadData& folder() {
  static const bx::WorkloadData data = [] {
    const fs::path dir = scratch() / "folder";
    for (int c = 0; c < 10; ++c) {
      fs::create_directories(dir / ("class" + std::to_string(c)));
      for (int i = 0; i < 16; ++i) {
        const auto bytes = jpeg(c * 16 + i);
        std::ofstream(dir / ("class" + std::to_string(c)) / (std::to_string(i) + ".jpg"), std::ios::binary)
            .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
      }
    }
    bx::ImageFolderSpec s;
    s.path = dir.string();
    s.verify = false;
    return bx::load_image_folder(s);
  }();
  return data;
}

// Batches of `batch` through a loader of `threads` threads kept 4 ahead:
// what the pipeline alone delivers, in examples/s.
void pipeline(benchmark::State& state, const bx::WorkloadData& data) {
  const auto threads = static_cast<int>(state.range(0));
  const std::int64_t batch = state.range(1), n = data.train->size();
  at::set_num_threads(1);
  bx::BatchLoader loader(*data.train, threads, false);
  std::int64_t asked = 0, taken = 0;
  const auto index_of = [&](std::int64_t k) {
    return at::arange(k * batch, (k + 1) * batch, at::kLong).remainder_(n);
  };
  for (auto _ : state) {
    while (asked < taken + 4) {
      loader.request(index_of(asked), bx::Draw{1, asked});
      ++asked;
    }
    benchmark::DoNotOptimize(loader.take(index_of(taken)).input.data_ptr());
    ++taken;
  }
  state.SetItemsProcessed(state.iterations() * batch);
}

void BM_CifarPipeline(benchmark::State& state) { pipeline(state, cifar()); }
BENCHMARK(BM_CifarPipeline)->ArgNames({"threads", "batch"})->Args({1, 128})->Args({2, 128})->Args({1, 1024})->Args({2, 1024})->UseRealTime();

void BM_FolderPipeline(benchmark::State& state) { pipeline(state, folder()); }
BENCHMARK(BM_FolderPipeline)->ArgNames({"threads", "batch"})->Args({1, 32})->Args({2, 32})->UseRealTime();

// The decoder alone: one 500 x 375 JPEG (quality 90) to RGB, in images/s.
void BM_JpegDecode(benchmark::State& state) {
  const auto bytes = jpeg(0);
  const cv::Mat raw(1, static_cast<int>(bytes.size()), CV_8U, const_cast<unsigned char*>(bytes.data()));
  cv::setNumThreads(0);
  for (auto _ : state) {
    cv::Mat image = cv::imdecode(raw, cv::IMREAD_COLOR);
    benchmark::DoNotOptimize(image.data);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["Mpixel/s"] = benchmark::Counter(500.0 * 375.0 / 1e6 * static_cast<double>(state.iterations()),
                                                  benchmark::Counter::kIsRate);
}
BENCHMARK(BM_JpegDecode);

// ResNet-8 (width 16, batch norm) on the CIFAR data, SGD with momentum, for
// `steps` steps a run with one loader thread and one intra-op thread: the
// step's consumption in examples/s and the fraction of it waiting for data.
void BM_Resnet8Training(benchmark::State& state) {
  const std::int64_t batch = state.range(0), steps = batch >= 1024 ? 3 : 12;
  const bx::WorkloadData& data = cifar();
  bx::TrialConfig t;
  t.sweep = "bm";
  t.name = "resnet8";
  t.data = {"cifar10", nlohmann::json::object()};  // (not loaded: `data` is given)
  bx::ModelSpec m;
  m.type = bx::ModelType::kResnet;
  m.norm = bx::Norm::kBatch;
  t.model = bx::model_part(m);
  t.batch_size = batch;
  t.schedule.base_lr = 0.05;
  t.schedule.base_batch = batch;
  t.budget = {static_cast<double>(steps), bigbatch::schedules::Unit::kSteps};
  t.target = {bx::Metric::kValLoss, -1, 1000000};
  t.loader.threads = 1;
  at::set_num_threads(1);
  double wait = 0;
  for (auto _ : state) {
    bx::Trainer trainer(t, data);
    for (std::int64_t s = 0; s < steps; ++s) trainer.train_step();
    wait += trainer.data_wait_fraction();
  }
  state.SetItemsProcessed(state.iterations() * steps * batch);
  state.counters["wait_fraction"] = wait / static_cast<double>(state.iterations());
}
BENCHMARK(BM_Resnet8Training)->ArgName("batch")->Arg(128)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
