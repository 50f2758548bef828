#!/usr/bin/env bash
# Sets up, builds, and runs the whole test suite through ctest in three lanes:
# against Debian's LibTorch 1.13 (./build), then against the LibTorch of the
# newest torch wheel on PyPI (./build-torch-VERSION, scripts/check_torch.sh),
# then the tests labelled "sanitize" under ASan and UBSan (./build-asan,
# scripts/sanitize.sh). Every lane always runs; the last line adds up their
# ctest summaries.
set -uo pipefail
cd "$(dirname "$0")/.."
torch_pin=2.15.0  # the second lane's torch: the newest on PyPI, pinned here only

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
echo "== lane 1: Debian's LibTorch 1.13"
{ scripts/setup.sh && CCACHE_DIR="${CCACHE_DIR:-$HOME/.ccache}" \
    ctest --test-dir build --output-on-failure --parallel 2 --timeout 900; } 2>&1 | tee -a "$log" || status=1
echo "== lane 2: PyPI's torch $torch_pin"
# The SIMT executor's suite (the CUDA device code, which no LibTorch version
# changes) runs in lane 1 only.
scripts/check_torch.sh "$torch_pin" -DBIGBATCH_SIMT_TESTS=OFF 2>&1 | tee -a "$log" || status=1
echo "== lane 3: ASan and UBSan"
scripts/sanitize.sh 2>&1 | tee -a "$log" || status=1

# ctest: "100% tests passed, 0 tests failed out of 390" per lane.
read -r lanes total failed < <(awk '/tests passed, [0-9]+ tests? failed out of/ {n++; f += $4; t += $NF}
                                    END {print n + 0, t + 0, f + 0}' "$log")
skipped=$(grep -cE '^[[:space:]]*[0-9]+ - .* \(Skipped\)$' "$log")
if [ "$lanes" -ne 3 ] || [ "$total" -eq 0 ]; then status=1; fi
echo "(three lanes; the skipped entries are the _CUDA tests, one entry per test binary, which need a GPU (lane 1 runs them on the SIMT executor), and lane 1's TorchOptim.MuonMatchesPyTorchsMuon, whose PyTorch Muon comes with lane 2's torch wheel)"
echo "total: $((total - failed - skipped)) passed, $failed failed, $skipped skipped"
exit $status
