// The "python" dataset and model (python.h).
#include "python.h"

#include "../../config/json_reader.h"

#include <string>

namespace bigbatch::experiments {
void refuse_python_part(const std::string& what) {
  throw ConfigError(what + " \"python\": the user's own, held by the Python process that trains this sweep's "
                           "trials (bigbatch.sweep with train_data=...); this program alone cannot train it");
}

DatasetRegistration python_dataset() {
  DatasetRegistration d;
  d.name = "python";
  d.resolve = [](const nlohmann::json& params) {
    config::JsonReader r(params, "dataset");
    const std::int64_t train = r.integer("train_size"), val = r.integer("val_size");
    const std::string id = r.string("id");
    r.finish();
    if (train < 1) throw ConfigError("dataset.train_size: must be >= 1, got " + std::to_string(train));
    if (val < 1) throw ConfigError("dataset.val_size: must be >= 1, got " + std::to_string(val));
    return nlohmann::json{{"train_size", train}, {"val_size", val}, {"id", id}};
  };
  d.load = [](const nlohmann::json&) -> WorkloadData { refuse_python_part("dataset"); };
  return d;
}

ModelRegistration python_model() {
  ModelRegistration m;
  m.type = "python";
  m.resolve = [](const nlohmann::json& params) {
    config::JsonReader r(params, "model");
    const std::string cls = r.string("class"), digest = r.string("digest");
    r.finish();
    return nlohmann::json{{"class", cls}, {"digest", digest}};
  };
  m.build = [](const nlohmann::json&, const ModelInput&) -> Model { refuse_python_part("model"); };
  return m;
}

std::int64_t python_train_size(const WorkloadPart& data) { return data.params.at("train_size").get<std::int64_t>(); }

}  // namespace bigbatch::experiments
