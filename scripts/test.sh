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
lane() {  # lane NAME BUILD SETUP_ARGS...: set up and build, then the suite
  local name=$1 build=$2
  shift 2
  echo "== $name"
  { scripts/setup.sh "$@" && ctest --test-dir "$build" --output-on-failure --parallel 2 --timeout 900; } 2>&1 |
    tee -a "$log" || status=1
}
lane "lane 1: current LibTorch (the main build)" build
# The SIMT executor's suite (the CUDA device code, which no LibTorch version
# changes) runs in lane 1 only.
lane "lane 2: Debian's LibTorch 1.13 (compatibility)" build-debian --debian -DBIGBATCH_SIMT_TESTS=OFF
echo "== lane 3: ASan and UBSan"
scripts/sanitize.sh 2>&1 | tee -a "$log" || status=1

# ctest: "100% tests passed, 0 tests failed out of 390" per lane.
read -r lanes total failed < <(awk '/tests passed, [0-9]+ tests? failed out of/ {n++; f += $4; t += $NF}
                                    END {print n + 0, t + 0, f + 0}' "$log")
skipped=$(grep -cE '^[[:space:]]*[0-9]+ - .* \(Skipped\)$' "$log")
if [ "$lanes" -ne 3 ] || [ "$total" -eq 0 ]; then status=1; fi
echo "(three lanes; the skipped entries are the _CUDA tests, one entry per test binary, which need a GPU (lane 1 runs them on the SIMT executor), and lane 2's TorchOptim.MuonMatchesPyTorchsMuon, whose PyTorch Muon comes with current LibTorch)"
echo "total: $((total - failed - skipped)) passed, $failed failed, $skipped skipped"
exit $status
