// Strict reading of JSON config objects: every key known, every type right,
// every error naming the key by its full path (e.g. "schedule.decay.gamma"),
// and the tables that spell enums in configs and result files. Below every
// folder that reads or writes JSON: the schedule's JSON form (schedules/) and
// the experiment configs and results (experiments/).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace bigbatch::config {

/// How a config spells one value of an enum. A table of these (or of any
/// struct with `value` and `name` members), in the order error messages list
/// them, is what enum_name, enum_value and JsonReader::choice read.
template <typename E>
struct EnumName {
  E value;
  const char* name;
};

[[noreturn]] void config_error(const std::string& path, const std::string& problem);

/// The spelling of `value` in `table`; std::logic_error when the table lacks it.
template <typename Table, typename E>
std::string enum_name(const Table& table, E value) {
  for (const auto& entry : table) {
    if (entry.value == value) return entry.name;
  }
  throw std::logic_error("enum value " + std::to_string(static_cast<int>(value)) + " has no name");
}

/// The value `table` spells `text`; otherwise config_error(path,
/// "unknown value \"<text>\" (one of: <names>)").
template <typename Table>
auto enum_value(const Table& table, const std::string& text, const std::string& path) {
  std::string choices;
  for (const auto& entry : table) {
    if (text == entry.name) return entry.value;
    choices += (choices.empty() ? "" : ", ") + std::string(entry.name);
  }
  config_error(path, "unknown value \"" + text + "\" (one of: " + choices + ")");
}

/// Reads one JSON object. Each getter marks its key as known; finish() then
/// rejects any key nobody asked for. Errors are c10::Error with the message
/// "<path>: <problem>".
class JsonReader {
 public:
  /// `path` names the object in messages ("" for the top level).
  JsonReader(const nlohmann::json& object, std::string path);

  bool has(const std::string& key) const;
  /// The object's own path in messages, and a key's below it.
  const std::string& path() const { return path_; }
  std::string path_of(const std::string& key) const;

  double number(const std::string& key, double fallback);
  double number(const std::string& key);  // required
  std::optional<double> optional_number(const std::string& key);
  std::int64_t integer(const std::string& key, std::int64_t fallback);
  std::int64_t integer(const std::string& key);  // required
  bool boolean(const std::string& key, bool fallback);
  std::string string(const std::string& key, const std::string& fallback);
  std::string string(const std::string& key);  // required
  std::vector<double> numbers(const std::string& key, std::vector<double> fallback);
  std::vector<std::int64_t> integers(const std::string& key, std::vector<std::int64_t> fallback);
  /// The raw value (any type), marking the key known; nullptr when absent.
  const nlohmann::json* raw(const std::string& key);
  /// An enum spelled as one of `table`'s names; absent -> `fallback`.
  template <typename Table, typename E>
  E choice(const std::string& key, const Table& table, E fallback) {
    return enum_value(table, string(key, enum_name(table, fallback)), path_of(key));
  }
  /// A nested object; absent -> an empty object.
  JsonReader object(const std::string& key);

  /// Throws naming the first key that no getter asked for.
  void finish() const;

 private:
  const nlohmann::json& value(const std::string& key);
  // An array whose every item passes accept(item); items/item name them in errors.
  template <typename T, typename Accept>
  std::vector<T> array_of(const std::string& key, std::vector<T> fallback, const char* items, const char* item,
                          Accept accept);

  const nlohmann::json* object_;
  std::string path_;
  std::set<std::string> known_;
};

/// config_error(path, problem) throws "<path>: <problem>" as a c10::Error, for
/// checks after reading (declared above).

}  // namespace bigbatch::config
