// SentencePiece for the "text" dataset (text.h: SentencePieceText), through
// Debian's sentencepiece programs (spm_train, spm_encode, spm_decode,
// spm_export_vocab) run as child processes. Not the library: Debian's
// libsentencepiece carries its own copy of protobuf-lite whose exported
// symbols collide with the system libprotobuf that Debian's LibTorch loads,
// and the program crashes before main (docs/workloads.md "Language models").
#include "text.h"

#include "../io/files.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace bigbatch::experiments {
namespace {

namespace fs = std::filesystem;

// A folder of its own under the system's temporary folder, removed with it.
class ScratchFolder {
 public:
  ScratchFolder() {
    std::string pattern = (fs::temp_directory_path() / "bigbatch-spm-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error(pattern + ": cannot create a temporary folder: " + std::strerror(errno));
    }
    path_ = pattern;
  }
  ~ScratchFolder() {
    try {
      remove_tree(path_);
    } catch (const std::exception&) {  // a destructor: what is left stays in the temporary folder
    }
  }
  ScratchFolder(const ScratchFolder&) = delete;
  ScratchFolder& operator=(const ScratchFolder&) = delete;
  std::string file(const char* name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

// Runs `args` (args[0] found on PATH) with stdin from `in` (empty: none) and
// stdout to `out`; a program that is missing, or fails, is an error naming
// it with its exit status and the last line it wrote to stderr.
void run_tool(const std::vector<std::string>& args, const std::string& in, const std::string& out,
              const ScratchFolder& scratch) {
  const std::string err = scratch.file("stderr");
  // The files are opened here, so that a failure names the file, not the program.
  const auto open_or_throw = [](const std::string& path, int flags) {
    const int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
    return fd;
  };
  struct Fds {
    int fd[3] = {-1, -1, -1};
    ~Fds() {
      for (const int f : fd) {
        if (f >= 0) ::close(f);
      }
    }
  } fds;
  fds.fd[0] = open_or_throw(in.empty() ? "/dev/null" : in, O_RDONLY);
  fds.fd[1] = open_or_throw(out, O_WRONLY | O_CREAT | O_TRUNC);
  fds.fd[2] = open_or_throw(err, O_WRONLY | O_CREAT | O_TRUNC);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  for (int i = 0; i < 3; ++i) posix_spawn_file_actions_adddup2(&files, fds.fd[i], i);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = ::posix_spawnp(&pid, argv[0], &files, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&files);
  if (spawned != 0) {
    throw std::runtime_error(args[0] + ": cannot run: " + std::strerror(spawned) +
                             (spawned == ENOENT ? " (Debian package sentencepiece; scripts/packages.sh installs it)" : ""));
  }
  int status = 0;
  pid_t waited = -1;
  while ((waited = ::waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  if (waited < 0) throw std::runtime_error(args[0] + ": cannot wait for it: " + std::strerror(errno));
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    std::string said = read_file(err);
    while (!said.empty() && said.back() == '\n') said.pop_back();
    const auto cut = said.rfind('\n');
    if (cut != std::string::npos) said = said.substr(cut + 1);
    throw std::runtime_error(args[0] + " failed (" +
                             (WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                                : "signal " + std::to_string(WTERMSIG(status))) +
                             (said.empty() ? ")" : "): " + said));
  }
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::size_t begin = 0;
  while (true) {
    const auto end = text.find('\n', begin);
    if (end == std::string::npos) {
      out.push_back(text.substr(begin));
      return out;
    }
    out.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
}

}  // namespace

struct SentencePieceText::Impl {
  std::string model;
  std::int64_t size = 0;
  std::int32_t eos = -1;
};

SentencePieceText::SentencePieceText(const std::string& model) : impl_(std::make_unique<Impl>()) {
  impl_->model = model;
  (void)read_file(model);  // "<model>: cannot read: <reason>" before any program runs
  const ScratchFolder scratch;
  const std::string vocab = scratch.file("vocab");
  run_tool({"spm_export_vocab", "--model=" + model}, "", vocab, scratch);
  std::istringstream pieces(read_file(vocab));
  std::string line;
  for (std::int32_t i = 0; std::getline(pieces, line); ++i) {
    if (line.compare(0, line.find('\t'), "</s>") == 0) impl_->eos = i;
    impl_->size = i + 1;
  }
  if (impl_->eos < 0) {
    throw std::runtime_error(model + ": the SentencePiece model has no end-of-sentence piece </s> (the newline token)");
  }
}
SentencePieceText::~SentencePieceText() = default;
SentencePieceText::SentencePieceText(SentencePieceText&&) noexcept = default;
SentencePieceText& SentencePieceText::operator=(SentencePieceText&&) noexcept = default;

void SentencePieceText::train(const std::string& corpus, std::int64_t vocab_size, const std::string& model) {
  (void)read_file(corpus);
  const ScratchFolder scratch;
  const std::string prefix = scratch.file("m");
  // spm_train's --input is a comma-separated list: the corpus goes by a
  // link of a plain name, whatever its own path holds.
  const std::string input = scratch.file("corpus");
  std::error_code linked;
  fs::create_symlink(fs::absolute(corpus), input, linked);
  if (linked) throw std::runtime_error(input + ": cannot link to " + corpus + ": " + linked.message());
  run_tool({"spm_train", "--input=" + input, "--model_prefix=" + prefix, "--vocab_size=" + std::to_string(vocab_size),
            "--model_type=bpe", "--character_coverage=1.0",
            "--byte_fallback=true",                   // a character the corpus lacks still encodes (as bytes)
            "--normalization_rule_name=identity",     // text in, the same text out
            "--remove_extra_whitespaces=false",
            "--hard_vocab_limit=false",               // a small corpus may have fewer merges than asked for
            "--num_threads=2", "--minloglevel=2"},
           "", scratch.file("log"), scratch);
  write_file_atomic(model, read_file(prefix + ".model"));
}

std::string SentencePieceText::cached(const std::string& corpus, std::int64_t vocab_size) {
  // Named by the corpus's contents, so that a changed corpus trains a new model.
  const std::string bytes = read_file(corpus);
  std::uint64_t hash = 1469598103934665603ULL;  // FNV-1a
  for (const char c : bytes) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  char tag[24];
  std::snprintf(tag, sizeof tag, "%016llx", static_cast<unsigned long long>(hash));
  const std::string model = corpus + ".bpe" + std::to_string(vocab_size) + "-" + tag + ".model";
  static std::mutex mutex;  // trials loading at once train it once
  std::lock_guard<std::mutex> lock(mutex);
  if (!fs::exists(model)) train(corpus, vocab_size, model);
  return model;
}

std::int64_t SentencePieceText::size() const { return impl_->size; }

std::vector<std::int32_t> SentencePieceText::encode(const std::string& text) const {
  const ScratchFolder scratch;
  const std::string in = scratch.file("text"), out = scratch.file("ids");
  write_file_atomic(in, text);
  run_tool({"spm_encode", "--model=" + impl_->model, "--output_format=id"}, in, out, scratch);
  // One line of ids per line of text; a text ending in a newline has an
  // empty last line that spm_encode does not write.
  const std::vector<std::string> lines = lines_of(text);
  std::vector<std::string> ids = lines_of(read_file(out));
  if (!ids.empty() && ids.back().empty()) ids.pop_back();
  if (ids.size() + 1 == lines.size() && lines.back().empty()) ids.emplace_back();
  if (ids.size() != lines.size()) {
    throw std::runtime_error("spm_encode: " + std::to_string(ids.size()) + " lines of ids for " +
                             std::to_string(lines.size()) + " lines of text");
  }
  std::vector<std::int32_t> tokens;
  tokens.reserve(text.size() / 2);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) tokens.push_back(impl_->eos);
    std::istringstream line(ids[i]);
    for (std::int32_t id = 0; line >> id;) tokens.push_back(id);
  }
  return tokens;
}

std::string SentencePieceText::decode(const std::vector<std::int32_t>& tokens) const {
  std::string lines;
  std::size_t count = 1;
  bool first = true;
  for (const std::int32_t t : tokens) {
    if (t == impl_->eos) {
      lines += '\n';
      ++count;
      first = true;
    } else {
      lines += (first ? "" : " ") + std::to_string(t);
      first = false;
    }
  }
  lines += '\n';
  const ScratchFolder scratch;
  const std::string in = scratch.file("ids"), out = scratch.file("text");
  write_file_atomic(in, lines);
  run_tool({"spm_decode", "--model=" + impl_->model, "--input_format=id"}, in, out, scratch);
  std::vector<std::string> text = lines_of(read_file(out));
  if (!text.empty() && text.back().empty()) text.pop_back();
  if (text.size() != count) {
    throw std::runtime_error("spm_decode: " + std::to_string(text.size()) + " lines for " + std::to_string(count) +
                             " lines of ids");
  }
  std::string joined;
  for (std::size_t i = 0; i < text.size(); ++i) joined += (i > 0 ? "\n" : "") + text[i];
  return joined;
}

}  // namespace bigbatch::experiments
