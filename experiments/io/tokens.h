// Token streams for language models, read from the files the common
// training codes write, and the two tokenizers that need no model: bytes
// and characters. Torch-free (bigbatch_io), so that the readers' tests run
// under the sanitizers. The "text" dataset (text.h) builds on these; the
// formats and their checks are in docs/workloads.md "Language models".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bigbatch::experiments {

/// llm.c's token files (dev/data/*.bin): a header of 256 little-endian
/// int32 (magic 20240520, version 1, the token count, the rest unused),
/// then that many little-endian uint16 tokens.
constexpr std::int32_t kLlmcMagic = 20240520;
constexpr std::int32_t kLlmcVersion = 1;
constexpr std::size_t kLlmcHeaderInts = 256;

/// The tokens of an llm.c .bin file. Throws std::runtime_error naming the
/// file and the value: a wrong magic or version, a negative count, a file
/// whose size is not the header plus 2 bytes per counted token.
std::vector<std::int32_t> read_llmc_tokens(const std::string& path);
/// The tokens of a headerless file of little-endian uint16 (nanoGPT's
/// train.bin and val.bin). An odd size is an error naming the file.
std::vector<std::int32_t> read_uint16_tokens(const std::string& path);
/// Writes `tokens` (each in [0, 65535]) as an llm.c .bin file.
void write_llmc_tokens(const std::string& path, const std::vector<std::int32_t>& tokens);

/// Every token in [0, vocabulary): else std::runtime_error "<path>: token
/// <value> at position <i> is outside the vocabulary of <vocabulary>".
void check_tokens(const std::vector<std::int32_t>& tokens, std::int64_t vocabulary, const std::string& path);

/// The Unicode code points of UTF-8 `text`; std::runtime_error "<what>: not
/// UTF-8 at byte <offset>" on a malformed sequence.
std::vector<std::int32_t> utf8_code_points(std::string_view text, const std::string& what);
/// UTF-8 of code points (each a valid scalar value).
std::string utf8_text(const std::vector<std::int32_t>& code_points);

/// Characters as tokens: the distinct code points of a corpus, in increasing
/// order, token i being the i-th. (Karpathy's char-rnn and nanoGPT's
/// shakespeare_char build theirs the same way.)
class CharVocabulary {
 public:
  CharVocabulary() = default;
  /// The vocabulary of the code points that occur in `text`.
  static CharVocabulary of(const std::vector<std::int32_t>& code_points);
  std::int64_t size() const { return static_cast<std::int64_t>(chars_.size()); }
  const std::vector<std::int32_t>& chars() const { return chars_; }
  /// Tokens of code points; one not in the vocabulary is an error naming
  /// it, its position and `what`.
  std::vector<std::int32_t> encode(const std::vector<std::int32_t>& code_points, const std::string& what) const;
  /// The text of tokens (each in [0, size())).
  std::string decode(const std::vector<std::int32_t>& tokens) const;

 private:
  std::vector<std::int32_t> chars_;
};

/// Bytes as tokens (a vocabulary of 256): any file, UTF-8 or not.
std::vector<std::int32_t> byte_tokens(std::string_view text);
std::string byte_text(const std::vector<std::int32_t>& tokens);

}  // namespace bigbatch::experiments
