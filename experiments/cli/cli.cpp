// The bigbatch command line (cli.h), one struct per subcommand (its
// arguments, add() declaring them, run()).
//   bigbatch sweep CONFIG [--out DIR] [--jobs N]   run or resume a sweep
//   bigbatch train CONFIG [--out DIR] [...]        one trial of a sweep config
//   bigbatch cbs CONFIG [--out DIR] [--compare]    the critical batch size over training
//   bigbatch plot DIR... [--out FIG_DIR]           the plots of sweep folders, compared
//   bigbatch report DIR... [--format F]            their steps-to-target tables
//   bigbatch slurm CONFIG [--workers N] [...]      a sweep as a Slurm job array of workers
//   bigbatch env [--json]                          what this machine computes with, and the math check
//   bigbatch data CONFIG --save FILE               its dataset's splits as tensors (for Python)
// Exit 0 on success, 2 on a bad config or arguments (one line), 1 on failures,
// 75 for a sweep stopped by a signal once its trials were checkpointed.
#include "cli.h"

#include "../../distributed/process_group.h"
#include "../sweep/cbs.h"
#include "../sweep/executor.h"
#include "../cluster/claims.h"
#include "../runconfig/config.h"
#include "../io/files.h"
#include "../cluster/launch.h"
#include "../sweep/machine.h"
#include "../sweep/preflight.h"
#include "../sweep/results.h"
#include "../cluster/slurm.h"
#include "../sweep/sweep.h"
#include "../sweep/trial_folder.h"
#include "../sweep/workers.h"

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>
#include <torch/serialize.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <unistd.h>
#include <string>

// The plot script: the source tree's (a build), else the installed copy.
#ifndef BIGBATCH_PLOT_SCRIPT
#define BIGBATCH_PLOT_SCRIPT "plots/plot_sweep.py"
#endif
#ifndef BIGBATCH_PLOT_SCRIPT_INSTALLED
#define BIGBATCH_PLOT_SCRIPT_INSTALLED BIGBATCH_PLOT_SCRIPT
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

// Runs the plot script with these arguments.
void run_plot_script(const std::vector<std::string>& args) {
  const char* env = std::getenv("BIGBATCH_PLOT_SCRIPT");
  const std::string script = env                                  ? env
                             : fs::exists(BIGBATCH_PLOT_SCRIPT) ? BIGBATCH_PLOT_SCRIPT
                                                                : BIGBATCH_PLOT_SCRIPT_INSTALLED;
  const std::string python = std::getenv("BIGBATCH_PYTHON") ? std::getenv("BIGBATCH_PYTHON") : "/usr/bin/python3";
  // Arguments are quoted for the shell; names were checked, paths may have spaces.
  const auto quote = [](const std::string& s) {
    std::string q = "'";
    for (const char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  std::string command = quote(python) + " " + quote(script);
  for (const auto& a : args) command += " " + quote(a);
  const int rc = std::system(command.c_str());
  if (rc != 0) throw std::runtime_error("plotting failed (" + python + " " + script + "); see above");
}

// Every sweep folder under DIRS (each a sweep or a config's variants), named
// by its sweep's name, or by --labels (one per folder), or by its path when
// two share a name.
std::vector<bx::LabelledSweep> labelled_sweeps(const std::vector<std::string>& dirs,
                                               const std::vector<std::string>& labels) {
  std::vector<bx::LabelledSweep> sweeps;
  for (const auto& dir : dirs) {
    for (const auto& d : sweep_folders(dir)) sweeps.push_back({fs::path(d).filename().string(), d});
  }
  if (!labels.empty()) {
    if (labels.size() != sweeps.size()) {
      throw bx::ConfigError("--labels: " + std::to_string(labels.size()) + " labels for " +
                            std::to_string(sweeps.size()) + " sweep folders");
    }
    for (std::size_t i = 0; i < labels.size(); ++i) {
      if (labels[i].empty() || labels[i].find('=') != std::string::npos) {
        throw bx::ConfigError("--labels: \"" + labels[i] + "\" must be non-empty and without '='");
      }
      sweeps[i].label = labels[i];
    }
  }
  std::set<std::string> seen;
  bool unique = true;
  for (const auto& s : sweeps) unique = seen.insert(s.label).second && unique;
  if (!unique) {
    for (auto& s : sweeps) s.label = s.dir;
  }
  return sweeps;
}

// Each sweep's own plots; with several sweeps (a config's variants, or several
// DIRs) also the comparison figures, into --out or else DIR/plots.
int plot(const std::vector<std::string>& dirs, const std::optional<std::string>& out,
         const std::vector<std::string>& labels) {
  if (dirs.size() == 1 && fs::exists(fs::path(dirs.front()) / "cbs.csv")) {  // a cbs folder
    run_plot_script({"--cbs", dirs.front()});
    return 0;
  }
  const auto sweeps = labelled_sweeps(dirs, labels);
  if (dirs.size() > 1 && !out) throw bx::ConfigError("--out: needed where several folders are compared");
  bool compare = sweeps.size() > 1;
  if (compare && dirs.size() == 1 && !out) {
    try {
      bx::check_comparable(sweeps);
    } catch (const bx::ConfigError& e) {  // variants that change the target: each alone
      std::cerr << "bigbatch: no comparison figures: " << e.what() << "\n";
      compare = false;
    }
  } else if (compare) {
    bx::check_comparable(sweeps);
  }
  if (!out) {
    for (const auto& s : sweeps) run_plot_script({s.dir});
  }
  if (compare) {
    std::vector<std::string> args{"--compare", out ? *out : (fs::path(dirs.front()) / "plots").string()};
    for (const auto& s : sweeps) args.push_back(s.label + "=" + s.dir);
    run_plot_script(args);
  }
  return 0;
}

// A sweep whose first round is still running (its workers, on this machine
// or on a cluster, have written no table yet): how far it is, from its trial
// folders and claims. Empty when `dir` is no such sweep.
std::string progress_of(const fs::path& dir) {
  if (!fs::exists(dir / "sweep.json") || fs::exists(dir / "steps_to_target.csv")) return "";
  std::int64_t started = 0, finished = 0, running = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!fs::exists(entry.path() / "config.json")) continue;
    ++started;
    if (fs::exists(entry.path() / "summary.json")) ++finished;
  }
  if (fs::is_directory(dir / "claims")) {
    // A trial runs while its highest claim slot is a "run" one.
    std::map<std::string, std::pair<std::int64_t, std::string>> highest;
    for (const auto& entry : fs::directory_iterator(dir / "claims")) {
      const std::string name = entry.path().filename().string();
      const auto dot = name.rfind('.');
      if (name.empty() || name[0] == '.' || dot == std::string::npos) continue;
      const std::string n = name.substr(dot + 1);
      if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos) continue;
      auto& h = highest[name.substr(0, dot)];
      if (std::stoll(n) > h.first) h = {std::stoll(n), entry.path().string()};
    }
    for (const auto& [trial, h] : highest) {
      std::ifstream slot(h.second);
      std::string kind;
      if (slot >> kind && kind == "run") ++running;
    }
  }
  return dir.string() + ": in progress: " + std::to_string(finished) + " trial(s) finished, " +
         std::to_string(running) + " running, " + std::to_string(started) +
         " started; the table is written when the first round ends\n";
}

int report(const std::vector<std::string>& dirs, bx::TableFormat format, const std::vector<std::string>& labels) {
  if (dirs.size() == 1 && fs::exists(fs::path(dirs.front()) / "cbs.csv")) {  // a cbs folder
    std::cout << bx::cbs_report(dirs.front());
    return 0;
  }
  if (dirs.size() == 1) {
    if (const std::string progress = progress_of(dirs.front()); !progress.empty()) {
      std::cout << progress;
      return 0;
    }
  }
  const auto sweeps = labelled_sweeps(dirs, labels);
  if (format == bx::TableFormat::kText) {
    for (const auto& s : sweeps) {
      if (sweeps.size() > 1) std::cout << "== " << s.dir << "\n";
      std::cout << bx::report(s.dir);
    }
    if (sweeps.size() > 1) std::cout << "== side by side (steps to target)\n";
  }
  if (format != bx::TableFormat::kText || sweeps.size() > 1) std::cout << bx::compare_report(sweeps, format);
  return 0;
}

// --jobs of sweep and cbs: how many `runs` (trials, branches) at once.
void add_jobs(CLI::App* cmd, int& jobs, const std::string& runs) {
  cmd->add_option("--jobs", jobs,
                  runs + " in parallel, in one process, each with the config's runner.threads_per_trial intra-op "
                         "threads (default 1); capped at what fits the cores. It never changes the results")
      ->capture_default_str();
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
  // Whether this process starts the ranks; first refuses impossible counts
  // (--nproc 0 would otherwise train as one process).
  bool launcher() const {
    bx::check_launch(launch);
    return !bx::launched_by_bigbatch() && (launch.nproc > 1 || launch.nnodes > 1);
  }
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

// --device in place of the config's device, checked as the config's is.
void set_device(bx::TrialConfig& base, const std::string& device) {
  base.device = bigbatch::config::enum_value(bx::kDeviceTypes, device, "--device");
  const std::string refusal = bx::precision_refusal(base.precision, base.device);
  if (!refusal.empty()) throw bx::ConfigError("--device " + device + ": precision " + refusal);
}

// The sweeps of a config, with --device applied.
std::vector<bx::NamedSweep> load(const std::string& config, const Parallel& p) {
  auto sweeps = bx::load_sweeps(config);
  if (p.device) {
    for (auto& named : sweeps) set_device(named.sweep.base, *p.device);
  }
  return sweeps;
}

// ------------------------------------------------------------ subcommands --
// Each subcommand: its arguments, add() declaring them to CLI11, and run().

// Set by the signals a sweep worker stops on (SIGTERM: scancel, a time
// limit, a preemption; SIGUSR1: Slurm's --signal ahead of it; SIGINT:
// Ctrl-C): the sweep checkpoints and gives back its running trials
// (sweep.h). The handler then steps aside (SA_RESETHAND): the same signal
// again ends the process at once.
std::atomic<int> stop_signal{0};

extern "C" void on_stop_signal(int signal) { stop_signal.store(signal); }

void catch_stop_signals() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  action.sa_flags = SA_RESETHAND | SA_RESTART;  // no system call of any thread fails with EINTR for it
  sigemptyset(&action.sa_mask);
  for (const int signal : {SIGTERM, SIGUSR1, SIGINT}) sigaction(signal, &action, nullptr);
}

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGINT: return "SIGINT";
    default: return "a signal";
  }
}

// --lease of sweep and slurm.
void add_lease(CLI::App* cmd, double& lease) {
  cmd->add_option("--lease", lease,
                  "seconds a worker's claim on a trial lives without its heartbeat before another worker sharing "
                  "the sweep folder takes the trial over from its last checkpoint (docs/cluster.md)")
      ->capture_default_str();
}

struct SweepCommand {
  std::string config, out = "runs", executor;
  int jobs = 1;
  double lease = 120;
  bool no_prune = false, extend_search = false, batch_trials = false, no_batch_trials = false;
  Parallel parallel;

  CLI::App* add(CLI::App& app) {
    auto* cmd = app.add_subcommand("sweep", "run (or resume) every trial of a sweep config, then its tables");
    cmd->add_option("CONFIG", config, "sweep config (JSON)")->required();
    cmd->add_option("--out", out, "output folder; the sweep goes to OUT/<name>/")->capture_default_str();
    add_jobs(cmd, jobs, "trials");
    auto* batch = cmd->add_flag("--batch-trials", batch_trials,
                                "train trials that differ only in rate and momentum as one stacked model (config: "
                                "runner.batch_trials; default: on for device cuda, off on CPUs, as measured)");
    cmd->add_flag("--no-batch-trials", no_batch_trials, "train every trial alone, on CUDA too")->excludes(batch);
    cmd->add_flag("--extend-search", extend_search,
                  "for each batch size whose best rate is the lowest or highest it tried, try one grid step "
                  "beyond, up to 3 rounds (kept in the folder's extensions.json)");
    cmd->add_flag("--no-prune", no_prune,
                  "run every trial to its end, even one that can no longer change the steps-to-target table "
                  "(config: runner.prune)");
    add_lease(cmd, lease);
    cmd->add_option("--executor", executor,
                    "R,W: file descriptors of a trial executor's pipes; it trains the trials, this program keeps "
                    "the sweep (bigbatch.sweep with train_data=... passes them; docs/python.md)");
    parallel.add_to(cmd);
    return cmd;
  }

  int run(int argc, char** argv) const {
    if (!(lease > 0)) throw bx::ConfigError("--lease: must be a number of seconds > 0, got " + bx::seconds_text(lease));
    std::unique_ptr<bx::TrialExecutor> trials_by;
    if (!executor.empty()) {
      trials_by = bx::open_executor(executor);
      std::signal(SIGPIPE, SIG_IGN);  // an executor gone shows as a write error, not a killed program
    }
    auto sweeps = load(config, parallel);  // every variant parsed before any runs
    for (auto& named : sweeps) {
      if (no_prune) named.sweep.runner.prune = false;
      if (batch_trials) named.sweep.runner.batch_trials = true;
      if (no_batch_trials) named.sweep.runner.batch_trials = false;
    }
    if (parallel.launcher()) {
      for (const auto& named : sweeps) bx::check_world(named.sweep, parallel.world_size());
      return bx::launch_local(parallel.launch, argc, argv);
    }
    const auto group = join(parallel, sweeps.front().sweep.base.device);
    for (const auto& named : sweeps) {  // a sharded variant in a world of one: refused before any runs
      if (!group && named.sweep.base.distributed.shard != bigbatch::distributed::ShardStage::kNone) {
        bx::check_world(named.sweep, 1);
      }
    }
    const bool writer = !group || group->rank() == 0;  // only rank 0 prints
    // A data-parallel sweep's ranks would stop at different steps: they keep
    // the signals' default (resume from the last periodic checkpoint).
    if (!group) catch_stop_signals();
    for (const auto& named : sweeps) {
      const std::string parent = (fs::path(out) / named.folder).parent_path().string();
      bx::SweepOptions options;
      options.out = parent;
      options.jobs = jobs;
      options.extend_search = extend_search ? 3 : 0;
      options.lease = lease;
      options.stop = group ? nullptr : &stop_signal;
      options.executor = trials_by.get();
      const bx::SweepSummary s = bx::run_sweep(named.sweep, options, group.get());
      if (s.interrupted != 0) {
        std::cerr << "bigbatch: stopped by " << signal_name(s.interrupted) << ": " << s.released
                  << " running trial(s) given back, checkpointed unless batched; the same command goes on from "
                  << "there (exit " << bx::kExitInterrupted << ")\n";
        return bx::kExitInterrupted;
      }
      if (!writer) continue;
      std::cout << bx::report(s.dir);
      std::cout << "sweep " << named.folder << ": " << s.trials << " trials (" << s.skipped << " resumed), "
                << s.reached << " reached the target, " << s.pruned << " pruned, " << s.wall_time
                << " s; results in " << s.dir << "\n";
    }
    if (writer) {
      const std::string top = (fs::path(out) / fs::path(sweeps.front().folder).begin()->string()).string();
      // The program as it was started: `bigbatch`, or a user's program over cli_main.
      std::cout << "plots: " << argv[0] << " plot " << top << "\n";
    }
    return 0;
  }
};

struct TrainCommand {
  std::string config, out = "runs";
  std::optional<std::int64_t> batch, steps;
  std::optional<double> lr;
  std::optional<std::uint64_t> seed;
  std::optional<std::string> variant;
  Parallel parallel;

  CLI::App* add(CLI::App& app) {
    auto* cmd = app.add_subcommand("train", "run one trial of a sweep config into OUT/<name>.train/<trial>/");
    cmd->add_option("CONFIG", config, "sweep config (JSON)")->required();
    cmd->add_option("--out", out, "output folder")->capture_default_str();
    cmd->add_option("--batch-size", batch, "batch size (default: the config's first)");
    cmd->add_option("--lr", lr, "base learning rate (default: the search's first point)");
    cmd->add_option("--seed", seed, "seed (default: the config's first)");
    cmd->add_option("--steps", steps, "cap the budget at this many steps");
    cmd->add_option("--variant", variant, "which variant of the config (default: the first)");
    parallel.add_to(cmd);
    return cmd;
  }

  // The config's sweep (its chosen variant) narrowed to the one trial.
  std::pair<bx::NamedSweep, bx::TrialConfig> narrowed() const {
    const auto sweeps = load(config, parallel);
    const auto chosen = std::find_if(sweeps.begin(), sweeps.end(), [&](const bx::NamedSweep& n) {
      return !variant || n.sweep.base.sweep == *variant;
    });
    if (chosen == sweeps.end()) throw bx::ConfigError("--variant: no variant named " + *variant);
    bx::NamedSweep named = *chosen;
    bx::SweepConfig& cfg = named.sweep;
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
    return {named, bx::expand(cfg).front()};
  }

  int run(int argc, char** argv) const {
    const auto [named, trial] = narrowed();
    const bx::SweepConfig& cfg = named.sweep;
    bx::check_world(cfg, parallel.launcher() ? parallel.world_size()
                                             : bigbatch::distributed::world_from_env().world_size);
    if (parallel.launcher()) return bx::launch_local(parallel.launch, argc, argv);
    const auto group = join(parallel, cfg.base.device);
    // The sweep's thread count per trial (and rank), so that the trial
    // computes what it computes in the sweep.
    bx::this_machine();  // the math check, measured before the trial (its summary.json records it)
    if (!group || group->rank() == 0) bx::warn_if_slow_math();
    const bx::WorkloadData data = bx::load_data(cfg);
    const int threads = static_cast<int>(cfg.runner.threads_per_trial);
    at::set_num_threads(threads);
    const std::string tdir = (fs::path(out) / (named.folder + ".train") / trial.name).string();
    bx::FolderHooks hooks;
    hooks.progress = [](const bx::TrialProgress& p) {
      std::cerr << "step " << p.step << "/" << p.budget << " loss " << p.loss << "\n";
    };
    const bx::TrialResult r = bx::run_one(trial, data, tdir, hooks, group.get());
    if (group && group->rank() != 0) return 0;
    std::cout << (group ? "data-parallel over " + std::to_string(group->size()) + " ranks (" +
                              bigbatch::distributed::backend_name(group->backend()) + ", " +
                              std::to_string(threads) + (threads == 1 ? " intra-op thread" : " intra-op threads") +
                              " per rank): "
                        : std::string())
              << trial.name << ": " << bx::to_string(r.status) << " after " << r.steps << " steps, best "
              << bx::to_string(trial.target.metric) << " " << r.best_metric << "; results in " << tdir << "\n";
    if (r.exchange.is_object()) {  // what the gradient exchange sent (rank 0's counts)
      const auto& x = r.exchange;
      const std::string sync = x.value("sync", "every_step");
      std::cout << (sync == "every_step" ? std::string("gradient exchange: ")
                                         : sync + " every " + std::to_string(x["every"].get<std::int64_t>()) +
                                               " steps, " + std::to_string(x["syncs"].get<std::int64_t>()) +
                                               " synchronizations: ")
                << x["compression"].get<std::string>() << ", "
                << bx::bytes_text(x["bytes_sent_per_step"].get<double>()) << " sent a step per rank (fp32"
                << (sync == "every_step" ? ": " : " synchronous: ")
                << bx::bytes_text(x["dense_bytes_per_step"].get<double>()) << ", ratio " << std::setprecision(3)
                << x["compression_ratio"].get<double>() << "), " << bx::bytes_text(x["bytes_sent"].get<double>())
                << " in all\n";
    }
    return 0;
  }
};

struct CbsCommand {
  std::string config, out = "runs";
  int jobs = 1;
  bool compare = false, no_plots = false;
  Parallel parallel;

  CLI::App* add(CLI::App& app) {
    auto* cmd = app.add_subcommand(
        "cbs", "measure the critical batch size over training (Merrill et al. 2025): a reference run, branches at "
               "each checkpoint, cbs.csv and the batch-size warmup it allows (schedule.json), then its plots");
    cmd->add_option("CONFIG", config, "cbs config (JSON)")->required();
    cmd->add_option("--out", out, "output folder; the run goes to OUT/<name>/")->capture_default_str();
    add_jobs(cmd, jobs, "branches");
    cmd->add_flag("--compare", compare,
                  "then train the derived warmup against the fixed reference batch and a fixed large batch to the "
                  "config's target (compare.csv)");
    cmd->add_flag("--no-plots", no_plots, "skip the plots");
    parallel.add_to(cmd);
    return cmd;
  }

  int run(int argc, char** argv) const {
    bx::CbsConfig c = bx::load_cbs(config);
    if (parallel.device) set_device(c.sweep.base, *parallel.device);
    if (parallel.launcher()) {
      bx::check_world(c.sweep, parallel.world_size());
      return bx::launch_local(parallel.launch, argc, argv);
    }
    const auto group = join(parallel, c.sweep.base.device);
    const bx::CbsSummary s = bx::run_cbs(c, {out, jobs, compare}, group.get());
    if (group && group->rank() != 0) return 0;
    std::cout << bx::cbs_report(s.dir);
    std::cout << "cbs " << c.sweep.base.sweep << ": " << s.branches << " branches (" << s.skipped << " resumed), "
              << s.wall_time << " s; results in " << s.dir << "\n";
    if (!no_plots) {
      run_plot_script({"--cbs", s.dir});
      std::cout << "plots in " << (fs::path(s.dir) / "plots").string() << "\n";
    }
    return 0;
  }
};

struct SlurmCommand {
  std::string config, out = "runs";
  int workers = 4, throttle = 0, gpus = 0, signal_seconds = 90;
  std::optional<int> cpus;
  std::optional<std::string> time, partition, device;
  double lease = 120;
  bool requeue = false, no_prune = false, extend_search = false;
  std::vector<std::string> sbatch_options;

  CLI::App* add(CLI::App& app) {
    auto* cmd = app.add_subcommand(
        "slurm", "submit a sweep as a Slurm job array of workers on one sweep folder, print the job id, and exit "
                 "(docs/cluster.md)");
    cmd->add_option("CONFIG", config, "sweep config (JSON)")->required();
    cmd->add_option("--out", out, "output folder, shared by the nodes (NFS, Lustre)")->capture_default_str();
    cmd->add_option("--workers", workers, "array tasks, each a `bigbatch sweep` worker")->capture_default_str();
    cmd->add_option("--throttle", throttle, "at most this many workers at once (default: all)");
    cmd->add_option("--time", time, "each worker's time limit (sbatch --time, e.g. 4:00:00)");
    cmd->add_option("--partition", partition, "the partition (sbatch --partition)");
    cmd->add_option("--cpus-per-worker", cpus,
                    "cores per worker; it runs cores / runner.threads_per_trial trials at once (default: one trial)");
    cmd->add_option("--gpus-per-worker", gpus, "GPUs per worker (sbatch --gres=gpu:N)")->capture_default_str();
    cmd->add_option("--device", device, "cpu or cuda (default: the config's device)")
        ->check(CLI::IsMember({"cpu", "cuda"}));
    cmd->add_option("--signal-seconds", signal_seconds,
                    "seconds before the time limit at which Slurm signals a worker to checkpoint and give back its "
                    "trials (sbatch --signal=B:USR1@N; 0: none)")
        ->capture_default_str();
    cmd->add_flag("--requeue", requeue, "a worker stopped by that signal requeues its array task");
    cmd->add_flag("--extend-search", extend_search, "as for sweep");
    cmd->add_flag("--no-prune", no_prune, "as for sweep");
    add_lease(cmd, lease);
    cmd->add_option("SBATCH_OPTIONS", sbatch_options, "further sbatch options, after --  (e.g. -- --account=abc)");
    return cmd;
  }

  int run() const {
    // Every argument is checked, and the config read, before sbatch is asked.
    if (workers < 1) throw bx::ConfigError("--workers: must be >= 1, got " + std::to_string(workers));
    if (throttle < 0) throw bx::ConfigError("--throttle: must be >= 0, got " + std::to_string(throttle));
    if (gpus < 0) throw bx::ConfigError("--gpus-per-worker: must be >= 0, got " + std::to_string(gpus));
    if (signal_seconds < 0) throw bx::ConfigError("--signal-seconds: must be >= 0, got " + std::to_string(signal_seconds));
    if (!(lease > 0)) throw bx::ConfigError("--lease: must be a number of seconds > 0, got " + bx::seconds_text(lease));
    const auto sweeps = bx::load_sweeps(config);
    const int threads = static_cast<int>(sweeps.front().sweep.runner.threads_per_trial);
    const int cores = cpus.value_or(threads);
    if (cores < threads) {
      throw bx::ConfigError("--cpus-per-worker: " + std::to_string(cores) + " is fewer than the config's " +
                            "runner.threads_per_trial, " + std::to_string(threads));
    }
    const auto sbatch = bx::find_on_path("sbatch");
    if (!sbatch) {
      throw bx::ConfigError("sbatch: not found on PATH (run this on a Slurm login node); nothing submitted");
    }
    const fs::path cwd = fs::current_path();
    const fs::path root = fs::absolute(out) / fs::path(sweeps.front().folder).begin()->string();
    const fs::path logs = root / "slurm";
    bx::check_folder(logs.string(), "--out");
    bx::SlurmJob job;
    job.program = fs::read_symlink("/proc/self/exe").string();
    job.workdir = cwd.string();
    job.name = "bigbatch-" + sweeps.front().sweep.base.sweep;
    job.log_folder = logs.string();
    job.worker_args = {"sweep", fs::absolute(config).string(), "--out", fs::absolute(out).string(),
                       "--jobs", std::to_string(cores / threads), "--lease", bx::seconds_text(lease)};
    if (device) job.worker_args.insert(job.worker_args.end(), {"--device", *device});
    if (no_prune) job.worker_args.push_back("--no-prune");
    if (extend_search) job.worker_args.push_back("--extend-search");
    job.workers = workers;
    job.throttle = throttle;
    job.cpus_per_worker = cores;
    job.gpus_per_worker = gpus;
    job.time = time;
    job.partition = partition;
    job.signal_seconds = signal_seconds;
    job.requeue = requeue;
    const fs::path script = logs / ("submit." + std::to_string(::getpid()) + ".sbatch");
    bx::write_file_atomic(script.string(), bx::batch_script(job));
    std::vector<std::string> argv{*sbatch, "--parsable"};
    argv.insert(argv.end(), sbatch_options.begin(), sbatch_options.end());
    argv.push_back(script.string());
    const bx::ProgramRun r = bx::run_program(argv);
    if (r.status != 0) {
      fs::remove(script);
      std::string why = r.err.empty() ? r.out : r.err;
      while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
      std::replace(why.begin(), why.end(), '\n', ' ');
      throw bx::ConfigError("sbatch refused the job (exit " + std::to_string(r.status) + "): " + why +
                            "; nothing submitted");
    }
    const std::string id = r.out.substr(0, r.out.find_first_of(";\n"));
    const fs::path kept = logs / (id + ".sbatch");
    fs::rename(script, kept);
    std::cout << "submitted job " << id << ": " << workers << " worker(s)"
              << (throttle > 0 && throttle < workers ? ", at most " + std::to_string(throttle) + " at once" : "")
              << ", " << cores << " core(s) each, on " << root.string() << "\n"
              << "script " << kept.string() << ", logs " << (logs / (id + "_<task>.out")).string() << "\n"
              << "follow it: squeue -j " << id << "; bigbatch report " << root.string() << " (once written)\n";
    return 0;
  }
};

struct PlotCommand {
  std::vector<std::string> dirs, labels;
  std::optional<std::string> out;

  CLI::App* add(CLI::App& app) {
    auto* cmd = app.add_subcommand(
        "plot", "write the plots of sweep folders (PNG, SVG, JSON points); several sweeps (a config's variants, "
                "or several DIRs) are also compared on one set of figures");
    cmd->add_option("DIR", dirs, "sweep folders, e.g. runs/quickstart, or a config's folder of variants")->required();
    cmd->add_option("--out", out,
                    "write only the comparison figures, here (needed with several DIRs; default: DIR/plots)");
    cmd->add_option("--labels", labels, "names of the compared sweeps, one per sweep folder (default: their names)")
        ->delimiter(',');
    return cmd;
  }

  int run() const { return plot(dirs, out, labels); }
};

struct ReportCommand {
  std::vector<std::string> dirs, labels;
  std::string format = "text";

  CLI::App* add(CLI::App& app) {
    auto* cmd = app.add_subcommand("report", "print the steps-to-target tables of sweep folders");
    cmd->add_option("DIR", dirs, "sweep folders, or a config's folder of variants")->required();
    cmd->add_option("--format", format,
                    "text (each table, then side by side), or markdown, csv, latex: the sweeps side by side, "
                    "steps per sweep and the ratio to the first")
        ->check(CLI::IsMember({"text", "markdown", "csv", "latex"}))
        ->capture_default_str();
    cmd->add_option("--labels", labels, "column names, one per sweep folder (default: their names)")->delimiter(',');
    return cmd;
  }

  int run() const { return report(dirs, bigbatch::config::enum_value(bx::kTableFormats, format, "--format"), labels); }
};

struct EnvCommand {
  bool json = false;

  CLI::App* add(CLI::App& app) {
    auto* cmd = app.add_subcommand(
        "env", "print what a bug report needs: versions, BLAS, MKL and oneDNN, the CPU and its vector "
               "instructions, threads, CUDA, NCCL and the GPUs; and measure one thread's matrix-product rate "
               "against the CPU's multiply-add peak (slow when below " +
                   std::to_string(static_cast<int>(100 * bx::kSlowMathFraction)) +
                   "%, or BIGBATCH_SLOW_MATH_BELOW)");
    cmd->add_flag("--json", json, "print it as JSON");
    return cmd;
  }

  int run() const {
    const bx::MachineInfo& machine = bx::this_machine();
    std::cout << (json ? bx::to_json(machine).dump(2) + "\n" : bx::env_report(machine));
    return 0;
  }
};

// The splits of a config's dataset as tensors, for a Python process that
// trains the same data (bigbatch.datasets; docs/python.md "Two executors,
// one folder"). Every example as evaluation reads it: no augmentation.
struct DataCommand {
  std::string config, save;

  CLI::App* add(CLI::App& app) {
    auto* cmd = app.add_subcommand("data", "save a sweep config's training and validation splits as one file of "
                                           "tensors (torch.load reads it: a tuple of train input, train target, "
                                           "validation input, validation target)");
    cmd->add_option("CONFIG", config, "sweep config (JSON)")->required();
    cmd->add_option("--save", save, "the file to write")->required();
    return cmd;
  }

  int run() const {
    const auto sweeps = bx::load_sweeps(config);
    const bx::WorkloadData data = bx::load_data(sweeps.front().sweep);
    // A tuple: torch.load(weights_only=True) takes it (a typed dict carries
    // a type tag it refuses).
    std::vector<c10::IValue> splits;
    for (const auto* examples : {data.train.get(), data.validation.get()}) {
      const bx::Batch all = examples->range(0, examples->size());
      splits.emplace_back(all.input.contiguous());
      splits.emplace_back(all.target.contiguous());
    }
    const std::vector<char> bytes = torch::pickle_save(c10::ivalue::Tuple::create(std::move(splits)));
    bx::write_file_atomic(save, std::string(bytes.begin(), bytes.end()));
    return 0;
  }
};

// The command line, parsed; the chosen subcommand's exit code.
int run(int argc, char** argv) {
  CLI::App app{"bigbatch: batch size against steps to target, on LibTorch"};
  app.require_subcommand(1);
  SweepCommand sweep;
  TrainCommand train;
  CbsCommand cbs;
  PlotCommand plot;
  ReportCommand report;
  SlurmCommand slurm;
  EnvCommand env;
  DataCommand data;
  const CLI::App* chosen[] = {sweep.add(app), train.add(app), cbs.add(app), plot.add(app), report.add(app),
                              slurm.add(app), env.add(app), data.add(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << "bigbatch: " << e.what() << " (see bigbatch --help)\n";
    return 2;
  }
  if (*chosen[0]) return sweep.run(argc, argv);
  if (*chosen[1]) return train.run(argc, argv);
  if (*chosen[2]) return cbs.run(argc, argv);
  if (*chosen[3]) return plot.run();
  if (*chosen[5]) return slurm.run();
  if (*chosen[6]) return env.run();
  if (*chosen[7]) return data.run();
  return report.run();
}

}  // namespace

namespace bigbatch::experiments {

int cli_main(int argc, char** argv) {
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

}  // namespace bigbatch::experiments
