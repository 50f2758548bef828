// bigbatch: the whole public API in one header.
// Layer-wise adaptive optimizers (LARS, LARC, LAMB, NovoGrad) for LibTorch.
#pragma once

#include <bigbatch/optimizers/lamb.h>
#include <bigbatch/optimizers/larc.h>
#include <bigbatch/optimizers/lars.h>
#include <bigbatch/optimizers/novograd.h>
#include <bigbatch/optimizers/param_groups.h>
