// NovoGrad on CUDA (kernels/novograd.h; Ginsburg et al. 2019, arXiv:1905.11286):
// ||g||^2 -> the layer's scalar second moment updated on the device ->
// d = (g/(sqrt(v)+eps) + wd*w)*f, m = b1*m + d, w -= lr*m, in two passes.
#include <bigbatch/kernels/cuda/multi_tensor.cuh>
#include <bigbatch/kernels/novograd.h>

namespace bigbatch::kernels::cuda {
namespace {

// --------------------------------------------------------------- functors ----

/// After the norms: the skip decision; then, unless skipped, each tensor's
/// step count and v = n at its first step, else b2*v + (1-b2)*n (fp32, as the
/// CPU path rounds it); the update's denominator sqrt(v) + eps.
struct MomentFinalize {
  __device__ void operator()(const Table& table) const {
    const bool skip = decide_skip(table, 0);
    for (int t = threadIdx.x; t < table.num_tensors; t += kThreads) {
      const Slot& s = table.slots[t];
      const GroupOptions& o = table.groups[s.group];
      float v = *s.v;
      if (!skip) {
        table.steps[t] += 1;
        const double g_norm = sqrt(tensor_sum(table, t, 0));
        const double n = g_norm * g_norm;
        if (table.steps[t] == 1) {
          v = static_cast<float>(n);
        } else {
          v = __fadd_rn(__fmul_rn(v, static_cast<float>(o.beta2)), static_cast<float>(n * (1 - o.beta2)));
        }
        *s.v = v;
      }
      table.coef[t] = sqrtf(v) + static_cast<float>(o.eps);
    }
  }
};

/// The update: reads w g m, writes m w.
struct ApplyPass {
  static constexpr PassArrays kArrays{kParam | kGrad | kM, kParam | kM};
  static constexpr bool kReduce = false;
  bool check_skip;

  struct Op {
    NovoGradStep s;
    __device__ void operator()(float& w, float& g, float& m, float&, double (&)[2]) const {
      const NovoGradElement e = novograd_element(g, w, m, s);
      m = e.m;
      w = e.w;
    }
  };
  __device__ Op element_op(const Table& table, int t, const Slot& s) const {
    const GroupOptions& o = table.groups[s.group];
    NovoGradStep step;
    step.beta1 = static_cast<float>(o.beta1);
    step.denom = table.coef[t];
    step.weight_decay = static_cast<float>(o.weight_decay);
    step.grad_factor = static_cast<float>((o.flags & kGradAveraging) != 0 ? 1 - o.beta1 : 1.0);
    step.lr = static_cast<float>(o.lr);
    return {step};
  }
};

}  // namespace

// --------------------------------------------------------------- launcher ----

void run_novograd(const Table& table, const Launch& launch, cudaStream_t stream) {
  launch_chunks(table, SquaresPass<false>{}, stream);
  launch_finalize(table, MomentFinalize{}, stream);
  launch_chunks(table, ApplyPass{launch.check_skip}, stream);
}

std::vector<PassArrays> novograd_passes(const Launch&) {
  return {SquaresPass<false>::kArrays, ApplyPass::kArrays};
}

}  // namespace bigbatch::kernels::cuda
