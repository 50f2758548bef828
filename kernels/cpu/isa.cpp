// The element loops' vector instructions (isa.h).
#include "isa.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <string>

namespace bigbatch::kernels::cpu {
namespace {

Isa best() {
#if defined(__x86_64__) && defined(__GNUC__)
  if (cpu_has(Isa::kAvx512)) return Isa::kAvx512;
  if (cpu_has(Isa::kAvx2)) return Isa::kAvx2;
#endif
  return Isa::kBaseline;
}

// The choice at first use: the best, or BIGBATCH_CPU_ISA when it names one
// the CPU can run (a narrower one: a name it cannot run is an error).
int initial() {
  Isa isa = best();
  if (const char* asked = std::getenv("BIGBATCH_CPU_ISA"); asked != nullptr && *asked != '\0') {
    const std::string name(asked);
    bool known = false;
    for (const Isa i : {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512}) {
      if (name == isa_name(i)) {
        TORCH_CHECK(cpu_has(i), "BIGBATCH_CPU_ISA=", name, ": this CPU cannot run it (best: ", isa_name(best()), ")");
        isa = i;
        known = true;
      }
    }
    TORCH_CHECK(known, "BIGBATCH_CPU_ISA=", name, ": expected baseline, avx2 or avx512");
  }
  return static_cast<int>(isa);
}

std::atomic<int>& chosen() {
  static std::atomic<int> isa{initial()};
  return isa;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kBaseline: return "baseline";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

bool cpu_has(Isa isa) {
#if defined(__x86_64__) && defined(__GNUC__)
  switch (isa) {
    case Isa::kBaseline: return true;
    case Isa::kAvx2: return __builtin_cpu_supports("avx2");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  }
  return false;
#else
  return isa == Isa::kBaseline;
#endif
}

Isa cpu_isa() { return static_cast<Isa>(chosen().load(std::memory_order_relaxed)); }

void set_cpu_isa(Isa isa) {
  TORCH_CHECK(cpu_has(isa), "bigbatch: this CPU cannot run the ", isa_name(isa), " loops (best: ", isa_name(best()),
              ")");
  chosen().store(static_cast<int>(isa));
}

}  // namespace bigbatch::kernels::cpu
