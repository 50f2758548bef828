// Gradient compression (distributed/compression.h) on this machine's CPU, on
// the ResNet-50-like and BERT-large-like gradient lists:
//
// - codec/<compressor>/<list>: one exchange's compression and decompression
//   in a world of one (the library's own path: flatten into 25 MB buckets,
//   encode, decode, copy back; the collectives' time left out), as fp32 GB/s
//   of gradient, beside copy/<list>, a copy of the same fp32 bytes;
// - pass/<name>/<list>: the bare passes the goal is stated for: the fp16
//   round trip (divide, cast, cast back), the sign code (scale, pack, unpack)
//   and top-k's selection (at::topk of |g| over each bucket, k = 1%);
// - step/<compressor>/resnet50 (world 2): one exchange over 2 Gloo ranks on
//   127.0.0.1, wall time, with the bytes each rank sent (counted) beside
//   the formula's (docs/formulas.md, "Bytes") and the ratio to fp32.
//
// Run without arguments: it measures the world of one, then re-executes
// itself as 2 ranks (rank 0 prints). Iteration counts are fixed in world 2 so
// that the ranks stay in step. ctest's smoke run cuts the lists and the
// iterations down (smoke.h).
//
// --device=cuda (scripts/gpu.sh bench, a BIGBATCH_CUDA build): the codecs
// and the copy on the GPU, in an NCCL world of one, each iteration timed
// from the host to a device synchronization (the world of one's all-reduce,
// a device copy, included); no passes, no world 2.
#include "optimizer_bench.h"
#include "smoke.h"

#include "../distributed/compression.h"
#include "../experiments/cluster/launch.h"
#include "../kernels/compress.h"

#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/cuda.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace bd = bigbatch::distributed;
using bd::Compression;
using bigbatch::bench::ShapeList;
std::unique_ptr<bd::ProcessGroup> group;
at::Device device = at::kCPU;

void sync() {
  if (device.is_cuda()) torch::cuda::synchronize();
}

// The list, or in ctest's smoke run the same tensors cut down (smoke.h).
ShapeList sized(ShapeList list) {
  for (auto& shape : list.shapes) {
    for (auto& d : shape) d = bigbatch::bench::dimension(d);
  }
  return list;
}

// Parameters of the list's shapes with random gradients.
struct Grads {
  std::vector<at::Tensor> params;
  explicit Grads(const ShapeList& list) {
    for (const auto& s : list.shapes) {
      at::Tensor p = at::zeros(s, at::TensorOptions().device(device)).requires_grad_(true);
      p.mutable_grad() = at::randn(s, at::TensorOptions().device(device));
      params.push_back(p);
    }
  }
  double bytes() const {
    double n = 0;
    for (const auto& p : params) n += 4.0 * static_cast<double>(p.numel());
    return n;
  }
};

bd::CompressionSpec spec_of(Compression c) {
  bd::CompressionSpec s;
  s.method = c;
  s.ratio = 0.01;
  s.rank = 2;
  return s;
}

void codec(benchmark::State& state, const ShapeList& list, Compression c) {
  Grads g(list);
  bd::GradientExchange ex(spec_of(c));
  for (auto _ : state) {
    if (device.is_cuda()) {  // host time to the device's end
      sync();
      const auto start = std::chrono::steady_clock::now();
      ex.exchange(*group, g.params);
      sync();
      state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    } else {
      ex.exchange(*group, g.params);
      state.SetIterationTime(ex.last().compress_seconds);
    }
  }
  state.counters["GB/s"] = benchmark::Counter(g.bytes() * static_cast<double>(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
}

void copy(benchmark::State& state, const ShapeList& list) {
  const at::Tensor src = at::randn({list.sizes().total()}, at::TensorOptions().device(device));
  at::Tensor dst = at::zeros_like(src);  // its pages touched before the timing
  for (auto _ : state) {
    dst.copy_(src);
    sync();
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(src.numel()) * 4 *
                                                  static_cast<double>(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
}

// The list as the exchange's 25 MB buckets.
std::vector<at::Tensor> buckets(const ShapeList& list) {
  std::vector<at::Tensor> out;
  const std::int64_t per = (25 << 20) / 4;
  std::int64_t open = 0;
  for (const std::int64_t n : list.sizes().sizes) {
    if (open > 0 && open + n > per) {
      out.push_back(at::randn({open}));
      open = 0;
    }
    open += n;
  }
  if (open > 0) out.push_back(at::randn({open}));
  return out;
}

void pass(benchmark::State& state, const ShapeList& list, const std::string& what) {
  namespace kc = bigbatch::kernels::compress;
  std::vector<at::Tensor> flat = buckets(list);
  std::vector<at::Tensor> words, out, half;
  double bytes = 0;
  for (const auto& b : flat) {
    words.push_back(at::empty({kc::words_for(b.numel(), kc::kSignPerWord)}, at::kInt));
    out.push_back(at::zeros_like(b));
    half.push_back(at::zeros({b.numel()}, at::kHalf));
    bytes += 4.0 * static_cast<double>(b.numel());
  }
  for (auto _ : state) {
    for (std::size_t i = 0; i < flat.size(); ++i) {
      const at::Tensor& b = flat[i];
      if (what == "fp16") {  // as the exchange does for 2 ranks: g / 2 rounded to fp16, and back
        at::mul_out(half[i], b, at::scalar_tensor(0.5));
        out[i].copy_(half[i]);
      } else if (what == "sign") {
        const float scale = static_cast<float>(b.norm(1).item<double>() / static_cast<double>(b.numel()));
        auto* w = reinterpret_cast<std::uint32_t*>(words[i].data_ptr<std::int32_t>());
        kc::cpu::sign_pack(b.data_ptr<float>(), b.numel(), scale, /*feedback=*/false, w);
        kc::cpu::sign_unpack_add(w, b.numel(), scale, out[i].data_ptr<float>());
      } else {  // topk_select
        benchmark::DoNotOptimize(b.abs().topk(std::max<std::int64_t>(1, b.numel() / 100), 0, true, false));
      }
    }
  }
  state.counters["GB/s"] =
      benchmark::Counter(bytes * static_cast<double>(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

// What docs/formulas.md says a rank sends per step over W ranks.
double formula_bytes(const ShapeList& list, const bd::CompressionSpec& s, int w) {
  const double ring_reduce = 2.0 * (w - 1) / w, ring_gather = w - 1;
  double reduce = 0, gather = 0;
  std::int64_t bucket_n = 0, bucket_tensors = 0, bucket_words = 0;
  const auto close_bucket = [&] {
    if (bucket_n == 0) return;
    const auto k = static_cast<double>(std::max<std::int64_t>(1, std::llround(s.ratio * static_cast<double>(bucket_n))));
    switch (s.method) {
      case Compression::kNone: reduce += 4.0 * bucket_n; break;
      case Compression::kFp16: case Compression::kBf16: reduce += 2.0 * bucket_n; break;
      case Compression::kTopK: case Compression::kDgc: gather += 8 * k; break;
      case Compression::kRandomK: reduce += 4 * k; break;
      case Compression::kSign: case Compression::kTernGrad: gather += 4.0 * (bucket_words + bucket_tensors); break;
      case Compression::kQsgd: gather += bucket_n + 4.0 * ((bucket_n + s.chunk - 1) / s.chunk); break;
      case Compression::kPowerSgd: reduce += 4.0 * bucket_n; break;
    }
    bucket_n = bucket_tensors = bucket_words = 0;
  };
  const std::int64_t per = s.bucket_bytes / 4;
  for (const auto& shape : list.shapes) {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    if (s.method == Compression::kPowerSgd && shape.size() >= 2) {
      const std::int64_t rows = shape[0], cols = n / rows, r = std::min({s.rank, rows, cols});
      if ((rows + cols) * r < rows * cols) {
        reduce += 4.0 * (rows + cols) * r;
        continue;
      }
    }
    if (bucket_n > 0 && bucket_n + n > per) close_bucket();
    bucket_n += n;
    bucket_tensors += 1;
    bucket_words += (n + (s.method == Compression::kSign ? 31 : 15)) / (s.method == Compression::kSign ? 32 : 16);
  }
  close_bucket();
  return reduce * ring_reduce + gather * ring_gather;
}

void step(benchmark::State& state, const ShapeList& list, Compression c) {
  Grads g(list);
  const bd::CompressionSpec s = spec_of(c);
  bd::GradientExchange ex(s);
  for (auto _ : state) ex.exchange(*group, g.params);
  state.counters["MB_sent"] = ex.last().bytes_sent / 1e6;
  state.counters["MB_formula"] = formula_bytes(list, s, group->size()) / 1e6;
  state.counters["ratio"] = ex.last().ratio();
  state.counters["comm_ms"] = 1e3 * ex.totals().communicate_seconds / static_cast<double>(ex.totals().steps);
}

constexpr Compression kAll[] = {Compression::kNone, Compression::kFp16,    Compression::kBf16,
                                Compression::kTopK, Compression::kRandomK, Compression::kDgc,
                                Compression::kSign, Compression::kTernGrad, Compression::kQsgd,
                                Compression::kPowerSgd};

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--device=cuda") == 0) {
      device = at::Device(at::kCUDA, 0);
      for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
      --argc;
      break;
    }
  }
  if (device.is_cuda() && (!torch::cuda::is_available() || !bd::nccl_available())) {
    std::fprintf(stderr, "bm_compression: --device=cuda needs a GPU and a build with NCCL\n");
    return 2;
  }
  const auto world = bd::world_from_env();
  const bool launched = bigbatch::experiments::launched_by_bigbatch();
  bd::WorldInfo info = world;
  if (world.world_size == 1) info.master_port = 29000 + static_cast<int>((getpid() + 500) % 1000);
  group = std::make_unique<bd::ProcessGroup>(info, std::chrono::seconds(300),
                                             device.is_cuda() ? bd::Backend::kNccl : bd::Backend::kGloo);
  if (world.world_size > 1) {
    at::set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / world.world_size));
    const ShapeList r = sized(bigbatch::bench::resnet50());
    for (const Compression c : kAll) {
      benchmark::RegisterBenchmark((std::string("step/") + bd::compression_name(c) + "/" + r.name + "/world2").c_str(),
                                   [r, c](benchmark::State& st) { step(st, r, c); })
          ->Iterations(bigbatch::bench::iterations(3))->Unit(benchmark::kMillisecond)->UseRealTime();
    }
  } else {
    for (const ShapeList& list : {sized(bigbatch::bench::resnet50()), sized(bigbatch::bench::bert_large())}) {
      const std::string name = list.name;
      benchmark::RegisterBenchmark(("copy/" + name).c_str(), [list](benchmark::State& st) { copy(st, list); })
          ->Unit(benchmark::kMillisecond)->UseRealTime();
      for (const char* what : {"fp16", "sign", "topk_select"}) {
        if (device.is_cuda()) break;  // the CPU loops
        benchmark::RegisterBenchmark((std::string("pass/") + what + "/" + name).c_str(),
                                     [list, what](benchmark::State& st) { pass(st, list, what); })
            ->Unit(benchmark::kMillisecond)->UseRealTime();
      }
      for (const Compression c : kAll) {
        benchmark::RegisterBenchmark((std::string("codec/") + bd::compression_name(c) + "/" + name).c_str(),
                                     [list, c](benchmark::State& st) { codec(st, list, c); })
            ->Unit(benchmark::kMillisecond)->UseManualTime();
      }
    }
  }
  if (world.rank != 0) std::freopen("/dev/null", "w", stdout);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  group.reset();
  if (launched || world.world_size > 1 || device.is_cuda()) return 0;
  std::fflush(stdout);
  bigbatch::experiments::LaunchOptions two;  // now the same as 2 ranks
  two.nproc = 2;
  two.master_port = 29000 + static_cast<int>(getpid() % 1000);
  return bigbatch::experiments::launch_local(two, argc, argv);
}
