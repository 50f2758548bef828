// bigbatch: the command line of the experiment runner.
//   bigbatch sweep CONFIG [--out DIR] [--jobs N]   run or resume a sweep
//   bigbatch train CONFIG [--out DIR] [...]        one trial of a sweep config
//   bigbatch plot DIR                              the plots of a sweep folder
//   bigbatch report DIR                            its steps-to-target table
// Exit 0 on success, 2 on a bad config or arguments (one line), 1 on failures.
#include <bigbatch/distributed/process_group.h>
#include <bigbatch/experiments/config.h>
#include <bigbatch/experiments/launch.h>
#include <bigbatch/experiments/preflight.h>
#include <bigbatch/experiments/results.h>
#include <bigbatch/experiments/sweep.h>
#include <bigbatch/experiments/trial_folder.h>

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>

#ifndef BIGBATCH_PLOT_SCRIPT
#define BIGBATCH_PLOT_SCRIPT "plots/plot_sweep.py"
#endif

namespace {

namespace bx = bigbatch::experiments;
namespace fs = std::filesystem;

// The finished sweep folders at DIR: DIR itself, or its variants' folders.
std::vector<std::string> sweep_folders(const std::string& dir) {
  if (fs::exists(fs::path(dir) / "steps_to_target.csv")) return {dir};
  std::vector<std::string> out;
  if (fs::is_directory(dir)) {
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (fs::exists(entry.path() / "steps_to_target.csv")) out.push_back(entry.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  if (out.empty()) throw bx::ConfigError(dir + ": no steps_to_target.csv here or in its variant folders (not a finished sweep)");
  return out;
}

int plot_one(const std::string& dir) {
  const char* env = std::getenv("BIGBATCH_PLOT_SCRIPT");
  const std::string script = env ? env : BIGBATCH_PLOT_SCRIPT;
  const std::string python = std::getenv("BIGBATCH_PYTHON") ? std::getenv("BIGBATCH_PYTHON") : "/usr/bin/python3";
  // Arguments are quoted for the shell; names were checked, paths may have spaces.
  const auto quote = [](const std::string& s) {
    std::string q = "'";
    for (const char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  const int rc = std::system((quote(python) + " " + quote(script) + " " + quote(dir)).c_str());
  if (rc != 0) throw std::runtime_error("plotting failed (" + python + " " + script + "); see above");
  return 0;
}

int plot(const std::string& dir) {
  for (const auto& d : sweep_folders(dir)) plot_one(d);
  return 0;
}

int report(const std::string& dir) {
  const auto folders = sweep_folders(dir);
  for (const auto& d : folders) {
    if (folders.size() > 1) std::cout << "== " << d << "\n";
    std::cout << bx::report(d);
  }
  return 0;
}

// Device and data-parallel options shared by sweep and train.
struct Parallel {
  bx::LaunchOptions launch;
  double timeout = 60;
  std::string backend = "auto";
  std::optional<std::string> device;
  void add_to(CLI::App* cmd) {
    cmd->add_option("--device", device, "cpu or cuda (default: the config's device; cuda: cuda:LOCAL_RANK)")
        ->check(CLI::IsMember({"cpu", "cuda"}));
    cmd->add_option("--nproc", launch.nproc, "data-parallel ranks to start on this node")
        ->capture_default_str();
    cmd->add_option("--backend", backend,
                    "c10d backend: auto (a world of one has none; else nccl on cuda where built, gloo otherwise), "
                    "gloo or nccl (a group even for a world of one)")
        ->check(CLI::IsMember({"auto", "gloo", "nccl"}))
        ->capture_default_str();
    cmd->add_option("--nnodes", launch.nnodes, "nodes; run the same command on each")->capture_default_str();
    cmd->add_option("--node-rank", launch.node_rank, "this node's index")->capture_default_str();
    cmd->add_option("--master-addr", launch.master_addr, "rank 0's address")->capture_default_str();
    cmd->add_option("--master-port", launch.master_port, "rank 0's rendezvous port")->capture_default_str();
    cmd->add_option("--timeout", timeout, "seconds before a collective gives up (a dead rank)")
        ->capture_default_str();
  }
  bool launcher() const { return !bx::launched_by_bigbatch() && (launch.nproc > 1 || launch.nnodes > 1); }
  int world_size() const { return launch.nproc * launch.nnodes; }
};

// This process's place in a data-parallel job (torchrun, mpirun or our launcher),
// with its process group on the backend for `device`; none in a world of one
// unless --backend names one.
std::unique_ptr<bigbatch::distributed::ProcessGroup> join(const Parallel& p, bx::DeviceType device) {
  namespace bd = bigbatch::distributed;
  const auto world = bd::world_from_env();
  if (world.world_size == 1 && p.backend == "auto") return nullptr;
  if (!(p.timeout > 0)) throw bx::ConfigError("--timeout: must be > 0, got " + std::to_string(p.timeout));
  if (p.backend == "nccl" && !bd::nccl_available()) {
    throw bx::ConfigError("--backend nccl: this build has no NCCL (build against a CUDA LibTorch with -DBIGBATCH_CUDA=ON)");
  }
  const bd::Backend backend = p.backend == "nccl"   ? bd::Backend::kNccl
                              : p.backend == "gloo" ? bd::Backend::kGloo
                              : device == bx::DeviceType::kCuda && bd::nccl_available() ? bd::Backend::kNccl
                                                                         : bd::Backend::kGloo;
  return std::make_unique<bd::ProcessGroup>(world, std::chrono::milliseconds(static_cast<std::int64_t>(p.timeout * 1000)),
                                            backend);
}

// The sweeps of a config, with --device applied.
std::vector<bx::NamedSweep> load(const std::string& config, const Parallel& p) {
  auto sweeps = bx::load_sweeps(config);
  if (p.device) {
    const auto device = bigbatch::schedules::enum_value(bx::kDeviceTypes, *p.device, "--device");
    for (auto& named : sweeps) named.sweep.base.device = device;
  }
  return sweeps;
}

int run(int argc, char** argv) {
  CLI::App app{"bigbatch: batch size against steps to target, on LibTorch"};
  app.require_subcommand(1);
  std::string config, out = "runs", dir;
  int jobs = 1;
  auto* sweep = app.add_subcommand("sweep", "run (or resume) every trial of a sweep config, then its tables");
  sweep->add_option("CONFIG", config, "sweep config (JSON)")->required();
  sweep->add_option("--out", out, "output folder; the sweep goes to OUT/<name>/")->capture_default_str();
  sweep->add_option("--jobs", jobs, "trials in parallel (intra-op threads: cores / jobs)")->capture_default_str();
  Parallel parallel;
  parallel.add_to(sweep);

  auto* train = app.add_subcommand("train", "run one trial of a sweep config into OUT/<name>.train/<trial>/");
  std::optional<std::int64_t> batch, steps;
  std::optional<double> lr;
  std::optional<std::uint64_t> seed;
  train->add_option("CONFIG", config, "sweep config (JSON)")->required();
  train->add_option("--out", out, "output folder")->capture_default_str();
  train->add_option("--batch-size", batch, "batch size (default: the config's first)");
  train->add_option("--lr", lr, "base learning rate (default: the search's first point)");
  train->add_option("--seed", seed, "seed (default: the config's first)");
  train->add_option("--steps", steps, "cap the budget at this many steps");
  std::optional<std::string> variant;
  train->add_option("--variant", variant, "which variant of the config (default: the first)");
  parallel.add_to(train);

  auto* plot_cmd = app.add_subcommand("plot", "write the plots of a sweep folder (PNG, SVG, JSON points)");
  plot_cmd->add_option("DIR", dir, "sweep folder, e.g. runs/quickstart")->required();
  auto* report_cmd = app.add_subcommand("report", "print the steps-to-target table of a sweep folder");
  report_cmd->add_option("DIR", dir, "sweep folder")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << "bigbatch: " << e.what() << " (see bigbatch --help)\n";
    return 2;
  }

  if (*sweep) {
    const auto sweeps = load(config, parallel);  // every variant parsed before any runs
    if (parallel.launcher()) {
      for (const auto& named : sweeps) bx::check_world(named.sweep, parallel.world_size());
      return bx::launch_local(parallel.launch, argc, argv);
    }
    const auto group = join(parallel, sweeps.front().sweep.base.device);
    if (group && group->rank() != 0) {
      for (const auto& named : sweeps) {
        bx::run_sweep(named.sweep, {(fs::path(out) / named.folder).parent_path().string(), jobs}, group.get());
      }
      return 0;
    }
    for (const auto& named : sweeps) {
      const std::string parent = (fs::path(out) / named.folder).parent_path().string();
      const bx::SweepSummary s = bx::run_sweep(named.sweep, {parent, jobs}, group.get());
      std::cout << bx::report(s.dir);
      std::cout << "sweep " << named.folder << ": " << s.trials << " trials (" << s.skipped << " resumed), "
                << s.reached << " reached the target, " << s.wall_time << " s; results in " << s.dir << "\n";
    }
    const std::string top = (fs::path(out) / fs::path(sweeps.front().folder).begin()->string()).string();
    std::cout << "plots: bigbatch plot " << top << "\n";
    return 0;
  }
  if (*train) {
    const auto sweeps = load(config, parallel);
    const auto chosen = std::find_if(sweeps.begin(), sweeps.end(), [&](const bx::NamedSweep& n) {
      return !variant || n.sweep.base.sweep == *variant;
    });
    if (chosen == sweeps.end()) throw bx::ConfigError("--variant: no variant named " + *variant);
    bx::SweepConfig cfg = chosen->sweep;
    if (batch) cfg.batch_sizes = {*batch};
    if (seed) cfg.seeds = {*seed};
    if (lr) {
      if (!(*lr > 0)) throw bx::ConfigError("--lr: must be > 0, got " + std::to_string(*lr));
      cfg.search = bx::SearchSpec{};
      cfg.search.lr = {*lr};
    }
    if (steps) {
      if (*steps < 1) throw bx::ConfigError("--steps: must be >= 1, got " + std::to_string(*steps));
      cfg.base.budget = {static_cast<double>(*steps), bigbatch::schedules::Unit::kSteps};
    }
    cfg.batch_sizes = {cfg.batch_sizes.front()};  // the trial's: the checks below are about it
    const bx::TrialConfig trial = bx::expand(cfg).front();
    bx::check_world(cfg, parallel.launcher() ? parallel.world_size()
                                             : bigbatch::distributed::world_from_env().world_size);
    if (parallel.launcher()) return bx::launch_local(parallel.launch, argc, argv);
    const auto group = join(parallel, cfg.base.device);
    const bx::Dataset data = bx::load_data(cfg);
    const std::string tdir = (fs::path(out) / (chosen->folder + ".train") / trial.name).string();
    const bx::TrialResult r = bx::run_one(
        trial, data, tdir,
        [](const bx::TrialProgress& p) { std::cerr << "step " << p.step << "/" << p.budget << " loss " << p.loss << "\n"; },
        group.get());
    if (group && group->rank() != 0) return 0;
    std::cout << (group ? "data-parallel over " + std::to_string(group->size()) + " ranks (" +
                              bigbatch::distributed::backend_name(group->backend()) + "): "
                        : std::string())
              << trial.name << ": " << bx::to_string(r.status) << " after " << r.steps << " steps, best "
              << bx::to_string(trial.target.metric)
              << " " << r.best_metric << "; results in " << tdir << "\n";
    return 0;
  }
  if (*plot_cmd) return plot(dir);
  return report(dir);
}

}  // namespace

int main(int argc, char** argv) {
  // In a data-parallel job every rank's message says which rank it is.
  const char* rank = std::getenv("RANK");
  const std::string who = rank != nullptr && std::getenv("WORLD_SIZE") != nullptr &&
                                  std::string(std::getenv("WORLD_SIZE")) != "1"
                              ? std::string("bigbatch: rank ") + rank + ": "
                              : std::string("bigbatch: ");
  try {
    return run(argc, argv);
  } catch (const bx::ConfigError& e) {
    std::cerr << who << e.what() << "\n";
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << who << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << who << e.what() << "\n";
    return 1;
  }
}
