#!/usr/bin/env bash
# Sets up, builds, and runs the whole test suite in four lanes: through ctest
# against current LibTorch, the main build (./build: the installed PyTorch's,
# else that of the torch wheel pinned in scripts/torch_version); the Python
# package, pip-installed from this checkout into ./.pyenv (PyPI's torch of
# that pin, scripts/pyenv.sh) and tested with pytest (tests/python, against
# the main build's C++ peer program and CLI); through ctest against Debian's
# LibTorch 1.13, the compatibility lane (./build-debian), which builds and
# runs what depends on the LibTorch version; then the tests labelled
# "sanitize" under ASan and UBSan (./build-asan, scripts/sanitize.sh).
# Every lane always runs. The last lines give each lane's summary beside its
# wall time (setup and build, then tests), and add the summaries up.
set -uo pipefail
cd "$(dirname "$0")/.."
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.ccache}"
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"

# A whole run from a fresh clone writes about 16 GB here (the wheels and the
# Python environment 9, the three builds 6): say so at once where the disk
# has less free, since "No space left on device" half-way is the alternative.
need_gb=16
free_gb=$(df -Pk . | awk 'NR == 2 {print int($4 / 1048576)}')
low_disk=""
if [ -n "$free_gb" ] && [ "$free_gb" -lt "$need_gb" ]; then
  low_disk="test: $PWD has $free_gb GB free; a whole run from a fresh clone writes about $need_gb GB (less where earlier runs left their builds and environment)"
  echo "$low_disk"
fi

logs=$(mktemp -d)
pyenv_pid=""
trap '[ -z "$pyenv_pid" ] || kill "$pyenv_pid" 2>/dev/null; rm -rf "$logs"' EXIT
status=0
began=$SECONDS
clock() { printf '%d min %02d s' $(($1 / 60)) $(($1 % 60)); }

# lane N NAME FUNCTION [ARGS...]: runs one lane, its output shown and kept
# in its own log, and times it; FUNCTION writes "build SECONDS" to the file
# $logs/N.build where the lane builds before it tests.
lane() {
  local n=$1 name=$2 t0=$SECONDS
  shift 2
  echo "== lane $n: $name"
  "$@" "$n" 2>&1 | tee "$logs/$n" || status=1
  echo "$name" > "$logs/$n.name"
  echo $((SECONDS - t0)) > "$logs/$n.wall"
}
built() { echo $((SECONDS - $2)) > "$logs/$1.build"; }  # built N T0: lane N built, T0 its start

# ctest_lane BUILD SETUP_ARGS... N: set up and build, then the suite (what
# a build registers is its configuration's: BIGBATCH_COMPAT_TESTS).
ctest_lane() {
  local build=$1 n=${!#} t0=$SECONDS
  set -- "${@:2:$#-2}"
  scripts/setup.sh "$@" && remedy "$build" || return 1
  built "$n" "$t0"
  ctest --test-dir "$build" --output-on-failure --parallel 2 --timeout 900
}
# Where the build's BLAS is an OpenBLAS running generic kernels (Debian's
# 1.13 on the Xeons of this machine kind: a third of the speed, and of the
# suite's time), the suite runs with the remedy `bigbatch env` names, as a
# user would; the tests that need the generic kernels ask for them.
remedy() {
  local core
  core=$("$1/experiments/bigbatch" env --json | /usr/bin/python3 -c 'import json, sys
m = json.load(sys.stdin)
if m["math"]["slow"] and m["blas"].startswith("OpenBLAS"):
    print("SkylakeX" if "avx512f" in m["isa"] else "Haswell" if "avx2" in m["isa"] else "")')
  if [ -n "$core" ] && [ -z "${OPENBLAS_CORETYPE:-}" ]; then
    echo "test: $1's OpenBLAS runs generic kernels here: the suite runs with OPENBLAS_CORETYPE=$core"
    export OPENBLAS_CORETYPE=$core
  fi
}

# The Python lane's environment (2.9 GB of wheels, fetched once, and their
# unpacking: network and disk more than CPU) is made while lane 1 builds,
# once the packages and the torch wheel it shares with lane 1 are there.
scripts/packages.sh && /usr/bin/python3 scripts/fetch_torch.py "$(cat scripts/torch_version)" ".torch/$(cat scripts/torch_version)" ||
  status=1
# (A lane runs in a pipeline's subshell, which cannot wait for this job: it
# waits for the exit status the job writes.)
{ scripts/pyenv.sh > "$logs/pyenv" 2>&1; echo $? > "$logs/pyenv.rc"; } &
pyenv_pid=$!

lane 1 "current LibTorch (the main build)" ctest_lane build

# The package builds without its CLI here (BIGBATCH_PYTHON_CLI=OFF: the main
# build's serves bigbatch.sweep, through BIGBATCH_CLI), which saves two of
# the package's three and a half minutes of compiling; docs/python.md. It is
# built as a wheel (pip wheel, in .pyenv where its torch is), installed into
# a fresh venv with no compiler to be found (./.wheelenv: .pyenv's torch and
# references through a .pth file, bigbatch only from the wheel), and the
# tests run there: what a user installing the wheel gets.
python_lane() {
  local n=$1 t0=$SECONDS rc=0 dist=build-python/dist purelib
  while [ ! -e "$logs/pyenv.rc" ]; do sleep 1; done
  cat "$logs/pyenv"
  [ "$(cat "$logs/pyenv.rc")" -eq 0 ] || return 1
  rm -rf "$dist"
  .pyenv/bin/python -m pip uninstall --quiet --yes bigbatch 2> /dev/null  # (an earlier run's install)
  CMAKE_BUILD_PARALLEL_LEVEL=2 BIGBATCH_PYTHON_CLI=OFF .pyenv/bin/python -m pip wheel --quiet \
    --disable-pip-version-check --no-build-isolation --no-deps --wheel-dir "$dist" . || return 1
  built "$n" "$t0"
  rm -rf .wheelenv
  /usr/bin/python3 -m venv .wheelenv || return 1
  purelib=$(.pyenv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$purelib" > "$(.wheelenv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/pyenv.pth"
  env -i HOME="$HOME" PATH=/nonexistent CC=/bin/false CXX=/bin/false .wheelenv/bin/python -m pip install \
    --quiet --disable-pip-version-check --no-index --no-deps "$dist"/bigbatch-*.whl || return 1
  echo "python lane: $(basename "$dist"/bigbatch-*.whl) installed into .wheelenv without a compiler"
  rm -f build/pytest.xml
  BIGBATCH_CLI="$PWD/build/experiments/bigbatch" BIGBATCH_PYTHON_PEER="$PWD/build/tests/python_peer" \
    BIGBATCH_REQUIRE_REFERENCES=1 .wheelenv/bin/python -m pytest -q -p no:cacheprovider --junitxml=build/pytest.xml \
    tests/python || rc=1
  # Its summary in one line, failures included (the total below adds it up).
  [ -e build/pytest.xml ] && /usr/bin/python3 -c 'import sys, xml.etree.ElementTree as et
s = et.parse(sys.argv[1]).getroot().find("testsuite")
n, bad, skip = (int(s.get(k)) for k in ("tests", "failures", "skipped"))
bad += int(s.get("errors"))
print(f"pytest: {n - bad - skip} tests passed, {bad} tests failed, {skip} skipped, out of {n}")' build/pytest.xml
  return $rc
}
lane 2 "the Python package (its wheel installed without a compiler, pytest)" python_lane

# Lane 3 builds and runs what depends on the LibTorch version: the
# libraries, the CLI, the test binaries that call LibTorch and the CUDA
# compile check (the C++ only a BIGBATCH_CUDA build uses, against 1.13's
# c10d and c10/cuda headers), and their tests. It leaves out what does not:
# the SIMT executor's suite (the CUDA device code), the torch-free tests
# (io_tests and the fuzz corpora of torch-free formats, which lane 4 also
# runs under the sanitizers; the scripts' checks of the tree),
# the benchmarks, the add_subdirectory consumer (it builds bigbatch once
# more; Consumer.package runs, without the example workload, whose programs
# are the runner's), the runner scenarios whose subject is its own logic,
# and the Slurm cluster. tests/CMakeLists.txt says which is which
# (BIGBATCH_COMPAT_TESTS).
lane 3 "Debian's LibTorch 1.13 (compatibility)" ctest_lane build-debian \
  --debian -DBIGBATCH_SIMT_TESTS=OFF -DBIGBATCH_BUILD_BENCHMARKS=OFF -DBIGBATCH_COMPAT_TESTS=ON

sanitize_lane() {
  local n=$1 t0=$SECONDS
  scripts/sanitize.sh --build || return 1
  built "$n" "$t0"
  scripts/sanitize.sh --test
}
lane 4 "ASan and UBSan" sanitize_lane

# ctest: "100% tests passed, 0 tests failed out of 132" per lane; pytest's
# line above: "pytest: 40 tests passed, 0 tests failed, 0 skipped, out of 40".
echo "== summary: each lane's tests, and its wall time (setup and build, then tests)"
passed=0 failed=0 skipped=0 lanes=0
for n in 1 2 3 4; do
  line=$(grep -hE 'tests passed, [0-9]+ tests? failed out of|^pytest: [0-9]+ tests passed' "$logs/$n" 2>/dev/null | tail -1)
  wall=$(cat "$logs/$n.wall" 2>/dev/null || echo 0)
  build=$(cat "$logs/$n.build" 2>/dev/null || echo "")
  times="$(clock "$wall")${build:+: setup and build $(clock "$build"), tests $(clock $((wall - build)))}"
  echo "lane $n, $(cat "$logs/$n.name" 2>/dev/null): ${line:-no summary (the lane stopped before its tests)} [$times]"
  [ -n "$line" ] || continue
  lanes=$((lanes + 1))
  # Out of how many, failed, skipped (ctest's skipped: its "(Skipped)" lines).
  read -r t f s < <(awk '/tests passed, [0-9]+ tests? failed out of/ {print $NF, $4, -1}
                         /^pytest: [0-9]+ tests passed/ {print $NF, $5, $8}' <<<"$line")
  [ "$s" -ge 0 ] || s=$(grep -cE '^[[:space:]]*[0-9]+ - .* \(Skipped\)$' "$logs/$n")
  passed=$((passed + t - f - s)) failed=$((failed + f)) skipped=$((skipped + s))
done
if [ "$lanes" -ne 4 ] || [ "$passed" -le 0 ]; then status=1; fi
echo "(the skipped entries are the _CUDA tests, one entry per test binary, which need a GPU (lane 1 runs them on the SIMT executor), and lane 2's tests/python/test_cuda.py (no GPU); a ctest entry is a GoogleTest suite, and a test skipped inside one, such as lane 3's TorchOptim.MuonMatchesPyTorchsMuon (PyTorch's Muon comes with current LibTorch), counts with its suite)"
[ -z "$low_disk" ] || echo "$low_disk"
echo "total: $passed passed, $failed failed, $skipped skipped, in $(clock $((SECONDS - began)))"
exit $status
