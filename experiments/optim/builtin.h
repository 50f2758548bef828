// The built-in optimizers' entries, one file each (optimizer.h). The
// registry lists them through builtin_optimizers(), in the order error
// messages list them.
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

inline std::vector<OptimizerEntry> builtin_optimizers() {
  return {sgd_entry(),  adam_entry(),     adamw_entry(), lars_entry(), larc_entry(),
          lamb_entry(), novograd_entry(), lion_entry(),  muon_entry()};
}

}  // namespace bigbatch::experiments
