// LARS and LARC on CUDA (kernels/momentum.h; You, Gitman, Ginsburg 2017,
// arXiv:1708.03888; apex's LARC): ||w||, ||g|| -> per-tensor trust ratio on the
// device -> d = g + wd*w, v = mu*v + scale*d, w -= step*v, in two passes.
#include <bigbatch/kernels/cuda/multi_tensor.cuh>
#include <bigbatch/kernels/momentum.h>

namespace bigbatch::kernels::cuda {
namespace {

// --------------------------------------------------------------- functors ----

/// After the norms: the skip decision and each tensor's scale (LARS: lr*ratio,
/// the rate inside the buffer; LARC: the clipped local rate over lr).
struct ScaleFinalize {
  bool larc;

  __device__ void operator()(const Table& table) const {
    decide_skip(table, 0);
    for (int t = threadIdx.x; t < table.num_tensors; t += kThreads) {
      const GroupOptions& o = table.groups[table.slots[t].group];
      const double g_norm = sqrt(tensor_sum(table, t, 0));
      const double w_norm = sqrt(tensor_sum(table, t, 1));
      const bool adapt = (o.flags & kAdapt) != 0;
      const double scale =
          larc ? larc_scale(w_norm, g_norm, adapt, (o.flags & kClip) != 0, o.lr, o.trust_coefficient,
                            o.weight_decay, o.eps)
               : o.lr * lars_trust_ratio(w_norm, g_norm, adapt, o.trust_coefficient, o.weight_decay, o.eps);
      table.coef[t] = static_cast<float>(scale);
    }
  }
};

/// The update: reads w g v, writes v w.
struct ApplyPass {
  static constexpr PassArrays kArrays{kParam | kGrad | kM, kParam | kM};
  static constexpr bool kReduce = false;
  bool check_skip;
  bool larc;

  struct Op {
    MomentumStep s;
    __device__ void operator()(float& w, float& g, float& v, float&, double (&)[2]) const {
      const MomentumElement e = momentum_element(g, w, v, s);
      v = e.v;
      w = e.w;
    }
  };
  __device__ Op element_op(const Table& table, int t, const Slot& s) const {
    const GroupOptions& o = table.groups[s.group];
    // LARS: step_size 1 (lr is in the buffer); LARC: step_size lr.
    return {MomentumStep{table.coef[t], larc ? static_cast<float>(o.lr) : 1.0f, static_cast<float>(o.momentum),
                         static_cast<float>(o.weight_decay), (o.flags & kNesterov) != 0}};
  }
};

}  // namespace

// --------------------------------------------------------------- launcher ----

void run_lars_larc(const Table& table, const Launch& launch, bool larc, cudaStream_t stream) {
  launch_chunks(table, SquaresPass<true>{}, stream);
  launch_finalize(table, ScaleFinalize{larc}, stream);
  launch_chunks(table, ApplyPass{launch.check_skip, larc}, stream);
}

std::vector<PassArrays> lars_larc_passes(const Launch&) {
  return {SquaresPass<true>::kArrays, ApplyPass::kArrays};
}

}  // namespace bigbatch::kernels::cuda
