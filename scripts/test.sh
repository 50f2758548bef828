#!/usr/bin/env bash
# Sets up, builds, and runs the whole test suite in four lanes: through ctest
# against current LibTorch, the main build (./build: the installed PyTorch's,
# else that of the torch wheel pinned in scripts/torch_version); the Python
# package, pip-installed from this checkout into ./.pyenv (PyPI's torch of
# that pin, scripts/pyenv.sh) and tested with pytest (tests/python, against
# the main build's C++ peer program and CLI); through ctest against Debian's
# LibTorch 1.13, the compatibility lane (./build-debian); then the tests
# labelled "sanitize" under ASan and UBSan (./build-asan, scripts/sanitize.sh).
# Every lane always runs; the last line adds up their summaries.
set -uo pipefail
cd "$(dirname "$0")/.."
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.ccache}"
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
lane() {  # lane NAME BUILD EXCLUDE SETUP_ARGS...: set up and build, then the suite but the tests EXCLUDE matches
  local name=$1 build=$2 exclude=$3
  shift 3
  echo "== $name"
  { scripts/setup.sh "$@" && remedy "$build" &&
    ctest --test-dir "$build" --output-on-failure --parallel 2 --timeout 900 ${exclude:+-E "$exclude"}; } 2>&1 |
    tee -a "$log" || status=1
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
lane "lane 1: current LibTorch (the main build)" build ""
# The package builds without its CLI here (BIGBATCH_PYTHON_CLI=OFF: the main
# build's serves bigbatch.sweep, through BIGBATCH_CLI), which saves two of
# the package's three and a half minutes of compiling; docs/python.md.
echo "== lane 2: the Python package (pip install from this checkout, pytest)"
python_lane() {
  scripts/pyenv.sh &&
    CMAKE_BUILD_PARALLEL_LEVEL=2 BIGBATCH_PYTHON_CLI=OFF .pyenv/bin/python -m pip install --quiet \
      --disable-pip-version-check --no-build-isolation . || return 1
  rm -f build/pytest.xml
  local rc=0
  BIGBATCH_CLI="$PWD/build/experiments/bigbatch" BIGBATCH_PYTHON_PEER="$PWD/build/tests/python_peer" \
    BIGBATCH_REQUIRE_REFERENCES=1 .pyenv/bin/python -m pytest -q -p no:cacheprovider --junitxml=build/pytest.xml \
    tests/python || rc=1
  # Its summary in one line, failures included (the total below adds it up).
  [ -e build/pytest.xml ] && /usr/bin/python3 -c 'import sys, xml.etree.ElementTree as et
s = et.parse(sys.argv[1]).getroot().find("testsuite")
n, bad, skip = (int(s.get(k)) for k in ("tests", "failures", "skipped"))
bad += int(s.get("errors"))
print(f"pytest: {n - bad - skip} tests passed, {bad} tests failed, {skip} skipped, out of {n}")' build/pytest.xml
  return $rc
}
python_lane 2>&1 | tee -a "$log" || status=1
# Lane 3 builds everything but the SIMT executor's suite (the CUDA device
# code, which no LibTorch version changes) and runs the rest but for what
# does not depend on the LibTorch version and costs minutes: the
# add_subdirectory consumer (it builds bigbatch once more; Consumer.package
# runs), the benchmarks' smoke runs and the Slurm cluster.
lane "lane 3: Debian's LibTorch 1.13 (compatibility)" build-debian '^Consumer\.subdirectory$|^Benchmarks\.|^Slurm\.cluster$' \
  --debian -DBIGBATCH_SIMT_TESTS=OFF
echo "== lane 4: ASan and UBSan"
scripts/sanitize.sh 2>&1 | tee -a "$log" || status=1

# ctest: "100% tests passed, 0 tests failed out of 390" per lane; pytest's
# line above: "pytest: 40 tests passed, 0 tests failed, 0 skipped, out of 40".
read -r lanes total failed < <(awk '/tests passed, [0-9]+ tests? failed out of/ {n++; f += $4; t += $NF}
                                    /^pytest: [0-9]+ tests passed/ {n++; f += $5; t += $NF}
                                    END {print n + 0, t + 0, f + 0}' "$log")
skipped=$(( $(grep -cE '^[[:space:]]*[0-9]+ - .* \(Skipped\)$' "$log") +
            $(awk '/^pytest: [0-9]+ tests passed/ {s += $8} END {print s + 0}' "$log") ))
if [ "$lanes" -ne 4 ] || [ "$total" -eq 0 ]; then status=1; fi
echo "(four lanes; the skipped entries are the _CUDA tests, one entry per test binary, which need a GPU (lane 1 runs them on the SIMT executor), lane 2's tests/python/test_cuda.py (no GPU), and lane 3's TorchOptim.MuonMatchesPyTorchsMuon, whose PyTorch Muon comes with current LibTorch; lane 3 leaves out Consumer.subdirectory, Benchmarks.* and Slurm.cluster)"
echo "total: $((total - failed - skipped)) passed, $failed failed, $skipped skipped"
exit $status
