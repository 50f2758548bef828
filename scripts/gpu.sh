#!/usr/bin/env bash
# The GPU run (H100/H200, PyTorch 2.x with its LibTorch, nvcc, ncu,
# compute-sanitizer, no network), in stages that each fit one call of a lent
# machine (under 10 minutes, the build kept between calls while it is warm):
#
#   tests     configure and build (BIGBATCH_CUDA=ON, all cores) against
#             torch's LibTorch; every _CUDA test (none may be skipped), the
#             CUDA graph test among them; the rest of the suite against this
#             LibTorch; a quickstart trial on the GPU in an NCCL world of one
#   sanitize  compute-sanitizer memcheck, racecheck and synccheck over the
#             kernels' _CUDA tests
#   bench     bm_cuda_optimizers (CUDA events, medians of 5), PyTorch's
#             AdamW(fused=True) on the same lists, the table of docs/cuda.md,
#             and an ncu summary of LAMB's passes on the BERT-large list
#   sweeps    the quickstart sweep on the CPU (all cores), on the GPU, and on
#             the GPU with --batch-trials: wall times and the three
#             steps-to-target tables side by side
#   all       the four in order (default)
#
# Every stage builds first (nothing to do when the build is there), runs each
# step under a time limit, goes on after a failing step, and writes to OUT
# (default $OUT, else build-gpu/out): STAGE.log (a line per step: status,
# seconds, name; the last lines of each failing step), STAGE.md (the results:
# tables, summaries) and a STAGE.tar.gz per stage run (every step's whole
# output and JSON): 6 files at most, as a lent machine sends back 8. It
# exits 1 when a step failed.
# The Debian packages it needs come from ./.debs (scripts/fetch_gpu_debs.sh,
# run on a networked Debian machine); they are unpacked under build-gpu/deps.
# Usage: scripts/gpu.sh [tests|sanitize|bench|sweeps|all] [OUT]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD
stage=${1:-all}
out=${2:-${OUT:-$root/build-gpu/out}}
case $stage in tests | sanitize | bench | sweeps | all) ;; *)
  echo "gpu.sh: unknown stage '$stage' (tests, sanitize, bench, sweeps or all)" >&2
  exit 2
  ;;
esac
build=$root/build-gpu
deps=$build/deps
mkdir -p "$out" "$deps"
# The unpacked packages' programs (ninja) and shared libraries (Google
# Benchmark's, which the benchmark binary loads).
export PATH="$deps/usr/bin:$PATH"
export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
python=${PYTHON:-python3}
jobs=$(nproc)
failed=0

# step NAME SECONDS COMMAND...: runs COMMAND (for at most SECONDS; a shell
# function of this script runs unbounded) with its output in $res/NAME.txt,
# records its status and time in $log, and goes on.
step() {
  local name=$1 limit=$2 start=$SECONDS rc=0
  shift 2
  echo "== $name" >&2
  if declare -F "$1" > /dev/null; then
    ("$@") > "$res/$name.txt" 2>&1 || rc=$?
  else
    timeout --kill-after=10 "$limit" "$@" > "$res/$name.txt" 2>&1 || rc=$?
  fi
  local took=$((SECONDS - start)) verdict=ok
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then verdict="TIMEOUT after ${limit}s"; elif [ "$rc" -ne 0 ]; then verdict="FAILED rc=$rc"; fi
  printf '%-22s %5ss  %s\n' "$verdict" "$took" "$name" >> "$log"
  if [ "$verdict" != ok ]; then
    failed=1
    tail -n 15 "$res/$name.txt" | sed 's/^/    /' >> "$log"
  fi
  return "$rc"
}

# The build: the .debs unpacked, configured against this torch, built.
build() {
  local debs=("$root"/.debs/*.deb)
  if [ ! -e "${debs[0]}" ]; then
    echo "no .debs/*.deb: run scripts/fetch_gpu_debs.sh on a networked machine and carry .debs"
    return 2
  fi
  for deb in "${debs[@]}"; do dpkg -x "$deb" "$deps"; done
  "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0))'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  local torch_prefix generator=()
  torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
  command -v ninja > /dev/null && generator=(-G Ninja)
  # The SIMT executor's tests are CI's stand-in for this machine: not built here.
  cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DBIGBATCH_CUDA=ON \
    -DBIGBATCH_SIMT_TESTS=OFF -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" \
    -DBIGBATCH_TORCH_PYTHON="$(command -v "$python")" \
    -DCMAKE_PREFIX_PATH="$torch_prefix;$deps/usr;$deps/usr/lib/x86_64-linux-gnu/cmake;$deps/usr/share/cmake" \
    -DCMAKE_INCLUDE_PATH="$deps/usr/include" -DCMAKE_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu" &&
    cmake --build "$build" --parallel "$jobs"
}

# cuda_tool NAME: the CUDA toolkit's NAME (ncu, compute-sanitizer) from PATH,
# else where the toolkit and Nsight Compute put it; NAME when not found.
cuda_tool() {
  local found
  found=$(command -v "$1" || ls -d /usr/local/cuda/bin/"$1" /usr/local/cuda/"$1"/"$1" \
    /opt/nvidia/nsight-compute/*/"$1" 2> /dev/null | tail -n 1)
  echo "${found:-$1}"
}

# The test binaries with _CUDA tests, each run on them alone.
cuda_binaries=(optimizers_tests cuda_graph_tests normalization_tests distributed_tests experiments_tests)

stage_tests() {
  for t in "${cuda_binaries[@]}"; do
    step "cuda_$t" 300 "$build/tests/$t" --gtest_filter='*_CUDA*' --gtest_output="json:$res/$t.json"
  done
  step cuda_tests_ran 60 "$python" "$root/benchmarks/cuda_table.py" tests "$res"/*_tests.json
  cat "$res/cuda_tests_ran.txt" >> "$md"  # which ran, which failed or were skipped
  # The rest against this LibTorch (CI runs it against 1.13 and 2.x on CPUs);
  # the CLI scenarios, consumers and benchmark smoke runs are CI's.
  step ctest_rest 420 ctest --test-dir "$build" -j "$jobs" --timeout 300 \
    -E '\.CUDA$|^CLI\.|^Consumer\.|^Benchmarks\.|^Fuzz\.|^TorchOptim'
  grep -E "tests passed|tests failed" "$res/ctest_rest.txt" >> "$md"
  step quickstart_cuda_nccl1 300 "$build/experiments/bigbatch" train "$root/experiments/configs/quickstart.json" \
    --device cuda --backend nccl --batch-size 256 --steps 200 --out "$res/runs"
  tail -n 1 "$res/quickstart_cuda_nccl1.txt" >> "$md"
}

stage_sanitize() {
  # The optimizers' _CUDA tests drive every kernel (each plan, fp32 and
  # 16-bit, the finalizers, the non-finite skip).
  for tool in memcheck racecheck synccheck; do
    step "sanitizer_$tool" 170 "$(cuda_tool compute-sanitizer)" --tool "$tool" --error-exitcode 3 \
      "$build/tests/optimizers_tests" --gtest_filter='*_CUDA*' --gtest_brief=1
    echo "compute-sanitizer $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|Device not supported' \
      "$res/sanitizer_$tool.txt" | tail -n 1)" >> "$md"
  done
}

stage_bench() {
  step bm_cuda_optimizers 300 "$build/benchmarks/bm_cuda_optimizers" --benchmark_repetitions=5 \
    --benchmark_min_time=0.2 --benchmark_report_aggregates_only=true --benchmark_out="$res/bm_cuda_optimizers.json" \
    --benchmark_out_format=json
  step adamw_fused 60 "$python" "$root/benchmarks/cuda_table.py" adamw "$res/adamw_fused.json"
  step table 60 "$python" "$root/benchmarks/cuda_table.py" table "$res/bm_cuda_optimizers.json" \
    "$res/adamw_fused.json" && cat "$res/table.txt" >> "$md"
  # LAMB's passes on BERT-large: the fused step's kernels, a few launches
  # after warm-up, the card's clocks left as they are.
  local metrics=gpu__time_duration.sum,dram__bytes.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
  metrics+=,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread
  metrics+=,launch__occupancy_limit_registers,launch__grid_size
  step ncu_lamb 120 "$(cuda_tool ncu)" --clock-control none --kernel-name regex:'chunk_kernel|finalize_kernel' \
    --launch-skip 20 --launch-count 6 --metrics "$metrics" --csv \
    "$build/benchmarks/bm_cuda_optimizers" --benchmark_filter='^LAMB/bert_large_335M/fused$' \
    --benchmark_min_time=0.05 &&
    { echo; echo "ncu, LAMB/bert_large_335M/fused (kernel | metric | value):";
      grep -E '^"[0-9]' "$res/ncu_lamb.txt" | awk -F'","' '{print substr($5, 1, 90) " | " $(NF-2) " | " $NF}' | tr -d '"'
    } >> "$md"
}

stage_sweeps() {
  local config=$root/experiments/configs/quickstart.json cpus=$((jobs / 2))
  step sweep_cpu 150 "$build/experiments/bigbatch" sweep "$config" --out "$res/sweep_cpu" --jobs "$cpus"
  step sweep_cuda 210 "$build/experiments/bigbatch" sweep "$config" --out "$res/sweep_cuda" --device cuda
  step sweep_cuda_batched 210 "$build/experiments/bigbatch" sweep "$config" --out "$res/sweep_cuda_batched" \
    --device cuda --batch-trials
  grep -hE "^sweep quickstart" "$res"/sweep_cpu.txt "$res"/sweep_cuda.txt "$res"/sweep_cuda_batched.txt >> "$md"
  local dirs=() labels=()
  for run in cpu cuda cuda_batched; do
    [ -e "$res/sweep_$run/quickstart/steps_to_target.csv" ] || continue
    dirs+=("$res/sweep_$run/quickstart")
    labels+=("$run")
  done
  if [ ${#dirs[@]} -gt 0 ]; then
    step sweeps_report 60 "$build/experiments/bigbatch" report "${dirs[@]}" --labels "$(IFS=,; echo "${labels[*]}")"
    cat "$res/sweeps_report.txt" >> "$md"
  fi
}

# One log and one results file for the call (STAGE.log, STAGE.md; all.log
# and all.md for all four), and each stage's outputs as STAGE.tar.gz.
log=$out/$stage.log
md=$out/$stage.md
: > "$log"
: > "$md"
run_stage() {
  local s=$1
  res=$build/results/$s
  rm -rf "$res" && mkdir -p "$res"
  echo "# stage $s" >> "$log"
  echo "# gpu.sh $s, $(date -u +%Y-%m-%dT%H:%MZ)" >> "$md"
  if step build 0 build; then
    grep -E "^torch |, [0-9.]+, " "$res/build.txt" | head -n 2 >> "$md"
    "stage_$s"
  fi
  echo >> "$md"
  # (checkpoints and TensorBoard files left out: the files back are capped)
  tar -czf "$out/$s.tar.gz" --exclude='*.pt' --exclude='events.out.tfevents*' -C "$build/results" "$s"
}

export BIGBATCH_FASHION_MNIST_DIR=$deps/usr/share/datasets/fashion-mnist
if [ "$stage" = all ]; then
  for s in tests sanitize bench sweeps; do run_stage "$s"; done
else
  run_stage "$stage"
fi
echo "--- $log"
cat "$log"
echo "--- $md"
cat "$md"
exit "$failed"
