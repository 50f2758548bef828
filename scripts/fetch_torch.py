#!/usr/bin/env python3
"""Unpack the LibTorch of a PyTorch wheel from PyPI into a project-local folder.

Usage: fetch_torch.py VERSION DEST [--cuda]

The `torch` wheel for Linux carries LibTorch (headers, CMake files, libraries)
built with CUDA. A C++ build on a machine without CUDA needs only its CPU part,
so this unpacks, from the wheel that pip downloads (cached in DEST/../wheels):
  DEST/torch/include, DEST/torch/share     headers and the wheel's CMake files
  DEST/torch/lib/libtorch_cpu.so, libc10.so
  DEST/nvidia/...                           libcudart and libcupti, the two CUDA
      libraries libtorch_cpu.so is linked against, from the nvidia-* wheels the
      torch wheel names (found through libtorch_cpu.so's $ORIGIN/../../nvidia RPATH)
  DEST/torch/optim/_muon.py                 PyTorch's Muon, for the cross-check of
                                            tests/optimizers/torch_optim_reference.py
  DEST/cmake/TorchConfig.cmake              a Torch package over those CPU
      libraries (cmake/TorchCpuConfig.cmake); the wheel's own needs the CUDA
      toolkit and libtorch_cuda.so
With --cuda it unpacks the wheel's whole torch/ folder instead (libtorch_cuda.so
too) and no CMake package of its own: the wheel's TorchConfig.cmake, with the
CUDA toolkit, then configures a BIGBATCH_CUDA=ON build, whose objects compile
here; linking them needs the CUDA libraries of the nvidia-* wheels (cuDNN, ...).
Nothing is installed system-wide. A finished DEST holds DEST/.complete, and a
second run with it present does nothing.
"""
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

# libtorch_cpu.so's other needs are the system's: among them libgomp.so.1, which
# the wheel also ships, but older than GCC 12's (GOMP_5.0 against 5.1), and the
# program's own OpenMP code needs the newer one: so the wheel's is left out.
CPU_LIBS = re.compile(r"torch/lib/(libtorch_cpu|libc10)\.so")
MUON = "torch/optim/_muon.py"  # torch >= 2.9


def pip_download(requirements, dest, deps):
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
           "--only-binary=:all:", "-d", str(dest)]
    if not deps:
        cmd.append("--no-deps")
    subprocess.run(cmd + requirements, check=True)


def cuda_runtime_requirements(metadata):
    """The requirements that bring libcudart and libcupti, as the wheel names them:
    `cuda-toolkit[...]==V` (CUDA 13 wheels) or nvidia-cuda-{runtime,cupti}-cuNN==V."""
    reqs = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:") or "extra ==" in line:
            continue
        spec = line.split(":", 1)[1].split(";", 1)[0].strip()
        toolkit = re.match(r"cuda-toolkit\[[^]]*\]\s*(==\s*\S+)", spec)
        if toolkit:
            reqs.append("cuda-toolkit[cudart,cupti]" + toolkit.group(1).replace(" ", ""))
        elif re.match(r"nvidia-cuda-(runtime|cupti)-cu\d+", spec):
            reqs.append(spec.replace(" ", ""))
    return reqs


def main():
    args = [a for a in sys.argv[1:] if a != "--cuda"]
    cuda = len(args) < len(sys.argv) - 1
    if len(args) != 2:
        sys.exit(__doc__.split("\n\n")[1])
    version, dest = args[0], pathlib.Path(args[1]).resolve()
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", version):
        print(f"fetch_torch: version must look like 2.15.0, got '{version}'", file=sys.stderr)
        sys.exit(2)
    wheels = dest.parent / "wheels" / version
    if (dest / ".complete").exists():
        # A folder unpacked before _muon.py was taken: take it from the cached wheel.
        cached = list(wheels.glob(f"torch-{version}-*.whl"))
        if cached and not (dest / MUON).exists():
            with zipfile.ZipFile(cached[0]) as z:
                if MUON in z.namelist():
                    z.extract(MUON, dest)
        return
    pip_download([f"torch=={version}"], wheels, deps=False)
    wheel = next(wheels.glob(f"torch-{version}-*.whl"))

    if dest.exists():
        shutil.rmtree(dest)  # a run killed half-way: start over
    with zipfile.ZipFile(wheel) as z:
        metadata = z.read(f"torch-{version}.dist-info/METADATA").decode()
        for name in z.namelist():
            if name.startswith(("torch/include/", "torch/share/")) or CPU_LIBS.fullmatch(name) \
                    or name in ("torch/version.py", MUON) or (cuda and name.startswith("torch/lib/")):
                z.extract(name, dest)
    if not (dest / "torch/lib/libtorch_cpu.so").exists():
        sys.exit(f"fetch_torch: {wheel.name} has no torch/lib/libtorch_cpu.so")

    reqs = cuda_runtime_requirements(metadata)
    if reqs:  # a CUDA wheel: libtorch_cpu.so needs libcudart and libcupti to link and load
        runtime = wheels / "cuda-runtime"
        pip_download(reqs, runtime, deps=True)
        for w in runtime.glob("nvidia_cuda_*.whl"):
            with zipfile.ZipFile(w) as z:
                z.extractall(dest, [n for n in z.namelist() if n.startswith("nvidia/")])

    if not cuda:
        config = dest / "cmake" / "TorchConfig.cmake"
        config.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(pathlib.Path(__file__).resolve().parent.parent / "cmake" / "TorchCpuConfig.cmake", config)
    (dest / ".complete").write_text(wheel.name + "\n")
    what = "its CUDA build" if cuda else "CPU libraries"
    print(f"fetch_torch: LibTorch {version} ({what} of {wheel.name}) in {dest}")


if __name__ == "__main__":
    main()
