// Shared parts of the micro-benchmarks. See micro_util.h.
#include "bench/micro_util.h"

#include <algorithm>
#include <cmath>

#include "format/error.h"

namespace tessera::microbench {

Gpu& gpu() {
  static Gpu g = [] {
    Gpu r;
    try {
      r.ctx = std::make_unique<vk::Context>();
      r.local = std::make_unique<vk::MemoryPool>(r.ctx->device(), vk::MemoryKind::DeviceLocal, 256ull << 20);
      r.xfer = std::make_unique<vk::Transfer>(r.ctx->device());
    } catch (const Error& e) {
      r.ctx.reset();
      r.why = e.what();
    }
    return r;
  }();
  return g;
}

vk::Buffer make_buffer(Gpu& g, size_t bytes, const std::string& name) {
  return g.local->create_buffer(std::max<size_t>((bytes + 15) / 16 * 16, 16), name);
}

vk::Buffer upload(Gpu& g, const void* data, size_t bytes, const std::string& name) {
  vk::Buffer b = make_buffer(g, bytes, name);
  g.xfer->upload(b, 0, data, bytes);
  g.xfer->finish();
  return b;
}

std::vector<float> download(Gpu& g, const vk::Buffer& b, size_t n_floats) {
  std::vector<float> v(n_floats);
  g.xfer->download(b, 0, v.data(), n_floats * 4);
  return v;
}

std::vector<float> random_floats(std::mt19937& rng, size_t n, float scale) {
  std::uniform_real_distribution<float> u(-1.f, 1.f), e(-2.f, 2.f);
  std::vector<float> v(n);
  float group = 1;
  for (size_t i = 0; i < n; ++i) {
    if (i % 16 == 0) group = std::exp(e(rng));
    v[i] = scale * group * u(rng);
  }
  return v;
}

double rel_error(const std::vector<float>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

uint32_t copies_for(const Gpu& g, uint64_t bytes) {
  const uint64_t target = g.ctx->info().type == VK_PHYSICAL_DEVICE_TYPE_CPU ? 16ull << 20 : 256ull << 20;
  return uint32_t(std::clamp<uint64_t>((target + bytes - 1) / std::max<uint64_t>(bytes, 1), 2, 64));
}

TimedOps::TimedOps(Gpu& g, uint32_t copies, const std::function<void(vk::CommandRecorder&, uint32_t)>& record)
    : copies_(copies) {
  rec_ = std::make_unique<vk::CommandRecorder>(*g.ctx, vk::RecorderOptions{.timestamps = true});
  rec_->begin();
  for (uint32_t c = 0; c < copies; ++c) {
    record(*rec_, c);
    rec_->barrier();
  }
  rec_->end();
}

double TimedOps::run_timed() {
  rec_->run();
  const std::vector<vk::DispatchTiming> t = rec_->timings();
  if (t.empty()) runtime_error("micro-benchmark: the device returned no timestamps");
  // An op may record several dispatches: sum them per copy, then take the median copy.
  const size_t per_copy = t.size() / copies_;
  std::vector<double> us;
  for (uint32_t c = 0; c < copies_; ++c) {
    double s = 0;
    for (size_t k = 0; k < per_copy; ++k) s += t[c * per_copy + k].microseconds;
    us.push_back(s);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

void time_loop(benchmark::State& state, TimedOps& ops, uint64_t bytes_per_call) {
  ops.run_timed();  // warm-up
  double total_us = 0;
  for (auto _ : state) {
    const double us = ops.run_timed();
    total_us += us;
    state.SetIterationTime(us * 1e-6);
  }
  state.counters["bytes_per_second"] =
      benchmark::Counter(double(bytes_per_call), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["us_per_call"] = state.iterations() ? total_us / double(state.iterations()) : 0;
}

bool require_gpu(benchmark::State& state, Gpu& g) {
  if (g.ctx) return true;
  state.SkipWithError(("no usable Vulkan device: " + g.why).c_str());
  return false;
}

}  // namespace tessera::microbench
