// The files of a run folder: whole-file reads, atomic writes (a temporary name
// and a rename, so a reader or a killed writer never sees half a file), and
// the version stamps every summary records.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace bigbatch::experiments {

/// The bytes of `path`; std::runtime_error "<path>: cannot read" when missing.
std::string read_file(const std::string& path);

/// The JSON in `path`; std::runtime_error naming the file when it is not JSON.
nlohmann::json read_json(const std::string& path);

/// Writes `text` to `path` through a temporary file and a rename.
void write_file_atomic(const std::string& path, const std::string& text);

/// The code version (git describe at configure time) and the LibTorch version.
std::string code_version();
std::string libtorch_version();

}  // namespace bigbatch::experiments
