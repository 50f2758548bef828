// The `bigbatch` program: the command line of cli.h over the built-in
// workloads.
#include "cli.h"

int main(int argc, char** argv) { return bigbatch::experiments::cli_main(argc, argv); }
