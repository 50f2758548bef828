// The language-model workload's data, registered as any user's dataset
// (workload.h): "text", a token stream read from llm.c's .bin files,
// headerless uint16 files (nanoGPT's train.bin/val.bin), or any text file
// tokenized by bytes, characters or a SentencePiece BPE model (trained on
// the corpus once and cached beside it, or given). An example is a window of
// `context` tokens and its targets, the same window shifted by one;
// training windows start at a random offset drawn per (seed, epoch, window)
// so that every epoch sees other windows, validation is a fixed set of
// windows. docs/workloads.md "Language models" gives the parameters.
#pragma once

#include "workload.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace bigbatch::experiments {

enum class TokenFormat { kText, kLlmc, kUint16 };
enum class Tokenizer { kChar, kByte, kSentencePiece };

struct TextSpec {
  std::string path;             ///< the training tokens (all of them when validation_path is empty)
  std::string validation_path;  ///< empty: the last validation_fraction of path's tokens
  TokenFormat format = TokenFormat::kText;
  Tokenizer tokenizer = Tokenizer::kChar;  ///< format "text" only
  /// uint16: the vocabulary (required); llmc: GPT-2's 50257 unless given;
  /// sentencepiece: the size of the model trained on the corpus.
  std::int64_t vocab_size = 0;
  std::string spm_model;  ///< sentencepiece: a given .model (empty: train one, cached beside path)
  std::int64_t context = 128;
  double validation_fraction = 0.1;
  std::int64_t validation_windows = 0;  ///< 0: every whole window of the validation tokens; else at most this many, evenly spread
};

/// A tokenized corpus: the two splits' tokens and the vocabulary.
struct TokenCorpus {
  std::vector<std::int32_t> train, validation;
  std::int64_t vocabulary = 0;
  std::string tokenizer;  ///< what made the tokens, for the report ("char", "sentencepiece <model path>", ...)
};

/// Reads and tokenizes the corpus of `spec`, every token checked against
/// the vocabulary. Throws std::runtime_error naming the file and the value.
TokenCorpus load_tokens(const TextSpec& spec);

/// SentencePiece, as the dataset uses it, through Debian's sentencepiece
/// programs (sentencepiece.cpp says why not the library): a newline is the
/// model's end-of-sentence token </s>, lines are encoded one by one (the
/// trainer reads one sentence per line), and the normalization is the
/// identity, so that decode(encode(text)) == text.
class SentencePieceText {
 public:
  /// Loads `model` (std::runtime_error naming it when it cannot).
  explicit SentencePieceText(const std::string& model);
  ~SentencePieceText();
  SentencePieceText(SentencePieceText&&) noexcept;
  SentencePieceText& operator=(SentencePieceText&&) noexcept;
  /// Trains a BPE model of `vocab_size` pieces on the text file `corpus`
  /// and writes it to `model` (and its .vocab beside it).
  static void train(const std::string& corpus, std::int64_t vocab_size, const std::string& model);
  /// The model for `corpus` and `vocab_size`, cached beside it as
  /// "<corpus>.bpe<vocab_size>-<hash of its bytes>.model": trained when
  /// the file is missing.
  static std::string cached(const std::string& corpus, std::int64_t vocab_size);

  std::int64_t size() const;
  std::vector<std::int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<std::int32_t>& tokens) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Windows of a token stream as examples: example i is the `context` tokens
/// from starts[i] (inputs, int64 [context]) and the next token of each
/// (targets). `jitter` > 0: a training batch moves each window by an offset
/// in [0, jitter) drawn from ExampleRandom(draw, i).
std::shared_ptr<const Examples> token_windows(at::Tensor tokens, std::vector<std::int64_t> starts,
                                              std::int64_t context, std::int64_t jitter);

/// The dataset of `spec`: training windows at multiples of context, moved
/// by a random offset each epoch; validation windows fixed.
WorkloadData load_text(const TextSpec& spec);

/// The registration "text".
DatasetRegistration text_dataset();

}  // namespace bigbatch::experiments
