// Strict JSON object reading (json_reader.h).
#include "json_reader.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <limits>

namespace bigbatch::config {
namespace {

const nlohmann::json& empty_object() {
  static const nlohmann::json empty = nlohmann::json::object();
  return empty;
}

std::string type_name(const nlohmann::json& j) { return j.type_name(); }

}  // namespace

void config_error(const std::string& path, const std::string& problem) {
  TORCH_CHECK(false, path, ": ", problem);
  __builtin_unreachable();
}

JsonReader::JsonReader(const nlohmann::json& object, std::string path)
    : object_(&object), path_(std::move(path)) {
  if (!object.is_object()) {
    config_error(path_.empty() ? "config" : path_,
                 "expected an object, got " + type_name(object));
  }
}

std::string JsonReader::path_of(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

bool JsonReader::has(const std::string& key) const { return object_->contains(key); }

const nlohmann::json& JsonReader::value(const std::string& key) {
  known_.insert(key);
  return object_->at(key);
}

const nlohmann::json* JsonReader::raw(const std::string& key) {
  known_.insert(key);
  return has(key) ? &object_->at(key) : nullptr;
}

double JsonReader::number(const std::string& key) {
  if (!has(key)) config_error(path_of(key), "missing (a number is required)");
  const auto& v = value(key);
  if (!v.is_number()) config_error(path_of(key), "expected a number, got " + type_name(v));
  const double x = v.get<double>();
  if (!std::isfinite(x)) config_error(path_of(key), "must be finite");
  return x;
}

double JsonReader::number(const std::string& key, double fallback) {
  known_.insert(key);
  return has(key) ? number(key) : fallback;
}

std::optional<double> JsonReader::optional_number(const std::string& key) {
  known_.insert(key);
  if (!has(key) || object_->at(key).is_null()) return std::nullopt;
  return number(key);
}

std::int64_t JsonReader::integer(const std::string& key) {
  if (!has(key)) config_error(path_of(key), "missing (an integer is required)");
  const auto& v = value(key);
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (v.is_number_float()) {
    const double x = v.get<double>();
    if (std::floor(x) == x && std::abs(x) < 9e15) return static_cast<std::int64_t>(x);
  }
  config_error(path_of(key), "expected an integer, got " + (v.is_number() ? v.dump() : type_name(v)));
}

std::int64_t JsonReader::integer(const std::string& key, std::int64_t fallback) {
  known_.insert(key);
  return has(key) ? integer(key) : fallback;
}

bool JsonReader::boolean(const std::string& key, bool fallback) {
  known_.insert(key);
  if (!has(key)) return fallback;
  const auto& v = value(key);
  if (!v.is_boolean()) config_error(path_of(key), "expected true or false, got " + type_name(v));
  return v.get<bool>();
}

std::string JsonReader::string(const std::string& key) {
  if (!has(key)) config_error(path_of(key), "missing (a string is required)");
  const auto& v = value(key);
  if (!v.is_string()) config_error(path_of(key), "expected a string, got " + type_name(v));
  return v.get<std::string>();
}

std::string JsonReader::string(const std::string& key, const std::string& fallback) {
  known_.insert(key);
  return has(key) ? string(key) : fallback;
}

template <typename T, typename Accept>
std::vector<T> JsonReader::array_of(const std::string& key, std::vector<T> fallback, const char* items,
                                    const char* item, Accept accept) {
  known_.insert(key);
  if (!has(key)) return fallback;
  const auto& v = value(key);
  if (!v.is_array()) config_error(path_of(key), std::string("expected an array of ") + items + ", got " + type_name(v));
  std::vector<T> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!accept(v[i])) {
      config_error(path_of(key) + "[" + std::to_string(i) + "]", std::string("expected ") + item + ", got " + v[i].dump());
    }
    out.push_back(v[i].get<T>());
  }
  return out;
}

std::vector<double> JsonReader::numbers(const std::string& key, std::vector<double> fallback) {
  return array_of<double>(key, std::move(fallback), "numbers", "a finite number",
                          [](const nlohmann::json& x) { return x.is_number() && std::isfinite(x.get<double>()); });
}

std::vector<std::int64_t> JsonReader::integers(const std::string& key, std::vector<std::int64_t> fallback) {
  return array_of<std::int64_t>(key, std::move(fallback), "integers", "an integer",
                                [](const nlohmann::json& x) { return x.is_number_integer(); });
}

JsonReader JsonReader::object(const std::string& key) {
  known_.insert(key);
  return JsonReader(has(key) ? object_->at(key) : empty_object(), path_of(key));
}

void JsonReader::finish() const {
  for (const auto& item : object_->items()) {
    if (!known_.count(item.key())) config_error(path_of(item.key()), "unknown key");
  }
}

}  // namespace bigbatch::config
