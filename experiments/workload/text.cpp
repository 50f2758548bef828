// The "text" dataset (text.h): token files, tokenizers, windows.
#include "text.h"

#include "../io/files.h"
#include "../io/tokens.h"
#include "../../config/json_reader.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <stdexcept>

namespace bigbatch::experiments {
namespace {

using json = nlohmann::json;

constexpr std::int64_t kGpt2Vocabulary = 50257;

const std::array<config::EnumName<TokenFormat>, 3> kFormats{
    {{TokenFormat::kText, "text"}, {TokenFormat::kLlmc, "llmc"}, {TokenFormat::kUint16, "uint16"}}};
const std::array<config::EnumName<Tokenizer>, 3> kTokenizers{
    {{Tokenizer::kChar, "char"}, {Tokenizer::kByte, "byte"}, {Tokenizer::kSentencePiece, "sentencepiece"}}};

// Splits one token stream into training and validation: the last `fraction`
// of it is validation (a contiguous tail, so no window of one split
// overlaps the other).
void split_tail(std::vector<std::int32_t> all, double fraction, TokenCorpus& out) {
  const auto n = static_cast<std::int64_t>(all.size());
  const auto held = static_cast<std::int64_t>(static_cast<double>(n) * fraction);
  out.validation.assign(all.end() - held, all.end());
  all.resize(static_cast<std::size_t>(n - held));
  out.train = std::move(all);
}

}  // namespace

// ----------------------------------------------------------- the corpus --

TokenCorpus load_tokens(const TextSpec& spec) {
  TokenCorpus out;
  const bool separate = !spec.validation_path.empty();
  const auto split = [&](std::vector<std::int32_t> train, std::vector<std::int32_t> validation) {
    if (separate) {
      out.train = std::move(train);
      out.validation = std::move(validation);
    } else {
      split_tail(std::move(train), spec.validation_fraction, out);
    }
  };
  if (spec.format == TokenFormat::kText) {
    const std::string text = read_file(spec.path);
    const std::string held = separate ? read_file(spec.validation_path) : std::string();
    switch (spec.tokenizer) {
      case Tokenizer::kByte:
        out.vocabulary = 256;
        out.tokenizer = "byte";
        split(byte_tokens(text), byte_tokens(held));
        break;
      case Tokenizer::kChar: {
        // The vocabulary is every character of both files: a token is only a name.
        auto train = utf8_code_points(text, spec.path);
        auto validation = utf8_code_points(held, spec.validation_path);
        std::vector<std::int32_t> both = train;
        both.insert(both.end(), validation.begin(), validation.end());
        const CharVocabulary v = CharVocabulary::of(both);
        out.vocabulary = v.size();
        out.tokenizer = "char";
        split(v.encode(train, spec.path), v.encode(validation, spec.validation_path));
        break;
      }
      case Tokenizer::kSentencePiece: {
        const std::string model =
            spec.spm_model.empty() ? SentencePieceText::cached(spec.path, spec.vocab_size) : spec.spm_model;
        const SentencePieceText spm(model);
        out.vocabulary = spm.size();
        out.tokenizer = "sentencepiece " + model;
        split(spm.encode(text), separate ? spm.encode(held) : std::vector<std::int32_t>{});
        break;
      }
    }
  } else {
    const auto read = spec.format == TokenFormat::kLlmc ? read_llmc_tokens : read_uint16_tokens;
    out.vocabulary = spec.vocab_size;
    out.tokenizer = spec.format == TokenFormat::kLlmc ? "llmc" : "uint16";
    auto train = read(spec.path);
    check_tokens(train, out.vocabulary, spec.path);
    std::vector<std::int32_t> validation;
    if (separate) {
      validation = read(spec.validation_path);
      check_tokens(validation, out.vocabulary, spec.validation_path);
    }
    split(std::move(train), std::move(validation));
  }
  return out;
}

// ------------------------------------------------------------- windows --

namespace {

class TokenWindows final : public Examples {
 public:
  TokenWindows(at::Tensor tokens, std::vector<std::int64_t> starts, std::int64_t context, std::int64_t jitter)
      : tokens_(std::move(tokens)), starts_(std::move(starts)), context_(context), jitter_(jitter) {}

  std::int64_t size() const override { return static_cast<std::int64_t>(starts_.size()); }
  Batch get(const at::Tensor& index) const override { return windows(index, nullptr); }
  Batch augmented(const at::Tensor& index, const Draw& draw) const override {
    return jitter_ > 1 ? windows(index, &draw) : windows(index, nullptr);
  }

 private:
  Batch windows(const at::Tensor& index, const Draw* draw) const {
    const at::Tensor i = index.to(at::kLong).contiguous();
    const std::int64_t n = i.numel();
    const std::int64_t* p = i.data_ptr<std::int64_t>();
    at::Tensor input = at::empty({n, context_}, at::kLong), target = at::empty({n, context_}, at::kLong);
    const std::int32_t* t = tokens_.data_ptr<std::int32_t>();
    std::int64_t* x = input.data_ptr<std::int64_t>();
    std::int64_t* y = target.data_ptr<std::int64_t>();
    for (std::int64_t k = 0; k < n; ++k) {
      TORCH_CHECK(p[k] >= 0 && p[k] < size(), "text: window ", p[k], " outside [0, ", size(), ")");
      std::int64_t s = starts_[static_cast<std::size_t>(p[k])];
      if (draw != nullptr) {
        ExampleRandom random(*draw, p[k]);
        s += random.below(jitter_);
      }
      for (std::int64_t j = 0; j < context_; ++j) {
        x[k * context_ + j] = t[s + j];
        y[k * context_ + j] = t[s + j + 1];
      }
    }
    return {input, target};
  }

  at::Tensor tokens_;  // int32 [N]
  std::vector<std::int64_t> starts_;
  std::int64_t context_, jitter_;
};

at::Tensor as_tensor(const std::vector<std::int32_t>& tokens) {
  return at::from_blob(const_cast<std::int32_t*>(tokens.data()), {static_cast<std::int64_t>(tokens.size())},
                       at::kInt)
      .clone();
}

}  // namespace

std::shared_ptr<const Examples> token_windows(at::Tensor tokens, std::vector<std::int64_t> starts,
                                              std::int64_t context, std::int64_t jitter) {
  TORCH_CHECK(tokens.dim() == 1 && tokens.scalar_type() == at::kInt && tokens.is_contiguous(),
              "token_windows: tokens must be a contiguous int32 vector");
  TORCH_CHECK(context >= 1 && jitter >= 0, "token_windows: context ", context, ", jitter ", jitter);
  const std::int64_t n = tokens.numel();
  for (const std::int64_t s : starts) {
    TORCH_CHECK(s >= 0 && s + std::max<std::int64_t>(jitter, 1) - 1 + context + 1 <= n, "token_windows: a window at ",
                s, " (jitter ", jitter, ", context ", context, ") runs past the ", n, " tokens");
  }
  return std::make_shared<TokenWindows>(std::move(tokens), std::move(starts), context, jitter);
}

WorkloadData load_text(const TextSpec& spec) {
  TokenCorpus corpus = load_tokens(spec);
  const std::int64_t T = spec.context;
  const auto n_train = static_cast<std::int64_t>(corpus.train.size());
  const auto n_val = static_cast<std::int64_t>(corpus.validation.size());
  const std::string val_name = spec.validation_path.empty() ? spec.path + " (its validation part)" : spec.validation_path;
  // Training: window i at i * T, moved by up to T - 1 tokens, so that every
  // token but the last 2T or fewer is a window's start in some epoch.
  const std::int64_t train_windows = n_train / T - 1;
  if (train_windows < 1) {
    throw std::runtime_error(spec.path + ": " + std::to_string(n_train) + " training tokens, fewer than the " +
                             std::to_string(2 * T) + " that one window of context " + std::to_string(T) +
                             " and its offsets need");
  }
  std::vector<std::int64_t> starts(static_cast<std::size_t>(train_windows));
  for (std::int64_t i = 0; i < train_windows; ++i) starts[static_cast<std::size_t>(i)] = i * T;
  // Validation: the whole windows, or `validation_windows` of them spread evenly.
  const std::int64_t whole = (n_val - 1) / T;
  if (whole < 1) {
    throw std::runtime_error(val_name + ": " + std::to_string(n_val) +
                             " validation tokens, fewer than one window of context " + std::to_string(T) + " + 1");
  }
  const std::int64_t count = spec.validation_windows > 0 ? std::min(spec.validation_windows, whole) : whole;
  std::vector<std::int64_t> val_starts(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) val_starts[static_cast<std::size_t>(i)] = i * whole / count * T;

  WorkloadData d;
  d.classes = corpus.vocabulary;
  d.train = token_windows(as_tensor(corpus.train), std::move(starts), T, T);
  d.validation = token_windows(as_tensor(corpus.validation), std::move(val_starts), T, 0);
  d.report = [=, tokenizer = corpus.tokenizer, vocabulary = corpus.vocabulary] {
    return json{{"tokenizer", tokenizer},     {"vocabulary", vocabulary},     {"context", T},
                {"train_tokens", n_train},    {"validation_tokens", n_val},   {"train_windows", train_windows},
                {"validation_windows", count}};
  };
  return d;
}

// -------------------------------------------------------- registration --

namespace {

TextSpec text_spec(const json& params) {
  config::JsonReader r(params, "dataset");
  TextSpec s;
  s.path = r.string("path");
  s.validation_path = r.string("validation_path", "");
  s.format = r.choice("format", kFormats, s.format);
  const bool text = s.format == TokenFormat::kText;
  if (text) s.tokenizer = r.choice("tokenizer", kTokenizers, s.tokenizer);
  const bool spm = text && s.tokenizer == Tokenizer::kSentencePiece;
  if (spm) s.spm_model = r.string("spm_model", "");
  const bool sized = s.format == TokenFormat::kUint16 || s.format == TokenFormat::kLlmc || (spm && s.spm_model.empty());
  if (sized) {
    const std::int64_t fallback = s.format == TokenFormat::kLlmc ? kGpt2Vocabulary : spm ? 1024 : 0;
    s.vocab_size = s.format == TokenFormat::kUint16 ? r.integer("vocab_size") : r.integer("vocab_size", fallback);
    const std::int64_t most = spm ? 1 << 20 : 65536;
    if (s.vocab_size < (spm ? 260 : 1) || s.vocab_size > most) {
      config::config_error(r.path_of("vocab_size"), "must be in [" + std::to_string(spm ? 260 : 1) + ", " +
                                                         std::to_string(most) + "], got " + std::to_string(s.vocab_size));
    }
  }
  s.context = r.integer("context", s.context);
  if (s.context < 1) config::config_error(r.path_of("context"), "must be >= 1, got " + std::to_string(s.context));
  if (s.validation_path.empty()) {
    s.validation_fraction = r.number("validation_fraction", s.validation_fraction);
    if (!(s.validation_fraction > 0 && s.validation_fraction < 1)) {
      config::config_error(r.path_of("validation_fraction"),
                           "must be in (0, 1), got " + std::to_string(s.validation_fraction));
    }
  }
  s.validation_windows = r.integer("validation_windows", 0);
  if (s.validation_windows < 0) {
    config::config_error(r.path_of("validation_windows"), "must be >= 0, got " + std::to_string(s.validation_windows));
  }
  r.finish();
  return s;
}

json text_json(const TextSpec& s) {
  json j = {{"path", s.path}, {"format", config::enum_name(kFormats, s.format)}, {"context", s.context},
            {"validation_windows", s.validation_windows}};
  if (s.validation_path.empty()) {
    j["validation_fraction"] = s.validation_fraction;
  } else {
    j["validation_path"] = s.validation_path;
  }
  if (s.format == TokenFormat::kText) j["tokenizer"] = config::enum_name(kTokenizers, s.tokenizer);
  if (!s.spm_model.empty()) j["spm_model"] = s.spm_model;
  if (s.vocab_size > 0) j["vocab_size"] = s.vocab_size;
  return j;
}

}  // namespace

DatasetRegistration text_dataset() {
  return {"text", [](const json& p) { return text_json(text_spec(p)); },
          [](const json& p) { return load_text(text_spec(p)); }};
}

}  // namespace bigbatch::experiments
