#!/usr/bin/env bash
# Sets up, builds, and runs the whole test suite through ctest in three lanes:
# against current LibTorch, the main build (./build: the installed PyTorch's,
# else that of the torch wheel pinned in scripts/torch_version), then against
# Debian's LibTorch 1.13, the compatibility lane (./build-debian), then the
# tests labelled "sanitize" under ASan and UBSan (./build-asan,
# scripts/sanitize.sh). Every lane always runs; the last line adds up their
# ctest summaries.
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
# Lane 2 builds everything but the SIMT executor's suite (the CUDA device
# code, which no LibTorch version changes) and runs the rest but for what
# does not depend on the LibTorch version and costs minutes: the
# add_subdirectory consumer (it builds bigbatch once more; Consumer.package
# runs), the benchmarks' smoke runs and the Slurm cluster.
lane "lane 2: Debian's LibTorch 1.13 (compatibility)" build-debian '^Consumer\.subdirectory$|^Benchmarks\.|^Slurm\.cluster$' \
  --debian -DBIGBATCH_SIMT_TESTS=OFF
echo "== lane 3: ASan and UBSan"
scripts/sanitize.sh 2>&1 | tee -a "$log" || status=1

# ctest: "100% tests passed, 0 tests failed out of 390" per lane.
read -r lanes total failed < <(awk '/tests passed, [0-9]+ tests? failed out of/ {n++; f += $4; t += $NF}
                                    END {print n + 0, t + 0, f + 0}' "$log")
skipped=$(grep -cE '^[[:space:]]*[0-9]+ - .* \(Skipped\)$' "$log")
if [ "$lanes" -ne 3 ] || [ "$total" -eq 0 ]; then status=1; fi
echo "(three lanes; the skipped entries are the _CUDA tests, one entry per test binary, which need a GPU (lane 1 runs them on the SIMT executor), and lane 2's TorchOptim.MuonMatchesPyTorchsMuon, whose PyTorch Muon comes with current LibTorch; lane 2 leaves out Consumer.subdirectory, Benchmarks.* and Slurm.cluster)"
echo "total: $((total - failed - skipped)) passed, $failed failed, $skipped skipped"
exit $status
