// The coordination a sweep worker pays per trial on a shared folder
// (experiments/cluster/claims.h): claim + commit of a trial nobody holds, the look at
// a trial another worker holds (what a waiting worker pays per poll), a
// release, the listing of 1,000 trials' announcements and the look at the
// claims folder's mtime; against write_file_atomic of a summary.json-sized file, the
// cheapest write a trial already makes. Run in the temporary folder ($TMPDIR,
// else /tmp), or in the folder BIGBATCH_BENCH_DIR names (an NFS mount, say).
#include "../experiments/cluster/claims.h"
#include "../experiments/io/files.h"

#include <benchmark/benchmark.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>

namespace {

namespace bx = bigbatch::experiments;

// A fresh folder for one benchmark, removed with it.
struct Folder {
  std::string path;
  Folder() {
    const char* where = std::getenv("BIGBATCH_BENCH_DIR");
    const char* tmp = std::getenv("TMPDIR");
    path = std::string(where != nullptr ? where : (tmp != nullptr ? tmp : "/tmp")) + "/bm_claims." +
           std::to_string(::getpid()) + "." + std::to_string(counter++);
    bx::remove_tree(path);
    bx::write_file_atomic(path + ".probe", "");  // the parent is writable
    ::unlink((path + ".probe").c_str());
    ::mkdir(path.c_str(), 0755);
  }
  ~Folder() { bx::remove_tree(path); }
  static inline int counter = 0;
};

// A trial nobody holds: taken and its result committed (3 slot files'
// worth of work: a temporary, its link, its unlink, twice).
void BM_ClaimAndCommit(benchmark::State& state) {
  Folder folder;
  bx::ClaimBoard board(folder.path, 120);
  std::int64_t i = 0;
  for (auto _ : state) {
    const std::string trial = "b64_p" + std::to_string(i++) + "_s0";
    if (board.try_claim(trial, false) != bx::ClaimBoard::State::kClaimed || !board.commit(trial)) {
      state.SkipWithError("a free trial was not claimed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ClaimAndCommit)->Unit(benchmark::kMicrosecond);

// Claimed, then given back (a preempted worker's release).
void BM_ClaimAndRelease(benchmark::State& state) {
  Folder folder;
  bx::ClaimBoard board(folder.path, 120);
  std::int64_t i = 0;
  for (auto _ : state) {
    const std::string trial = "b64_p" + std::to_string(i++) + "_s0";
    board.try_claim(trial, false);
    board.release(trial);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ClaimAndRelease)->Unit(benchmark::kMicrosecond);

// A trial a live worker holds: read its slot, find it busy.
void BM_LookAtABusyTrial(benchmark::State& state) {
  Folder folder;
  bx::ClaimBoard holder(folder.path, 120), looker(folder.path, 120);
  holder.try_claim("b64_p0_s0", false);
  for (auto _ : state) {
    if (looker.try_claim("b64_p0_s0", false) != bx::ClaimBoard::State::kBusy) {
      state.SkipWithError("a held trial was taken");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_LookAtABusyTrial)->Unit(benchmark::kMicrosecond);

// What a worker reads to learn the others' results: one listing of the
// claims folder of a sweep of 1,000 trials, each with its run and done slots
// and its announcement.
void BM_ListAnnouncementsOf1000Trials(benchmark::State& state) {
  Folder folder;
  bx::ClaimBoard board(folder.path, 120);
  for (int i = 0; i < 1000; ++i) {
    const std::string trial = "b64_p" + std::to_string(i) + "_s0";
    board.try_claim(trial, false);
    board.commit(trial);
    board.announce(trial);
  }
  for (auto _ : state) {
    if (board.announced().size() != 1000) {
      state.SkipWithError("not every announcement listed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ListAnnouncementsOf1000Trials)->Unit(benchmark::kMicrosecond);

// Whether the claims folder changed (one open and fstat): asked before each
// step of a running trial, at most every 0.2 s.
void BM_FolderChanged(benchmark::State& state) {
  Folder folder;
  bx::ClaimBoard board(folder.path, 120);
  for (auto _ : state) benchmark::DoNotOptimize(board.changed());
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_FolderChanged)->Unit(benchmark::kMicrosecond);

// The peer: a trial's summary.json (about 2 KB) written through a temporary
// and a rename, as every trial does once anyway.
void BM_WriteSummaryAtomically(benchmark::State& state) {
  Folder folder;
  const std::string text(2048, 'x');
  for (auto _ : state) bx::write_file_atomic(folder.path + "/summary.json", text);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_WriteSummaryAtomically)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
