// Claims on a shared sweep folder (claims.h), on POSIX calls that NFS and
// Lustre implement atomically: link(2) to create a slot exclusively, a
// rename-free heartbeat by utimensat(2), and open(2) + fstat(2) to read.
#include "claims.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <vector>

namespace bigbatch::experiments {
namespace {

[[noreturn]] void fail(const std::string& path, const char* what, int error) {
  throw std::runtime_error(path + ": " + what + ": " + std::generic_category().message(error));
}

double seconds_of(const struct timespec& t) { return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec); }

const char* kind_name(ClaimSlot::Kind kind) {
  switch (kind) {
    case ClaimSlot::Kind::kRun: return "run";
    case ClaimSlot::Kind::kReleased: return "released";
    case ClaimSlot::Kind::kDone: return "done";
  }
  return "run";
}

// Slot `path`'s record and mtime; nullopt when it does not exist.
std::optional<ClaimSlot> read_slot(const std::string& path, std::int64_t n) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    fail(path, "cannot read", errno);
  }
  struct stat st {};
  char buffer[512];
  ssize_t got = -1;
  int error = 0;
  if (::fstat(fd, &st) != 0) {
    error = errno;
  } else {
    do {
      got = ::read(fd, buffer, sizeof buffer - 1);
    } while (got < 0 && errno == EINTR);
    if (got < 0) error = errno;
  }
  ::close(fd);
  if (error != 0) fail(path, "cannot read", error);
  const std::string text(buffer, static_cast<std::size_t>(got));
  const auto space = text.find(' ');
  const std::string kind = text.substr(0, space);
  ClaimSlot slot;
  slot.n = n;
  slot.mtime = seconds_of(st.st_mtim);
  slot.worker = space == std::string::npos ? "" : text.substr(space + 1, text.find('\n') - space - 1);
  if (kind == "run") {
    slot.kind = ClaimSlot::Kind::kRun;
  } else if (kind == "released") {
    slot.kind = ClaimSlot::Kind::kReleased;
  } else if (kind == "done") {
    slot.kind = ClaimSlot::Kind::kDone;
  } else {
    // Created whole by link(2), so only a hand edit gets here.
    throw std::runtime_error(path + ": not a claim slot (\"" + text.substr(0, 40) + "\"); remove the sweep's claims/ "
                             "folder when no worker runs");
  }
  return slot;
}

// This machine's name, as worker ids carry it.
std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "unknown";
  std::string name(host);
  for (char& c : name) {
    if (c == '/' || c == ' ' || c == '\n' || c == ':') c = '_';
  }
  return name;
}

// Whether `worker` ("<host>:<pid>:<tag>") is a process of this machine that
// no longer exists: its claims need not wait out their lease. (A reused pid
// only makes this answer "no", and the lease decides.)
bool gone_from_this_machine(const std::string& worker) {
  const auto first = worker.find(':');
  const auto second = worker.find(':', first + 1);
  if (first == std::string::npos || second == std::string::npos || worker.substr(0, first) != host_name()) {
    return false;
  }
  const std::string pid = worker.substr(first + 1, second - first - 1);
  if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) return false;
  return ::kill(static_cast<pid_t>(std::stol(pid)), 0) != 0 && errno == ESRCH;
}

}  // namespace

std::string seconds_text(double seconds) {
  std::ostringstream out;
  out << seconds;
  return out.str();
}

std::string new_worker_id() {
  std::random_device device;
  char tail[16];
  std::snprintf(tail, sizeof tail, "%08x", static_cast<unsigned>(device()));
  return host_name() + ":" + std::to_string(::getpid()) + ":" + tail;
}

ClaimBoard::ClaimBoard(const std::string& sweep_dir, double lease, std::string worker, std::function<void()> tick)
    : dir_(sweep_dir + "/claims"),
      worker_(std::move(worker)),
      clock_(dir_ + "/.clock." + worker_),
      lease_(lease),
      tick_(std::move(tick)) {
  if (!(lease > 0)) throw std::invalid_argument("claim lease must be > 0 seconds, got " + seconds_text(lease));
  if (::mkdir(dir_.c_str(), 0755) != 0 && errno != EEXIST) fail(dir_, "cannot create", errno);
  born_ = folder_now();
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
}

ClaimBoard::~ClaimBoard() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  heartbeat_.join();
  ::unlink(clock_.c_str());
}

std::string ClaimBoard::slot_path(const std::string& trial, std::int64_t n) const {
  return dir_ + "/" + trial + "." + std::to_string(n);
}

double ClaimBoard::folder_now() {
  const int fd = ::open(clock_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) fail(clock_, "cannot write", errno);
  struct stat st {};
  int error = 0;
  // Times "now" (NFS: set to the server's time), then read back.
  if (::futimens(fd, nullptr) != 0 || ::fstat(fd, &st) != 0) error = errno;
  ::close(fd);
  if (error != 0) fail(clock_, "cannot write", error);
  return seconds_of(st.st_mtim);
}

bool ClaimBoard::create(const std::string& trial, std::int64_t n, const char* kind) {
  const std::string tmp = dir_ + "/.tmp." + worker_ + "." + std::to_string(temporaries_++);
  const std::string slot = slot_path(trial, n);
  const std::string text = std::string(kind) + " " + worker_ + "\n";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail(tmp, "cannot create", errno);
  int error = 0;
  if (::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) error = errno != 0 ? errno : EIO;
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error != 0) {
    ::unlink(tmp.c_str());
    fail(tmp, "cannot write", error);
  }
  const int linked = ::link(tmp.c_str(), slot.c_str());
  const int link_error = errno;
  struct stat st {};
  // A retried link whose first reply was lost fails with EEXIST although it
  // succeeded: the temporary's second name shows it did.
  const bool won = linked == 0 || (::stat(tmp.c_str(), &st) == 0 && st.st_nlink == 2);
  ::unlink(tmp.c_str());
  if (won) {
    std::lock_guard<std::mutex> lock(mutex_);
    highest_[trial] = std::max(highest_[trial], n);
    return true;
  }
  if (link_error == EEXIST) return false;
  fail(slot, "cannot create", link_error);
}

bool ClaimBoard::changed() {
  const int fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(dir_, "cannot read", errno);
  struct stat st {};
  const int rc = ::fstat(fd, &st);
  const int error = errno;
  ::close(fd);
  if (rc != 0) fail(dir_, "cannot read", error);
  std::lock_guard<std::mutex> lock(mutex_);
  const bool same = st.st_mtim.tv_sec == folder_mtime_.tv_sec && st.st_mtim.tv_nsec == folder_mtime_.tv_nsec;
  folder_mtime_ = st.st_mtim;
  return !same;
}

void ClaimBoard::announce(const std::string& trial) {
  const std::string marker = dir_ + "/" + trial + ".finished";
  // Made anew (a trial run again has one already), so that the folder changes.
  ::unlink(marker.c_str());
  const int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) fail(marker, "cannot create", errno);
  ::close(fd);
}

std::vector<std::string> ClaimBoard::announced() {
  static const std::string suffix = ".finished";
  std::vector<std::string> out;
  DIR* dir = ::opendir(dir_.c_str());
  if (dir == nullptr) fail(dir_, "cannot list", errno);
  while (const dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      out.push_back(name.substr(0, name.size() - suffix.size()));
    }
  }
  ::closedir(dir);
  return out;
}

std::optional<ClaimSlot> ClaimBoard::last_slot(const std::string& trial) {
  std::int64_t n = 1;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = highest_.find(trial);
    if (it != highest_.end()) n = it->second;
  }
  std::optional<ClaimSlot> last = read_slot(slot_path(trial, n), n);
  if (!last && n > 1) {  // the claims folder was emptied by hand: start over
    n = 1;
    last = read_slot(slot_path(trial, n), n);
  }
  if (!last) return std::nullopt;
  while (auto next = read_slot(slot_path(trial, last->n + 1), last->n + 1)) last = next;
  std::lock_guard<std::mutex> lock(mutex_);
  highest_[trial] = last->n;
  return last;
}

ClaimBoard::State ClaimBoard::try_claim(const std::string& trial, bool has_summary) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (held_.count(trial) != 0) return State::kBusy;  // this worker runs it
  }
  const std::optional<ClaimSlot> last = last_slot(trial);
  if (last) {
    const double age = folder_now() - last->mtime;
    switch (last->kind) {
      case ClaimSlot::Kind::kRun:
        if (age <= lease_) {
          if (!gone_from_this_machine(last->worker)) return State::kBusy;
          std::cerr << "taking over trial " << trial << " from worker " << last->worker
                    << " (its process on this machine is gone)\n";
        } else {
          std::cerr << "taking over trial " << trial << " from worker " << last->worker << " (silent for "
                    << seconds_text(std::round(age * 10) / 10) << " s, lease " << seconds_text(lease_) << " s)\n";
        }
        break;
      case ClaimSlot::Kind::kReleased:
        break;
      case ClaimSlot::Kind::kDone:
        if (!has_summary) {
          // Its summary is being written: only a writer silent for the lease
          // (or gone from this machine) died before it was, whenever it was.
          if (age <= lease_ && !gone_from_this_machine(last->worker)) return State::kBusy;
        } else if (last->mtime >= born_) {
          return State::kSettled;  // a result of this generation, not taken as final: settled for it
        }
        break;
    }
  }
  if (!create(trial, last ? last->n + 1 : 1, kind_name(ClaimSlot::Kind::kRun))) return State::kBusy;
  std::lock_guard<std::mutex> lock(mutex_);
  held_[trial] = Held{last ? last->n + 1 : 1};
  return State::kClaimed;
}

bool ClaimBoard::robbed(const std::string& trial) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = held_.find(trial);
  return it != held_.end() && it->second.robbed;
}

bool ClaimBoard::verify(const std::string& trial) {
  std::int64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = held_.find(trial);
    if (it == held_.end()) return false;
    if (it->second.robbed) return false;
    n = it->second.n;
  }
  if (::access(slot_path(trial, n + 1).c_str(), F_OK) != 0) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = held_.find(trial);
  if (it != held_.end() && it->second.n == n) it->second.robbed = true;
  return false;
}

bool ClaimBoard::commit(const std::string& trial) {
  std::int64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = held_.find(trial);
    if (it == held_.end()) throw std::logic_error("commit of trial " + trial + ", which this worker does not hold");
    n = it->second.n;
  }
  const bool won = create(trial, n + 1, kind_name(ClaimSlot::Kind::kDone));
  abandon(trial);
  return won;
}

void ClaimBoard::release(const std::string& trial) {
  std::int64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = held_.find(trial);
    if (it == held_.end()) return;
    n = it->second.n;
  }
  create(trial, n + 1, kind_name(ClaimSlot::Kind::kReleased));  // false: taken over meanwhile, nothing to give
  abandon(trial);
}

void ClaimBoard::abandon(const std::string& trial) {
  std::lock_guard<std::mutex> lock(mutex_);
  held_.erase(trial);
}

void ClaimBoard::beat() {
  std::vector<std::pair<std::string, std::int64_t>> held;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [trial, h] : held_) held.emplace_back(trial, h.n);
  }
  for (const auto& [trial, n] : held) {
    const std::string slot = slot_path(trial, n);
    // A slot gone (the claims folder removed by hand) or a next slot made by
    // another worker: this worker no longer holds the trial.
    const bool gone = ::utimensat(AT_FDCWD, slot.c_str(), nullptr, 0) != 0 && errno == ENOENT;
    const bool taken = gone || ::access(slot_path(trial, n + 1).c_str(), F_OK) == 0;
    if (!taken) continue;
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = held_.find(trial);
    if (it != held_.end() && it->second.n == n) it->second.robbed = true;
  }
}

void ClaimBoard::heartbeat_loop() {
  const auto every = std::chrono::duration<double>(std::max(0.05, lease_ / 8));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, every, [&] { return stopping_; })) {
    lock.unlock();
    try {
      beat();
      if (tick_) tick_();
    } catch (const std::exception& e) {
      std::cerr << "warning: claims heartbeat: " << e.what() << "\n";
    }
    lock.lock();
  }
}

}  // namespace bigbatch::experiments
