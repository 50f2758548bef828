// Fuzz target: the TensorBoard event file reader (TFRecords, then each record's
// Event protobuf), as a resumed trial reads its own file back.
#include "../../experiments/io/records.h"
#include "../../experiments/io/tensorboard.h"

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace tb = bigbatch::experiments::tensorboard;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const auto records = bigbatch::experiments::records::read_records(bytes);
  if (records.whole_bytes > size) __builtin_trap();
  for (const auto& payload : records.payloads) {
    try {
      const auto event = tb::parse_event(payload);
      (void)tb::parse_event(tb::serialize(event));  // what it read, written again, reads
    } catch (const std::runtime_error&) {
    }
  }
  // The first bytes as a bare Event too, without the framing in the way.
  try {
    (void)tb::parse_event(bytes);
  } catch (const std::runtime_error&) {
  }
  return 0;
}
