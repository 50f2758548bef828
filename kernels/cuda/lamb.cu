// LAMB on CUDA (kernels/lamb.h; You et al. 2019, arXiv:1904.00962): the
// multi-tensor step of FORMULAS.md in three passes over the data,
//   [||g||^2: non-finite check and global clipping] -> moments, ||w||, ||u|| -> w -= lr*ratio*u
// with the per-tensor trust ratios decided on the device in between.
#include <bigbatch/kernels/cuda/multi_tensor.cuh>
#include <bigbatch/kernels/lamb.h>

namespace bigbatch::kernels::cuda {
namespace {

// ------------------------------------------------------------ device math ----

/// The coefficients of step `t` of a tensor in group `o`.
__device__ LambStep step_of(const GroupOptions& o, std::int64_t t, float grad_scale) {
  return lamb_step(o.beta1, o.beta2, (o.flags & kGradAveraging) != 0, (o.flags & kBiasCorrection) != 0,
                   o.eps, o.weight_decay, (o.flags & kAdamW) != 0, t, grad_scale);
}

// --------------------------------------------------------------- functors ----

/// After the gradient norms: the skip decision, G over all tensors of all
/// groups, and each group's clipping factor 1 / max(1, G / max_grad_norm).
struct ClipFinalize {
  __device__ void operator()(const Table& table) const {
    decide_skip(table, 0);
    double sq = 0;
    for (int t = threadIdx.x; t < table.num_tensors; t += kThreads) sq += tensor_sum(table, t, 0);
    const double global_norm = sqrt(block_sum(sq));
    for (int g = threadIdx.x; g < table.num_groups; g += kThreads) {
      const double max_norm = table.groups[g].max_grad_norm;
      table.group_scale[g] =
          static_cast<float>(max_norm > 0 ? 1.0 / fmax(1.0, global_norm / max_norm) : 1.0);
    }
  }
};

/// Pass 2: new moments stored, sums ||w||^2 and ||u||^2 (reads w g m v, writes m v).
struct MomentsPass {
  static constexpr PassArrays kArrays{kParam | kGrad | kM | kV, kM | kV};
  static constexpr bool kReduce = true;
  bool check_skip;
  bool clip;

  struct Op {
    LambStep s;
    __device__ void operator()(float& w, float& g, float& m, float& v, double (&acc)[2]) const {
      const LambElement e = lamb_element(g, w, m, v, s);
      m = e.m;
      v = e.v;
      acc[0] += static_cast<double>(w) * w;      // ||w||^2
      acc[1] += static_cast<double>(e.u) * e.u;  // ||u||^2
    }
  };
  __device__ Op element_op(const Table& table, int t, const Slot& s) const {
    return {step_of(table.groups[s.group], table.steps[t] + 1, clip ? table.group_scale[s.group] : 1.0f)};
  }
};

/// After pass 2: each tensor's step count and lr * trust ratio.
struct RatioFinalize {
  bool check_skip;

  __device__ void operator()(const Table& table) const {
    const bool skip = check_skip && table.scalars->skip != 0;
    for (int t = threadIdx.x; t < table.num_tensors; t += kThreads) {
      const GroupOptions& o = table.groups[table.slots[t].group];
      if (!skip) table.steps[t] += 1;
      const bool use_ratio = (o.flags & kAdapt) != 0 && (o.weight_decay != 0 || (o.flags & kAlwaysAdapt) != 0);
      const double ratio = lamb_trust_ratio(sqrt(tensor_sum(table, t, 0)), sqrt(tensor_sum(table, t, 1)),
                                            use_ratio, o.min_trust, o.max_trust, (o.flags & kTrustClip) != 0);
      table.coef[t] = static_cast<float>(o.lr * ratio);
    }
  }
};

/// Pass 3: w -= lr*ratio*u from the stored moments (reads w m v, writes w).
struct ApplyPass {
  static constexpr PassArrays kArrays{kParam | kM | kV, kParam};
  static constexpr bool kReduce = false;
  bool check_skip;

  struct Op {
    LambStep s;
    float lr_ratio;
    __device__ void operator()(float& w, float&, float& m, float& v, double (&)[2]) const {
      w = w - lr_ratio * lamb_direction(m, v, w, s);  // w = w - lr*ratio*u
    }
  };
  __device__ Op element_op(const Table& table, int t, const Slot& s) const {
    return {step_of(table.groups[s.group], table.steps[t], 1.0f), table.coef[t]};
  }
};

}  // namespace

// --------------------------------------------------------------- launcher ----

void run_lamb(const Table& table, const Launch& launch, cudaStream_t stream) {
  if (launch.check_skip || launch.clip) {
    launch_chunks(table, SquaresPass<false>{}, stream);
    launch_finalize(table, ClipFinalize{}, stream);
  }
  launch_chunks(table, MomentsPass{launch.check_skip, launch.clip}, stream);
  launch_finalize(table, RatioFinalize{launch.check_skip}, stream);
  launch_chunks(table, ApplyPass{launch.check_skip}, stream);
}

std::vector<PassArrays> lamb_passes(const Launch& launch) {
  std::vector<PassArrays> passes;
  if (launch.check_skip || launch.clip) passes.push_back(SquaresPass<false>::kArrays);
  passes.push_back(MomentsPass::kArrays);
  passes.push_back(ApplyPass::kArrays);
  return passes;
}

}  // namespace bigbatch::kernels::cuda
