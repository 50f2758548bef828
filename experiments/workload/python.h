// The workload of a sweep whose trials Python trains (bigbatch.sweep with
// the user's nn.Module and DataLoader; docs/python.md "Sweeps of any
// nn.Module"): "dataset": {"name": "python", ...} and "model": {"type":
// "python", ...} name what the Python process holds, so that the sweep
// folder records it and a resumed sweep compares it. This program cannot
// load either: loading one is a ConfigError that says where they run.
#pragma once

#include "workload.h"

#include <cstdint>
#include <string>

namespace bigbatch::experiments {

/// "dataset": {"name": "python", "train_size": N, "val_size": M, "id": TEXT}:
/// the sizes of the user's splits (the schedule counts epochs in the first)
/// and what names the data (the dataset's class, or the user's `data_id`).
DatasetRegistration python_dataset();
/// "model": {"type": "python", "class": TEXT, "digest": HEX}: the module's
/// class and a digest of its initial weights.
ModelRegistration python_model();

/// The ConfigError for loading a "python" dataset or building a "python"
/// model (`what`: "dataset", "model") here: it says where they run.
[[noreturn]] void refuse_python_part(const std::string& what);

/// The training set's size a "python" dataset part records (resolved).
std::int64_t python_train_size(const WorkloadPart& data);

}  // namespace bigbatch::experiments
