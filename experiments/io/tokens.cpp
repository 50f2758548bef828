// Token files and the byte and character tokenizers (tokens.h).
#include "tokens.h"

#include "files.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace bigbatch::experiments {
namespace {

std::uint32_t le32(const std::string& bytes, std::size_t at) {
  const auto b = [&](std::size_t i) { return static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[at + i])); };
  return b(0) | (b(1) << 8) | (b(2) << 16) | (b(3) << 24);
}

// Little-endian uint16 tokens from `begin` to the end of `bytes`.
std::vector<std::int32_t> le16_tokens(const std::string& bytes, std::size_t begin) {
  std::vector<std::int32_t> out((bytes.size() - begin) / 2);
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data() + begin);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::int32_t>(p[2 * i] | (p[2 * i + 1] << 8));
  return out;
}

}  // namespace

std::vector<std::int32_t> read_llmc_tokens(const std::string& path) {
  const std::string bytes = read_file(path);
  const std::size_t header = kLlmcHeaderInts * 4;
  if (bytes.size() < header) {
    throw std::runtime_error(path + ": " + std::to_string(bytes.size()) +
                             " bytes, shorter than llm.c's header of 1024 bytes: not an llm.c token file");
  }
  const auto magic = static_cast<std::int32_t>(le32(bytes, 0));
  if (magic != kLlmcMagic) {
    throw std::runtime_error(path + ": magic number " + std::to_string(magic) + ", not llm.c's " +
                             std::to_string(kLlmcMagic) + ": not an llm.c token file");
  }
  const auto version = static_cast<std::int32_t>(le32(bytes, 4));
  if (version != kLlmcVersion) {
    throw std::runtime_error(path + ": llm.c token file version " + std::to_string(version) + ", only version " +
                             std::to_string(kLlmcVersion) + " (uint16 tokens) is read");
  }
  const auto count = static_cast<std::int32_t>(le32(bytes, 8));
  if (count < 0) throw std::runtime_error(path + ": token count " + std::to_string(count) + " in the header");
  const std::size_t expected = header + 2 * static_cast<std::size_t>(count);
  if (bytes.size() != expected) {
    throw std::runtime_error(path + ": the header counts " + std::to_string(count) + " tokens (" +
                             std::to_string(expected) + " bytes with the header), the file has " +
                             std::to_string(bytes.size()) + " bytes" +
                             (bytes.size() < expected ? " (truncated?)" : ""));
  }
  return le16_tokens(bytes, header);
}

std::vector<std::int32_t> read_uint16_tokens(const std::string& path) {
  const std::string bytes = read_file(path);
  if (bytes.size() % 2 != 0) {
    throw std::runtime_error(path + ": " + std::to_string(bytes.size()) +
                             " bytes, an odd number: not a file of uint16 tokens (truncated?)");
  }
  return le16_tokens(bytes, 0);
}

void write_llmc_tokens(const std::string& path, const std::vector<std::int32_t>& tokens) {
  std::string bytes(kLlmcHeaderInts * 4 + 2 * tokens.size(), '\0');
  const auto put32 = [&](std::size_t at, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  };
  put32(0, static_cast<std::uint32_t>(kLlmcMagic));
  put32(4, static_cast<std::uint32_t>(kLlmcVersion));
  put32(8, static_cast<std::uint32_t>(tokens.size()));
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] > 0xffff) {
      throw std::invalid_argument(path + ": token " + std::to_string(tokens[i]) + " does not fit in uint16");
    }
    bytes[kLlmcHeaderInts * 4 + 2 * i] = static_cast<char>(tokens[i] & 0xff);
    bytes[kLlmcHeaderInts * 4 + 2 * i + 1] = static_cast<char>(tokens[i] >> 8);
  }
  write_file_atomic(path, bytes);
}

void check_tokens(const std::vector<std::int32_t>& tokens, std::int64_t vocabulary, const std::string& path) {
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocabulary) {
      throw std::runtime_error(path + ": token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                               " is outside the vocabulary of " + std::to_string(vocabulary));
    }
  }
}

std::vector<std::int32_t> utf8_code_points(std::string_view text, const std::string& what) {
  std::vector<std::int32_t> out;
  out.reserve(text.size());
  std::size_t i = 0;
  const auto bad = [&](std::size_t at) {
    throw std::runtime_error(what + ": not UTF-8 at byte " + std::to_string(at) +
                             " (use \"tokenizer\": \"byte\" for any bytes)");
  };
  while (i < text.size()) {
    const auto b0 = static_cast<unsigned char>(text[i]);
    int extra = 0;
    std::int32_t cp = 0, least = 0;
    if (b0 < 0x80) {
      cp = b0;
    } else if ((b0 & 0xe0) == 0xc0) {
      extra = 1, cp = b0 & 0x1f, least = 0x80;
    } else if ((b0 & 0xf0) == 0xe0) {
      extra = 2, cp = b0 & 0x0f, least = 0x800;
    } else if ((b0 & 0xf8) == 0xf0) {
      extra = 3, cp = b0 & 0x07, least = 0x10000;
    } else {
      bad(i);
    }
    if (i + static_cast<std::size_t>(extra) >= text.size()) bad(i);  // cut short
    for (int k = 1; k <= extra; ++k) {
      const auto b = static_cast<unsigned char>(text[i + static_cast<std::size_t>(k)]);
      if ((b & 0xc0) != 0x80) bad(i);
      cp = (cp << 6) | (b & 0x3f);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    if (cp < least || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) bad(i);
    out.push_back(cp);
    i += 1 + static_cast<std::size_t>(extra);
  }
  return out;
}

std::string utf8_text(const std::vector<std::int32_t>& code_points) {
  std::string out;
  out.reserve(code_points.size());
  for (const std::int32_t cp : code_points) {
    const auto c = static_cast<std::uint32_t>(cp);
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xc0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3f));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xe0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (c & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (c & 0x3f));
    }
  }
  return out;
}

CharVocabulary CharVocabulary::of(const std::vector<std::int32_t>& code_points) {
  CharVocabulary v;
  v.chars_ = code_points;
  std::sort(v.chars_.begin(), v.chars_.end());
  v.chars_.erase(std::unique(v.chars_.begin(), v.chars_.end()), v.chars_.end());
  return v;
}

std::vector<std::int32_t> CharVocabulary::encode(const std::vector<std::int32_t>& code_points,
                                                 const std::string& what) const {
  std::vector<std::int32_t> out(code_points.size());
  for (std::size_t i = 0; i < code_points.size(); ++i) {
    const auto it = std::lower_bound(chars_.begin(), chars_.end(), code_points[i]);
    if (it == chars_.end() || *it != code_points[i]) {
      char hex[16];
      std::snprintf(hex, sizeof hex, "U+%04X", static_cast<unsigned>(code_points[i]));
      throw std::runtime_error(what + ": character " + hex + " at position " +
                               std::to_string(i) + " is not in the vocabulary of the training text");
    }
    out[i] = static_cast<std::int32_t>(it - chars_.begin());
  }
  return out;
}

std::string CharVocabulary::decode(const std::vector<std::int32_t>& tokens) const {
  std::vector<std::int32_t> cps(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) cps[i] = chars_.at(static_cast<std::size_t>(tokens[i]));
  return utf8_text(cps);
}

std::vector<std::int32_t> byte_tokens(std::string_view text) {
  std::vector<std::int32_t> out(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string byte_text(const std::vector<std::int32_t>& tokens) {
  std::string out(tokens.size(), '\0');
  for (std::size_t i = 0; i < tokens.size(); ++i) out[i] = static_cast<char>(tokens[i]);
  return out;
}

}  // namespace bigbatch::experiments
