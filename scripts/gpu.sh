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
#             an ncu summary of LAMB's passes on the BERT-large list, and
#             bm_compression --device=cuda (each gradient compressor's codec
#             on the GPU against a device copy), bm_muon --device=cuda and
#             PyTorch's torch.optim.Muon on the same lists
#   sweeps    the quickstart sweep on the CPU (all cores), on the GPU with
#             --no-batch-trials, and on the GPU with --batch-trials: wall times and the three
#             steps-to-target tables side by side; the quickstart in fp32,
#             bf16 and fp16 (loss-scaled) on the GPU, side by side;
#             ResNet-20 on generated CIFAR-format files on the GPU with its data-wait fraction
#   python    the Python package built with its CUDA kernels against this
#             torch (a venv over the system's, the build backend and pytest
#             from .debs/wheels), tests/python on it (CUDA tensors against the
#             CPU, and bit for bit against the C++ peer), and
#             benchmarks/python/bench_optim.py on the GPU (docs/python.md)
#   all       the five in order (default)
#
# A lease of 15 minutes of device time in all (the machine's start included)
# takes two calls, the second at once while the machine is warm:
#   lease     build (tests, CLI, CUDA benchmarks); at once: the tests stage
#             and the sanitize stage; then alone: bm_cuda_optimizers' fused
#             steps on the ResNet-50 list and a few others, and the quickstart
#             sweep on CUDA by its default (batched) and with
#             --no-batch-trials, side by side
#   lease2    the python stage; the quickstart in fp32, bf16 and fp16 on CUDA;
#             bm_compression, bm_muon and torch.optim.Muon on the GPU
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
# Usage: scripts/gpu.sh [tests|sanitize|bench|sweeps|python|all|lease|lease2] [OUT]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD
stage=${1:-all}
out=${2:-${OUT:-$root/build-gpu/out}}
case $stage in tests | sanitize | bench | sweeps | python | all | lease | lease2) ;; *)
  echo "gpu.sh: unknown stage '$stage' (tests, sanitize, bench, sweeps, python, all, lease or lease2)" >&2
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
# One stage must end inside one call of a lent machine (10 minutes): every
# step's limit is cut to what is left of GPU_SH_BUDGET seconds (default 560
# for one stage, none for all), keeping 20 s for the tarball.
budget=${GPU_SH_BUDGET:-$([ "$stage" = all ] && echo 0 || echo 560)}
deadline=$((SECONDS + budget))
export root build deps python jobs

# step NAME SECONDS COMMAND...: runs COMMAND (a program, or a function of
# this script) for at most SECONDS (0: no limit of its own) and what is left
# of the budget, with its output in $res/NAME.txt; records its status and
# time in $log, and goes on.
step() {
  local name=$1 limit=$2 start=$SECONDS rc=0
  shift 2
  if [ "$budget" -gt 0 ]; then
    local left=$((deadline - SECONDS - 20))
    if [ "$left" -lt 30 ]; then
      printf '%-22s %5ss  %s\n' "SKIPPED (no time left)" 0 "$name" >> "$log"
      failed=1
      return 124
    fi
    if [ "$limit" -eq 0 ] || [ "$limit" -gt "$left" ]; then limit=$left; fi
  fi
  echo "== $name" >&2
  local command=("$@")
  if declare -F "$1" > /dev/null; then command=(bash -c "$(declare -f "$1"); $(printf '%q ' "$@")"); fi
  if [ "$limit" -gt 0 ]; then command=(timeout --kill-after=10 "$limit" "${command[@]}"); fi
  "${command[@]}" > "$res/$name.txt" 2>&1 || rc=$?
  local took=$((SECONDS - start)) verdict=ok
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then verdict="TIMEOUT after ${limit}s"; elif [ "$rc" -ne 0 ]; then verdict="FAILED rc=$rc"; fi
  printf '%-22s %5ss  %s\n' "$verdict" "$took" "$name" >> "$log"
  if [ "$verdict" != ok ]; then
    failed=1
    tail -n 15 "$res/$name.txt" | sed 's/^/    /' >> "$log"
  fi
  return "$rc"
}

# build [TARGET...]: the .debs unpacked, configured against this torch (once:
# ninja reconfigures by itself when a CMakeLists changes), the targets built
# (all by default), going on past a failing object so that one broken target
# stops only the steps that need it.
build() {
  local debs=("$root"/.debs/*.deb)
  if [ -e "${debs[0]}" ]; then
    for deb in "${debs[@]}"; do dpkg -x "$deb" "$deps"; done
  elif [ ! -e "$deps/usr/include/gtest/gtest.h" ]; then
    echo "no .debs/*.deb: run scripts/fetch_gpu_debs.sh on a networked machine and carry .debs"
    return 2
  fi
  "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0))'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  if [ ! -e "$build/build.ninja" ]; then
    local torch_prefix
    torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
    # The SIMT executor's tests are CI's stand-in for this machine: not built here.
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBIGBATCH_CUDA=ON \
      -DBIGBATCH_SIMT_TESTS=OFF -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" \
      -DBIGBATCH_TORCH_PYTHON="$(command -v "$python")" \
      -DCMAKE_PREFIX_PATH="$torch_prefix;$deps/usr;$deps/usr/lib/x86_64-linux-gnu/cmake;$deps/usr/share/cmake" \
      -DCMAKE_INCLUDE_PATH="$deps/usr/include" -DCMAKE_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu" || return 1
  fi
  # (@tests: every *_tests program, as the configured build names them)
  local targets=() t
  for t in "$@"; do
    if [ "$t" = @tests ]; then
      for t in $(cmake --build "$build" --target help | grep -oE '^[a-z_]+_tests' | sort -u); do targets+=(--target "$t"); done
    else
      targets+=(--target "$t")
    fi
  done
  cmake --build "$build" --parallel "$jobs" "${targets[@]}" -- -k 0
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
  # The GPU's tests beside the CPU suite (no verdict here depends on timing).
  # The rest runs against this LibTorch (CI runs it against 1.13 and 2.x on
  # CPUs); the CLI scenarios, consumers and benchmark smoke runs are CI's.
  # Two intra-op threads a test: 12 tests at once beside the GPU's.
  (
    for t in "${cuda_binaries[@]}"; do
      step "cuda_$t" 300 "$build/tests/$t" --gtest_filter='*_CUDA*' --gtest_output="json:$res/$t.json"
    done
  ) &
  local gpu=$!
  step ctest_rest 420 env OMP_NUM_THREADS=2 ctest --test-dir "$build" -j $((jobs - 4)) --timeout 300 \
    --output-on-failure -E '\.CUDA$|^CLI\.|^Consumer\.|^Benchmarks\.|^Fuzz\.|^TorchOptim'
  wait "$gpu"
  step cuda_tests_ran 60 "$python" "$root/benchmarks/cuda_table.py" tests "$res"/*_tests.json
  cat "$res/cuda_tests_ran.txt" >> "$md"  # which ran, which failed or were skipped
  grep -E "tests passed|tests failed" "$res/ctest_rest.txt" >> "$md"
  step quickstart_cuda_nccl1 300 "$build/experiments/bigbatch" train "$root/experiments/configs/quickstart.json" \
    --device cuda --backend nccl --batch-size 256 --steps 200 --out "$res/runs"
  tail -n 1 "$res/quickstart_cuda_nccl1.txt" >> "$md"
}

stage_sanitize() {
  # The optimizers' _CUDA tests drive every kernel (each plan, fp32 and
  # 16-bit, the finalizers, the non-finite skip).
  # racecheck and synccheck look at shared memory and barriers, which the
  # 3,000-tensor cases exercise no differently, and slowly: left out there.
  # The three tools run at once: their verdicts do not depend on timing,
  # and the stage then shares a call with another.
  local filter pids=()
  for tool in memcheck racecheck synccheck; do
    filter='*_CUDA*'
    [ "$tool" = memcheck ] || filter='*_CUDA*-*ThousandsOfTensors*'
    step "sanitizer_$tool" 200 "$(cuda_tool compute-sanitizer)" --tool "$tool" --error-exitcode 3 \
      "$build/tests/optimizers_tests" --gtest_filter="$filter" --gtest_brief=1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  for tool in memcheck racecheck synccheck; do
    echo "compute-sanitizer $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|Device not supported' \
      "$res/sanitizer_$tool.txt" | tail -n 1)" >> "$md"
  done
}

stage_bench() {
  # One run per parameter list, so a time limit loses one list, not all.
  # The reference path on 10,000 tensors takes seconds a step (an H100,
  # 2026-11-24: 1.4 to 3.6 s): one repetition of it, apart, and five of the
  # rest (five of everything ran past 150 s).
  local filter reps
  for list in bert_large_335M resnet50_25M small_10000t small_10000t_reference; do
    filter="/$list/" reps=(--benchmark_repetitions=5 --benchmark_min_time=0.2 --benchmark_report_aggregates_only=true)
    [ "$list" = small_10000t ] && filter='/small_10000t/fused|^copy/small_10000t/'
    [ "$list" = small_10000t_reference ] && filter='/small_10000t/reference' reps=(--benchmark_min_time=0.01)
    step "bm_$list" 150 "$build/benchmarks/bm_cuda_optimizers" --benchmark_filter="$filter" "${reps[@]}" \
      --benchmark_out="$res/bmlist_$list.json" --benchmark_out_format=json
  done
  step bm_merge 30 "$python" -c 'import json, sys
runs = []
for path in sys.argv[2:]:
    try:
        runs += json.load(open(path))["benchmarks"]
    except (OSError, ValueError) as e:
        print("left out:", path, e)
json.dump({"benchmarks": runs}, open(sys.argv[1], "w"), indent=1)' "$res/bm_cuda_optimizers.json" "$res"/bmlist_*.json
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
    "$build/benchmarks/bm_cuda_optimizers" --benchmark_filter='^LAMB/bert_large_335M/fused/manual_time$' \
    --benchmark_min_time=0.05 &&
    { echo; echo "ncu, LAMB/bert_large_335M/fused (launch | kernel | grid | metric | value):";
      grep -E '^"[0-9]' "$res/ncu_lamb.txt" | awk -F'","' '{n = $5; gsub(/bigbatch::kernels::(cuda::)?/, "", n);
        print substr($1, 2) " | " substr(n, 1, 110) " | " $9 " | " $(NF-2) " | " $NF}' | tr -d '"'
    } >> "$md"
  if [ -e "$res/ncu_lamb.txt" ] && ! grep -q '^"[0-9]' "$res/ncu_lamb.txt"; then
    echo "ncu_lamb: no kernel was profiled" >> "$log"
    failed=1
  fi
  codecs_and_muon 0.2
}

# codecs_and_muon MIN_TIME: gradient compression's codecs on the GPU
# (docs/distributed.md); Muon there, fused and reference, fp32 and bf16,
# against its products alone, and PyTorch's own torch.optim.Muon on the same
# lists (docs/cuda.md); each benchmark for at least MIN_TIME seconds.
codecs_and_muon() {
  step bm_compression 120 "$build/benchmarks/bm_compression" --device=cuda --benchmark_min_time="$1" \
    --benchmark_out="$res/bm_compression.json" --benchmark_out_format=json &&
    { echo; echo "bm_compression --device=cuda:"; grep -E '^(copy|codec)/' "$res/bm_compression.txt"; } >> "$md"
  step bm_muon 150 "$build/benchmarks/bm_muon" --device=cuda --benchmark_min_time="$1" \
    --benchmark_filter='gpt_small|resnet50' --benchmark_out="$res/bm_muon.json" --benchmark_out_format=json &&
    { echo; echo "bm_muon --device=cuda:"; grep -E '^Muon/' "$res/bm_muon.txt"; } >> "$md"
  step torch_muon 90 "$python" "$root/benchmarks/torch_muon_bench.py" --device cuda --lists gpt_small_124M,resnet50_25M \
    --steps 10 && { echo; echo "torch.optim.Muon:"; cat "$res/torch_muon.txt"; } >> "$md"
}

stage_sweeps() {
  local config=$root/experiments/configs/quickstart.json cpus=$((jobs / 2))
  step sweep_cpu 120 "$build/experiments/bigbatch" sweep "$config" --out "$res/sweep_cpu" --jobs "$cpus"
  # Batched is CUDA's default (docs/experiments.md "Batched trials"): the
  # unbatched run is asked for, to keep the measurement behind that default.
  step sweep_cuda 210 "$build/experiments/bigbatch" sweep "$config" --out "$res/sweep_cuda" --device cuda \
    --no-batch-trials
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
  precision_on_cuda
  # ResNet-8 on generated CIFAR-format files on the GPU: the loader's pinned
  # batches and non-blocking copies, and how long the step waits for data.
  step cifar_data 60 "$python" "$root/tests/experiments/make_cifar.py" "$res/cifar10" --train 12000 --test 1000
  cat > "$res/cifar_cuda.json" << JSON
{"name": "cifar_cuda", "dataset": {"name": "cifar10", "path": "$res/cifar10", "validation": 2000},
 "model": {"type": "resnet", "depth": 20}, "optimizer": {"name": "sgd", "momentum": 0.9, "nesterov": true},
 "schedule": {"scaling": "none"}, "target": {"metric": "val_error", "threshold": 0.2, "eval_every": 50},
 "budget": {"steps": 400}, "batch_sizes": [128, 1024], "search": {"lr": [0.1]}, "device": "cuda"}
JSON
  step cifar_cuda 150 "$build/experiments/bigbatch" sweep "$res/cifar_cuda.json" --out "$res/sweep_cifar_cuda"
  grep -hE "^sweep cifar_cuda" "$res/cifar_cuda.txt" >> "$md"
  local summary
  for summary in "$res"/sweep_cifar_cuda/cifar_cuda/b*/summary.json; do
    [ -e "$summary" ] && "$python" -c 'import json, sys; s = json.load(open(sys.argv[1])); print("cifar ResNet-20 batch", s["batch_size"], s["status"], "steps", s["steps"], "wall", round(s["wall_time"], 1), "s, data", s["data"])' "$summary" >> "$md"
  done
  # The language-model quickstart on the GPU: the GPT's fused causal
  # attention (at::scaled_dot_product_attention) on CUDA, its steps-to-target
  # table beside the CPU one of docs/workloads.md. The corpus comes from the
  # unpacked bible-kjv debs (scripts/kjv.sh, with their program and data).
  if [ ! -s "$root/data/kjv.txt" ] && [ -x "$deps/usr/bin/bible" ]; then
    mkdir -p "$root/data"
    COLUMNS=80 "$deps/usr/bin/bible" -p "$deps/usr/lib" -l80 'gen1:1-rev22:21' > "$root/data/kjv.txt.tmp" &&
      mv "$root/data/kjv.txt.tmp" "$root/data/kjv.txt"
  fi
  "$python" -c 'import json, sys; c = json.load(open(sys.argv[1])); c["dataset"]["path"] = sys.argv[2]; json.dump(c, open(sys.argv[3], "w"))' \
    "$root/experiments/configs/lm_quickstart.json" "$root/data/kjv.txt" "$res/lm_quickstart.json"
  step lm_cuda 240 "$build/experiments/bigbatch" sweep "$res/lm_quickstart.json" --out "$res/sweep_lm_cuda" --device cuda
  grep -hE "^sweep lm_quickstart" "$res/lm_cuda.txt" >> "$md"
  [ -e "$res/sweep_lm_cuda/lm_quickstart/steps_to_target.csv" ] && cat "$res/sweep_lm_cuda/lm_quickstart/steps_to_target.csv" >> "$md"
}

# Mixed precision on the GPU: the quickstart at batch 256 and 1024 (its
# best rate, 3 seeds) in fp32, bf16 and fp16 with its loss scale, each
# trial alone (fp16 trials do not batch): the tables side by side with
# their intervals, and each variant's wall time (docs/experiments.md "Mixed precision").
precision_on_cuda() {
  "$python" -c 'import json, sys; c = json.load(open(sys.argv[1])); c.update(name="precision_cuda", batch_sizes=[256, 1024], search={"lr": [0.02]}, device="cuda", variants={"fp32": {}, "bf16": {"precision": "bf16"}, "fp16": {"precision": "fp16"}}); json.dump(c, open(sys.argv[2], "w"))' \
    "$root/experiments/configs/quickstart.json" "$res/precision_cuda.json"
  step precision_cuda 150 "$build/experiments/bigbatch" sweep "$res/precision_cuda.json" --out "$res/sweep_precision" \
    --no-batch-trials
  grep -hE "^sweep precision_cuda" "$res/precision_cuda.txt" >> "$md"
  step precision_report 30 "$build/experiments/bigbatch" report "$res/sweep_precision/precision_cuda" &&
    cat "$res/precision_report.txt" >> "$md"
}

# The quickstart sweep on CUDA by its default (batched trials) and with
# --no-batch-trials, and the report of the two tables side by side.
sweeps_default_and_unbatched() {
  local config=$root/experiments/configs/quickstart.json
  step sweep_cuda_default 150 "$build/experiments/bigbatch" sweep "$config" --out "$res/sweep_cuda_default" --device cuda
  step sweep_cuda 150 "$build/experiments/bigbatch" sweep "$config" --out "$res/sweep_cuda" --device cuda \
    --no-batch-trials
  grep -hE "^sweep quickstart" "$res"/sweep_cuda_default.txt "$res"/sweep_cuda.txt >> "$md"
  if [ -e "$res/sweep_cuda_default/quickstart/steps_to_target.csv" ] && [ -e "$res/sweep_cuda/quickstart/steps_to_target.csv" ]; then
    step sweeps_report 60 "$build/experiments/bigbatch" report "$res/sweep_cuda/quickstart" \
      "$res/sweep_cuda_default/quickstart" --labels unbatched,default
    cat "$res/sweeps_report.txt" >> "$md"
  fi
}

stage_lease() {
  # Correctness first, all at once: the sanitizers beside the tests stage.
  (stage_sanitize) &
  local sanitize=$!
  stage_tests
  wait "$sanitize"
  # Then alone: the fused steps on the ResNet-50 list (where a step's fixed
  # costs weigh), BERT-large's LAMB, LARS and NovoGrad, and LAMB on 10,000 tensors.
  local filter='^[A-Za-z]+(_clip|_bf16)?/resnet50_25M/fused|^copy/resnet50_25M/'
  filter+='|^(LAMB|LARS|NovoGrad)/bert_large_335M/fused|^copy/bert_large_335M/(24|28|44)B|^LAMB/small_10000t/fused'
  step bm_lists 120 "$build/benchmarks/bm_cuda_optimizers" --benchmark_filter="$filter" --benchmark_repetitions=5 \
    --benchmark_min_time=0.1 --benchmark_report_aggregates_only=true --benchmark_out="$res/bm_lists.json" \
    --benchmark_out_format=json && { echo; echo "bm_cuda_optimizers (medians of 5):"; grep -E '_median' "$res/bm_lists.txt"; } >> "$md"
  sweeps_default_and_unbatched
}

# The Python package on the GPU (docs/python.md): pip builds it with
# BIGBATCH_CUDA=ON against this torch, in a venv that sees the system's
# packages (torch) and gets the build backend and pytest from .debs/wheels
# (no network here); tests/python runs on it (the CUDA tests, and the CPU ones
# with the C++ peer of this build; timm's are skipped where timm is missing);
# then one step of bigbatch.optim.LAMB on the GPU against AdamW(fused=True).
python_package() {
  local venv=$build/pyenv
  if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv --system-site-packages "$venv" &&
      "$venv/bin/python" -m pip install --quiet --no-index --find-links "$root/.debs/wheels" scikit-build-core pytest ||
      return 1
  fi
  TORCH_CUDA_ARCH_LIST=9.0 BIGBATCH_PYTHON_CLI=OFF CMAKE_BUILD_PARALLEL_LEVEL=$jobs "$venv/bin/python" -m pip install \
    --quiet --no-index --no-deps --no-build-isolation --config-settings=cmake.define.BIGBATCH_CUDA=ON \
    --config-settings=cmake.define.CMAKE_PREFIX_PATH="$deps/usr;$deps/usr/share/cmake" \
    --config-settings=build-dir="$build/python" "$root"
}
stage_python() {
  local venv=$build/pyenv
  step python_install 300 python_package || return
  step python_tests 240 env BIGBATCH_PYTHON_PEER="$build/tests/python_peer" BIGBATCH_CLI="$build/experiments/bigbatch" \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider -rs "$root/tests/python"
  tail -n 1 "$res/python_tests.txt" >> "$md"
  step python_bench 180 "$venv/bin/python" "$root/benchmarks/python/bench_optim.py" --device cuda --min-time 0.5 \
    --peer "$build/tests/python_peer" && { echo; echo "bench_optim.py --device cuda:"; cat "$res/python_bench.txt"; } >> "$md"
}

stage_lease2() {
  stage_python
  precision_on_cuda
  codecs_and_muon 0.1
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
  # What each stage needs, built alone on a fresh machine.
  local targets=()
  case $s in
    tests) targets=(bigbatch_cli @tests) ;;
    python) targets=(bigbatch_cli python_peer) ;;
    sanitize) targets=(optimizers_tests) ;;
    bench) targets=(bm_cuda_optimizers bm_compression) ;;
    sweeps) targets=(bigbatch_cli) ;;
    lease | lease2)
      # The tests, the CLI and the CUDA benchmarks: not the CPU benchmarks,
      # fuzzers and consumers, which the lease does not run.
      targets=(bigbatch_cli bm_cuda_optimizers bm_muon bm_compression python_peer @tests)
      ;;
  esac
  step build 0 build "${targets[@]}"
  grep -E "^torch |, [0-9.]+, " "$res/build.txt" | head -n 2 >> "$md"
  # A failed build still runs the steps whose programs were built.
  if [ -e "$build/build.ninja" ]; then "stage_$s"; fi
  echo >> "$md"
  # (checkpoints and TensorBoard files left out: the files back are capped)
  # ("$1", not $s: a stage's own loop variables could overwrite $s.)
  tar -czf "$out/$1.tar.gz" --exclude='*.pt' --exclude='events.out.tfevents*' -C "$build/results" "$1"
}

export BIGBATCH_FASHION_MNIST_DIR=$deps/usr/share/datasets/fashion-mnist
# (the lease's stages each budget their own call unless told otherwise)
if [ "$stage" = all ]; then
  for s in tests sanitize bench sweeps python; do run_stage "$s"; done
else
  run_stage "$stage"
fi
# (steps run in the background cannot set $failed: their log lines can)
grep -qE '^(FAILED|TIMEOUT|SKIPPED)' "$log" && failed=1
echo "--- $log"
cat "$log"
echo "--- $md"
cat "$md"
exit "$failed"
