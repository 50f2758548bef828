// Fuzz target: extensions.json (the rates --extend-search added to a sweep
// folder), as a resumed sweep reads it back: the points, written again,
// read back the same. Every rejection must be a ConfigError; anything else
// escaping is a bug.
#include "../../experiments/sweep/sweep.h"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace bx = bigbatch::experiments;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto points = bx::parse_extensions(text, "extensions.json");
    const auto again = bx::parse_extensions(bx::extensions_json(points), "extensions.json");
    if (again.size() != points.size()) __builtin_trap();
    for (std::size_t i = 0; i < points.size(); ++i) {
      if (again[i].batch_size != points[i].batch_size || again[i].lr != points[i].lr ||
          again[i].momentum != points[i].momentum) {
        __builtin_trap();
      }
    }
  } catch (const bx::ConfigError&) {
  }
  return 0;
}
