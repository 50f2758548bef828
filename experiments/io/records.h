// TFRecord framing: the container of TensorBoard event files and of
// checkpoints. Torch-free. A record is a little-endian uint64 length, the
// masked CRC32C of those 8 bytes, the payload, and the masked CRC32C of the
// payload, so a reader can tell a whole record from one a killed writer cut
// short or a disk damaged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bigbatch::experiments::records {

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `bytes`.
std::uint32_t crc32c(std::string_view bytes);
/// The TFRecord checksum: crc32c rotated right by 15 bits plus 0xa282ead8.
std::uint32_t masked_crc32c(std::string_view bytes);

/// `payload` framed as one record.
std::string frame(std::string_view payload);

/// The whole records at the start of `bytes`: reading stops at the first
/// record that is cut short or whose checksums do not match (the tail a killed
/// writer leaves). `whole_bytes` is where the last whole record ends.
struct Records {
  std::vector<std::string> payloads;
  std::size_t whole_bytes = 0;
};
Records read_records(std::string_view bytes);

/// `value`'s bytes, least significant first, and back.
template <typename T>
std::string little_endian(T value) {
  std::string out(sizeof(T), '\0');
  for (std::size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xFF);
  return out;
}
template <typename T>
T read_little_endian(std::string_view bytes) {
  T value = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) value |= T{static_cast<unsigned char>(bytes[i])} << (8 * i);
  return value;
}

}  // namespace bigbatch::experiments::records
