// bigbatch's CSV files (csv.h).
#include "csv.h"

#include "files.h"

#include <cmath>
#include <iomanip>
#include <sstream>
#include <stdexcept>

namespace bigbatch::experiments {
namespace {

std::vector<std::string> cells_of(const std::string& line) {
  std::vector<std::string> cells;
  std::size_t begin = 0;
  for (std::size_t comma = line.find(','); comma != std::string::npos; comma = line.find(',', begin)) {
    cells.push_back(line.substr(begin, comma - begin));
    begin = comma + 1;
  }
  cells.push_back(line.substr(begin));
  return cells;
}

}  // namespace

std::string csv_number(double x) {
  if (!std::isfinite(x)) return "";
  std::ostringstream s;
  s << std::setprecision(10) << x;
  return s.str();
}

CsvTable::CsvTable(const std::string& text, const std::string& path) : path_(path) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line)) throw std::runtime_error(path_ + ": empty (no header line)");
  header_ = cells_of(line);
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto cells = cells_of(line);
    if (cells.size() > header_.size()) {
      throw std::runtime_error(path_ + ": row " + std::to_string(rows_.size() + 1) + " has " +
                               std::to_string(cells.size()) + " cells, the header " +
                               std::to_string(header_.size()));
    }
    cells.resize(header_.size());
    rows_.push_back(std::move(cells));
  }
}

CsvTable CsvTable::read(const std::string& path) { return CsvTable(read_file(path), path); }

std::size_t CsvTable::index_of(const std::string& column) const {
  for (std::size_t i = 0; i < header_.size(); ++i) {
    if (header_[i] == column) return i;
  }
  throw std::runtime_error(path_ + ": no column \"" + column + "\"");
}

const std::string& CsvTable::at(std::size_t row, const std::string& column) const {
  return rows_.at(row)[index_of(column)];
}

// `text` (a cell, or a part of one) as a T by `parse` (std::stod,
// std::stoll); throws naming the file, row and column when it is not one.
template <typename T, typename Parse>
T CsvTable::parse_text(const std::string& text, std::size_t row, const std::string& column, Parse parse,
                       const char* what) const {
  std::size_t used = 0;
  T x{};
  try {
    x = parse(text, &used);
  } catch (const std::logic_error&) {
    used = 0;
  }
  if (used != text.size()) {
    throw std::runtime_error(path_ + ": row " + std::to_string(row + 1) + ", column " + column + ": \"" + text +
                             "\" is not " + what);
  }
  return x;
}

// The cell as a T by `parse`, nullopt when empty.
template <typename T, typename Parse>
std::optional<T> CsvTable::parsed(std::size_t row, const std::string& column, Parse parse, const char* what) const {
  const std::string& cell = at(row, column);
  if (cell.empty()) return std::nullopt;
  return parse_text<T>(cell, row, column, parse, what);
}

std::vector<double> CsvTable::numbers(std::size_t row, const std::string& column) const {
  std::istringstream parts(at(row, column));
  std::vector<double> out;
  std::string part;
  while (parts >> part) {
    out.push_back(parse_text<double>(part, row, column, [](const std::string& c, std::size_t* n) { return std::stod(c, n); },
                                     "a space-separated list of numbers"));
  }
  return out;
}

std::optional<double> CsvTable::number(std::size_t row, const std::string& column) const {
  return parsed<double>(row, column, [](const std::string& c, std::size_t* n) { return std::stod(c, n); }, "a number");
}

std::optional<std::int64_t> CsvTable::integer(std::size_t row, const std::string& column) const {
  return parsed<std::int64_t>(row, column, [](const std::string& c, std::size_t* n) { return std::stoll(c, n); },
                           "an integer");
}

}  // namespace bigbatch::experiments
