// The built-in optimizers' entries, one file each (optimizer.h), listed
// once, in the order error messages name them.
#pragma once

#include "optimizer.h"

#include <vector>

namespace bigbatch::experiments {

OptimizerEntry sgd_entry();       // sgd.cpp
OptimizerEntry adam_entry();      // adam.cpp
OptimizerEntry adamw_entry();     // adam.cpp
OptimizerEntry lars_entry();      // lars.cpp
OptimizerEntry larc_entry();      // lars.cpp
OptimizerEntry lamb_entry();      // lamb.cpp
OptimizerEntry novograd_entry();  // novograd.cpp
OptimizerEntry lion_entry();      // lion.cpp
OptimizerEntry muon_entry();      // muon.cpp

/// A built-in's name and the function that makes its entry: the registry
/// makes an entry the first time its optimizer is asked for, so a run of
/// LAMB reads lamb.cpp and none of the others.
struct BuiltinOptimizer {
  const char* name;
  OptimizerEntry (*entry)();
};
inline constexpr BuiltinOptimizer kBuiltinOptimizers[] = {
    {"sgd", sgd_entry},   {"adam", adam_entry}, {"adamw", adamw_entry},       {"lars", lars_entry}, {"larc", larc_entry},
    {"lamb", lamb_entry}, {"novograd", novograd_entry}, {"lion", lion_entry}, {"muon", muon_entry}};

}  // namespace bigbatch::experiments
