// Run-folder files (files.h), on POSIX calls, so that each failure's errno
// reaches the message.
#include "files.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <stdexcept>
#include <system_error>
#include <utility>

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

// nftw's callback has no context: the entry that could not be removed and
// why, for remove_tree to report (one walk at a time per thread).
thread_local std::string remove_failed;
thread_local int remove_errno = 0;

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  if (::remove(path) == 0 || errno == ENOENT) return 0;
  remove_failed = path;
  remove_errno = errno;
  return 1;
}

}  // namespace

void remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    fail(path, "cannot remove", errno);
  }
  // Depth first (a folder after what it holds), links not followed.
  remove_failed.clear();
  remove_errno = 0;
  if (::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) {
    if (!remove_failed.empty()) fail(remove_failed, "cannot remove", remove_errno);
    fail(path, "cannot remove", errno);
  }
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
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
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
