// The two pieces of Slurm's environment a task of `srun` needs decoded to
// join a data-parallel job as torchrun's ranks do (world_from_env,
// process_group.h): the first host of a node list (rank 0's, the
// rendezvous) and the tasks a node runs. Torch-free, header-only.
#pragma once

#include <cctype>
#include <cstddef>
#include <stdexcept>
#include <string>

namespace bigbatch::distributed {

/// The first host of a Slurm node list, as `scontrol show hostnames`
/// would print it first: "node[07-09,12],gpu1" -> "node07" (zero padding
/// kept), "a[1-2]-ib" -> "a1-ib", "solo" -> "solo". Throws
/// std::invalid_argument on an empty list or an unclosed bracket.
inline std::string first_slurm_host(const std::string& nodelist) {
  std::string host;
  std::size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    if (nodelist[i] != '[') {
      host += nodelist[i++];
      continue;
    }
    const std::size_t close = nodelist.find(']', i);
    if (close == std::string::npos) throw std::invalid_argument("node list \"" + nodelist + "\": unclosed '['");
    // A range list: its first item, and of a range its start.
    const std::string ranges = nodelist.substr(i + 1, close - i - 1);
    host += ranges.substr(0, ranges.find_first_of(",-"));
    i = close + 1;
  }
  if (host.empty()) throw std::invalid_argument("node list \"" + nodelist + "\": no host");
  return host;
}

/// How many tasks node `node` runs, from a tasks-per-node list such as
/// SLURM_STEP_TASKS_PER_NODE="2(x3),1" (nodes 0-2 run 2, node 3 runs 1).
/// Throws std::invalid_argument on a list it cannot read or a node past it.
inline int slurm_tasks_on_node(const std::string& spec, int node) {
  std::size_t i = 0;
  int first = 0;  // the index of the next entry's first node
  const auto fail = [&] { return std::invalid_argument("tasks per node \"" + spec + "\": cannot read it"); };
  while (i < spec.size()) {
    std::size_t used = 0;
    if (!std::isdigit(static_cast<unsigned char>(spec[i]))) throw fail();
    const int tasks = std::stoi(spec.substr(i), &used);
    i += used;
    int repeat = 1;
    if (i < spec.size() && spec[i] == '(') {
      if (spec.compare(i, 2, "(x") != 0) throw fail();
      repeat = std::stoi(spec.substr(i + 2), &used);
      i += 2 + used;
      if (i >= spec.size() || spec[i] != ')') throw fail();
      ++i;
    }
    if (node < first + repeat) return tasks;
    first += repeat;
    if (i < spec.size()) {
      if (spec[i] != ',') throw fail();
      ++i;
    }
  }
  throw std::invalid_argument("tasks per node \"" + spec + "\": no entry for node " + std::to_string(node));
}

}  // namespace bigbatch::distributed
