// Fuzz target: the CSV reader of bigbatch's tables (csv.h): any bytes as a
// CsvTable, every cell as text, number and integer, and the rows of a
// steps_to_target.csv (what report, plot's comparison and --extend-search
// read back; cbs.csv and compare.csv go through the same reader). Every
// rejection must be a std::runtime_error naming the file; anything else
// escaping is a bug.
#include "../../experiments/io/csv.h"
#include "../../experiments/sweep/results.h"

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace bx = bigbatch::experiments;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const bx::CsvTable csv(text, "fuzz.csv");
    for (std::size_t row = 0; row < csv.rows(); ++row) {
      for (const auto& column : csv.header()) {
        (void)csv.at(row, column);
        try {
          (void)csv.number(row, column);
        } catch (const std::runtime_error&) {
        }
        try {
          (void)csv.integer(row, column);
        } catch (const std::runtime_error&) {
        }
      }
    }
    (void)bx::target_rows(csv);
  } catch (const std::runtime_error&) {
  }
  return 0;
}
