// TorchScript models (torchscript.h).
#include "torchscript.h"

#include "../../config/json_reader.h"

#include <c10/util/Exception.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/nn/module.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>

namespace bigbatch::experiments {
namespace {

// The script module's tensors registered in `to` under the same names, child
// by child: nn::Module keeps the tensor it is given, so both share storage
// (an optimizer's in-place update, a move to another device: set_data).
void mirror(const torch::jit::Module& from, torch::nn::Module& to) {
  for (const auto& p : from.named_parameters(/*recurse=*/false)) {
    to.register_parameter(p.name, p.value, p.value.requires_grad());
  }
  for (const auto& b : from.named_buffers(/*recurse=*/false)) to.register_buffer(b.name, b.value);
  for (const auto& child : from.named_children()) {
    auto mirrored = std::make_shared<torch::nn::Module>(child.value.type()->name()->name());
    mirror(child.value, *mirrored);
    to.register_module(child.name, mirrored);
  }
}

class ScriptModuleImpl final : public torch::nn::Module {
 public:
  explicit ScriptModuleImpl(torch::jit::Module script)
      : torch::nn::Module("TorchScript"), script_(std::move(script)) {
    mirror(script_, *this);
  }
  at::Tensor forward(const at::Tensor& x) {
    const c10::IValue out = script_.forward({x});
    TORCH_CHECK(out.isTensor(), "TorchScript model: forward returned ", out.tagKind(), ", not a tensor");
    return out.toTensor();
  }
  void train(bool on) override {
    torch::nn::Module::train(on);
    script_.train(on);
  }

 private:
  torch::jit::Module script_;
};

[[noreturn]] void bad_file(const std::string& path, const std::string& problem) {
  throw ConfigError("model.path: " + path + ": " + problem);
}

}  // namespace

Model script_model(const torch::jit::Module& module) {
  auto impl = std::make_shared<ScriptModuleImpl>(module);
  return Model(impl);
}

Model load_script_model(const std::string& path) {
  if (!std::ifstream(path).good()) bad_file(path, std::string("cannot open (") + std::strerror(errno) + ")");
  torch::jit::Module module;
  try {
    module = torch::jit::load(path, at::Device(at::kCPU));
  } catch (const c10::Error& e) {
    bad_file(path, "not a TorchScript module (torch::jit::load: " + error_line(e) + ")");
  }
  if (!module.find_method("forward")) bad_file(path, "the TorchScript module has no forward method");
  bool trainable = false;
  for (const auto& p : module.parameters()) trainable = trainable || p.requires_grad();
  if (!trainable) bad_file(path, "the TorchScript module has no parameters to train");
  module.train();
  return script_model(module);
}

ModelRegistration torchscript_model() {
  ModelRegistration r;
  r.type = "torchscript";
  r.resolve = [](const nlohmann::json& params) {
    config::JsonReader reader(params, "model");
    const std::string path = reader.string("path");
    reader.finish();
    if (!std::ifstream(path).good()) bad_file(path, std::string("cannot open (") + std::strerror(errno) + ")");
    return nlohmann::json{{"path", path}};
  };
  r.build = [](const nlohmann::json& params, const ModelInput&) {
    return load_script_model(params.at("path").get<std::string>());
  };
  return r;
}

}  // namespace bigbatch::experiments
