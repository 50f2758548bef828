// kernels/cuda/momentum.cu compiled by g++ for the SIMT executor (see ../CMakeLists.txt).
#include "../cuda/momentum.cu"
