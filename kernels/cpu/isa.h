// The vector instructions the CPU runner's element loops run with
// (cpu/runner.h). Each loop is compiled three times, for the baseline x86-64
// ISA (SSE2), for AVX2 and for AVX-512 (F, BW, DQ, VL), and each call takes
// the variant this process chose: the widest the CPU has, as ATen's
// CPU_CAPABILITY does, unless BIGBATCH_CPU_ISA (baseline, avx2, avx512) or
// set_cpu_isa asks for a narrower one. No variant contracts a multiply and an
// add (no FMA; -ffp-contract=off), and the sums of squares are kept in a
// fixed number of partial sums whatever the vector width, so every variant
// gives the baseline's bits (tests/kernels/cpu_engine_test.cpp).
#pragma once

namespace bigbatch::kernels::cpu {

enum class Isa { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

/// "baseline", "avx2", "avx512".
const char* isa_name(Isa isa);
/// Whether this CPU (and this build: x86-64 with GCC or Clang) can run `isa`.
bool cpu_has(Isa isa);
/// What the element loops run with now.
Isa cpu_isa();
/// Runs the element loops with `isa` from now on (a test, a comparison);
/// c10::Error when the CPU cannot run it.
void set_cpu_isa(Isa isa);

}  // namespace bigbatch::kernels::cpu
