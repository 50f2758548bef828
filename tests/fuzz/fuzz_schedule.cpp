// Fuzz target: the schedule JSON reader and the schedule it resolves to. The
// first 8 bytes choose the batch size, the epoch length and the steps looked
// at; the rest is the "schedule" object. Rejections must be c10::Error.
#include "../../schedules/schedule.h"

#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace bs = bigbatch::schedules;
  if (size < 8) return 0;
  std::uint16_t batch, epoch, step, length;
  std::memcpy(&batch, data, 2);
  std::memcpy(&epoch, data + 2, 2);
  std::memcpy(&step, data + 4, 2);
  std::memcpy(&length, data + 6, 2);
  const auto j = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(data) + 8, size - 8), nullptr,
                                       /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    const bs::ScheduleSpec spec = bs::schedule_from_json(j);
    if (bs::schedule_from_json(bs::to_json(spec)).base_lr != spec.base_lr) __builtin_trap();
    const bs::Schedule s(spec, 1 + batch % 4096, epoch);
    for (const std::int64_t t : {std::int64_t{0}, std::int64_t{step}, std::int64_t{step} * 1000}) {
      (void)s.lr(t);
      (void)s.batch_size(t);
      (void)s.examples_seen(t);
    }
    (void)s.steps(length);
  } catch (const c10::Error&) {
  }
  return 0;
}
