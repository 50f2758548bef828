// A workload of its own, run by the whole bigbatch command line: noisy waves
// of four frequencies, classified by a small 1-D convolutional network.
//
//   waves sweep sweep.json --out runs     steps to target against batch size
//   waves cbs cbs.json --out runs         the critical batch size over training
//   waves plot runs/waves                 the plots
//
// The data is a LibTorch map-style dataset, as a LibTorch program already
// has one; the model is a torch::nn::Module. Both are registered under the
// names the configs use, then cli_main() is the `bigbatch` program.
// docs/workloads.md walks through it.
#include <bigbatch/experiments/cli/cli.h>
#include <bigbatch/experiments/workload/workload.h>
#include <bigbatch/config/json_reader.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>

namespace bx = bigbatch::experiments;

// Example i: a sine wave of one of four frequencies (its class) with a random
// phase and amplitude, plus Gaussian noise; 64 samples, one channel. Each
// example comes from its own generator seeded by (seed, i), so the same index
// gives the same example on every call and from any thread.
class Waves : public torch::data::datasets::Dataset<Waves> {
 public:
  static constexpr std::int64_t kLength = 64;

  Waves(std::int64_t size, double noise, std::uint64_t seed) : size_(size), noise_(noise), seed_(seed) {}

  torch::data::Example<> get(std::size_t index) override {
    auto gen = at::detail::createCPUGenerator(seed_ * 1000003 + index);
    const std::int64_t label = at::randint(4, {1}, gen, at::kLong).item<std::int64_t>();
    const double phase = 2 * M_PI * at::rand({1}, gen, at::kDouble).item<double>();
    const double amplitude = 0.5 + at::rand({1}, gen, at::kDouble).item<double>();
    const at::Tensor t = at::arange(kLength, at::kFloat) / static_cast<double>(kLength);
    const double cycles = 2.0 + 2.0 * static_cast<double>(label);  // 2, 4, 6 or 8 per window
    at::Tensor x = amplitude * at::sin(2 * M_PI * cycles * t + phase) + noise_ * at::randn({kLength}, gen, at::kFloat);
    return {x.unsqueeze(0), at::scalar_tensor(label, at::kLong)};
  }
  torch::optional<std::size_t> size() const override { return static_cast<std::size_t>(size_); }

 private:
  std::int64_t size_;
  double noise_;
  std::uint64_t seed_;
};

// conv5-relu-pool2-conv5-relu-global average-linear, over [N, 1, 64].
struct WaveNetImpl : torch::nn::Module {
  WaveNetImpl(std::int64_t channels, std::int64_t classes)
      : conv1(register_module("conv1", torch::nn::Conv1d(torch::nn::Conv1dOptions(1, channels, 5).padding(2)))),
        conv2(register_module("conv2",
                              torch::nn::Conv1d(torch::nn::Conv1dOptions(channels, 2 * channels, 5).padding(2)))),
        fc(register_module("fc", torch::nn::Linear(2 * channels, classes))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::max_pool1d(torch::relu(conv1(x)), 2);
    h = torch::relu(conv2(h)).mean(2);
    return fc(h);
  }

  torch::nn::Conv1d conv1, conv2;
  torch::nn::Linear fc;
};
TORCH_MODULE(WaveNet);

int main(int argc, char** argv) {
  // "dataset": {"name": "waves", "train_size": ..., "val_size": ..., "noise": ..., "seed": ...}
  bx::register_dataset({
      "waves",
      [](const nlohmann::json& params) {  // checked, with every default written out
        bigbatch::config::JsonReader r(params, "dataset");
        const nlohmann::json out = {{"train_size", r.integer("train_size", 8192)},
                                    {"val_size", r.integer("val_size", 1024)},
                                    {"noise", r.number("noise", 1.0)},
                                    {"seed", r.integer("seed", 0)}};
        r.finish();
        if (out["train_size"] < 1 || out["val_size"] < 1) {
          bigbatch::config::config_error("dataset", "train_size and val_size must be >= 1");
        }
        return out;
      },
      [](const nlohmann::json& p) {
        const auto seed = p["seed"].get<std::uint64_t>();
        const double noise = p["noise"].get<double>();
        bx::WorkloadData data;
        data.classes = 4;
        data.train = bx::dataset_examples(Waves(p["train_size"].get<std::int64_t>(), noise, 2 * seed));
        data.validation = bx::dataset_examples(Waves(p["val_size"].get<std::int64_t>(), noise, 2 * seed + 1));
        return data;
      }});
  // "model": {"type": "wave_cnn", "channels": ...}
  bx::register_model({"wave_cnn",
                      [](const nlohmann::json& params) {
                        bigbatch::config::JsonReader r(params, "model");
                        const nlohmann::json out = {{"channels", r.integer("channels", 16)}};
                        r.finish();
                        return out;
                      },
                      [](const nlohmann::json& p, const bx::ModelInput& input) -> bx::Model {
                        return WaveNet(p["channels"].get<std::int64_t>(), input.outputs);
                      }});
  return bx::cli_main(argc, argv);
}
