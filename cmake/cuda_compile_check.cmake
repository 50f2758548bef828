# Without a CUDA-enabled LibTorch (CI), still compile, not link, the C++ that
# only a BIGBATCH_CUDA build uses: an optimizer's fused step with its CUDA
# runner (LAMB's: the fused step is the same template for the four,
# optimizers/layerwise_optimizer_impl.h), the process group with NCCL, the
# CUDA graph test and the CUDA benchmark, against LibTorch's c10/cuda and
# c10d headers and the toolkit's (CUDA, NCCL). A CPU-only LibTorch lacks the
# one header its CUDA build generates (c10/cuda/impl/cuda_cmake_macros.h); an
# empty one stands in.
find_path(BIGBATCH_C10_CUDA_INCLUDE c10/cuda/CUDAStream.h PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
if(NOT BIGBATCH_C10_CUDA_INCLUDE)
  return()
endif()
find_package(CUDAToolkit REQUIRED)
set(shim ${PROJECT_BINARY_DIR}/cuda_compile_check)
if(NOT EXISTS ${BIGBATCH_C10_CUDA_INCLUDE}/c10/cuda/impl/cuda_cmake_macros.h)
  file(WRITE ${shim}/c10/cuda/impl/cuda_cmake_macros.h "#pragma once\n")
endif()

set(sources optimizers/lamb.cpp distributed/process_group.cpp distributed/compression.cpp)
set(libs bigbatch_kernels bigbatch_noise bigbatch_compat)
if(BIGBATCH_BUILD_TESTS)
  find_package(GTest REQUIRED)
  list(APPEND sources tests/optimizers/cuda_graph_test.cpp)
  list(APPEND libs GTest::gtest)
endif()
if(BIGBATCH_BUILD_BENCHMARKS)
  find_package(benchmark REQUIRED)
  list(APPEND sources benchmarks/bm_cuda_optimizers.cpp)
  list(APPEND libs benchmark::benchmark)
endif()
add_library(bigbatch_cuda_compile_check OBJECT ${sources})
target_include_directories(bigbatch_cuda_compile_check PRIVATE ${shim} ${CUDAToolkit_INCLUDE_DIRS})
target_compile_definitions(bigbatch_cuda_compile_check PRIVATE BIGBATCH_WITH_CUDA USE_C10D_NCCL USE_C10D_GLOO)
target_link_libraries(bigbatch_cuda_compile_check PRIVATE ${libs})
target_compile_options(bigbatch_cuda_compile_check PRIVATE $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall -Wextra>)
# The LibTorch headers parsed once, as for the libraries (the library
# targets' precompiled header: the same flags; -Winvalid-pch says if not).
bigbatch_precompile(bigbatch_cuda_compile_check)
