// "muon": what the runner adds to the entry it derives from Muon's own
// description (optimizers/kind.h, which also gives it Muon's split: the hidden
// matrices orthogonalized; AdamW for the input layer, the output head and,
// without decay, the plain parameters). The update scale is Moonshot's
// match_rms_adamw unless the config says: one rate then suits both parts,
// which is what a rate search over one lr needs.
#include "builtin.h"
#include "entry.h"

namespace bigbatch::experiments {

OptimizerEntry muon_entry(const optim::OptimizerKind& kind) {
  OptimizerEntry e = kind_entry(kind, {{"adjust_lr", "match_rms_adamw"}});
  // Folders written while the runner spelled the AdamW groups' options its
  // own way ("betas" and "eps"; "eps" is now the iteration's, as in C++ and Python).
  e.upgrade = [](nlohmann::json resolved) {
    if (!resolved.contains("betas")) return resolved;
    resolved["adamw_betas"] = resolved["betas"];
    resolved.erase("betas");
    if (resolved.contains("eps")) {
      resolved["adamw_eps"] = resolved["eps"];
      resolved.erase("eps");
    }
    return resolved;
  };
  return e;
}

}  // namespace bigbatch::experiments
