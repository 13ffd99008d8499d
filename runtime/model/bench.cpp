// `tessera bench`: the test grid on the Vulkan runtime or the CPU reference. See bench.h.
#include "format/version.h"
#include "runtime/model/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <thread>

#include "format/error.h"
#include "format/gguf.h"
#include "format/model_config.h"
#include "format/tsr.h"
#include "runtime/cpu/forward.h"
#include "runtime/cpu/weight_source.h"
#include "runtime/model/gpu_model.h"
#include "runtime/vulkan/context.h"

namespace tessera::model {
namespace {

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Deterministic, spread-out token ids (the speed of a step does not depend on which ids).
std::vector<int32_t> bench_tokens(uint32_t n, uint32_t first, uint32_t n_vocab) {
  std::vector<int32_t> t(n);
  for (uint32_t i = 0; i < n; ++i) t[i] = int32_t((uint64_t(first + i) * 2654435761ull + 12345) % n_vocab);
  return t;
}

bool file_is_tsr(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) bad_input(path, ": cannot open the model file");
  uint8_t magic[8] = {};
  in.read(reinterpret_cast<char*>(magic), sizeof magic);
  return is_tsr_magic(std::span<const uint8_t>(magic, size_t(in.gcount())));
}

// "q4_0 93.1 %, f32 2.7 %" from bytes per type; also the total.
std::string types_summary(const std::map<std::string, uint64_t>& bytes, uint64_t& total) {
  total = 0;
  for (const auto& [t, b] : bytes) total += b;
  std::vector<std::pair<uint64_t, std::string>> order;
  for (const auto& [t, b] : bytes) order.push_back({b, t});
  std::sort(order.rbegin(), order.rend());
  std::string s;
  char buf[64];
  for (const auto& [b, t] : order) {
    std::snprintf(buf, sizeof buf, "%s%s %.1f %%", s.empty() ? "" : ", ", t.c_str(), total ? 100.0 * b / total : 0.0);
    s += buf;
  }
  return s;
}

// Weight types, composition and name of a model file, for the header.
void describe_file(const std::string& path, bool tsr, BenchHeader& h) {
  std::map<std::string, uint64_t> bytes;
  auto has = [&](auto& file, const std::string& n) { return file.find_tensor(n) != nullptr; };
  bool qk = false, vo = false;
  if (tsr) {
    const TsrFile f = TsrFile::open(path);
    for (const TsrTensor& t : f.tensors()) {
      if (t.layout == TsrLayout::MoeTile1) {
        const MoeTileGeometry g = t.moe_tile();
        bytes[type_name(g.gateup_type)] += g.n_expert * g.down_offset;
        bytes[type_name(g.down_type)] += g.n_expert * (g.slot_stride - g.down_offset);
        if (g.has_shared()) {
          bytes[type_name(g.shared_gateup_type)] += g.shared_down_offset - g.shared_gateup_offset;
          bytes[type_name(g.shared_down_type)] += g.total_bytes - g.shared_down_offset;
        }
      } else {
        bytes[type_name(t.type)] += t.nbytes;
      }
    }
    qk = has(f, "blk.0.attn_qk.weight");
    vo = has(f, "blk.0.attn_vo.weight");
    h.model_name = f.metadata().get_string("general.name").value_or("");
  } else {
    const GgufFile f = GgufFile::open(path);
    for (const GgufTensorInfo& t : f.tensors()) bytes[type_name(t.type)] += t.nbytes;
    qk = has(f, "blk.0.attn_qk.weight");
    vo = has(f, "blk.0.attn_vo.weight");
    h.model_name = f.metadata().get_string("general.name").value_or("");
  }
  h.types = types_summary(bytes, h.model_bytes);
  h.composition = qk && vo ? "qk+vo" : qk ? "qk" : vo ? "vo" : "none";
}

// One backend under test: keeps the cache at a depth, runs prefill and decode.
class Target {
 public:
  virtual ~Target() = default;
  // Makes the cache hold exactly `depth` positions (filling it untimed when it holds fewer).
  virtual void set_depth(uint32_t depth) = 0;
  virtual void prefill(std::span<const int32_t> tokens) = 0;
  // Decodes n tokens, each fed the one before (forced: fed forced[i] instead); returns the
  // sampled ones.
  virtual std::vector<int32_t> decode(uint32_t n, const std::vector<int32_t>* forced) = 0;
};

constexpr uint32_t kFillChunk = 256;

class GpuTarget : public Target {
 public:
  explicit GpuTarget(GpuModel& m) : m_(m) {}
  // Keeps the fill's positions only (a test's tokens past them are dropped), so the cache at a
  // depth holds what the CPU target's refill gives: the fill's token at a position depends on
  // the position alone.
  void set_depth(uint32_t depth) override {
    m_.rewind(std::min(depth, filled_));
    while (uint32_t(m_.n_past()) < depth) {
      const uint32_t n = std::min(kFillChunk, depth - uint32_t(m_.n_past()));
      m_.forward(bench_tokens(n, uint32_t(m_.n_past()), m_.n_vocab()), true);
    }
    filled_ = depth;
  }
  void prefill(std::span<const int32_t> tokens) override { m_.forward(tokens, true); }
  std::vector<int32_t> decode(uint32_t n, const std::vector<int32_t>* forced) override {
    std::vector<int32_t> ids;
    ids.reserve(n);
    m_.decode_steps(n, forced ? std::span<const int32_t>(*forced) : std::span<const int32_t>(), [&](int32_t t) {
      ids.push_back(t);
      return true;
    });
    return ids;
  }

 private:
  GpuModel& m_;
  uint32_t filled_ = 0;  // positions 0 .. filled_ - 1 hold the fill's tokens
};

class CpuTarget : public Target {
 public:
  explicit CpuTarget(CpuModel& m) : m_(m) {}
  void set_depth(uint32_t depth) override {
    if (uint32_t(m_.n_past()) > depth) m_.reset();  // no rewind on the CPU model: refill
    while (uint32_t(m_.n_past()) < depth) {
      const uint32_t n = std::min(kFillChunk, depth - uint32_t(m_.n_past()));
      last_ = m_.forward(bench_tokens(n, uint32_t(m_.n_past()), m_.n_vocab()), true);
    }
  }
  void prefill(std::span<const int32_t> tokens) override { last_ = m_.forward(tokens, true); }
  std::vector<int32_t> decode(uint32_t n, const std::vector<int32_t>* forced) override {
    std::vector<int32_t> ids(n);
    for (uint32_t i = 0; i < n; ++i) {
      int32_t next = 0;
      if (forced) next = (*forced)[i];
      else if (!last_.empty()) next = int32_t(std::max_element(last_.begin(), last_.end()) - last_.begin());
      last_ = m_.forward(std::span<const int32_t>(&next, 1), true);
      ids[i] = int32_t(std::max_element(last_.begin(), last_.end()) - last_.begin());
    }
    return ids;
  }

 private:
  CpuModel& m_;
  std::vector<float> last_;
};

void say(const BenchOptions& o, const std::string& s) {
  if (o.log) o.log(s);
}

constexpr uint32_t kMaxWarmupRuns = 1000;

// Runs every test of the grid on `t`, depths ascending: per test the warm-up runs
// (BenchOptions::warmup_seconds), then the timed ones.
std::vector<BenchResult> run_grid(const BenchOptions& o, Target& t, uint32_t n_vocab) {
  std::vector<uint32_t> depths = o.depths;
  std::sort(depths.begin(), depths.end());
  depths.erase(std::unique(depths.begin(), depths.end()), depths.end());
  std::vector<BenchResult> out;
  for (uint32_t d : depths) {
    if (d > 0) say(o, cat("filling the cache to depth ", d, " (untimed)"));
    t.set_depth(d);
    auto run_test = [&](const char* kind, uint32_t n) {
      BenchResult r;
      r.kind = kind;
      r.n_tokens = n;
      r.depth = d;
      say(o, cat("running ", r.name(), " (warm-up + ", o.repetitions, " runs)"));
      const std::vector<int32_t> prompt = bench_tokens(n, 7 * d + 1, n_vocab);
      const std::vector<int32_t> forced = bench_tokens(n, 11 * d + 3, n_vocab);
      uint64_t digest = 0xcbf29ce484222325ull;  // FNV-1a over the timed runs' token ids
      auto run_once = [&](std::vector<int32_t>& ids) {
        t.set_depth(d);
        const double t0 = now_s();
        if (r.kind == "pp") t.prefill(prompt);
        else ids = t.decode(n, o.forced_tokens ? &forced : nullptr);
        return now_s() - t0;
      };
      // A greedy decode (no forced tokens) starts from the token the run before it sampled: its
      // warm-up is one run, so that the timed runs' tokens (the digest) do not depend on timing.
      const bool warm_by_time = r.kind == "pp" || o.forced_tokens;
      // The first run carries one-time costs (a recording's first use: 0.6 s for a 16-token
      // prefill on the H100), so the warm-up's seconds count from the second.
      std::vector<int32_t> ids, first_ids;
      // Forced inputs: every run must decode the first run's ids (BenchResult::runs_differ).
      const bool same_ids = r.kind == "tg" && o.forced_tokens;
      auto check_ids = [&] {
        if (same_ids && ids != first_ids) ++r.runs_differ;
      };
      run_once(ids);
      first_ids = ids;
      r.warmup_runs = 1;
      for (double warm = 0; warm_by_time && warm < o.warmup_seconds && r.warmup_runs < kMaxWarmupRuns; ++r.warmup_runs) {
        warm += run_once(ids);
        check_ids();
      }
      for (int rep = 0; rep < o.repetitions; ++rep) {
        r.seconds.push_back(run_once(ids));
        check_ids();
        for (int32_t id : ids)
          for (int b = 0; b < 4; ++b) digest = (digest ^ ((uint32_t(id) >> (8 * b)) & 0xffu)) * 0x100000001b3ull;
      }
      if (r.kind == "tg") r.ids_digest = digest;
      if (r.runs_differ)
        std::fprintf(stderr, "bench: warning: %s: %u of %u runs decoded other token ids than the first from the same "
                     "forced inputs (a nondeterministic decode: a race between kernels?)\n",
                     r.name().c_str(), r.runs_differ, r.warmup_runs + o.repetitions);
      std::vector<double> tps;
      for (double s : r.seconds) tps.push_back(s > 0 ? n / s : 0);
      double sum = 0, sq = 0;
      for (double v : tps) sum += v;
      r.tps_mean = sum / tps.size();
      for (double v : tps) sq += (v - r.tps_mean) * (v - r.tps_mean);
      r.tps_stddev = tps.size() > 1 ? std::sqrt(sq / (tps.size() - 1)) : 0;
      r.tps_median = median(tps);
      out.push_back(std::move(r));
    };
    for (uint32_t p : o.prompt_sizes)
      if (p) run_test("pp", p);
    for (uint32_t n : o.decode_sizes)
      if (n) run_test("tg", n);
  }
  return out;
}

// Profiles one decoded token per depth (GpuModel::profile_step: the step recorded with timestamps)
// and, where the context leaves room, one prefill chunk (GpuModel::profile_prefill).
std::vector<TokenProfile> run_profiles(const BenchOptions& o, GpuModel& m, double read_gbps) {
  std::vector<uint32_t> depths = o.depths;
  std::sort(depths.begin(), depths.end());
  depths.erase(std::unique(depths.begin(), depths.end()), depths.end());
  GpuTarget t(m);
  std::vector<TokenProfile> out;
  const int reps = std::max(o.repetitions, 1);
  // A warm-up, then `reps` profiled runs of one recording; each run's host time from submit to done
  // is the measured time (timestamps on) the kernel times are held against.
  auto profile = [&](const auto& run_once, uint32_t d) {
    std::vector<std::vector<vk::DispatchTiming>> steps;
    std::vector<double> wall_us;
    run_once(nullptr);
    for (int r = 0; r < reps; ++r) {
      double wall = 0;
      steps.push_back(run_once(&wall));
      wall_us.push_back(wall);
    }
    return summarize_profile(steps, wall_us, read_gbps, d);
  };
  for (uint32_t d : depths) {
    say(o, cat("profiling a decoded token at depth ", d));
    t.set_depth(d);
    out.push_back(profile([&](double* wall) { return m.profile_step(d + 1, wall); }, d));
    // One prefill chunk at the same depth (the batched graph: its own kernels and bottlenecks),
    // and the tail recording's chunk (a prompt's last tokens) where there is one.
    for (const bool tail : {false, true}) {
      const uint32_t T = tail ? m.prefill_stats().tail_chunk : m.prefill_stats().chunk;
      if (T == 0 || d + T > uint32_t(m.n_ctx())) continue;
      const std::string what = cat(tail ? "prefill tail chunk of " : "prefill chunk of ", T, " tokens");
      say(o, cat("profiling a ", what, " at depth ", d));
      TokenProfile pp = profile([&](double* wall) { return m.profile_prefill(wall, tail); }, d);
      pp.what = what;
      out.push_back(std::move(pp));
    }
  }
  return out;
}

// The device-clock timeline of one decoded token per depth (GpuModel::timeline_step): a warm-up,
// then one token per repetition, each at the depth's position. read_gbps: the roofline's (0: none);
// roof: the roofline whose short and gated reads give each family's ceilings (null: no ceilings).
std::vector<TokenTimeline> run_timelines(const BenchOptions& o, GpuModel& m, double read_gbps, const RooflineResult* roof) {
  std::vector<uint32_t> depths = o.depths;
  std::sort(depths.begin(), depths.end());
  depths.erase(std::unique(depths.begin(), depths.end()), depths.end());
  GpuTarget t(m);
  std::vector<TokenTimeline> out;
  for (uint32_t d : depths) {
    say(o, cat("timeline of a decoded token at depth ", d));
    t.set_depth(d);
    std::vector<std::vector<DispatchSpan>> steps;
    std::vector<double> wall_us;
    m.timeline_step(d + 1);
    for (int r = 0; r < std::max(o.repetitions, 1); ++r) {
      double wall = 0;
      steps.push_back(m.timeline_step(d + 1, &wall));
      wall_us.push_back(wall);
    }
    out.push_back(summarize_timeline(steps, wall_us, d, m.timeline_untimed()));
    out.back().read_gbps = read_gbps;
    out.back().tc_phases = o.tc_phases;
    if (roof) {
      for (TimelineFamily& f : out.back().families) {
        f.ceiling_gbps = short_read_ceiling_gbps(roof->short_reads, f.bytes_per_call);
        f.gated_ceiling_gbps = short_read_ceiling_gbps(roof->gated_reads, f.bytes_per_call);
      }
    }
  }
  return out;
}

uint32_t max_of(const std::vector<uint32_t>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

void check_options(const BenchOptions& o) {
  if (o.repetitions < 1) usage_error("bench: -r must be >= 1, got ", o.repetitions);
  if (!(o.warmup_seconds >= 0 && o.warmup_seconds <= 60))
    usage_error("bench: --warmup must be 0..60 seconds, got ", o.warmup_seconds);
  if (o.model_path.empty()) {
    if (!o.roofline) usage_error("bench: give a model file, or --roofline to measure only the device");
    return;
  }
  if (o.depths.empty()) usage_error("bench: -d needs at least one depth");
  if (max_of(o.prompt_sizes) == 0 && max_of(o.decode_sizes) == 0 && !o.profile && !o.timeline)
    usage_error("bench: nothing to run: every -p and -n value is 0");
}

// --kernel-stats: every pipeline the run created with the driver's statistics (a name that
// several pipelines share, with different defines, gets " #2", " #3" ...), or a note saying
// why there are none.
void collect_kernel_stats(vk::Context& ctx, BenchReport& report) {
  if (!ctx.device().enabled().pipeline_statistics) {
    report.kernel_stats_note = ctx.info().name + " does not report kernel statistics (no VK_KHR_pipeline_executable_properties)";
    return;
  }
  std::map<std::string, int> seen;
  for (const vk::Pipeline* p : ctx.pipelines().all()) {
    const int n = ++seen[p->name()];
    KernelStats k{n > 1 ? cat(p->name(), " #", n) : p->name(), {}};
    for (const vk::KernelStatistic& st : p->statistics()) k.values.emplace_back(st.name, st.value);
    if (!k.values.empty()) report.kernel_stats.push_back(std::move(k));
  }
  if (report.kernel_stats.empty()) report.kernel_stats_note = "the driver returned no kernel statistics";
}

}  // namespace

std::string BenchResult::name() const {
  return cat(kind, n_tokens, depth ? cat(" @ d", depth) : std::string());
}

BenchReport run_bench(const BenchOptions& o) {
  check_options(o);
  BenchReport report;
  BenchHeader& h = report.header;
  h.version = tessera_version();
  h.commit = tessera_git_commit();
  const bool tsr = !o.model_path.empty() && file_is_tsr(o.model_path);
  h.backend = o.backend.empty() ? (tsr || o.model_path.empty() ? "vulkan" : "cpu") : o.backend;
  if (h.backend != "vulkan" && h.backend != "cpu") usage_error("bench: --backend must be vulkan or cpu, got '", h.backend, "'");
  if (h.backend == "vulkan" && !o.model_path.empty() && !tsr)
    usage_error("bench: ", o.model_path, " is not a packed .tsr file; the Vulkan runtime runs .tsr files (make one with "
                "`tessera convert`), or use --backend cpu for the CPU reference");
  if (h.backend == "cpu" && (o.profile || o.timeline || o.roofline || o.kernel_stats))
    usage_error("bench: --profile, --timeline, --roofline and --kernel-stats need the Vulkan backend");

  const uint32_t need_ctx = max_of(o.depths) + std::max(std::max(max_of(o.prompt_sizes), max_of(o.decode_sizes)), 1u);
  h.model_path = o.model_path;
  h.forced_tokens = o.forced_tokens;
  if (!o.model_path.empty()) describe_file(o.model_path, tsr, h);

  if (h.backend == "cpu") {
    const unsigned threads = o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());
    h.device = cat("CPU reference (", threads, " threads)");
    say(o, cat("loading ", o.model_path, " (CPU reference)"));
    const std::unique_ptr<WeightSource> weights = open_weights(o.model_path);
    const ModelConfig cfg = ModelConfig::from_metadata(weights->metadata());
    if (cfg.n_ctx_train && need_ctx > cfg.n_ctx_train)
      usage_error("bench: the grid needs ", need_ctx, " context positions, the model is trained for ", cfg.n_ctx_train);
    CpuModel model(*weights, int(need_ctx), threads, AttentionPath::Absorbed);
    h.n_ctx = uint32_t(model.n_ctx());
    CpuTarget t(model);
    report.results = run_grid(o, t, model.n_vocab());
    return report;
  }

  vk::ContextOptions co;
  co.device = o.device;
  co.kernel_statistics = o.kernel_stats;
  vk::Context ctx(co);
  h.device = ctx.info().name;
  h.driver = ctx.info().driver_name + " " + ctx.info().driver_info;
  double read_gbps = 0;
  if (o.roofline || o.profile || o.timeline) {  // the timeline gives kernels' rates as shares of it too
    RooflineOptions ro = o.roofline_options;
    ro.read_only = !o.roofline;
    ro.short_reads = o.timeline;  // each kernel family's ceiling for its size
    say(o, o.roofline ? "measuring the device's read bandwidth and dispatch costs" : "measuring the device's read bandwidth");
    report.roofline = measure_roofline(ctx, ro);
    read_gbps = report.roofline->read_gbps;
  }
  if (o.model_path.empty()) {
    if (o.kernel_stats) collect_kernel_stats(ctx, report);
    return report;
  }

  const TsrFile file = TsrFile::open(o.model_path);
  const ModelConfig cfg = ModelConfig::from_metadata(file.metadata());
  if (cfg.n_ctx_train && need_ctx > cfg.n_ctx_train)
    usage_error("bench: the grid needs ", need_ctx, " context positions (largest -d plus largest -p/-n), the model is "
                "trained for ", cfg.n_ctx_train);
  GpuModelOptions go;
  go.n_ctx = need_ctx;
  go.progress = false;
  go.int8_activations = o.int8_activations;
  go.attention = o.attention;
  go.matvec = o.matvec;
  go.moe = o.moe;
  go.prefetch = o.prefetch;
  go.fused_router = o.fused_router;
  go.olat_q8 = o.olat_q8;
  go.fused_down = o.fused_down;
  go.prefill_matmul = o.prefill_matmul;
  go.matmul = o.matmul;
  go.prefill_moe_matmul = o.prefill_moe_matmul;
  go.prefill_tail_chunks = o.prefill_tail_chunks;
  go.prefill_tc_split_depth = o.prefill_tc_split_depth;
  go.prefill_q8_input = o.prefill_q8_input;
  go.prefill_moe_f16_input = o.prefill_moe_f16_input;
  go.prefill_router = o.prefill_router;
  go.prefill_route_x = o.prefill_route_x;
  go.prefill_sum_norm = o.prefill_sum_norm;
  go.prefill_f16_olat = o.prefill_f16_olat;
  go.prefill_split_norm = o.prefill_split_norm;
  go.prefill_attention_groups = o.prefill_attention_groups;
  go.prefill_attention_min_chunk = o.prefill_attention_min_chunk;
  go.prefill_attention = o.prefill_attention;
  go.head_q8 = o.head_q8;
  go.dense_down_matvec = o.dense_down_matvec;
  go.step_local = o.step_local;
  go.pipeline = o.pipeline;
  go.steps_per_submit = o.steps_per_submit;
  go.early_vo = o.early_vo;
  go.gate_stats = o.gate_stats;
  go.early_down = o.early_down;
  go.early_next = o.early_next;
  go.early_qk = o.early_qk;
  go.early_attn = o.early_attn;
  go.early_gateup = o.early_gateup;
  go.qk_q8 = o.qk_q8;
  go.qk_q8_halves = o.qk_q8_halves;
  go.row_prefetch = o.row_prefetch;
  go.row_prefetch_l1 = o.row_prefetch_l1;
  go.row_prefetch_short_rows = o.row_prefetch_short_rows;
  go.vo_preload = o.vo_preload;
  go.vo_preload_split = o.vo_preload_split;
  go.gate_backoff = o.gate_backoff;
  go.mark_gates = o.mark_gates;
  go.tc_phases = o.tc_phases;
  go.vb_q8 = o.vb_q8;
  go.vb_teams = o.vb_teams;
  go.q8_raw = o.q8_raw;
  go.kq_pairs = o.kq_pairs;
  go.barrier_scope = o.barrier_scope;
  go.prefill_chunk = o.prefill_chunk;
  go.timeline = o.timeline;
  if (o.timeline && !ctx.device().enabled().device_clock)
    runtime_error("bench --timeline: ", h.device, " has no device clock in shaders (VK_KHR_shader_clock)");
  if (o.profile && !ctx.device().has_timestamps()) runtime_error("bench --profile: ", h.device, " has no timestamp queries");
  if (max_of(o.prompt_sizes) > 0 || max_of(o.decode_sizes) > 0 || o.profile || o.timeline) {
    say(o, cat("loading ", o.model_path, " onto ", h.device));
    GpuModel model(ctx, file, go);
    h.n_ctx = uint32_t(model.n_ctx());
    h.dispatches = model.stats().dispatches;
    h.barriers = model.stats().barriers;
    h.weight_bytes_per_token = model.stats().weight_bytes;
    h.activations = model.stats().int8_activations ? "int8 (Q4_0/Q8_0/Q4_K/Q6_K matvecs and experts)" : "f32";
    if (model.config().n_expert > 0) h.router = model.stats().fused_router ? "fused" : "dispatch";
    if (o.barrier_scope != vk::BarrierScope::ComputeOnly)  // said where it is not the default
      h.barrier_scope = o.barrier_scope == vk::BarrierScope::Compute ? "compute (--tune barrier=1)" : "full (--tune barrier=0)";
    h.prefill_chunk = model.prefill_stats().chunk;
    h.prefill_dispatches = model.prefill_stats().dispatches;
    h.prefill_barriers = model.prefill_stats().barriers;
    h.prefill_weight_bytes = model.prefill_stats().weight_bytes;
    const PrefillStats& ps = model.prefill_stats();
    h.prefill_dense = !ps.matmul ? "batched matvecs (8 tokens per dispatch)"
                      : ps.matmul_coop ? "matmuls on tensor cores (64 tokens per weight read)"
                                       : "matmuls, plain FMAs (64 tokens per weight read)";
    h.prefill_attention = ps.attention_tc ? "on tensor cores (one pass per 16 query-head rows)" : "split along the context + merge";
    GpuTarget t(model);
    report.results = run_grid(o, t, model.n_vocab());
    if (o.gate_stats) {
      const GateTrace& g = model.gate_trace();
      h.early_start = cat(g.closed, " of ", g.workgroups, " workgroups found the gate closed at their first poll");
      if (g.layers) {
        auto us = [&](uint64_t ns) { return cat(std::round(double(ns) / g.layers / 10.0) / 100.0); };
        h.early_start += cat("; per layer: ", us(g.wait_ns), " us from the first start to the first open, ",
                             us(g.open_spread_ns), " us first to last open, ", us(g.after_open_ns),
                             " us from the first open to the last end");
      }
    }
    // The profile reuses the loaded model and its filled cache (one more recording of the step).
    if (o.profile) report.profiles = run_profiles(o, model, read_gbps);
    if (o.timeline)
      report.timelines = run_timelines(o, model, read_gbps, report.roofline ? &*report.roofline : nullptr);
    h.timeline = o.timeline;
  }
  if (o.kernel_stats) collect_kernel_stats(ctx, report);
  return report;
}

}  // namespace tessera::model
