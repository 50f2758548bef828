#!/usr/bin/env python3
"""Unpack the LibTorch of a PyTorch wheel from PyPI into a project-local folder,
or point one at the LibTorch of an installed PyTorch.

Usage: fetch_torch.py VERSION DEST [--cuda]
       fetch_torch.py --installed DEST [PYTHON]

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

With --installed, DEST gets the same layout for the torch that PYTHON
(default: python3 on PATH) imports, as links into its site-packages instead
of copies: torch/include, torch/share, torch/version.py, torch/lib's
libtorch_cpu.so and libc10.so (alone, so that the program finds the system's
newer libgomp, not the older one beside them), torch/optim/_muon.py, nvidia/ (the CUDA libraries of
a CUDA build, which libtorch_cpu.so's $ORIGIN/../../nvidia RPATH then finds
through the links) and cmake/TorchConfig.cmake. It accepts a torch >= 2 built
with the C++11 ABI (PyPI's wheels since 2.7, and conda's), which the other
C++ libraries on the machine use; it exits 3 with the reason otherwise, and
scripts/setup.sh then takes the pinned wheel. DEST is made anew every run:
it follows the installed torch.
"""
import json
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


def installed(dest, python):
    """The link farm of the docstring for the torch `python` imports."""
    probe = ("import json, os, torch; print(json.dumps({'version': torch.__version__, "
             "'root': os.path.dirname(torch.__file__), 'abi': bool(torch._C._GLIBCXX_USE_CXX11_ABI)}))")
    try:
        out = subprocess.run([python, "-c", probe], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        print(f"fetch_torch: {python} imports no torch", file=sys.stderr)
        sys.exit(3)
    info = json.loads(out.strip().splitlines()[-1])
    version = info["version"].split("+")[0]
    if int(version.split(".")[0]) < 2:
        print(f"fetch_torch: the installed torch is {info['version']}, older than 2", file=sys.stderr)
        sys.exit(3)
    if not info["abi"]:
        print(f"fetch_torch: the installed torch {info['version']} uses the pre-C++11 ABI, which the "
              "machine's other C++ libraries do not", file=sys.stderr)
        sys.exit(3)
    root = pathlib.Path(info["root"])
    lib = root / "lib"
    if not (lib / "libtorch_cpu.so").exists():
        print(f"fetch_torch: no libtorch_cpu.so in {lib}", file=sys.stderr)
        sys.exit(3)
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "torch" / "lib").mkdir(parents=True)
    for name in ("include", "share", "version.py"):
        (dest / "torch" / name).symlink_to(root / name)
    for name in ("libtorch_cpu.so", "libc10.so"):
        (dest / "torch" / "lib" / name).symlink_to(lib / name)
    if (root / MUON.removeprefix("torch/")).exists():  # for the Muon cross-check, as a wheel's
        (dest / "torch" / "optim").mkdir()
        (dest / MUON).symlink_to(root / MUON.removeprefix("torch/"))
    if (root.parent / "nvidia").is_dir():
        (dest / "nvidia").symlink_to(root.parent / "nvidia")
    config = dest / "cmake" / "TorchConfig.cmake"
    config.parent.mkdir()
    shutil.copy(pathlib.Path(__file__).resolve().parent.parent / "cmake" / "TorchCpuConfig.cmake", config)
    (dest / ".complete").write_text(f"installed {info['version']} at {root}\n")
    print(f"fetch_torch: LibTorch {info['version']} of the installed torch at {root}")


def main():
    if sys.argv[1:2] == ["--installed"]:
        if len(sys.argv) not in (3, 4):
            sys.exit(__doc__.split("\n\n")[1])
        installed(pathlib.Path(sys.argv[2]).resolve(), sys.argv[3] if len(sys.argv) == 4 else "python3")
        return
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
        if not cuda:  # the config as this checkout has it (it may have changed since)
            shutil.copy(pathlib.Path(__file__).resolve().parent.parent / "cmake" / "TorchCpuConfig.cmake",
                        dest / "cmake" / "TorchConfig.cmake")
        return
    # A wheel downloaded before (an unpacking that was killed) is not fetched
    # again: that works offline, and saves 540 MB.
    if not list(wheels.glob(f"torch-{version}-*.whl")):
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
