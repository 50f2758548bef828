// kernels/cuda/lamb.cu compiled by g++ for the SIMT executor (see ../CMakeLists.txt).
#include "../cuda/lamb.cu"
