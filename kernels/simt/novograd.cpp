// kernels/cuda/novograd.cu compiled by g++ for the SIMT executor (see ../CMakeLists.txt).
#include "../cuda/novograd.cu"
