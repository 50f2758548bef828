#!/usr/bin/env bash
# Builds the libFuzzer programs of tests/fuzz with clang under ASan and UBSan
# (./build-fuzz, everything of bigbatch instrumented) and runs each for a given
# time, two at a time (this machine's two cores), starting from its kept corpus
# in tests/fuzz/corpus/NAME. Prints per target the inputs executed and the
# crashes found; a crash, hang or unbounded allocation leaves its input in
# build-fuzz/artifacts/NAME/, to fix and then keep in the corpus (ctest's
# Fuzz.NAME replays the corpus in every test run).
# Usage: scripts/fuzz.sh [--keep] [SECONDS] [NAME...]
#   SECONDS  per target (default 600); NAME: config cbs_config schedule idx events
#            checkpoint csv extensions
#   --keep   merge the inputs that reached new code into tests/fuzz/corpus/NAME
set -euo pipefail
cd "$(dirname "$0")/.."
keep=0
if [ "${1:-}" = --keep ]; then keep=1; shift; fi
seconds=${1:-600}
shift || true
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(config cbs_config schedule idx events checkpoint csv extensions)

scripts/packages.sh
for p in clang libclang-rt-14-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="${missing:-} $p"
done
if [ -n "${missing:-}" ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get install -y -q --no-install-recommends $missing
fi
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.ccache}" CCACHE_BASEDIR="$PWD"
# vptr: LibTorch's classes come from GCC-built libraries without UBSan's type info.
flags="-fsanitize=address,undefined -fno-sanitize=vptr -fno-sanitize-recover=undefined -fsanitize=fuzzer-no-link -fno-omit-frame-pointer -g"
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_CXX_FLAGS="$flags" -DBIGBATCH_FUZZ=ON -DBIGBATCH_BUILD_TESTS=OFF -DBIGBATCH_BUILD_BENCHMARKS=OFF > /dev/null
cmake --build build-fuzz --parallel 2 --target $(printf 'fuzz_%s ' "${names[@]}")

# LibTorch's own allocations outlive a run (its caches): no leak checks.
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
run() {
  local name=$1 work=build-fuzz/corpus/$1 artifacts=build-fuzz/artifacts/$1
  rm -rf "$artifacts"  # the crashes of this run only (keep one by copying it into the corpus)
  mkdir -p "$work" "$artifacts"
  local start=$SECONDS
  build-fuzz/tests/fuzz/fuzz_"$name" "$work" tests/fuzz/corpus/"$name" -max_total_time="$seconds" \
    -timeout=10 -rss_limit_mb=4096 -malloc_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" > "build-fuzz/$name.log" 2>&1 || true
  local executed crashes
  executed=$(awk '/stat::number_of_executed_units/ {print $2}' "build-fuzz/$name.log")
  crashes=$(find "$artifacts" -type f | wc -l)
  # libFuzzer stops at the first crash: the time is what it ran.
  echo "fuzz $name: ${executed:-?} inputs executed in $((SECONDS - start)) s, $crashes crashing inputs (build-fuzz/$name.log)"
  if ((keep)); then
    build-fuzz/tests/fuzz/fuzz_"$name" -merge=1 tests/fuzz/corpus/"$name" "$work" > /dev/null 2>&1 || true
  fi
}
for ((i = 0; i < ${#names[@]}; i += 2)); do
  run "${names[i]}" &
  if ((i + 1 < ${#names[@]})); then run "${names[i + 1]}" & fi
  wait
done
