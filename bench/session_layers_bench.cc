// Session layers on a workspace of 10,000 files (100 directories of 100
// files, ~2 KiB each) of which 100 changed:
//   - snapshot of the upper layer (overlay mode; target <= 100 ms), its
//     verification, and the diff against the base;
//   - the same in copy mode (a full copy of the workspace), for contrast.
// Absolute figures per operation; asserts nothing.
//
//   session_layers_bench [benchmark flags]   (fixtures under $TMPDIR or /tmp)
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "session/layers.h"

namespace {

namespace fs = std::filesystem;
using agentbox::session::LayerStack;

constexpr int kDirs = 100;
constexpr int kFilesPerDir = 100;
constexpr int kChanged = 100;

std::string g_root;  // holds base/, upper/, copy/, snaps/

std::string FileText(int dir, int file, bool changed) {
  std::string text;
  for (int line = 0; line < 40; ++line) {
    text += "dir " + std::to_string(dir) + " file " + std::to_string(file) + " line " + std::to_string(line);
    text += (changed && line == 20) ? " CHANGED\n" : " ........................\n";
  }
  return text;
}

std::string FileName(int dir, int file) {
  return "d" + std::to_string(dir) + "/f" + std::to_string(file) + ".txt";
}

void Put(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// The base; an upper layer holding the 100 changed files (as overlayfs would
// after copy-up: full files under their directories); a full copy with the
// same 100 changes for copy mode.
void MakeFixture() {
  const char* tmp = getenv("TMPDIR");
  std::string tmpl = std::string(tmp ? tmp : "/tmp") + "/agentbox-layers-bench.XXXXXX";
  g_root = mkdtemp(tmpl.data());
  for (int d = 0; d < kDirs; ++d) {
    for (int f = 0; f < kFilesPerDir; ++f) Put(g_root + "/base/" + FileName(d, f), FileText(d, f, false));
  }
  fs::copy(g_root + "/base", g_root + "/copy", fs::copy_options::recursive);
  for (int i = 0; i < kChanged; ++i) {
    int d = i, f = (i * 37) % kFilesPerDir;  // one per directory
    Put(g_root + "/upper/" + FileName(d, f), FileText(d, f, true));
    Put(g_root + "/copy/" + FileName(d, f), FileText(d, f, true));
  }
  fs::create_directories(g_root + "/snaps");
}

LayerStack Overlay() { return {g_root + "/base", {}, g_root + "/upper"}; }
LayerStack Copy() { return {g_root + "/base", {}, g_root + "/copy", /*copy_mode=*/true}; }

void Snapshot(benchmark::State& state, const LayerStack& stack) {
  int n = 0;
  for (auto _ : state) {
    const std::string dest = g_root + "/snaps/s" + std::to_string(n++);
    auto m = agentbox::session::CreateSnapshot(stack, "", dest);
    if (!m.ok()) {
      state.SkipWithError(m.status().ToString().c_str());
      break;
    }
    state.PauseTiming();
    fs::remove_all(dest);
    state.ResumeTiming();
  }
}

void BM_SnapshotOverlay100Changed(benchmark::State& state) { Snapshot(state, Overlay()); }
void BM_SnapshotCopyMode10kFiles(benchmark::State& state) { Snapshot(state, Copy()); }

void BM_VerifySnapshotOverlay(benchmark::State& state) {
  const std::string dest = g_root + "/snaps/verify";
  fs::remove_all(dest);
  if (!agentbox::session::CreateSnapshot(Overlay(), "", dest).ok()) {
    state.SkipWithError("snapshot failed");
    return;
  }
  for (auto _ : state) {
    agentbox::Status s = agentbox::session::VerifySnapshot(dest);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
  }
  fs::remove_all(dest);
}

void Diff(benchmark::State& state, const LayerStack& stack) {
  std::size_t files = 0, patch = 0;
  for (auto _ : state) {
    auto d = agentbox::session::ComputeDiff(stack, 16 << 20);
    if (!d.ok()) {
      state.SkipWithError(d.status().ToString().c_str());
      break;
    }
    files = (*d)["files"].size();
    patch = (*d)["patch"].get_ref<const std::string&>().size();
  }
  state.counters["files"] = static_cast<double>(files);
  state.counters["patch_bytes"] = static_cast<double>(patch);
}

void BM_DiffOverlay100Changed(benchmark::State& state) { Diff(state, Overlay()); }
void BM_DiffCopyMode10kFiles(benchmark::State& state) { Diff(state, Copy()); }

BENCHMARK(BM_SnapshotOverlay100Changed)->Unit(benchmark::kMillisecond)->MinTime(2.0)->UseRealTime();
BENCHMARK(BM_VerifySnapshotOverlay)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();
BENCHMARK(BM_DiffOverlay100Changed)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();
BENCHMARK(BM_SnapshotCopyMode10kFiles)->Unit(benchmark::kMillisecond)->MinTime(2.0)->UseRealTime();
BENCHMARK(BM_DiffCopyMode10kFiles)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  MakeFixture();
  std::printf("workspace: %d files in %d directories, %d changed; fixtures in %s\n", kDirs * kFilesPerDir, kDirs,
              kChanged, g_root.c_str());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  fs::remove_all(g_root);
  return 0;
}
