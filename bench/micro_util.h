// Shared parts of the micro-benchmarks (bench/micro_*.cpp): one Vulkan context, buffers, random
// data, error measures, and GPU-timestamp timing of a recorded op.
//
// Timing: `copies` calls of an op are recorded in one command buffer, each followed by a barrier,
// each reading its own copy of the inputs (so repeated calls stream from memory, not from cache);
// a benchmark iteration submits that buffer once and reports the median per-call GPU time
// (manual time). Counters: bytes_per_second from the bytes the op declares.
#pragma once
#include <benchmark/benchmark.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/vulkan/context.h"
#include "runtime/vulkan/memory.h"
#include "runtime/vulkan/recorder.h"
#include "runtime/vulkan/transfer.h"

namespace tessera::microbench {

struct Gpu {
  std::unique_ptr<vk::Context> ctx;
  std::unique_ptr<vk::MemoryPool> local;
  std::unique_ptr<vk::Transfer> xfer;
  std::string why;  // why there is no context (ctx null)
};
// The process-wide device (the best one); ctx is null when none is usable.
Gpu& gpu();

// Device-local buffers: filled from the host / read back.
vk::Buffer upload(Gpu& g, const void* data, size_t bytes, const std::string& name);
vk::Buffer make_buffer(Gpu& g, size_t bytes, const std::string& name);
std::vector<float> download(Gpu& g, const vk::Buffer& b, size_t n_floats);

// Random floats of varied magnitude (groups of 16 scaled by exp(U(-2, 2))).
std::vector<float> random_floats(std::mt19937& rng, size_t n, float scale = 1.f);

// ||got - want|| / ||want|| (L2); infinity when a value is not finite or the sizes differ.
double rel_error(const std::vector<float>& got, const std::vector<double>& want);

// How many copies of an input of `bytes` to rotate through so that they exceed the device's
// caches (about 256 MiB in all on a GPU, 16 MiB on a CPU device), between 2 and 64.
uint32_t copies_for(const Gpu& g, uint64_t bytes);

// Records record(rec, copy) for copy < copies, each followed by a barrier, with timestamps.
// run_timed() submits it and returns the median GPU microseconds of one call.
class TimedOps {
 public:
  TimedOps(Gpu& g, uint32_t copies, const std::function<void(vk::CommandRecorder&, uint32_t)>& record);
  double run_timed();
  uint32_t copies() const { return copies_; }

 private:
  std::unique_ptr<vk::CommandRecorder> rec_;
  uint32_t copies_;
};

// The benchmark loop: per iteration run_timed() as the manual time; sets bytes_per_second from
// `bytes_per_call`, and "us_per_call".
void time_loop(benchmark::State& state, TimedOps& ops, uint64_t bytes_per_call);

// Skips the benchmark (state.SkipWithError) when there is no device; returns false then.
bool require_gpu(benchmark::State& state, Gpu& g);

}  // namespace tessera::microbench
