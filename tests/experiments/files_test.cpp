// Run-folder files (files.h): whole writes through a temporary and a rename,
// and every failure naming the path and the system's reason. A full disk is
// /dev/full (every write: ENOSPC) and a file-size limit (RLIMIT_FSIZE: EFBIG),
// so the failures are real ones, made without privileges. Torch-free.
#include "../../experiments/io/files.h"

#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace bigbatch::experiments;
namespace fs = std::filesystem;

fs::path fresh_folder(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("bigbatch_files_" + name + "_" + std::to_string(::getpid()));
  bigbatch::experiments::remove_tree(dir);
  fs::create_directories(dir);
  return dir;
}

// The message of what `f` throws (std::runtime_error), or "" when it does not.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

// Files larger than `bytes` cannot be written while this lives (EFBIG, with
// SIGXFSZ ignored so that the write returns the error instead of killing us).
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &saved_);
    previous_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit limit = saved_;
    limit.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, previous_);
  }

 private:
  rlimit saved_{};
  void (*previous_)(int) = nullptr;
};

TEST(Files, AWholeWriteReadsBackAndLeavesNoTemporary) {
  const auto dir = fresh_folder("whole");
  const std::string path = (dir / "a.json").string();
  write_file_atomic(path, "first");
  write_file_atomic(path, std::string("second\0with a zero", 18));
  EXPECT_EQ(read_file(path), std::string("second\0with a zero", 18));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  bigbatch::experiments::remove_tree(dir);
}

// A message naming write_file_atomic's temporary "<path>.tmp.<host>.<pid>.<n>"
// (unique across the machines sharing a folder), with the three parts
// checked and replaced by HOST, PID and N.
std::string without_temporary_suffix(const std::string& message, const std::string& path) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string head = path + ".tmp." + host + "." + std::to_string(::getpid()) + ".";
  if (message.compare(0, head.size(), head) != 0) return message;
  const auto colon = message.find(':', head.size());
  const std::string n = message.substr(head.size(), colon - head.size());
  if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos) return message;
  return path + ".tmp.HOST.PID.N" + message.substr(colon);
}

TEST(Files, AMissingFileNamesThePathAndTheReason) {
  const auto dir = fresh_folder("missing");
  const std::string path = (dir / "nothing.json").string();
  EXPECT_EQ(error_of([&] { read_file(path); }), path + ": cannot read: No such file or directory");
  const std::string nested = (dir / "no_folder" / "x.csv").string();
  EXPECT_EQ(without_temporary_suffix(error_of([&] { write_file_atomic(nested, "x"); }), nested),
            nested + ".tmp.HOST.PID.N: cannot write: No such file or directory");
  bigbatch::experiments::remove_tree(dir);
}

// A write that fails part way keeps the file that was there, and removes the
// temporary it made.
TEST(Files, AFailedWriteKeepsTheOldFileAndSaysWhy) {
  const auto dir = fresh_folder("too_large");
  const std::string path = (dir / "metrics.csv").string();
  write_file_atomic(path, "old");
  std::string message;
  {
    const FileSizeLimit limit(1000);
    message = error_of([&] { write_file_atomic(path, std::string(4096, 'x')); });
  }
  EXPECT_EQ(without_temporary_suffix(message, path), path + ".tmp.HOST.PID.N: cannot write: File too large");
  EXPECT_EQ(read_file(path), "old");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  bigbatch::experiments::remove_tree(dir);
}

TEST(Files, AnAppendToAFullDiskSaysNoSpaceLeft) {
  AppendFile full("/dev/full");
  EXPECT_EQ(error_of([&] { full.write("a record"); }), "/dev/full: cannot write: No space left on device");
  // Empty writes succeed (nothing to write).
  full.write("");
}

TEST(Files, AppendsAddWholeRecords) {
  const auto dir = fresh_folder("append");
  const std::string path = (dir / "events").string();
  {
    AppendFile f(path);
    f.write("ab");
  }
  AppendFile moved = AppendFile(path);
  moved.write("cd");
  EXPECT_EQ(read_file(path), "abcd");
  {
    const FileSizeLimit limit(6);
    EXPECT_EQ(error_of([&] { moved.write("efgh"); }), path + ": cannot write: File too large");
  }
  EXPECT_EQ(error_of([&] { AppendFile((dir / "none" / "events").string()); }),
            (dir / "none" / "events").string() + ": cannot open for writing: No such file or directory");
  bigbatch::experiments::remove_tree(dir);
}

// remove_tree (not std::filesystem::remove_all, which a torch 2.11 wheel's
// own copy crashes in): the folder and all under it, links removed and never
// followed, a missing path no error, a refusal naming the entry and why.
TEST(Files, ARemovedTreeTakesItsSubfoldersAndNotWhatItsLinksPointTo) {
  const auto dir = fresh_folder("tree");
  const auto outside = fresh_folder("tree_outside");
  write_file_atomic((outside / "kept").string(), "x");
  fs::create_directories(dir / "a" / "b" / "c");
  write_file_atomic((dir / "a" / "f").string(), "1");
  write_file_atomic((dir / "a" / "b" / "c" / "g").string(), "2");
  fs::create_directory_symlink(outside, dir / "a" / "b" / "link");
  fs::create_symlink(dir / "nowhere", dir / "dangling");
  remove_tree(dir.string());
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir)));
  EXPECT_EQ(read_file((outside / "kept").string()), "x");
  remove_tree(dir.string());  // missing: nothing to do
  remove_tree((outside / "kept").string());  // a file
  EXPECT_FALSE(fs::exists(outside / "kept"));
  EXPECT_TRUE(fs::exists(outside));
  remove_tree(outside.string());
  // A link named with a trailing slash is still the link, not its target.
  const auto again = fresh_folder("tree_again");
  write_file_atomic((again / "kept").string(), "y");
  fs::create_directory_symlink(again, outside.string() + "_link");
  remove_tree(outside.string() + "_link/");
  EXPECT_FALSE(fs::exists(fs::symlink_status(outside.string() + "_link")));
  EXPECT_EQ(read_file((again / "kept").string()), "y");
  remove_tree(again.string());
  // /proc refuses removal even to root.
  const std::string refused = error_of([] { remove_tree("/proc/self/status"); });
  EXPECT_EQ(refused.rfind("/proc/self/status: cannot remove: ", 0), 0u) << refused;
}

// files_under: every file at any depth, sorted by path; a link to a file
// counts, a link to a folder is not followed; a missing folder is named.
TEST(Files, FilesUnderAFolderAreListedAtAnyDepthWithoutFollowingFolderLinks) {
  const auto dir = fresh_folder("list");
  const auto elsewhere = fresh_folder("list_elsewhere");
  write_file_atomic((elsewhere / "outside.png").string(), "o");
  fs::create_directories(dir / "b" / "deep");
  fs::create_directories(dir / "a");
  write_file_atomic((dir / "b" / "deep" / "2.png").string(), "2");
  write_file_atomic((dir / "a" / "1.png").string(), "1");
  write_file_atomic((dir / "0.png").string(), "0");
  fs::create_symlink(dir / "0.png", dir / "a" / "alias.png");
  fs::create_directory_symlink(elsewhere, dir / "b" / "folder_link");
  fs::create_symlink(dir / "nowhere.png", dir / "dangling.png");
  const std::vector<std::string> expected = {(dir / "0.png").string(), (dir / "a" / "1.png").string(),
                                             (dir / "a" / "alias.png").string(),
                                             (dir / "b" / "deep" / "2.png").string()};
  EXPECT_EQ(files_under(dir.string()), expected);
  EXPECT_EQ(files_under(dir.string() + "/"), expected);
  EXPECT_EQ(error_of([&] { files_under((dir / "none").string()); }),
            (dir / "none").string() + ": cannot list: No such file or directory");
  remove_tree(dir.string());
  remove_tree(elsewhere.string());
}

}  // namespace
