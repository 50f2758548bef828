// The LibTorch headers (and the few large others) that most of bigbatch's
// translation units include, parsed once per target instead of once per
// file: CMake precompiles this header for the targets that list it
// (bigbatch_precompile in compat/CMakeLists.txt, BIGBATCH_PRECOMPILE). A
// file still includes what it uses itself, so every file builds without it
// (Consumer.* compiles each public header alone).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
