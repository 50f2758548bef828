// Fuzz target: the cbs config reader (a config file's bytes -> the workload
// and the "cbs" object, then cbs.json, which must read back to the same
// spec), as `bigbatch cbs CONFIG` and cbs_report read it. Every rejection
// must be a ConfigError; anything else escaping is a bug.
#include "../../experiments/runconfig/config.h"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace bx = bigbatch::experiments;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;  // not JSON: read_config's own message
  try {
    const bx::CbsConfig c = bx::parse_cbs(j);
    const bx::CbsConfig again = bx::parse_cbs(bx::to_json(c));  // cbs.json reads back as it was written
    if (again.cbs.checkpoints != c.cbs.checkpoints || again.cbs.branch_batches != c.cbs.branch_batches ||
        again.cbs.window != c.cbs.window || again.cbs.tolerance.relative != c.cbs.tolerance.relative ||
        again.cbs.tolerance.value != c.cbs.tolerance.value || again.cbs.lr_factors != c.cbs.lr_factors) {
      __builtin_trap();
    }
  } catch (const bx::ConfigError&) {
  }
  return 0;
}
