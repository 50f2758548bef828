// The files of a run folder, read and written whole. A write goes to a
// temporary name and is renamed into place, so a reader or a killed writer
// never sees half a file; an append adds whole records. Every error names the
// path and the system's reason, e.g. "runs/q/b16_p0_s0/metrics.csv.tmp.4711:
// cannot write: No space left on device". Torch-free.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace bigbatch::experiments {

/// The bytes of `path`; std::runtime_error "<path>: cannot read: <reason>".
std::string read_file(const std::string& path);

/// The JSON in `path`; std::runtime_error naming the file when it is not JSON.
nlohmann::json read_json(const std::string& path);

/// Writes `text` to `path` through a temporary file beside it and a rename;
/// on failure the temporary is removed and `path` is as it was.
void write_file_atomic(const std::string& path, std::string_view text);

/// Removes `path` and, where it is a folder, everything under it (a link is
/// removed, never followed); a missing path is no error. std::runtime_error
/// "<path>: cannot remove: <reason>" names the entry that could not go.
/// Use it, not std::filesystem::remove_all, in anything that links LibTorch:
/// PyPI's torch 2.11 wheel exports its own copy of remove_all from
/// libtorch.so, ahead of libstdc++'s in a program's lookup order, and that
/// copy jumps to address 0 on a folder with subfolders (seen on the GPU
/// machine, 2026-11-24).
void remove_tree(const std::string& path);

/// Every file under `folder`, at any depth, sorted: regular files and links
/// to them; a link to a folder is not followed. std::runtime_error
/// "<path>: cannot list: <reason>" names a folder that could not be read.
/// (On nftw, not std::filesystem::recursive_directory_iterator, for the
/// reason remove_tree gives.)
std::vector<std::string> files_under(const std::string& folder);

/// A file opened to append to (created if missing): each write() adds all of
/// its bytes or throws naming the path and the reason (having perhaps added
/// part of them: a reader of records stops at a record cut short).
class AppendFile {
 public:
  AppendFile() = default;
  explicit AppendFile(const std::string& path);
  AppendFile(AppendFile&& other) noexcept;
  AppendFile& operator=(AppendFile&& other) noexcept;
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  ~AppendFile();

  void write(std::string_view bytes);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace bigbatch::experiments
