#!/usr/bin/env bash
# On the GPU machine (H100/H200, PyTorch 2.x with its LibTorch, nvcc, no
# network): builds bigbatch with BIGBATCH_CUDA=ON against torch's LibTorch,
# runs the test suites (the _CUDA tests included), a quickstart trial on the
# GPU in an NCCL world of one, the CUDA benchmarks and PyTorch's fused AdamW
# on the same parameter lists, and prints a table last.
# The Debian packages it needs come from ./.debs (scripts/fetch_gpu_debs.sh,
# run on a networked Debian machine); they are unpacked under build-gpu/deps.
# Usage: scripts/gpu.sh [output folder for the JSON results, default build-gpu/results]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=$root/build-gpu
out=${1:-$build/results}
deps=$build/deps
mkdir -p "$out" "$deps"

python=${PYTHON:-python3}
torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cxx11 abi", torch.compiled_with_cxx11_abi())'

shopt -s nullglob
debs=("$root"/.debs/*.deb)
((${#debs[@]})) || { echo "gpu.sh: no .debs/*.deb; run scripts/fetch_gpu_debs.sh on a networked machine first" >&2; exit 2; }
for deb in "${debs[@]}"; do dpkg -x "$deb" "$deps"; done
export PATH="$deps/usr/bin:$PATH"
export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

# The embedded Fashion-MNIST is found through the dataset package's path.
# The SIMT executor's tests are CI's stand-in for this machine: not built here.
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DBIGBATCH_CUDA=ON \
  -DBIGBATCH_SIMT_TESTS=OFF -DCMAKE_CUDA_COMPILER="$nvcc" \
  -DCMAKE_PREFIX_PATH="$torch_prefix;$deps/usr;$deps/usr/lib/x86_64-linux-gnu/cmake;$deps/usr/share/cmake" \
  -DCMAKE_INCLUDE_PATH="$deps/usr/include" -DCMAKE_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu"
cmake --build "$build" --parallel "$(nproc)"

export BIGBATCH_FASHION_MNIST_DIR=$deps/usr/share/datasets/fashion-mnist
status=0
for t in kernels_tests optimizers_tests cuda_graph_tests normalization_tests distributed_tests experiments_tests; do
  echo "== $t"
  "$build/tests/$t" --gtest_brief=1 --gtest_output="json:$out/$t.json" || status=1
done
echo "== _CUDA tests that ran (not skipped):"
"$python" "$root/benchmarks/cuda_table.py" tests "$out"/*_tests.json || status=1

echo "== a quickstart trial on the GPU, data-parallel in an NCCL world of one"
"$build/experiments/bigbatch" train "$root/experiments/configs/quickstart.json" --device cuda --backend nccl \
  --batch-size 256 --steps 200 --out "$out/runs" || status=1
gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())')
if [ "$gpus" -gt 1 ]; then
  echo "== the same on $gpus GPUs"
  "$build/experiments/bigbatch" train "$root/experiments/configs/quickstart.json" --device cuda --nproc "$gpus" \
    --batch-size 256 --steps 200 --out "$out/runs-$gpus" || status=1
fi

"$build/benchmarks/bm_cuda_optimizers" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
  --benchmark_out="$out/bm_cuda_optimizers.json" --benchmark_out_format=json || status=1
"$python" "$root/benchmarks/cuda_table.py" adamw "$out/adamw_fused.json" || status=1
"$python" "$root/benchmarks/cuda_table.py" table "$out/bm_cuda_optimizers.json" "$out/adamw_fused.json" || status=1
exit $status
