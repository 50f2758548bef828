# A Torch package over the CPU libraries of a PyTorch wheel, for builds on a
# machine without CUDA. scripts/fetch_torch.py copies this file to
# DEST/cmake/TorchConfig.cmake beside DEST/torch (the wheel's include/, share/
# and lib/libtorch_cpu.so, libc10.so); -DTorch_DIR=DEST/cmake selects it.
# The wheel's own TorchConfig.cmake cannot serve there: it is a CUDA build's,
# so it looks for the CUDA toolkit and links libtorch_cuda.so. This one gives
# what bigbatch and the LibTorch docs use from it: the `torch` target,
# TORCH_LIBRARIES, TORCH_INCLUDE_DIRS, TORCH_CXX_FLAGS, Torch_VERSION, and the
# C++ standard the headers need (C++20 where the wheel's config asks for it).
get_filename_component(TORCH_INSTALL_PREFIX "${CMAKE_CURRENT_LIST_DIR}/../torch" ABSOLUTE)
set(TORCH_INCLUDE_DIRS ${TORCH_INSTALL_PREFIX}/include ${TORCH_INSTALL_PREFIX}/include/torch/csrc/api/include)
# A build folder configured before against another LibTorch keeps no path of
# that one's: find_library skips its search when the variable is set, even in
# the cache (Debian's TorchConfig.cmake caches TORCH_LIBRARY), so the cached
# entries go first and NO_CACHE keeps this search's out of the cache.
unset(TORCH_LIBRARY CACHE)
unset(TORCH_C10_LIBRARY CACHE)
find_library(TORCH_LIBRARY torch_cpu PATHS ${TORCH_INSTALL_PREFIX}/lib NO_DEFAULT_PATH NO_CACHE)
find_library(TORCH_C10_LIBRARY c10 PATHS ${TORCH_INSTALL_PREFIX}/lib NO_DEFAULT_PATH NO_CACHE)

file(STRINGS "${TORCH_INSTALL_PREFIX}/version.py" torch_version_line REGEX "^__version__")
string(REGEX MATCH "[0-9]+\\.[0-9]+\\.[0-9]+" Torch_VERSION "${torch_version_line}")
set(TORCH_CXX_FLAGS "")  # the wheels of 2.x use the C++11 ABI, the compiler's default

if(TORCH_LIBRARY AND TORCH_C10_LIBRARY AND NOT TARGET torch)
  add_library(torch SHARED IMPORTED)
  set_target_properties(torch PROPERTIES
    IMPORTED_LOCATION "${TORCH_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${TORCH_INCLUDE_DIRS}"
    INTERFACE_LINK_LIBRARIES "${TORCH_C10_LIBRARY}")
  # The standard follows the wheel's own config, which names cxx_std_20 where
  # its headers need C++20 (2.15 does; 2.11 still builds as C++17).
  file(READ "${TORCH_INSTALL_PREFIX}/share/cmake/Torch/TorchConfig.cmake" torch_wheel_config)
  if(torch_wheel_config MATCHES "cxx_std_20")
    target_compile_features(torch INTERFACE cxx_std_20)
  else()
    target_compile_features(torch INTERFACE cxx_std_17)
  endif()
endif()
set(TORCH_LIBRARIES torch)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Torch REQUIRED_VARS TORCH_LIBRARY TORCH_C10_LIBRARY TORCH_INCLUDE_DIRS
                                  VERSION_VAR Torch_VERSION)
