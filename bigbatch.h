// bigbatch: the whole public API of bigbatch::bigbatch in one header.
// Large-batch optimizers (LARS, LARC, LAMB, NovoGrad, Lion, Muon, Schedule-Free AdamW and SGD) for LibTorch, with
// the schedules, ghost batch norm, gradient noise and noise-scale tools around them,
// data parallelism, sharded optimizer state and gradient compression, and the strict JSON reader. Every public
// header of config/, optimizers/, schedules/, normalization/, noise/ and distributed/
// is reached from here (scripts/check_includes.py checks it); kernels/ and compat/
// are what these are built on, included by them where needed.
#pragma once

#include "config/fields.h"
#include "config/json_reader.h"
#include "optimizers/kind.h"
#include "optimizers/lamb.h"
#include "optimizers/larc.h"
#include "optimizers/lars.h"
#include "optimizers/lion.h"
#include "optimizers/loss_scaler.h"
#include "optimizers/tensor_swap.h"
#include "optimizers/weight_average.h"
#include "optimizers/muon.h"
#include "optimizers/novograd.h"
#include "optimizers/param_groups.h"
#include "optimizers/schedule_free.h"
#include "optimizers/soap.h"
#include "optimizers/shampoo.h"
#include "schedules/lr_adapter.h"
#include "schedules/option_rules.h"
#include "schedules/schedule.h"
#include "normalization/ghost_batch_norm.h"
#include "noise/critical_batch.h"
#include "noise/gradient_noise.h"
#include "noise/noise_scale.h"
#include "distributed/compression.h"
#include "distributed/delayed.h"
#include "distributed/local_sgd.h"
#include "distributed/process_group.h"
#include "distributed/sharded.h"
#include "distributed/slurm_env.h"
