// The token files and the byte and character tokenizers (experiments/io/tokens.h)
// against files and text made by hand here: every header field, the byte
// order, and each way a file can be wrong.
#include "../../experiments/io/tokens.h"

#include "scratch_dir.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

namespace bigbatch::experiments {
namespace {

using testing_support::error_of;

class TokensTest : public testing_support::ScratchDirTest {
 protected:
  // An llm.c header written out byte by byte (little-endian int32s).
  static std::string header(std::uint32_t magic, std::uint32_t version, std::uint32_t count) {
    std::string h(1024, '\0');
    const std::uint32_t fields[3] = {magic, version, count};
    for (int f = 0; f < 3; ++f) {
      for (int b = 0; b < 4; ++b) h[static_cast<std::size_t>(4 * f + b)] = static_cast<char>((fields[f] >> (8 * b)) & 0xff);
    }
    return h;
  }
};

TEST_F(TokensTest, LlmcHeaderAndLittleEndianTokens) {
  // 20240520 = 0x0134D888: bytes 88 D8 34 01 on disk.
  const std::string h = header(20240520, 1, 3);
  EXPECT_EQ(static_cast<unsigned char>(h[0]), 0x88);
  EXPECT_EQ(static_cast<unsigned char>(h[1]), 0xD8);
  EXPECT_EQ(static_cast<unsigned char>(h[3]), 0x01);
  // Tokens 258 (02 01), 0 and 65535.
  const std::string path = write("a.bin", h + std::string("\x02\x01\x00\x00\xff\xff", 6));
  EXPECT_EQ(read_llmc_tokens(path), (std::vector<std::int32_t>{258, 0, 65535}));
}

TEST_F(TokensTest, LlmcWriterMatchesTheHandMadeFile) {
  const std::string path = (dir_ / "w.bin").string();
  write_llmc_tokens(path, {258, 0, 65535});
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes, header(20240520, 1, 3) + std::string("\x02\x01\x00\x00\xff\xff", 6));
}

TEST_F(TokensTest, LlmcRejectsWrongMagicVersionAndSize) {
  const std::string two("\x01\x00\x02\x00", 4);
  EXPECT_NE(error_of([&] { read_llmc_tokens(write("m.bin", header(20240521, 1, 2) + two)); })
                .find("m.bin: magic number 20240521, not llm.c's 20240520"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_llmc_tokens(write("v.bin", header(20240520, 2, 2) + two)); })
                .find("v.bin: llm.c token file version 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_llmc_tokens(write("t.bin", header(20240520, 1, 3) + two)); })
                .find("t.bin: the header counts 3 tokens (1030 bytes with the header), the file has 1028 bytes "
                      "(truncated?)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_llmc_tokens(write("s.bin", std::string(100, '\0'))); })
                .find("s.bin: 100 bytes, shorter than llm.c's header"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_llmc_tokens((dir_ / "none.bin").string()); }).find("none.bin: cannot read"),
            std::string::npos);
}

TEST_F(TokensTest, Uint16FilesAndTheirOddSize) {
  EXPECT_EQ(read_uint16_tokens(write("u.bin", std::string("\x34\x12\x07\x00", 4))),
            (std::vector<std::int32_t>{0x1234, 7}));
  EXPECT_NE(error_of([&] { read_uint16_tokens(write("odd.bin", std::string("\x34\x12\x07", 3))); })
                .find("odd.bin: 3 bytes, an odd number"),
            std::string::npos);
}

TEST_F(TokensTest, TokensOutsideTheVocabularyNameFileValueAndPosition) {
  EXPECT_NO_THROW(check_tokens({0, 4, 2}, 5, "f"));
  EXPECT_EQ(error_of([] { check_tokens({0, 5, 2}, 5, "f.bin"); }),
            "f.bin: token 5 at position 1 is outside the vocabulary of 5");
}

TEST_F(TokensTest, Utf8DecodesEveryLengthAndRejectsMalformedText) {
  // "aé€😀": 1, 2, 3 and 4 bytes.
  const std::string text = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
  const std::vector<std::int32_t> cps{0x61, 0xe9, 0x20ac, 0x1f600};
  EXPECT_EQ(utf8_code_points(text, "t"), cps);
  EXPECT_EQ(utf8_text(cps), text);
  EXPECT_EQ(error_of([] { utf8_code_points("ab\xc3", "x.txt"); }).rfind("x.txt: not UTF-8 at byte 2", 0), 0u);
  EXPECT_EQ(error_of([] { utf8_code_points("a\x80", "x"); }).rfind("x: not UTF-8 at byte 1", 0), 0u);
  EXPECT_EQ(error_of([] { utf8_code_points("\xc0\xaf", "x"); }).rfind("x: not UTF-8 at byte 0", 0), 0u);  // overlong
  EXPECT_EQ(error_of([] { utf8_code_points("\xed\xa0\x80", "x"); }).rfind("x: not UTF-8 at byte 0", 0), 0u);  // surrogate
}

TEST_F(TokensTest, CharactersRoundTripInSortedOrder) {
  const std::string text = "ba\xc3\xa9 ab\n";
  const auto cps = utf8_code_points(text, "t");
  const CharVocabulary v = CharVocabulary::of(cps);
  EXPECT_EQ(v.chars(), (std::vector<std::int32_t>{'\n', ' ', 'a', 'b', 0xe9}));
  const auto tokens = v.encode(cps, "t");
  EXPECT_EQ(tokens, (std::vector<std::int32_t>{3, 2, 4, 1, 2, 3, 0}));
  EXPECT_EQ(v.decode(tokens), text);
  EXPECT_EQ(error_of([&] { v.encode(utf8_code_points("abz", "t"), "val.txt"); }),
            "val.txt: character U+007A at position 2 is not in the vocabulary of the training text");
}

TEST_F(TokensTest, BytesRoundTripAnyData) {
  const std::string data("\x00\xff\x80 a", 5);
  const auto tokens = byte_tokens(data);
  EXPECT_EQ(tokens, (std::vector<std::int32_t>{0, 255, 128, 32, 97}));
  EXPECT_EQ(byte_text(tokens), data);
}

}  // namespace
}  // namespace bigbatch::experiments
