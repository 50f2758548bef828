#!/usr/bin/env bash
# The sanitizer lane: builds the tests labelled "sanitize" (the CPU kernels'
# tests, the torch-free file tests: run-folder files, records, TensorBoard
# events; and the replay of the schedule, IDX and event-file fuzz corpora)
# with AddressSanitizer and UndefinedBehaviorSanitizer
# in ./build-asan, and runs them through ctest. Any report fails the test
# (UBSan does not recover; ASan aborts). The SIMT executor's suites run under
# both sanitizers in the main build already.
# It builds against the main build's LibTorch (./build's, else the pinned
# wheel's).
# Usage: scripts/sanitize.sh [--build | --test]   (after scripts/setup.sh has installed the packages)
#   --build  configure and build only;  --test  run only (after --build);  neither: both
set -euo pipefail
cd "$(dirname "$0")/.."

build() {
  export CCACHE_DIR="${CCACHE_DIR:-$HOME/.ccache}" CCACHE_BASEDIR="$PWD"
  local torch_dir old version
  torch_dir=$(sed -n 's/^Torch_DIR:[A-Z]*=//p' build/CMakeCache.txt 2>/dev/null || true)
  if [ -z "$torch_dir" ]; then
    version=$(cat scripts/torch_version)
    /usr/bin/python3 scripts/fetch_torch.py "$version" ".torch/$version"
    torch_dir=$PWD/.torch/$version/cmake
  fi
  # A build-asan configured against another LibTorch (Debian's 1.13, before the
  # main build moved) is configured anew: its cache names that one's libraries.
  old=$(sed -n 's/^Torch_DIR:[A-Z]*=//p' build-asan/CMakeCache.txt 2>/dev/null || true)
  if [ -n "$old" ] && [ "$old" != "$torch_dir" ]; then
    echo "sanitize: build-asan was configured against the LibTorch in $old: configuring it anew"
    rm -f build-asan/CMakeCache.txt
  fi
  local flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -O1 -g"
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="$flags" -DTorch_DIR="$torch_dir" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DBIGBATCH_BUILD_BENCHMARKS=OFF \
    -DBIGBATCH_SIMT_TESTS=OFF > /dev/null
  cmake --build build-asan --parallel 2 --target \
    kernels_tests io_tests fuzz_schedule_replay fuzz_idx_replay fuzz_events_replay
}

run() {
  # LibTorch's static caches outlive main: leak reports would be its, not ours.
  ASAN_OPTIONS="detect_leaks=0:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1" \
    ctest --test-dir build-asan -L sanitize --output-on-failure --parallel 2 --timeout 600
}

case ${1:-} in
  "") build && run ;;
  --build) build ;;
  --test) run ;;
  *) echo "sanitize: unknown argument '$1' (--build, --test, or none for both)" >&2; exit 2 ;;
esac
