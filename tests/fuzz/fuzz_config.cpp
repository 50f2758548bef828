// Fuzz target: the sweep config reader (a config file's bytes -> its sweeps,
// their trials and the resolved JSON), as `bigbatch sweep CONFIG` reads it.
// Every rejection must be a ConfigError; anything else escaping is a bug.
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
    for (const auto& named : bx::parse_sweeps(j)) {
      const auto trials = bx::expand(named.sweep);
      if (bx::parse_sweep(bx::to_json(named.sweep)).batch_sizes != named.sweep.batch_sizes) __builtin_trap();
      for (const auto& t : trials) (void)bx::to_json(t);
    }
  } catch (const bx::ConfigError&) {
  }
  return 0;
}
