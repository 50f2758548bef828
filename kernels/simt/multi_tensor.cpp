// kernels/cuda/multi_tensor.cu compiled by g++ for the SIMT executor (see ../CMakeLists.txt).
#include "../cuda/multi_tensor.cu"
