// The "text" dataset (experiments/workload/text.h): its windows against the corpus
// they were cut from (a text whose tokens are a closed form of their
// position), its splits, its checks, and SentencePiece's round trip.
#include "../../experiments/runconfig/config.h"
#include "../../experiments/workload/text.h"
#include "../../experiments/io/tokens.h"
#include "scratch_dir.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

namespace bigbatch::experiments {
namespace {

using testing_support::error_of;

class TextTest : public testing_support::ScratchDirTest {
 protected:
  // "abcdefghij" repeated: with the character tokenizer the token at
  // position p of the corpus is p % 10.
  std::string cycle(std::int64_t n) {
    std::string s;
    for (std::int64_t i = 0; i < n; ++i) s += static_cast<char>('a' + i % 10);
    return write("cycle.txt", s);
  }
  static nlohmann::json resolve(const nlohmann::json& params) { return text_dataset().resolve(params); }
  static WorkloadData load(const nlohmann::json& params) { return text_dataset().load(params); }
};

TEST_F(TextTest, WindowsAreTheCorpusAndItsNextTokens) {
  // 1000 characters: the last 10% (100) validation, 900 training tokens,
  // windows of 8: 900 / 8 - 1 = 111 training windows at multiples of 8.
  const WorkloadData d = load({{"path", cycle(1000)}, {"context", 8}, {"validation_fraction", 0.1}});
  EXPECT_EQ(d.classes, 10);
  ASSERT_EQ(d.train->size(), 111);
  const Batch b = d.train->get(at::tensor(std::vector<std::int64_t>{0, 5, 110}));
  ASSERT_EQ(b.input.sizes(), (std::vector<std::int64_t>{3, 8}));
  EXPECT_EQ(b.input.scalar_type(), at::kLong);
  const std::int64_t window[3] = {0, 5, 110};
  for (int k = 0; k < 3; ++k) {
    for (std::int64_t j = 0; j < 8; ++j) {
      EXPECT_EQ(b.input[k][j].item<std::int64_t>(), (window[k] * 8 + j) % 10);
      EXPECT_EQ(b.target[k][j].item<std::int64_t>(), (window[k] * 8 + j + 1) % 10);
    }
  }
  // Validation: the 100 tokens after the training ones (from position 900),
  // (100 - 1) / 8 = 12 whole windows.
  ASSERT_EQ(d.validation->size(), 12);
  const Batch v = d.validation->range(0, 12);
  for (std::int64_t k = 0; k < 12; ++k) {
    EXPECT_EQ(v.input[k][0].item<std::int64_t>(), (900 + 8 * k) % 10);
    EXPECT_EQ(v.target[k][7].item<std::int64_t>(), (900 + 8 * k + 8) % 10);
  }
  EXPECT_EQ(d.report()["train_tokens"], 900);
  EXPECT_EQ(d.report()["tokenizer"], "char");
}

TEST_F(TextTest, TrainingWindowsMoveByASeededOffsetPerEpoch) {
  const WorkloadData d = load({{"path", cycle(4000)}, {"context", 7}});
  const at::Tensor index = at::arange(0, 60, at::kLong);
  const Batch e0 = d.train->augmented(index, {3, 0});
  const Batch again = d.train->augmented(index, {3, 0});
  const Batch e1 = d.train->augmented(index, {3, 1});
  EXPECT_TRUE(e0.input.equal(again.input));
  std::set<std::int64_t> offsets;
  int moved = 0;
  for (std::int64_t k = 0; k < 60; ++k) {
    // Still a contiguous window of the corpus with its next tokens.
    const std::int64_t first = e0.input[k][0].item<std::int64_t>();
    const std::int64_t offset = ((first - 7 * k) % 10 + 10) % 10;
    for (std::int64_t j = 0; j < 7; ++j) {
      EXPECT_EQ(e0.input[k][j].item<std::int64_t>(), (first + j) % 10);
      EXPECT_EQ(e0.target[k][j].item<std::int64_t>(), (first + j + 1) % 10);
    }
    offsets.insert(offset);
    moved += e1.input[k][0].item<std::int64_t>() != first;
  }
  EXPECT_GE(offsets.size(), 5u);  // offsets in [0, 7) spread over the draws
  EXPECT_GT(moved, 30);           // another epoch, other offsets
  // Evaluation's view has no offset.
  EXPECT_EQ(d.train->get(index).input[1][0].item<std::int64_t>(), 7);
}

TEST_F(TextTest, ValidationWindowsAreAFixedEvenSpread) {
  const WorkloadData d =
      load({{"path", cycle(2000)}, {"context", 10}, {"validation_fraction", 0.5}, {"validation_windows", 4}});
  // 1000 validation tokens, 99 whole windows, 4 of them: 0, 24, 49, 74.
  ASSERT_EQ(d.validation->size(), 4);
  const Batch v = d.validation->range(0, 4);
  for (std::int64_t k = 0; k < 4; ++k) EXPECT_EQ(v.input[k][0].item<std::int64_t>(), 0);  // (1000 + 10 i) % 10
  EXPECT_EQ(d.report()["validation_windows"], 4);
}

TEST_F(TextTest, TokenFilesAreCheckedAgainstTheVocabulary) {
  const std::string path = (dir_ / "tokens.bin").string();
  std::vector<std::int32_t> tokens(300);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>(i % 50);
  write_llmc_tokens(path, tokens);
  const WorkloadData ok = load({{"path", path}, {"format", "llmc"}, {"context", 4}});
  EXPECT_EQ(ok.classes, 50257);  // GPT-2's, by default
  EXPECT_EQ(error_of([&] { load({{"path", path}, {"format", "llmc"}, {"vocab_size", 40}, {"context", 4}}); }),
            path + ": token 40 at position 40 is outside the vocabulary of 40");
  // Headerless uint16 needs its vocabulary.
  EXPECT_NE(error_of([&] { resolve({{"path", path}, {"format", "uint16"}}); }).find("dataset.vocab_size"),
            std::string::npos);
  // A text tokenizer takes no vocab_size; a format it does not know is named.
  EXPECT_NE(error_of([&] { resolve({{"path", path}, {"vocab_size", 5}}); }).find("dataset.vocab_size: unknown key"),
            std::string::npos);
  EXPECT_NE(error_of([&] { resolve({{"path", path}, {"format", "parquet"}}); })
                .find("dataset.format: unknown value \"parquet\" (one of: text, llmc, uint16)"),
            std::string::npos);
  // Too short for one window and its offsets.
  EXPECT_NE(error_of([&] { load({{"path", cycle(30)}, {"context", 16}}); })
                .find(": 27 training tokens, fewer than the 32 that one window of context 16 and its offsets need"),
            std::string::npos);
  // The resolved parameters write out every default and read back the same.
  const nlohmann::json r = resolve({{"path", "x.txt"}});
  EXPECT_EQ(r, (nlohmann::json{{"path", "x.txt"}, {"format", "text"}, {"tokenizer", "char"}, {"context", 128},
                               {"validation_fraction", 0.1}, {"validation_windows", 0}}));
  EXPECT_EQ(resolve(r), r);
}

TEST_F(TextTest, SentencePieceRoundTripsTextAndItsLines) {
  std::string corpus;
  for (int i = 0; i < 40; ++i) {
    corpus += "  " + std::to_string(i) + " In the beginning was the word, and the word was with the text.\n";
    corpus += "And the  text said: let there be tokens; and there were tokens.\n\n";
  }
  const std::string path = write("corpus.txt", corpus);
  const std::string model = SentencePieceText::cached(path, 320);
  EXPECT_NE(model.find("corpus.txt.bpe320-"), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(model));
  const SentencePieceText spm(model);
  EXPECT_GT(spm.size(), 259);  // the 256 bytes of byte fallback, unk, bos, eos and merges
  const std::string text = "  7 the word was with\n\nthe tokens.\n";
  const auto tokens = spm.encode(text);
  EXPECT_LT(tokens.size(), text.size());  // merged pieces, not characters
  EXPECT_EQ(spm.decode(tokens), text);
  const std::string unseen = "zebra \xc3\xa9!";  // characters the corpus lacks: bytes
  EXPECT_EQ(spm.decode(spm.encode(unseen)), unseen);
  // The dataset over the same corpus reads the cached model (no retraining).
  const auto written = std::filesystem::last_write_time(model);
  const WorkloadData d = load({{"path", path}, {"tokenizer", "sentencepiece"}, {"vocab_size", 320}, {"context", 8}});
  EXPECT_EQ(d.classes, spm.size());
  EXPECT_EQ(std::filesystem::last_write_time(model), written);
  EXPECT_NE(error_of([&] { SentencePieceText((dir_ / "no.model").string()); }).find("no.model: cannot read"),
            std::string::npos);
}

}  // namespace
}  // namespace bigbatch::experiments
