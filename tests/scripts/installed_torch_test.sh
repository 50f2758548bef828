#!/usr/bin/env bash
# scripts/fetch_torch.py --installed, the way scripts/setup.sh builds against
# a user's own PyTorch: a stand-in python whose torch is the unpacked wheel
# this build uses (Torch_DIR=.torch/VERSION/cmake), the link farm it makes,
# the libraries resolving through it (CUDA's beside it, the system's libgomp,
# not the older one a torch ships), a program built against it by CMake and
# run; and the torches it refuses (older than 2, the pre-C++11 ABI, none).
# Usage: installed_torch_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
work=$build/installed_torch_test
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
torch_dir=$(sed -n 's/^Torch_DIR:[A-Z]*=//p' "$build/CMakeCache.txt")
root=$(cd "$torch_dir/.." 2>/dev/null && pwd)/torch
if [ ! -e "$root/lib/libtorch_cpu.so" ] || [ ! -e "$root/version.py" ]; then
  echo "this build's LibTorch ($torch_dir) is not an unpacked wheel: nothing to stand in for an installed torch"
  echo "PASS installed_torch (skipped)"
  exit 0
fi
fake() {  # fake NAME VERSION ABI: a python whose torch is at $root
  printf '#!/bin/sh\necho '"'"'{"version": "%s", "root": "%s", "abi": %s}'"'"'\n' "$2" "$root" "$3" > "$work/$1"
  chmod +x "$work/$1"
}
fake python3 2.15.0+cpu true
/usr/bin/python3 "$src/scripts/fetch_torch.py" --installed "$work/farm" "$work/python3"
farm=$work/farm
for f in torch/include torch/share torch/version.py torch/lib/libtorch_cpu.so torch/lib/libc10.so cmake/TorchConfig.cmake; do
  [ -e "$farm/$f" ] || fail "the farm has no $f"
done
[ ! -e "$farm/torch/lib/libgomp.so.1" ] || fail "the farm's lib/ holds a libgomp"
deps=$(ldd "$farm/torch/lib/libtorch_cpu.so")
! grep -q "not found" <<<"$deps" || fail "libtorch_cpu.so through the farm: $(grep 'not found' <<<"$deps")"
if grep -q libcudart <<<"$deps"; then
  grep -q "libcudart.* => $farm/torch/lib/../../nvidia/" <<<"$deps" || fail "libcudart not found beside the farm: $deps"
fi
grep -q "libgomp.so.1 => /lib\|libgomp.so.1 => /usr/lib" <<<"$deps" || fail "not the system's libgomp: $deps"

# A program against it, as bigbatch's own build would be.
mkdir -p "$work/app"
cat > "$work/app/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.22)
project(app LANGUAGES CXX)
find_package(Torch REQUIRED)
add_executable(app app.cpp)
target_link_libraries(app PRIVATE ${TORCH_LIBRARIES})
CMAKE
cat > "$work/app/app.cpp" <<'CPP'
#include <ATen/ATen.h>
#include <iostream>
int main() { std::cout << "sum " << at::ones({3, 4}).sum().item<float>() << "\n"; }
CPP
cmake -S "$work/app" -B "$work/app/build" -G Ninja -DTorch_DIR="$farm/cmake" > "$work/cmake.log" ||
  fail "configure: $(tail -5 "$work/cmake.log")"
cmake --build "$work/app/build" > "$work/build.log" 2>&1 || fail "build: $(tail -5 "$work/build.log")"
[ "$("$work/app/build/app")" = "sum 12" ] || fail "the program printed $("$work/app/build/app")"
grep -q "Found Torch: $farm/torch/lib/libtorch_cpu.so" "$work/cmake.log" || fail "another Torch found: $(cat "$work/cmake.log")"

# The torches it will not take: setup.sh then falls back to the pinned wheel.
expect_refusal() {  # NAME VERSION ABI MESSAGE
  fake "$1" "$2" "$3"
  local rc=0
  /usr/bin/python3 "$src/scripts/fetch_torch.py" --installed "$work/refused" "$work/$1" 2> "$work/err.txt" || rc=$?
  [ "$rc" -eq 3 ] || fail "$1: exit $rc, want 3"
  grep -q "$4" "$work/err.txt" || fail "$1: said $(cat "$work/err.txt")"
}
expect_refusal old 1.13.1 true "older than 2"
expect_refusal abi 2.5.1 false "pre-C++11 ABI"
printf '#!/bin/sh\nexit 1\n' > "$work/none" && chmod +x "$work/none"
rc=0
/usr/bin/python3 "$src/scripts/fetch_torch.py" --installed "$work/refused" "$work/none" 2> "$work/err.txt" || rc=$?
[ "$rc" -eq 3 ] && grep -q "imports no torch" "$work/err.txt" || fail "no torch: exit $rc, $(cat "$work/err.txt")"
echo "PASS installed_torch"
