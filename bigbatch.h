// bigbatch: the whole public API in one header.
// Layer-wise adaptive optimizers (LARS, LARC, LAMB, NovoGrad) for LibTorch, with
// the schedules, ghost batch norm, gradient noise and noise-scale tools around them.
#pragma once

#include <bigbatch/optimizers/lamb.h>
#include <bigbatch/optimizers/larc.h>
#include <bigbatch/optimizers/lars.h>
#include <bigbatch/optimizers/novograd.h>
#include <bigbatch/optimizers/param_groups.h>
#include <bigbatch/schedules/lr_adapter.h>
#include <bigbatch/schedules/schedule.h>
#include <bigbatch/normalization/ghost_batch_norm.h>
#include <bigbatch/noise/critical_batch.h>
#include <bigbatch/noise/gradient_noise.h>
#include <bigbatch/noise/noise_scale.h>
#include <bigbatch/distributed/process_group.h>
