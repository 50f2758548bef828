// Run-folder files (files.h), on POSIX calls, so that each failure's errno
// reaches the message.
#include "files.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <stdexcept>
#include <system_error>
#include <utility>
#include <vector>

namespace bigbatch::experiments {
namespace {

// "<path>: <what>: <the system's reason for errno>".
[[noreturn]] void fail(const std::string& path, const char* what, int error) {
  throw std::runtime_error(path + ": " + what + ": " + std::generic_category().message(error));
}

// Writes all of `bytes` to `fd` (a short write is continued); the errno of a
// failure, else 0.
int write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return 0;
}

// nftw's callbacks have no context: the entry a walk stopped at and why, for
// the caller to report, and the files it lists (one walk at a time per thread).
thread_local std::string walk_failed;
thread_local int walk_errno = 0;
thread_local std::vector<std::string>* walk_found = nullptr;

int stop_walk(const char* path, int error) {
  walk_errno = error;  // before anything that could change errno
  walk_failed = path;
  return 1;
}

int remove_entry(const char* path, const struct stat*, int type, struct FTW*) {
  if (::remove(path) == 0 || errno == ENOENT) return 0;
  // A folder that could not be read is not empty for that reason.
  return stop_walk(path, type == FTW_DNR && errno == ENOTEMPTY ? EACCES : errno);
}

int list_entry(const char* path, const struct stat*, int type, struct FTW*) {
  if (type == FTW_DNR) return stop_walk(path, EACCES);
  if (type == FTW_NS) return stop_walk(path, errno == 0 ? EACCES : errno);
  struct stat target {};
  if (type == FTW_F || (type == FTW_SL && ::stat(path, &target) == 0 && S_ISREG(target.st_mode))) {
    walk_found->emplace_back(path);
  }
  return 0;
}

// `path` without trailing slashes ("link/" would make lstat follow a link).
std::string without_trailing_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

}  // namespace

void remove_tree(const std::string& given) {
  const std::string path = without_trailing_slashes(given);
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    fail(path, "cannot remove", errno);
  }
  // Depth first (a folder after what it holds), links not followed.
  walk_failed.clear();
  if (::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) {
    if (!walk_failed.empty()) fail(walk_failed, "cannot remove", walk_errno);
    const int error = errno;
    if (error == ENOENT && ::lstat(path.c_str(), &st) != 0 && errno == ENOENT) return;  // gone meanwhile
    fail(path, "cannot remove", error);
  }
}

std::vector<std::string> files_under(const std::string& given) {
  const std::string folder = without_trailing_slashes(given);
  std::vector<std::string> found;
  walk_found = &found;
  walk_failed.clear();
  const int rc = ::nftw(folder.c_str(), list_entry, 16, FTW_PHYS);
  const int error = errno;
  walk_found = nullptr;
  if (rc != 0) {
    if (!walk_failed.empty()) fail(walk_failed, "cannot list", walk_errno);
    fail(folder, "cannot list", error);
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::string read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot read", errno);
  std::string out;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      fail(path, "cannot read", error);
    }
    if (n == 0) break;
    out.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

nlohmann::json read_json(const std::string& path) {
  try {
    return nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::parse_error& e) {
    throw std::runtime_error(path + ": not valid JSON: " + e.what());
  }
}

void write_file_atomic(const std::string& path, std::string_view text) {
  // Unique across the machines sharing a folder (workers on NFS), the
  // processes of one, and the threads of one process.
  static const std::string host = [] {
    char name[256] = {};
    return ::gethostname(name, sizeof name - 1) == 0 ? std::string(name) : std::string("host");
  }();
  static std::atomic<unsigned long> counter{0};
  const std::string tmp = path + ".tmp." + host + "." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(tmp, "cannot write", errno);
  int error = write_all(fd, text);
  // close() reports what a network file system defers (a full disk on NFS).
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error != 0) {
    ::unlink(tmp.c_str());
    fail(tmp, "cannot write", error);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    error = errno;
    ::unlink(tmp.c_str());
    fail(path, "cannot rename into place", error);
  }
}

AppendFile::AppendFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path_, "cannot open for writing", errno);
}

AppendFile::AppendFile(AppendFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

AppendFile& AppendFile::operator=(AppendFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

void AppendFile::write(std::string_view bytes) {
  if (fd_ < 0) throw std::logic_error(path_ + ": not open");
  if (const int error = write_all(fd_, bytes)) fail(path_, "cannot write", error);
}

}  // namespace bigbatch::experiments
