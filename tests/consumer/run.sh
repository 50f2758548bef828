#!/usr/bin/env bash
# Builds and runs tests/consumer in one mode: package (install this build to a
# temporary prefix, then find_package) or subdirectory (add_subdirectory).
# Usage: run.sh MODE SOURCE_DIR BUILD_DIR [workload|no-workload]
# (no-workload: the package without the example workload, in the
# compatibility lane; tests/CMakeLists.txt says why.)
set -euo pipefail
mode=$1 src=$2 build=$3 workload=${4:-workload}
work="$build/consumer-$mode"
rm -rf "$work"
# A core ledger of its own (experiments/cluster/cores.h): a sweep the user runs beside
# the suite would otherwise hold this machine's cores and refuse the example's.
export BIGBATCH_CORE_LEDGER="$work/.cores"
args=(-G Ninja -DBIGBATCH_SOURCE_DIR="$src" -DBIGBATCH_CONSUMER_MODE="$mode")
# The package's programs are Release builds, as the README's user makes
# them. add_subdirectory compiles bigbatch itself once more, here with no
# build type (CMake's default: no optimization, assertions on), as a project
# that sets none builds it: what this mode checks (bigbatch's targets, their
# include paths and links inside another project) does not depend on the
# optimization, which would double the time it takes.
if [ "$mode" = package ]; then args+=(-DCMAKE_BUILD_TYPE=Release); else args+=(-DCMAKE_BUILD_TYPE=); fi
if command -v ccache >/dev/null; then args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
torch_dir=$(sed -n 's/^Torch_DIR:[A-Z]*=//p' "$build/CMakeCache.txt")
if [ "$mode" = package ]; then
  # As the README's user does: only the install prefix. The package finds the
  # LibTorch it was built against (cmake/bigbatchConfig.cmake.in), though
  # Debian's libtorch-dev, which the test command installs, sits in /usr.
  cmake --install "$build" --prefix "$work/prefix" >/dev/null
  args+=(-DCMAKE_PREFIX_PATH="$work/prefix" -DBIGBATCH_PUBLIC_HEADERS_DIR="$work/prefix/include/bigbatch")
  # A project that chose another LibTorch is refused at configure time,
  # naming both versions (not dozens of undefined c10:: symbols at link time).
  other=""
  for dir in /usr/lib/x86_64-linux-gnu/cmake/Torch "$src"/.torch/*/cmake; do
    if [ -e "$dir/TorchConfig.cmake" ] && [ "$(cd "$dir" && pwd -P)" != "$(cd "$torch_dir" && pwd -P)" ]; then
      other=$dir
      break
    fi
  done
  if [ -n "$other" ]; then
    mine=$(sed -n 's/^set(bigbatch_TORCH_VERSION "\(.*\)")$/\1/p' "$work/prefix/lib/cmake/bigbatch/bigbatchConfig.cmake")
    [ -n "$mine" ] || { echo "the installed bigbatchConfig.cmake records no LibTorch version" >&2; exit 1; }
    if out=$(cmake -S "$src/tests/consumer" -B "$work/other-torch" "${args[@]}" -DTorch_DIR="$other" 2>&1 |
             tr -s ' \n' '  '; exit "${PIPESTATUS[0]}"); then
      echo "a consumer of another LibTorch ($other) configured against bigbatch built with $mine" >&2
      exit 1
    fi
    theirs=$(grep -ho 'found LibTorch [0-9.a-z+]*' <<<"$out" | head -1)
    grep -q "built against LibTorch $mine " <<<"$out" && [ -n "$theirs" ] && [ "$theirs" != "found LibTorch $mine" ] ||
      { echo "another LibTorch refused without naming both versions:" >&2; echo "$out" >&2; exit 1; }
    echo "another LibTorch refused: built against $mine, $theirs"
  fi
else  # the build tree's links to the public headers (CMakeLists.txt, BIGBATCH_INCLUDE_ROOT);
  # bigbatch's own CMake finds the LibTorch this build used (Debian's, or a --torch wheel's).
  [ -z "$torch_dir" ] || args+=(-DTorch_DIR="$torch_dir")
  args+=(-DBIGBATCH_PUBLIC_HEADERS_DIR="$work/build/bigbatch/public-include/bigbatch")
fi
cmake -S "$src/tests/consumer" -B "$work/build" "${args[@]}" >/dev/null
# Everything this mode builds, in one build of two jobs: every public header
# alone in one file (tests/consumer/CMakeLists.txt), the README's example,
# and with the package the docs' examples and the example workload. The
# programs are built and run once, against the installed package; through
# add_subdirectory, what is its own: the configure (bigbatch's targets,
# bigbatch::experiments among them: the example workload's target links it),
# the headers, and a program built, linked and run. (Building the example
# workload there compiled the runner's 45 files a second time, for the same
# program.)
targets=(include_public readme_example)
[ "$mode" != package ] || targets+=(docs_examples)
[ "$mode" != package ] || [ "$workload" != workload ] || targets+=(waves)
cmake --build "$work/build" --parallel 2 --target "${targets[@]}" >/dev/null
# Only the public headers are reachable: each internal one fails to resolve.
IFS=';' read -r -a internal < "$work/build/include_internal_targets.txt"
for target in "${internal[@]}"; do
  if out=$(cmake --build "$work/build" --parallel 2 --target "$target" 2>&1); then
    echo "an internal header is reachable by a consumer: $target" >&2
    exit 1
  fi
  grep -q "No such file or directory" <<<"$out" || { echo "$target failed for another reason:" >&2; echo "$out" >&2; exit 1; }
done
echo "internal headers unreachable: ${#internal[@]}"
"$work/build/readme_example"
if [ "$mode" != package ]; then
  echo "add_subdirectory: configured, headers checked, README example ran"
  exit 0
fi
"$work/build/docs_examples"
if [ "$workload" != workload ]; then
  echo "package: configured, headers checked, README and docs examples ran"
  exit 0
fi
# The example workload: its sweep, its cbs, the plots and a data-parallel
# trial end to end, each with a table or a line to show.
example="$src/examples/sequence_workload"
runs="$work/runs"
"$work/build/sequence_workload/waves" sweep "$example/sweep.json" --out "$runs" --jobs 2 >/dev/null 2>"$work/sweep.log" ||
  { cat "$work/sweep.log" >&2; exit 1; }
grep -q "^512," "$runs/waves/steps_to_target.csv" || { echo "example sweep: no table" >&2; exit 1; }
"$work/build/sequence_workload/waves" cbs "$example/cbs.json" --out "$runs" --jobs 2 >/dev/null 2>"$work/cbs.log" ||
  { cat "$work/cbs.log" >&2; exit 1; }
test -s "$runs/waves_cbs/cbs.csv" || { echo "example cbs: no cbs.csv" >&2; exit 1; }
"$work/build/sequence_workload/waves" plot "$runs/waves" >/dev/null
test -s "$runs/waves/plots/steps_to_target.png" || { echo "example plot: no steps_to_target.png" >&2; exit 1; }
# (--nproc runs argv[0] again)
"$work/build/sequence_workload/waves" train "$example/sweep.json" --out "$runs" --nproc 2 --steps 20 \
  2>/dev/null | grep -q "data-parallel over 2 ranks" || { echo "example: no data-parallel trial" >&2; exit 1; }
echo "example workload: sweep, cbs, plot, data-parallel ran"
