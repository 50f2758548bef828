// One field list per spec, read strictly and written back: a spec's
// `xxx_fields(io, spec)` names each key once, with its default (the spec's
// initial value) and its checks; Reader fills the spec from a JSON object
// (JsonReader: every key known, every type checked) and runs the checks,
// Writer writes it back with every default spelled out. A key only one side
// knows cannot happen: there is one list. The runner's configs, the built-in
// datasets and models and each optimizer's keys are read this way.
#pragma once

#include "json_reader.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace bigbatch::config {

/// A number as a message shows it.
inline std::string num(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

/// Fills a spec from a JSON object (JsonReader: every key known, every type
/// checked) and runs its checks, failing on the first with its key's path.
class Reader {
 public:
  static constexpr bool kReading = true;
  explicit Reader(JsonReader r) : r_(std::move(r)) {}

  /// An optional key: absent leaves `value` (the default) as it is.
  template <typename T>
  void field(const std::string& key, T& value) { read(key, value); }
  void required(const std::string& key, double& value) { value = r_.number(key); }
  void required(const std::string& key, std::int64_t& value) { value = r_.integer(key); }
  void required(const std::string& key, std::string& value) { value = r_.string(key); }
  template <typename Table, typename E>
  void choice(const std::string& key, E& value, const Table& table) { value = r_.choice(key, table, value); }
  template <typename Table, typename E>
  void choice(const std::string& key, E& value, const Table& table, E fallback) {
    value = r_.choice(key, table, fallback);
  }
  /// A nested object read by `fields` (absent: an empty object, so defaults).
  template <typename Spec, typename Fields>
  void object(const std::string& key, Spec& spec, const Fields& fields) {
    Reader nested(r_.object(key));
    fields(nested, spec);
    nested.r_.finish();
  }
  /// Whether the config gives `key` (the writer asks the spec instead).
  bool given(const std::string& key, bool /*in_spec*/) const { return r_.has(key); }
  void check(const std::string& key, bool ok, const std::string& problem) const {
    if (!ok) config_error(r_.path_of(key), problem);
  }
  /// A check of the object as a whole, reported at its own path.
  void check_whole(bool ok, const std::string& problem) const {
    if (!ok) config_error(r_.path(), problem);
  }
  JsonReader& json_reader() { return r_; }

 private:
  void read(const std::string& key, double& v) { v = r_.number(key, v); }
  void read(const std::string& key, std::int64_t& v) { v = r_.integer(key, v); }
  void read(const std::string& key, std::uint64_t& v) {
    const std::int64_t x = r_.integer(key, static_cast<std::int64_t>(v));
    check(key, x >= 0, "must be >= 0, got " + std::to_string(x));
    v = static_cast<std::uint64_t>(x);
  }
  void read(const std::string& key, bool& v) { v = r_.boolean(key, v); }
  void read(const std::string& key, std::string& v) { v = r_.string(key, v); }
  void read(const std::string& key, std::optional<bool>& v) {
    if (r_.has(key)) v = r_.boolean(key, false);
  }
  void read(const std::string& key, std::vector<double>& v) { v = r_.numbers(key, v); }
  void read(const std::string& key, std::vector<std::int64_t>& v) { v = r_.integers(key, v); }
  void read(const std::string& key, std::vector<std::uint64_t>& v) {
    const auto xs = r_.integers(key, std::vector<std::int64_t>(v.begin(), v.end()));
    for (const auto x : xs) check(key, x >= 0, "must be >= 0, got " + std::to_string(x));
    v.assign(xs.begin(), xs.end());
  }
  void read(const std::string& key, std::optional<double>& v) { v = r_.optional_number(key); }
  void read(const std::string& key, std::optional<std::vector<double>>& v) {
    if (r_.has(key)) v = r_.numbers(key, {});
  }
  void read(const std::string& key, std::optional<std::string>& v) {
    if (r_.has(key)) v = r_.string(key);
  }

  JsonReader r_;
};

/// Writes a spec as a JSON object, every default spelled out but an unset
/// optional (runner.batch_trials, whose default is the device's); checks pass.
class Writer {
 public:
  static constexpr bool kReading = false;

  template <typename T>
  void field(const std::string& key, const T& value) { json_[key] = value; }
  template <typename T>
  void field(const std::string& key, const std::optional<T>& value) {
    if (value) json_[key] = *value;
  }
  template <typename T>
  void required(const std::string& key, const T& value) { field(key, value); }
  template <typename Table, typename E>
  void choice(const std::string& key, E value, const Table& table, E /*fallback*/ = E{}) {
    json_[key] = config::enum_name(table, value);
  }
  template <typename Spec, typename Fields>
  void object(const std::string& key, const Spec& spec, const Fields& fields) {
    Writer nested;
    fields(nested, spec);
    json_[key] = std::move(nested.json_);
  }
  bool given(const std::string& /*key*/, bool in_spec) const { return in_spec; }
  void check(const std::string&, bool, const std::string&) const {}
  void check_whole(bool, const std::string&) const {}
  nlohmann::json& out() { return json_; }

 private:
  nlohmann::json json_ = nlohmann::json::object();
};


/// A spec's fields as a JSON object, every default written out.
template <typename Spec, typename Fields>
nlohmann::json write_fields(const Spec& spec, const Fields& fields) {
  Writer w;
  fields(w, spec);
  return std::move(w.out());
}

/// A spec read from `j` by `fields`, errors naming keys below `path`.
template <typename Spec, typename Fields>
Spec read_fields(const nlohmann::json& j, const std::string& path, const Fields& fields) {
  Spec spec;
  Reader r(JsonReader(j, path));
  fields(r, spec);
  r.json_reader().finish();
  return spec;
}

}  // namespace bigbatch::config
