// The built-in optimizers' entries (optimizer.h): torch's three, one file
// each, then the library's, derived from optimizers/kind.h.
#pragma once

#include "optimizer.h"
#include "../../optimizers/kind.h"

#include <vector>

namespace bigbatch::experiments {

OptimizerEntry sgd_entry();    // sgd.cpp: torch's
OptimizerEntry adam_entry();   // adam.cpp: torch's
OptimizerEntry adamw_entry();  // adam.cpp: torch's

/// The library's optimizers (optimizers/kind.h) each get the entry
/// kind_entry() derives from their own description, under their name in
/// lower case, after torch's; these add to it.
OptimizerEntry lars_entry(const optim::OptimizerKind& kind);  // lars.cpp: the momentum correction
OptimizerEntry muon_entry(const optim::OptimizerKind& kind);  // muon.cpp: its default scale rule

/// torch's optimizers: a name and the function that makes its entry (the
/// registry makes an entry the first time its optimizer is asked for).
struct BuiltinOptimizer {
  const char* name;
  OptimizerEntry (*entry)();
};
inline constexpr BuiltinOptimizer kTorchOptimizers[] = {{"sgd", sgd_entry}, {"adam", adam_entry}, {"adamw", adamw_entry}};

/// The library's optimizers whose entry adds to the derived one.
struct DecoratedKind {
  const char* name;
  OptimizerEntry (*entry)(const optim::OptimizerKind& kind);
};
inline constexpr DecoratedKind kDecoratedKinds[] = {{"lars", lars_entry}, {"muon", muon_entry}};

}  // namespace bigbatch::experiments
