// c10d process group and data-parallel helpers (process_group.h). The c10d
// calls used here (TCPStore, ProcessGroupGloo and ProcessGroupNCCL with their
// Options, allreduce, broadcast, barrier) have the same form in LibTorch 1.13
// and 2.x; only their common base class differs (ProcessGroup, then Backend),
// which is why Impl keeps each backend's own pointer.
#include "process_group.h"

#include "slurm_env.h"

#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

namespace bigbatch::distributed {
namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::optional<std::string>(v) : std::nullopt;
}

int env_int(const char* name, int fallback) {
  const auto v = env(name);
  if (!v) return fallback;
  try {
    std::size_t used = 0;
    const int x = std::stoi(*v, &used);
    TORCH_CHECK(used == v->size(), "");
    return x;
  } catch (const std::exception&) {
    TORCH_CHECK(false, "environment variable ", name, "=\"", *v, "\" is not an integer");
  }
  return fallback;
}

}  // namespace

WorldInfo world_from_env() {
  WorldInfo w;
  const char* local_size = "LOCAL_WORLD_SIZE";
  if (env("RANK") || env("WORLD_SIZE")) {
    TORCH_CHECK(env("RANK") && env("WORLD_SIZE"), "RANK and WORLD_SIZE must be set together (torchrun style)");
    w.launcher = "torchrun";
    w.rank = env_int("RANK", 0);
    w.world_size = env_int("WORLD_SIZE", 1);
    w.local_rank = env_int("LOCAL_RANK", w.rank);
    w.local_world_size = env_int(local_size, w.world_size);
  } else if (env("OMPI_COMM_WORLD_RANK")) {
    w.launcher = "mpirun";
    w.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    w.world_size = env_int("OMPI_COMM_WORLD_SIZE", 1);
    w.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", w.rank);
    local_size = "OMPI_COMM_WORLD_LOCAL_SIZE";
    w.local_world_size = env_int(local_size, w.world_size);
  } else if (env("SLURM_STEP_NUM_TASKS") && env("SLURM_PROCID")) {
    // A task of `srun` (a batch script's own shell is no step task): rank 0
    // listens on the step's first host, at a port of the job's (two steps of
    // one job at once need MASTER_PORT).
    w.launcher = "srun";
    w.rank = env_int("SLURM_PROCID", 0);
    w.world_size = env_int("SLURM_STEP_NUM_TASKS", 1);
    w.local_rank = env_int("SLURM_LOCALID", 0);
    local_size = "SLURM_STEP_TASKS_PER_NODE";
    try {
      w.local_world_size = slurm_tasks_on_node(env(local_size).value_or("1"), env_int("SLURM_NODEID", 0));
      const auto nodes = env("SLURM_STEP_NODELIST") ? env("SLURM_STEP_NODELIST") : env("SLURM_JOB_NODELIST");
      if (nodes) w.master_addr = first_slurm_host(*nodes);
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK(false, "Slurm's environment: ", e.what());
    }
    w.master_port = 29500 + env_int("SLURM_JOB_ID", 0) % 20000;
  }
  w.master_addr = env("MASTER_ADDR").value_or(w.master_addr);
  w.master_port = env_int("MASTER_PORT", w.master_port);
  TORCH_CHECK(w.world_size >= 1, "WORLD_SIZE must be >= 1, got ", w.world_size);
  TORCH_CHECK(w.rank >= 0 && w.rank < w.world_size, "RANK must be in [0, ", w.world_size, "), got ", w.rank);
  TORCH_CHECK(w.local_world_size >= 1 && w.local_world_size <= w.world_size,
              local_size, " must be in [1, ", w.world_size, "], got ", w.local_world_size);
  TORCH_CHECK(w.master_port > 0 && w.master_port < 65536, "MASTER_PORT must be a port number, got ",
              w.master_port);
  return w;
}

bool nccl_available() {
#ifdef USE_C10D_NCCL
  return true;
#else
  return false;
#endif
}

const char* backend_name(Backend backend) { return backend == Backend::kNccl ? "nccl" : "gloo"; }

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
#ifdef USE_C10D_NCCL
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl;
#endif

  c10::Device nccl_device{c10::DeviceType::CPU};

  // Calls f on the backend in use; returns its work handle.
  template <typename F>
  auto with_backend(F&& f) {
#ifdef USE_C10D_NCCL
    if (nccl) return f(*nccl);
#endif
    return f(*gloo);
  }

  // Runs collective(tensors) and waits. NCCL takes CUDA tensors only: CPU
  // tensors (the scalars and masks the runner exchanges) travel through the
  // group's device and come back.
  template <typename F>
  void run(std::vector<at::Tensor>& tensors, F&& collective) {
    const bool stage = nccl_device.is_cuda() &&
                       std::any_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) { return !t.is_cuda(); });
    if (!stage) {
      with_backend([&](auto& pg) { return collective(pg, tensors); })->wait();
      return;
    }
    std::vector<at::Tensor> staged;
    for (const auto& t : tensors) staged.push_back(t.to(nccl_device));
    with_backend([&](auto& pg) { return collective(pg, staged); })->wait();
    for (std::size_t i = 0; i < tensors.size(); ++i) tensors[i].copy_(staged[i]);
  }
};

ProcessGroup::ProcessGroup(const WorldInfo& world, std::chrono::milliseconds timeout, Backend backend)
    : world_(world), backend_(backend), impl_(std::make_unique<Impl>()) {
  TORCH_CHECK(backend != Backend::kNccl || nccl_available(),
              "the nccl backend is not in this build: it needs a CUDA LibTorch with NCCL and bigbatch "
              "configured with -DBIGBATCH_CUDA=ON; use the gloo backend");
  c10d::TCPStoreOptions store;
  store.port = static_cast<std::uint16_t>(world.master_port);
  store.isServer = world.rank == 0;
  store.numWorkers = static_cast<std::size_t>(world.world_size);
  store.waitWorkers = true;
  store.timeout = timeout;
  impl_->store = c10::make_intrusive<c10d::TCPStore>(world.master_addr, store);
#ifdef USE_C10D_NCCL
  if (backend == Backend::kNccl) {
    // One GPU per local rank; NCCL's communicator binds to the current device.
    const auto* cuda = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    const int devices = static_cast<int>(cuda->deviceCount());
    TORCH_CHECK(devices > 0, "the nccl backend needs a CUDA device; none is visible");
    impl_->nccl_device = c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(world.local_rank % devices));
    cuda->setDevice(impl_->nccl_device);
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    impl_->nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(impl_->store, world.rank, world.world_size, options);
    return;
  }
#endif
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(world.master_addr));
  impl_->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(impl_->store, world.rank, world.world_size, options);
}

ProcessGroup::~ProcessGroup() = default;

void ProcessGroup::allreduce_sum(std::vector<at::Tensor>& tensors) {
  impl_->run(tensors, [](auto& pg, std::vector<at::Tensor>& t) { return pg.allreduce(t); });
}

std::vector<at::Tensor> ProcessGroup::allgather(const at::Tensor& input) {
  // NCCL takes device tensors only: a CPU input travels through the group's device.
  const bool stage = impl_->nccl_device.is_cuda() && !input.is_cuda();
  std::vector<at::Tensor> in{stage ? input.to(impl_->nccl_device) : input.contiguous()};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < size(); ++r) out[0].push_back(at::empty_like(in[0]));
  impl_->with_backend([&](auto& pg) { return pg.allgather(out, in); })->wait();
  if (stage) {
    for (auto& t : out[0]) t = t.to(input.device());
  }
  return out[0];
}

std::function<void()> ProcessGroup::allreduce_sum_async(std::vector<at::Tensor> tensors) {
  for (const auto& t : tensors) {
    TORCH_CHECK(!impl_->nccl_device.is_cuda() || t.is_cuda(), "allreduce_sum_async: a ", t.device(),
                " tensor for an nccl group (it does not stage CPU tensors)");
  }
  auto work = impl_->with_backend([&](auto& pg) { return pg.allreduce(tensors); });
  // The work handle's class is ProcessGroup::Work in LibTorch 1.13 and Work in
  // 2.x: the closure keeps it whatever it is called.
  return [work, tensors]() mutable { work->wait(); };
}

at::Tensor ProcessGroup::reduce_scatter_sum(at::Tensor& input) {
  TORCH_CHECK(input.dim() == 1 && input.is_contiguous() && input.numel() % size() == 0,
              "reduce_scatter_sum: a contiguous 1-D input whose length is a multiple of ", size(),
              ", got shape ", input.sizes());
  const std::int64_t part = input.numel() / size();
#ifdef USE_C10D_NCCL
  if (impl_->nccl) {
    const bool stage = !input.is_cuda();
    at::Tensor in = stage ? input.to(impl_->nccl_device) : input;
    at::Tensor out = at::empty({part}, in.options());
    impl_->nccl->_reduce_scatter_base(out, in)->wait();
    return stage ? out.to(input.device()) : out;
  }
#endif
  std::vector<std::vector<at::Tensor>> parts(static_cast<std::size_t>(size()));
  std::vector<decltype(impl_->gloo->barrier())> works;
  for (int r = 0; r < size(); ++r) {
    parts[r].push_back(input.narrow(0, r * part, part));
    c10d::ReduceOptions o;
    o.rootRank = r;
    works.push_back(impl_->gloo->reduce(parts[r], o));
  }
  for (auto& w : works) w->wait();
  return parts[rank()][0];
}

void ProcessGroup::broadcast(std::vector<at::Tensor>& tensors, int root) {
  c10d::BroadcastOptions o;
  o.rootRank = root;
  impl_->run(tensors, [&](auto& pg, std::vector<at::Tensor>& t) { return pg.broadcast(t, o); });
}

void ProcessGroup::barrier() {
  impl_->with_backend([&](auto& pg) { return pg.barrier(); })->wait();
}

std::string broadcast_bytes(ProcessGroup& group, const std::string& bytes, int root) {
  std::vector<at::Tensor> size{at::scalar_tensor(static_cast<std::int64_t>(bytes.size()), at::kLong).reshape({1})};
  group.broadcast(size, root);
  const std::int64_t n = size[0].item<std::int64_t>();
  if (n == 0) return {};
  std::vector<at::Tensor> data{at::zeros({n}, at::kByte)};
  if (group.rank() == root) std::memcpy(data[0].data_ptr(), bytes.data(), static_cast<std::size_t>(n));
  group.broadcast(data, root);
  return std::string(static_cast<const char*>(data[0].data_ptr()), static_cast<std::size_t>(n));
}

void broadcast_module(ProcessGroup& group, torch::nn::Module& module) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> tensors;
  for (const auto& p : module.parameters()) tensors.push_back(p.detach());
  for (const auto& b : module.buffers()) {
    if (b.defined()) tensors.push_back(b);
  }
  for (auto& t : tensors) {
    std::vector<at::Tensor> one{t};
    group.broadcast(one, 0);
  }
}

at::Tensor epoch_partition(std::int64_t n, std::int64_t batch_per_rank, int rank, int world, std::uint64_t seed,
                           std::int64_t epoch) {
  TORCH_CHECK(world >= 1 && rank >= 0 && rank < world, "epoch_partition: rank ", rank, " of world ", world);
  TORCH_CHECK(batch_per_rank >= 1, "epoch_partition: batch_per_rank must be >= 1, got ", batch_per_rank);
  const std::int64_t global = batch_per_rank * world;
  TORCH_CHECK(n >= global, "epoch_partition: ", n, " examples do not fill one global batch of ", global);
  auto gen = at::detail::createCPUGenerator(seed * 1000003ULL + static_cast<std::uint64_t>(epoch));
  const std::int64_t batches = n / global;  // the same on every rank: nobody waits for a missing batch
  return at::randperm(n, gen, at::kLong)
      .slice(0, 0, batches * global)
      .view({batches, world, batch_per_rank})
      .select(1, rank)
      .contiguous();
}

}  // namespace bigbatch::distributed
