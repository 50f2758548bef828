// The CSV files bigbatch writes and reads back (metrics.csv,
// steps_to_target.csv, cbs.csv, compare.csv): a header line of column names,
// then one line per row, cells separated by commas and never quoted (no cell
// holds a comma: numbers, names checked by check_name, status words). A
// number that is not finite is an empty cell, but for steps_to_target.csv's
// "inf": steps of seeds that did not reach.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace bigbatch::experiments {

/// A number for CSV: empty when not finite, else 10 significant digits.
std::string csv_number(double x);

/// A CSV file read whole: its columns by name, its rows as cells.
class CsvTable {
 public:
  /// Parses `text`; `path` names the file in errors. A row with fewer cells
  /// than the header has empty ones (files from before a column was added).
  CsvTable(const std::string& text, const std::string& path);
  /// Reads and parses the file at `path`.
  static CsvTable read(const std::string& path);

  std::size_t rows() const { return rows_.size(); }
  /// The cell of `column` in row `row` ("" when empty). Throws
  /// std::runtime_error naming the file when it has no such column.
  const std::string& at(std::size_t row, const std::string& column) const;
  /// The column's number in row `row`, or nullopt for an empty cell; throws
  /// naming the file, row and column when the cell is not a number.
  std::optional<double> number(std::size_t row, const std::string& column) const;
  std::optional<std::int64_t> integer(std::size_t row, const std::string& column) const;
  /// The column's space-separated numbers in row `row` (none for an empty
  /// cell); throws as number() does for a part that is not a number.
  std::vector<double> numbers(std::size_t row, const std::string& column) const;
  const std::vector<std::string>& header() const { return header_; }
  const std::string& path() const { return path_; }

 private:
  std::size_t index_of(const std::string& column) const;
  template <typename T, typename Parse>
  T parse_text(const std::string& text, std::size_t row, const std::string& column, Parse parse,
               const char* what) const;
  template <typename T, typename Parse>
  std::optional<T> parsed(std::size_t row, const std::string& column, Parse parse, const char* what) const;

  std::string path_;
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace bigbatch::experiments
