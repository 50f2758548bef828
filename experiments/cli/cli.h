// The whole bigbatch command line as one function, for a program of your
// own that registers its workloads (workload.h) first:
//
//   int main(int argc, char** argv) {
//     bigbatch::experiments::register_dataset({...});
//     bigbatch::experiments::register_model({...});
//     return bigbatch::experiments::cli_main(argc, argv);
//   }
//
// Every subcommand and flag of `bigbatch` (sweep, train, cbs, plot, report;
// `--help`) works as documented in docs/experiments.md. Pass argv as main
// received it: `--nproc` starts the ranks by running argv[0] again.
#pragma once

namespace bigbatch::experiments {

/// Runs the command line; the exit code: 0 success, 2 a bad config or
/// argument (one line on stderr, before any training), 1 a failure. Never
/// calls exit().
int cli_main(int argc, char** argv);

}  // namespace bigbatch::experiments
