// The machine's core ledger (cores.h), on flock(2): advisory locks held by
// open file descriptions, released by the kernel when their process dies.
#include "cores.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <system_error>

namespace bigbatch::experiments {
namespace {

[[noreturn]] void fail(const std::string& path, const char* what, int error) {
  throw std::runtime_error(path + ": " + what + ": " + std::generic_category().message(error));
}

// Holds the ledger's own lock (<folder>/.lock) while a process reads and changes it.
class LedgerLock {
 public:
  explicit LedgerLock(const std::string& folder) : path_(folder + "/.lock") {
    // Read-only is enough for flock, and lets every user's workers lock a
    // file another user made.
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0666);
    if (fd_ < 0) fail(path_, "cannot open", errno);
    ::fchmod(fd_, 0666);  // past the umask, where this user made it (others cannot: no matter)
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        const int error = errno;
        ::close(fd_);
        fail(path_, "cannot lock", error);
      }
    }
  }
  ~LedgerLock() { ::close(fd_); }  // closing drops the lock
  LedgerLock(const LedgerLock&) = delete;
  LedgerLock& operator=(const LedgerLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace

std::string core_ledger_folder() {
  if (const char* env = std::getenv("BIGBATCH_CORE_LEDGER"); env != nullptr && *env != '\0') return env;
  struct stat st {};
  return ::stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm/bigbatch-cores" : "/tmp/bigbatch-cores";
}

CoreLedger::CoreLedger(std::string folder, int cores) : folder_(std::move(folder)), cores_(cores) {
  if (::mkdir(folder_.c_str(), 01777) == 0) {
    ::chmod(folder_.c_str(), 01777);  // past the umask: every user's workers share it
  } else if (errno != EEXIST) {
    fail(folder_, "cannot create", errno);
  }
}

CoreLedger::~CoreLedger() {
  if (fd_ < 0) return;
  ::unlink((folder_ + "/" + entry_).c_str());
  ::close(fd_);
}

int CoreLedger::reserve(int jobs, int threads) {
  LedgerLock lock(folder_);
  others_.clear();
  // An entry is "<pid>", or "<pid>-<uid>" where another user's dead
  // process left a "<pid>" this one cannot reuse.
  const std::string mine = std::to_string(::getpid());
  int used = 0;
  DIR* dir = ::opendir(folder_.c_str());
  if (dir == nullptr) fail(folder_, "cannot list", errno);
  while (const dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    const std::string pid = name.substr(0, name.find('-'));
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos || name == entry_) continue;
    const std::string path = folder_ + "/" + name;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // gone meanwhile
    if (::flock(fd, LOCK_SH | LOCK_NB) == 0) {
      ::unlink(path.c_str());  // unlocked: its process has died
      ::close(fd);
      continue;
    }
    char buffer[32] = {};
    const ssize_t n = ::pread(fd, buffer, sizeof buffer - 1, 0);
    ::close(fd);
    const int reserved = n > 0 ? std::atoi(buffer) : 0;
    used += reserved;
    others_.emplace_back(std::stol(pid), reserved);
  }
  ::closedir(dir);
  const int granted = std::max(0, std::min(jobs, (cores_ - used) / std::max(1, threads)));
  if (granted == 0) return 0;
  if (fd_ < 0) {
    for (const std::string& name : {mine, mine + "-" + std::to_string(::getuid())}) {
      entry_ = name;
      fd_ = ::open((folder_ + "/" + name).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd_ >= 0 || errno != EACCES) break;
    }
    const std::string entry = folder_ + "/" + entry_;
    if (fd_ < 0) fail(entry, "cannot create", errno);
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) fail(entry, "cannot lock", errno);
  }
  const std::string entry = folder_ + "/" + entry_;
  const std::string text = std::to_string(granted * threads) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    fail(entry, "cannot write", errno);
  }
  return granted;
}

}  // namespace bigbatch::experiments
