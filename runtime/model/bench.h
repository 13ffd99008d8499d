// `tessera bench`: llama-bench style throughput tests of a model, on the Vulkan runtime (.tsr) or
// the CPU reference (.gguf, or any file with --backend cpu).
//
// Tests (a grid over every value of each list):
//   pp<P> @ d<D>  prefill of P tokens with D positions already cached. There is no batched prefill
//                 path yet: prefill runs the decode graph token by token (one submit per token,
//                 logits read back only for the last one).
//   tg<N> @ d<D>  decode of N tokens, each fed the previous one's sampled token (GPU sampler on
//                 Vulkan, argmax on the CPU), one submit + wait per token.
// The cache is filled to D first, untimed (steps without reading logits back, once per depth:
// later tests at the same depth rewind to D). Each test runs once as a warm-up, then
// `repetitions` timed runs: tok/s mean ± stddev and median.
//
// With `profile` (Vulkan only), the loaded model profiles one decoded token per depth with GPU
// timestamps (a second recording of the step) (profile.h); the floor uses the read bandwidth measured by bench_roofline.h.
// With `timeline`, every kernel records its workgroups' device-clock times and one decoded token
// per depth is shown as it ran (timeline.h).
//
//   BenchOptions o; o.model_path = "glm.tsr"; o.depths = {0, 4096};
//   BenchReport r = run_bench(o);
//   std::fputs(bench_markdown(r).c_str(), stdout);
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "runtime/model/bench_roofline.h"
#include "runtime/model/gpu_model.h"
#include "runtime/vulkan/kernels_attention.h"
#include "runtime/vulkan/kernels_matmul.h"
#include "runtime/vulkan/kernels_matvec.h"
#include "runtime/vulkan/kernels_moe.h"
#include "runtime/model/profile.h"
#include "runtime/model/timeline.h"

namespace tessera::model {

struct BenchOptions {
  std::string model_path;                 // .tsr or .gguf; empty: only the roofline (needs roofline)
  std::string backend;                    // "vulkan", "cpu"; empty: vulkan for .tsr, cpu for .gguf
  std::vector<uint32_t> prompt_sizes{512};  // -p (0 entries are skipped)
  std::vector<uint32_t> decode_sizes{128};  // -n (0 entries are skipped)
  std::vector<uint32_t> depths{0};          // -d
  int repetitions = 5;                    // timed runs per test after the warm-up
  // Untimed warm-up runs per test: one, then more until this many seconds of them have passed
  // (a 16-token prefill after the model's upload ran at 36 % speed for its first ~0.2 s on the
  // H100 and H200: the GPU's clocks coming up, session 21). A greedy decode test (no forced
  // tokens) warms up with one run: each run starts from the token the one before sampled.
  double warmup_seconds = 0.5;
  int device = -1;                        // Vulkan device (-1: the best one)
  unsigned threads = 0;                   // CPU backend threads (0: all)
  uint32_t prefill_chunk = kPrefillChunkAuto;  // Vulkan: tokens per batched prefill chunk (0: token by token)
  bool profile = false;                   // per-kernel profile per depth (Vulkan only)
  // The device-clock timeline of a decoded token per depth (timeline.h; Vulkan with a shader
  // clock). Every kernel then records its workgroups' times, in the throughput tests too.
  bool timeline = false;
  bool roofline = false;                  // measure the device's ceilings (bench_roofline.h)
  // Decode feeds fixed pseudo-random ids (bench_tokens) instead of each sampled token: every
  // variant then routes the same experts, whatever its rounding (--forced-tokens).
  bool forced_tokens = false;
  bool kernel_stats = false;              // the driver's statistics of every kernel (Vulkan; where the
                                          // device has VK_KHR_pipeline_executable_properties)
  bool int8_activations = true;           // GpuModelOptions::int8_activations
  vk::AttentionTuning attention;          // GpuModelOptions::attention (--attention)
  vk::MatvecTuning matvec;                // GpuModelOptions::matvec (--tune)
  vk::MoeTuning moe;                      // GpuModelOptions::moe (--tune)
  uint32_t prefetch = 0;                  // GpuModelOptions::prefetch (--tune prefetch=)
  bool fused_router = true;               // GpuModelOptions::fused_router (--tune router=0|1)
  bool olat_q8 = true;                    // GpuModelOptions::olat_q8 (--tune olat_q8=0|1)
  bool fused_down = false;                // GpuModelOptions::fused_down (--tune moe_fused=0|1)
  int prefill_matmul = -1;                // GpuModelOptions::prefill_matmul (--tune prefill_matmul=0..3)
  int prefill_moe_matmul = -1;            // GpuModelOptions::prefill_moe_matmul (--tune moe_matmul=0|1|2)
  uint32_t prefill_tail_chunks = 2;       // GpuModelOptions::prefill_tail_chunks (--tune tail_chunks)
  uint32_t prefill_tc_split_depth = 8;    // GpuModelOptions::prefill_tc_split_depth (--tune split_depth)
  bool prefill_q8_input = true;           // GpuModelOptions::prefill_q8_input (--tune prefill_q8_input)
  bool prefill_moe_f16_input = true;      // GpuModelOptions::prefill_moe_f16_input (--tune moe_f16_in)
  uint32_t prefill_router = 0;            // GpuModelOptions::prefill_router (--tune prefill_router)
  vk::RouteFromXTuning prefill_route_x;   // GpuModelOptions::prefill_route_x (--tune route_x_*)
  bool prefill_sum_norm = true;           // GpuModelOptions::prefill_sum_norm (--tune sum_norm)
  bool prefill_f16_olat = true;           // GpuModelOptions::prefill_f16_olat (--tune f16_olat)
  bool prefill_split_norm = true;         // GpuModelOptions::prefill_split_norm (--tune split_norm)
  uint32_t prefill_attention_groups = 0;     // GpuModelOptions::prefill_attention_groups (--tune pattn_groups)
  uint32_t prefill_attention_min_chunk = 0;  // ... _min_chunk (--tune pattn_min_chunk)
  vk::PrefillAttentionTuning prefill_attention;  // --tune pattn_queries / pattn_pairs
  vk::MatmulTuning matmul;                // GpuModelOptions::matmul (--tune matmul_rows / matmul_step / matmul_groups)
  bool head_q8 = false;                   // GpuModelOptions::head_q8 (--tune head_q8=0|1)
  bool dense_down_matvec = true;          // GpuModelOptions::dense_down_matvec (--tune dense_down=0|1)
  bool step_local = true;                 // GpuModelOptions::step_local (--tune step_local=0|1)
  bool pipeline = true;                   // GpuModelOptions::pipeline (--tune pipeline=0|1)
  uint32_t steps_per_submit = 8;          // GpuModelOptions::steps_per_submit (--tune steps=N)
  bool early_vo = true;                   // GpuModelOptions::early_vo (--tune early_vo=0|1)
  bool gate_stats = false;                // GpuModelOptions::gate_stats (--tune gate_stats=0|1)
  bool early_down = true;                 // GpuModelOptions::early_down (--tune early_down=0|1)
  bool early_next = false;                // GpuModelOptions::early_next (--tune early_next=0|1)
  int early_qk = -1;                      // GpuModelOptions::early_qk (--tune early_qk=0|1; -1 auto)
  bool early_attn = true;                 // GpuModelOptions::early_attn (--tune early_attn=0|1)
  bool early_gateup = true;               // GpuModelOptions::early_gateup (--tune early_gateup=0|1)
  int qk_q8 = -1;                         // GpuModelOptions::qk_q8 (--tune qk_q8=0|1|2; -1 auto)
  bool qk_q8_halves = true;               // GpuModelOptions::qk_q8_halves (--tune qk_q8=2: off)
  uint32_t row_prefetch = 2;              // GpuModelOptions::row_prefetch (--tune row_prefetch=0|1|2)
  uint32_t row_prefetch_short_rows = 2048;  // GpuModelOptions::row_prefetch_short_rows (--tune row_prefetch_short=N)
  bool row_prefetch_l1 = false;           // GpuModelOptions::row_prefetch_l1 (--tune row_prefetch_l1=0|1)
  uint32_t vo_preload = 3;                // GpuModelOptions::vo_preload (--tune vo_preload=N; 0 all)
  uint32_t vo_preload_split = 1;          // GpuModelOptions::vo_preload_split (--tune vo_preload_split=N; 0 all)
  uint32_t gate_backoff = 0;              // GpuModelOptions::gate_backoff (--tune gate_backoff=N)
  bool mark_gates = false;                // GpuModelOptions::mark_gates (--tune mark_gates=1)
  uint32_t tc_phases = 0;                 // GpuModelOptions::tc_phases (--tune tc_phases=1..4)
  bool vb_q8 = true;                      // GpuModelOptions::vb_q8 (--tune vb_q8=0|1)
  uint32_t vb_teams = 8;                  // GpuModelOptions::vb_teams (--tune vb_teams=N)
  bool q8_raw = true;                     // GpuModelOptions::q8_raw (--tune q8_raw=0|1)
  bool kq_pairs = true;                   // GpuModelOptions::kq_pairs (--tune kq_pairs=0|1)
  vk::BarrierScope barrier_scope = vk::BarrierScope::ComputeOnly;  // GpuModelOptions::barrier_scope (--tune barrier=)
  RooflineOptions roofline_options;
  // Status lines while running ("loading ...", "filling the cache to 4096 ..."); may be empty.
  std::function<void(const std::string&)> log;
};

// What ran where: the report's header lines.
struct BenchHeader {
  std::string device;          // "NVIDIA H100 80GB HBM3" / "CPU reference (16 threads)"
  std::string driver;          // "NVIDIA 580.159" / "" for the CPU
  std::string backend;         // "vulkan" / "cpu"
  std::string version, commit; // tessera's
  std::string model_path, model_name;
  std::string types;           // weight bytes by type: "q4_0 93.1 %, q6_K 4.2 %, f32 2.7 %"
  std::string composition;     // composed MLA weights in the file: "qk+vo", "qk", "vo", "none"
  uint64_t model_bytes = 0;    // weight bytes in the file
  uint32_t n_ctx = 0;          // KV-cache positions allocated for the grid
  uint32_t dispatches = 0, barriers = 0;  // per decoded token (Vulkan)
  std::string activations;     // "int8 (...)" or "f32": the matvec/expert input path (Vulkan)
  std::string router;          // "fused" (router fold) or "dispatch" (router kernel) (Vulkan MoE models)
  bool forced_tokens = false;  // decode fed fixed ids (BenchOptions::forced_tokens)
  bool timeline = false;       // every kernel recorded its device-clock times (BenchOptions::timeline)
  std::string barrier_scope;   // the decode step's barrier scope where not the default ("compute", "compute only")
  std::string early_start;     // --tune gate_stats=1: how many early-started W_vo workgroups waited
  uint64_t weight_bytes_per_token = 0;    // declared by the kernels (Vulkan)
  uint32_t prefill_chunk = 0;             // batched prefill: tokens per chunk (0: none, Vulkan)
  uint32_t prefill_dispatches = 0, prefill_barriers = 0;  // per chunk, without the LM head
  uint64_t prefill_weight_bytes = 0;      // per chunk, declared by the kernels
  std::string prefill_dense;              // how the dense matrices run, e.g. "matmuls on tensor cores"
  std::string prefill_attention;          // how the attention runs, e.g. "on tensor cores"
};

struct BenchResult {
  std::string kind;            // "pp" (prefill) or "tg" (decode)
  uint32_t n_tokens = 0;
  uint32_t depth = 0;
  std::vector<double> seconds; // per timed repetition
  uint32_t warmup_runs = 0;    // untimed runs before them
  double tps_mean = 0, tps_stddev = 0, tps_median = 0;  // tokens per second
  // tg: FNV-1a of every token id the timed runs decoded (each fed the one before, greedy), so
  // that two variants of the same model and kernels can be seen to decode the same tokens.
  uint64_t ids_digest = 0;
  // tg with forced tokens: the runs (warm-up and timed) whose token ids differ from the first
  // run's. Every run starts at the same depth from the same inputs, so any is a nondeterministic
  // decode (a race between kernels: session 33's early_qk on the H200); bench warns on stderr.
  uint32_t runs_differ = 0;
  std::string name() const;    // "pp512", "tg128 @ d4096"
};

// The driver's statistics of one compiled kernel (registers, shared memory, ...: names and
// meanings are the driver's), in the order it reports them.
struct KernelStats {
  std::string kernel;  // the pipeline's name, e.g. "moe_gateup.q4_0.q8act.rfold.ovl"
  std::vector<std::pair<std::string, std::string>> values;
};

struct BenchReport {
  BenchHeader header;
  std::vector<KernelStats> kernel_stats;  // --kernel-stats: every kernel the run created
  std::string kernel_stats_note;          // --kernel-stats where the device reports none: why
  std::vector<BenchResult> results;
  std::vector<TokenProfile> profiles;   // one per depth with profile
  std::vector<TokenTimeline> timelines; // one per depth with timeline
  std::optional<RooflineResult> roofline;
};

// Runs the grid. Throws Error(Usage) for bad options (empty lists, a grid that exceeds the model's
// context, --profile on the CPU backend), Error(BadInput) for an unusable model file,
// Error(Runtime) for device failures.
BenchReport run_bench(const BenchOptions& options);

// Output formats: a markdown table with the header lines above it (and the profile and roofline
// tables after it when present); JSON (one object: "tessera", "device", "model", "results",
// optional "profiles" and "roofline"); CSV (one line per result, header line first).
std::string bench_markdown(const BenchReport& r);
std::string bench_json(const BenchReport& r);
std::string bench_csv(const BenchReport& r);

}  // namespace tessera::model
