// TFRecord framing (records.h).
#include "records.h"

#include <array>

namespace bigbatch::experiments::records {
namespace {

constexpr std::array<std::uint32_t, 256> crc_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr auto kCrcTable = crc_table();

}  // namespace

std::uint32_t crc32c(std::string_view bytes) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (const char b : bytes) c = kCrcTable[(c ^ static_cast<unsigned char>(b)) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

std::uint32_t masked_crc32c(std::string_view bytes) {
  const std::uint32_t c = crc32c(bytes);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string frame(std::string_view payload) {
  const std::string length = little_endian<std::uint64_t>(payload.size());
  std::string out = length;
  out += little_endian(masked_crc32c(length));
  out += payload;
  out += little_endian(masked_crc32c(payload));
  return out;
}

Records read_records(std::string_view bytes) {
  Records out;
  std::size_t pos = 0;
  while (bytes.size() - pos >= 12) {
    const auto length_bytes = bytes.substr(pos, 8);
    if (read_little_endian<std::uint32_t>(bytes.substr(pos + 8, 4)) != masked_crc32c(length_bytes)) break;
    const std::uint64_t length = read_little_endian<std::uint64_t>(length_bytes);
    if (length > bytes.size() - pos - 12 || bytes.size() - pos - 12 - length < 4) break;
    const auto payload = bytes.substr(pos + 12, static_cast<std::size_t>(length));
    if (read_little_endian<std::uint32_t>(bytes.substr(pos + 12 + length, 4)) != masked_crc32c(payload)) break;
    out.payloads.emplace_back(payload);
    pos += 16 + static_cast<std::size_t>(length);
    out.whole_bytes = pos;
  }
  return out;
}

}  // namespace bigbatch::experiments::records
