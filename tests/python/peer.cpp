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
#include "../../optimizers/lamb.h"
#include "../../optimizers/larc.h"
#include "../../optimizers/lars.h"
#include "../../optimizers/lion.h"
#include "../../optimizers/muon.h"
#include "../../optimizers/novograd.h"

#include <ATen/ATen.h>
#include <torch/serialize.h>

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
      {"lamb_clip", layerwise<LAMB>(LAMBOptions(2e-3).betas(std::make_tuple(0.8, 0.99)).max_grad_norm(1.0).trust_clip(true))},
      {"lamb_reference", layerwise<LAMB>(LAMBOptions(1e-2).weight_decay(0.01).fused(false))},
      {"lamb_master", layerwise<LAMB>(LAMBOptions(1e-2).weight_decay(0.01).master_weights(true))},
      {"lars", layerwise<LARS>(LARSOptions(0.1).momentum(0.9).weight_decay(1e-4).nesterov(true))},
      {"larc", layerwise<LARC>(LARCOptions(0.1).weight_decay(5e-4))},
      {"novograd", layerwise<NovoGrad>(NovoGradOptions(1e-2).weight_decay(1e-3).grad_averaging(true))},
      {"lion", layerwise<Lion>(LionOptions(1e-3).weight_decay(0.1))},
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

}  // namespace

int main(int argc, char** argv) {
  try {
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
