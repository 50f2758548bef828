// The C++ side of the Python package's tests (tests/python/test_optim.py): a
// program that steps bigbatch's C++ optimizers, written with the C++ options
// API (not the package's JSON), on tensors the test hands it, so that the
// test compares the Python classes to a C++ program bit for bit, and moves
// optimizer files between the two.
//
//   python_peer CASE IN OUT [--load FILE] [--save FILE]
// IN (torch.save of a dict): "params", a list of tensors; "grads", a list of
// steps, each a list of gradients (None: no gradient that step). The
// parameters of 2 or more dimensions are group 0, the others group 1 (the
// usual split: no decay, no trust ratio). --load reads an optimizer file
// (torch::save's, in C++ or Python) before the steps, --save writes one
// after. OUT (torch.load-able): {"params": the final parameters,
// "skipped": skipped steps, "ratios": the last step's trust ratios}.
//
//   python_peer bench CASE IN MIN_SECONDS
// times the C++ step of CASE on IN's parameters with the first step's
// gradients for MIN_SECONDS and prints {"median_s": ...}, the median of
// blocks of steps (benchmarks/python/bench_optim.py: the Python call's
// overhead against this).
//
//   python_peer average SPEC IN OUT
// averages the weights of a run with optim::WeightAverage: SPEC is
// "ema:DECAY", "ema_half_life:H" (examples) or "lawa:K:EVERY"; IN holds
// "steps", a list of the parameters' values after each step, and "batches",
// each step's batch size; OUT is {"averaged": the averaged tensors}
// (tests/python/test_average.py: against torch.optim.swa_utils).
#include "../../optimizers/lamb.h"
#include "../../optimizers/larc.h"
#include "../../optimizers/lars.h"
#include "../../optimizers/lion.h"
#include "../../optimizers/schedule_free.h"
#include "../../optimizers/muon.h"
#include "../../optimizers/novograd.h"
#include "../../optimizers/shampoo.h"
#include "../../optimizers/soap.h"
#include "../../optimizers/weight_average.h"

#include <ATen/ATen.h>
#include <torch/serialize.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace {

using namespace bigbatch::optim;
using torch::optim::OptimizerParamGroup;

/// Groups 0 (the matrices, `weights`) and 1 (the rest, `rest`), as the test splits them.
template <typename Options>
std::vector<OptimizerParamGroup> split(const std::vector<at::Tensor>& params, const Options& weights,
                                       const Options& rest) {
  std::vector<at::Tensor> a, b;
  for (const auto& p : params) (p.dim() >= 2 ? a : b).push_back(p);
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(a, std::make_unique<Options>(weights));
  groups.emplace_back(b, std::make_unique<Options>(rest));
  return groups;
}

using Make = std::function<std::unique_ptr<LayerwiseOptimizerBase>(const std::vector<at::Tensor>&)>;

template <typename Opt, typename Options>
Make layerwise(const Options& o) {
  return [o](const std::vector<at::Tensor>& params) {
    Options plain = o;
    plain.weight_decay(0).adapt(false);
    return std::make_unique<Opt>(split(params, o, plain), o);
  };
}

/// The cases, by the names the test uses; each test case writes the same options in Python.
const std::map<std::string, Make>& cases() {
  static const std::map<std::string, Make> all = {
      {"lamb", layerwise<LAMB>(LAMBOptions(1e-2).weight_decay(0.01))},
      {"lamb_flat",
       [](const std::vector<at::Tensor>& params) -> std::unique_ptr<LayerwiseOptimizerBase> {
         return std::make_unique<LAMB>(params, LAMBOptions(1e-3));
       }},
      {"lamb_clip", layerwise<LAMB>(LAMBOptions(2e-3).betas(std::make_tuple(0.8, 0.99)).max_grad_norm(1.0).trust_clip(true))},
      {"lamb_reference", layerwise<LAMB>(LAMBOptions(1e-2).weight_decay(0.01).fused(false))},
      {"lamb_master", layerwise<LAMB>(LAMBOptions(1e-2).weight_decay(0.01).master_weights(true))},
      {"lars", layerwise<LARS>(LARSOptions(0.1).momentum(0.9).weight_decay(1e-4).nesterov(true))},
      {"larc", layerwise<LARC>(LARCOptions(0.1).weight_decay(5e-4))},
      {"novograd", layerwise<NovoGrad>(NovoGradOptions(1e-2).weight_decay(1e-3).grad_averaging(true))},
      {"lion", layerwise<Lion>(LionOptions(1e-3).weight_decay(0.1))},
      {"adamw_schedule_free",
       layerwise<AdamWScheduleFree>(AdamWScheduleFreeOptions(1e-2).weight_decay(0.05).warmup_steps(2))},
      {"sgd_schedule_free", layerwise<SGDScheduleFree>(SGDScheduleFreeOptions(0.1).weight_decay(1e-3))},
      {"soap", layerwise<SOAP>(SOAPOptions(3e-3).weight_decay(0.01).precondition_frequency(2))},
      {"shampoo", layerwise<Shampoo>(ShampooOptions(1e-2).betas({0.9, 0.99}).epsilon(1e-5).momentum(0.5)
                                         .weight_decay(0.01).precondition_frequency(2).max_preconditioner_dim(16))},
      {"muon",
       [](const std::vector<at::Tensor>& params) -> std::unique_ptr<LayerwiseOptimizerBase> {
         const auto o = MuonOptions(0.02).weight_decay(0.01);
         auto adamw = o;
         adamw.orthogonalize(false).weight_decay(0);
         return std::make_unique<Muon>(split(params, o, adamw), o);
       }},
  };
  return all;
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// The median seconds of one step, over blocks of at least 10 ms for `min_seconds` in all.
double bench(LayerwiseOptimizerBase& opt, double min_seconds) {
  using clock = std::chrono::steady_clock;
  opt.step();
  int per_block = 1;
  for (;;) {  // steps per block: at least 10 ms
    const auto t0 = clock::now();
    for (int i = 0; i < per_block; ++i) opt.step();
    if (std::chrono::duration<double>(clock::now() - t0).count() >= 0.01) break;
    per_block *= 2;
  }
  std::vector<double> blocks;
  const auto start = clock::now();
  while (blocks.size() < 5 || std::chrono::duration<double>(clock::now() - start).count() < min_seconds) {
    const auto t0 = clock::now();
    for (int i = 0; i < per_block; ++i) opt.step();
    blocks.push_back(std::chrono::duration<double>(clock::now() - t0).count() / per_block);
  }
  std::sort(blocks.begin(), blocks.end());
  return blocks[blocks.size() / 2];
}

// SPEC's fields split at ':'.
std::vector<std::string> fields_of(const std::string& spec) {
  std::vector<std::string> out(1);
  for (const char c : spec) {
    if (c == ':') {
      out.emplace_back();
    } else {
      out.back().push_back(c);
    }
  }
  return out;
}

// The average mode (see the top of this file).
void average(const std::string& spec, const std::string& in, const std::string& out_path) {
  const std::vector<std::string> f = fields_of(spec);
  AverageOptions o;
  if (f[0] == "ema" && f.size() == 2) {
    o.type = AverageType::kEma;
    o.decay = std::stod(f[1]);
  } else if (f[0] == "ema_half_life" && f.size() == 2) {
    o.type = AverageType::kEma;
    o.half_life = std::stod(f[1]);
  } else if (f[0] == "lawa" && f.size() == 3) {
    o.type = AverageType::kLawa;
    o.k = std::stoll(f[1]);
    o.every = std::stoll(f[2]);
  } else {
    throw std::invalid_argument("no average " + spec);
  }
  const auto dict = torch::pickle_load(read_file(in)).toGenericDict();
  const auto steps = dict.at("steps").toListRef();
  const auto batches = dict.at("batches").toListRef();
  std::vector<at::Tensor> params;
  for (const auto& p : steps.at(0).toListRef()) params.push_back(at::empty_like(p.toTensor()));
  WeightAverage avg(o, params);
  for (std::size_t t = 0; t < steps.size(); ++t) {
    for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(steps[t].toListRef()[i].toTensor());
    avg.update(static_cast<std::int64_t>(t) + 1, batches.at(t).toInt());
  }
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  c10::impl::GenericList averaged(c10::TensorType::get());
  for (const auto& a : avg.averaged()) averaged.push_back(a);
  out.insert("averaged", averaged);
  const auto bytes = torch::pickle_save(out);
  std::ofstream(out_path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 5 && std::string(argv[1]) == "average") {
      average(argv[2], argv[3], argv[4]);
      return 0;
    }
    if (argc == 5 && std::string(argv[1]) == "bench") {
      const auto it = cases().find(argv[2]);
      if (it == cases().end()) throw std::invalid_argument(std::string("no case ") + argv[2]);
      const auto dict = torch::pickle_load(read_file(argv[3])).toGenericDict();
      std::vector<at::Tensor> params;
      for (const auto& p : dict.at("params").toListRef()) params.push_back(p.toTensor().clone().requires_grad_(true));
      const auto first = dict.at("grads").toListRef()[0].toListRef();
      for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = first[i].toTensor().clone();
      auto opt = it->second(params);
      std::cout << "{\"median_s\": " << bench(*opt, std::stod(argv[4])) << "}\n";
      return 0;
    }
    if (argc < 4) throw std::invalid_argument("usage: python_peer CASE IN OUT [--load FILE] [--save FILE]");
    const std::string name = argv[1];
    std::string load, save;
    for (int i = 4; i + 1 < argc; i += 2) {
      const std::string flag = argv[i];
      (flag == "--load" ? load : flag == "--save" ? save : throw std::invalid_argument("unknown flag " + flag)) =
          argv[i + 1];
    }
    const auto it = cases().find(name);
    if (it == cases().end()) throw std::invalid_argument("no case " + name);
    const c10::IValue in = torch::pickle_load(read_file(argv[2]));
    const auto dict = in.toGenericDict();
    std::vector<at::Tensor> params;
    for (const auto& p : dict.at("params").toListRef()) params.push_back(p.toTensor().clone().requires_grad_(true));
    auto opt = it->second(params);
    if (!load.empty()) torch::load(*opt, load);
    for (const auto& step : dict.at("grads").toListRef()) {
      for (std::size_t i = 0; i < params.size(); ++i) {
        const auto& g = step.toListRef()[i];
        params[i].mutable_grad() = g.isNone() ? at::Tensor() : g.toTensor().clone();
      }
      opt->step();
    }
    if (!save.empty()) torch::save(*opt, save);
    c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
    c10::impl::GenericList finals(c10::TensorType::get());
    for (const auto& p : params) finals.push_back(p.detach());
    out.insert("params", finals);
    out.insert("skipped", opt->skipped_steps());
    c10::impl::GenericList ratios(c10::FloatType::get());
    for (const auto& r : opt->trust_ratios()) ratios.push_back(r.ratio);
    out.insert("ratios", ratios);
    const auto bytes = torch::pickle_save(out);
    std::ofstream(argv[3], std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "python_peer: " << e.what() << "\n";
    return 1;
  }
}
