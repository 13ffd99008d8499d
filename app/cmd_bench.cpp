// tessera bench [MODEL] [-p N,..] [-n N,..] [-d D,..] [-r R] [-o md|json|csv] [--json FILE] [--backend vulkan|cpu]
//   [--device N] [--threads N] [--profile] [--profile-out FILE.svg] [--timeline] [--roofline] [--roofline-mib M]
// Throughput like llama-bench (prefill pp<N>, decode tg<N>, at cache depths), a per-kernel profile
// of a decoded token, and the device's ceilings. Results to stdout, progress to stderr.
// Logic: runtime/model/bench.h, profile.h, timeline.h, bench_roofline.h.
#include <cstdio>
#include <fstream>
#include <memory>

#include "app/cli.h"
#include "format/error.h"
#include "runtime/model/bench.h"
#include "runtime/model/gpu_model.h"

namespace tessera::app {
namespace {

struct BenchArgs {
  model::BenchOptions bench;
  std::string output = "md";
  std::string profile_out;
  std::string json_out;
  unsigned threads = 0;
  uint64_t roofline_mib = 0;
  bool f32_activations = false;
  std::string attention;
  std::string tune;
};

// "KEY=NUMBER,KEY=NUMBER..." -> calls set(key, number); `what` names the option in errors.
template <class Set>
void parse_knobs(const std::string& text, const char* what, const char* keys, Set set) {
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(at, end - at);
    const size_t eq = item.find('=');
    uint32_t v = 0;
    try {
      if (eq == std::string::npos) throw std::invalid_argument(item);
      size_t used = 0;
      v = uint32_t(std::stoul(item.substr(eq + 1), &used));
      if (used != item.size() - eq - 1) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      usage_error(what, ": '", item, "' is not KEY=NUMBER (keys: ", keys, ")");
    }
    if (!set(item.substr(0, eq), v)) usage_error(what, ": unknown key '", item.substr(0, eq), "' (keys: ", keys, ")");
    at = end + 1;
  }
}

// One tuning knob of `T`: its key, the largest value it takes, what the values mean (the help
// text and errors show it), and where the value goes. Work splits take 0 for automatic; the ops
// check the finer rules (e.g. matvec_unroll 2 or 4) when they record.
template <class T>
struct Knob {
  const char* key;
  uint32_t most;
  const char* meaning;
  void (*set)(T&, uint32_t);
};

// --tune.
constexpr uint32_t kAnyCount = 1u << 24;  // counts with no bound of their own (positions, groups)
using O = model::BenchOptions;
const Knob<O> kTuneKnobs[] = {
    {"matvec_teams", 16, "subgroups per workgroup of the one-vector int8 matvec", [](O& o, uint32_t v) { o.matvec.teams = v; }},
    {"matvec_rows", 4, "rows per subgroup of it", [](O& o, uint32_t v) { o.matvec.rows = v; }},
    {"matvec_unroll", 4, "weight blocks per lane and loop iteration, 2 or 4", [](O& o, uint32_t v) { o.matvec.blocks_per_iter = v; }},
    {"matvec_ksplit", 4, "subgroups per long row, 1, 2 or 4", [](O& o, uint32_t v) { o.matvec.ksplit = v; }},
    {"matvec_preload", 8,
     "staged decode matvecs holding at most N weight blocks per lane load them before staging x; 0 off; default 2 (q_a / kv_a)",
     [](O& o, uint32_t v) { o.matvec.preload_blocks = int32_t(v); }},
    {"matvec_input_first", 1, "with matvec_preload: the staged values of x loaded before the weights; default 1",
     [](O& o, uint32_t v) { o.matvec.input_first = v != 0; }},
    {"pmatvec_teams", 16, "subgroups per workgroup of the prefill matvec", [](O& o, uint32_t v) { o.matvec.batch_teams = v; }},
    {"pmatvec_rows", 4, "rows per subgroup of it", [](O& o, uint32_t v) { o.matvec.batch_rows = v; }},
    {"gateup_teams", 32, "subgroups per int8 gate-up workgroup; 0 auto (16 early-started, 8 behind a barrier)", [](O& o, uint32_t v) { o.moe.q8_gateup_teams = v; }},
    {"gateup_outs", 9, "outputs per int8 gate-up subgroup and pass, every weight load issued first; 9: two, a round trip per unit; 0 auto (Q4_0 2, else 9)",
     [](O& o, uint32_t v) { o.moe.q8_gateup_outs = v; }},
    {"down_rows", 64, "rows per int8 down workgroup; 0 auto (4; early-started 2, K-quants 1)", [](O& o, uint32_t v) { o.moe.q8_down_rows = v; }},
    {"route_ranks", 1, "1: the int8 gate-up routes by ranking every expert across the workgroup; 0: subgroup 0's rounds; default: ranks for sigmoid gating, rounds for softmax",
     [](O& o, uint32_t v) { o.moe.route_ranks = v ? 1u : 2u; }},
    {"down_first", 9, "rows a pass (1, 2, 4) of the int8 down behind a barrier whose weight blocks load before their products; 9 none; 0 auto (Q4_0 1, else none)",
     [](O& o, uint32_t v) { o.moe.down_first_rows = v; }},
    {"gateup_overlap", 1, "1, default: the router fold's gate-up reads input, sums and bias in one phase",
     [](O& o, uint32_t v) { o.moe.q8_fold_overlap = v ? 1u : 2u; }},
    {"prefetch", model::kPrefetchAll, "L2 prefetch bits: 1 W_vo, 2 router + shared expert, 4 W_qk, 8 the next layer's attn_norm beside the MoE",
     [](O& o, uint32_t v) { o.prefetch = v; }},
    {"router", 1, "0: the router's own dispatch instead of the router fold", [](O& o, uint32_t v) { o.fused_router = v != 0; }},
    {"olat_q8", 1, "0: W_vo quantizes olat itself; default 1", [](O& o, uint32_t v) { o.olat_q8 = v != 0; }},
    {"prefill_matmul", 3,
     "the prefill's dense matrices: 0 batched matvecs, 1 matmuls (plain FMAs without tensor cores), 2 auto (matmuls on tensor cores), 3 matmuls with plain FMAs",
     [](O& o, uint32_t v) { o.prefill_matmul = v == 2 ? -1 : v == 3 ? 2 : int(v); }},
    {"moe_matmul", 2, "with the prefill's matmuls, the FFN (experts, dense layers) in its matmul form too: 0 never, 1 always, 2 auto (chunks of >= 256 tokens)",
     [](O& o, uint32_t v) { o.prefill_moe_matmul = v == 2 ? -1 : int(v); }},
    {"pattn_groups", 1024, "prefill attention chunks along the context per query (split-K); 0 auto (2048 / chunk tokens, 1..32)",
     [](O& o, uint32_t v) { o.prefill_attention_groups = v; }},
    {"pattn_min_chunk", 1u << 20, "their fewest positions; 0 auto (128)", [](O& o, uint32_t v) { o.prefill_attention_min_chunk = v; }},
    {"pattn_queries", 64, "queries per prefill attention workgroup; 0 auto (8)",
     [](O& o, uint32_t v) { o.prefill_attention.queries_per_group = v; }},
    {"pattn_pairs", 64, "(query, head) pairs per prefill attention workgroup, 32 or 64; 0 auto (32)",
     [](O& o, uint32_t v) { o.prefill_attention.max_pairs = v; }},
    {"pattn_tc", 2, "the prefill attention on tensor cores: 0 never, 1 always (plain FMAs without them), 2 auto",
     [](O& o, uint32_t v) { o.prefill_attention.tensor_cores = v == 2 ? -1 : int(v); }},
    {"pattn_tc_prefetch", 1, "the tensor-core prefill attention loads its next block of cache rows ahead: 1 (default) / 0",
     [](O& o, uint32_t v) { o.prefill_attention.tc_prefetch = v != 0; }},
    {"pattn_tc_margin", 10, "nats a row's maximum may grow before the tensor-core prefill attention rescales its O: 0..10 (default 8)",
     [](O& o, uint32_t v) { o.prefill_attention.tc_margin = v; }},
    {"pattn_tc_double_k", 1, "... two buffers of cache rows where they fit (3 barriers a block, not 4): 1 / 0 (default)",
     [](O& o, uint32_t v) { o.prefill_attention.tc_double_k = v != 0; }},
    {"pattn_tc_qreg", 1, "... each group's query tiles in registers (with tensor cores): 1 (default) / 0",
     [](O& o, uint32_t v) { o.prefill_attention.tc_qreg = v != 0; }},
    {"pattn_tc_groups", 8, "... groups of 32 invocations per tile of 16 rows: 4 (default) or 8 (with pattn_tc_m_tiles=1)",
     [](O& o, uint32_t v) { o.prefill_attention.tc_groups = v; }},
    {"pattn_tc_m_tiles", 2, "... tiles of 16 (query, head) rows per workgroup: 2 (default; 4 groups each) or 1",
     [](O& o, uint32_t v) { o.prefill_attention.tc_m_tiles = v; }},
    {"pattn_tc_stagger", 1, "... each workgroup walks the cache from its own block on: 1 (default) / 0",
     [](O& o, uint32_t v) { o.prefill_attention.tc_stagger = v != 0; }},
    {"pattn_tc_split", 8, "... each tile's walk in this many context chunks, then a merge: 0 automatic (default; the fewest rounds of the SMs), 1 none, 2-8",
     [](O& o, uint32_t v) { o.prefill_attention.tc_split = v; }},
    {"matmul_rows", 4, "16-row tiles per prefill matmul workgroup: 1, 2 or 4; 0 auto", [](O& o, uint32_t v) { o.matmul.row_tiles = v; }},
    {"matmul_step", 2048, "columns of W each prefill matmul workgroup stages per step (multiple of 32; of 64 for Q4_K / Q5_K, 128 for Q6_K); 0 auto (64)",
     [](O& o, uint32_t v) { o.matmul.step = v; }},
    {"matmul_splits", 64, "workgroups along K per prefill matmul tile (split-K); 0 auto, 1 none",
     [](O& o, uint32_t v) { o.matmul.splits = v; }},
    {"matmul_prefetch", 2, "1 / 0 (auto): prefill matmuls load the next step's token values ahead; 2: not",
     [](O& o, uint32_t v) { o.matmul.prefetch = v; }},
    {"matmul_prefetch_w", 3, "prefill matmuls load W words ahead: 1 one step, 3 two steps, 2 not; 0 auto (two in chunks of more than 64 tokens, else one)",
     [](O& o, uint32_t v) { o.matmul.prefetch_w = v; }},
    {"matmul_loop", 2, "prefill matmuls' 16-column slices: 1 / 0 unrolled, 2 a loop", [](O& o, uint32_t v) { o.matmul.loop = v; }},
    {"ffn_matmul_rows", 8, "16-row tiles of W per workgroup of the experts' / dense FFN's matmul form: 2, 4 or 8; 0 auto (4)",
     [](O& o, uint32_t v) { o.matmul.ffn.row_tiles = v; }},
    {"moe_f16_in", 1, "1, default: the experts' matmul form reads the router matmul's f16 rows; 0: the f32 rows",
     [](O& o, uint32_t v) { o.prefill_moe_f16_input = v != 0; }},
    {"prefill_router", 2, "the prefill's router logits: 1 a matmul (and its sum), 2 in the routing dispatch from x; 0 auto (2 where the FFN is not in its matmul form)",
     [](O& o, uint32_t v) { o.prefill_router = v; }},
    {"route_x_wg", 1024, "invocations per workgroup of the routing from x: a power of two from 64; 0 auto (1024)",
     [](O& o, uint32_t v) { o.prefill_route_x.wg = v; }},
    {"route_x_lanes", 32, "... its invocations per router row: 4, 8, 16 or 32; 0 auto (16)",
     [](O& o, uint32_t v) { o.prefill_route_x.lanes = v; }},
    {"route_x_batch", 16, "... a lane's router loads issued together: 4, 8 or 16; 0 auto (8)",
     [](O& o, uint32_t v) { o.prefill_route_x.batch = v; }},
    {"sum_norm", 1, "1, default: the prefill's FFN sum fused with the next layer's attention norm; 0: apart",
     [](O& o, uint32_t v) { o.prefill_sum_norm = v != 0; }},
    {"f16_olat", 1, "1, default: the tensor-core prefill attention writes W_vo's f16 input rows; 0: f32 olat and a conversion",
     [](O& o, uint32_t v) { o.prefill_f16_olat = v != 0; }},
    {"split_norm", 1, "1, default: q_a's split-K parts summed by the norm that reads them; 0: a sum dispatch and a barrier",
     [](O& o, uint32_t v) { o.prefill_split_norm = v != 0; }},
    {"ffn_matmul_groups", 4, "... groups of 16 pairs per workgroup: 1, 2 or 4; 0 auto (the most that fit)",
     [](O& o, uint32_t v) { o.matmul.ffn.groups = v; }},
    {"ffn_matmul_split_rows", 2, "... 2: two groups of 32 per 16 pairs, each half the row tiles; 1: not; 0 auto (2 for routed experts)",
     [](O& o, uint32_t v) { o.matmul.ffn.split_rows = v; }},
    {"ffn_matmul_loop", 2, "... the products' 16-column slices: 1 unrolled, 2 a loop (auto)", [](O& o, uint32_t v) { o.matmul.ffn.loop = v; }},
    {"ffn_matmul_step", 256, "... columns per step: 32, 64, 128 or 256; 0 auto (the first that fits: 64, Q6_K 128)",
     [](O& o, uint32_t v) { o.matmul.ffn.step = v; }},
    {"ffn_matmul_prefetch", 4, "... the next step's loads before this step's products: 1 none, 2 W, 3 inputs, 4 both; 0 auto",
     [](O& o, uint32_t v) { o.matmul.ffn.prefetch = v; }},
    {"tail_chunks", 64, "the most 64-token tail chunks a prompt's end runs in before the large recording takes it (0: none); default 2",
     [](O& o, uint32_t v) { o.prefill_tail_chunks = v; }},
    {"split_depth", 1024, "a chunk of T tokens from position k T on splits its tensor-core attention walks (pattn_tc_split); default k = 8, 0: every chunk",
     [](O& o, uint32_t v) { o.prefill_tc_split_depth = v; }},
    {"prefill_q8_input", 1, "1, default: the FFN's int8 prefill kernels read h2 as int8 blocks from its RMSNorm; 0: each workgroup quantizes",
     [](O& o, uint32_t v) { o.prefill_q8_input = v != 0; }},
    {"ffn_q8_lanes", 32, "lanes per weight row of the experts' / dense FFN's int8 form (short chunks): 8, 16 or 32; 0 auto (8)",
     [](O& o, uint32_t v) { o.matmul.ffn_int8.lanes = v; }},
    {"ffn_q8_rows", 128, "... output rows per workgroup of the routed experts: 32, 64 or 128; 0 auto (128)",
     [](O& o, uint32_t v) { o.matmul.ffn_int8.rows = v; }},
    {"ffn_q8_rows_all", 128, "... of the all-token dispatches (shared expert, dense FFN): 32, 64 or 128; 0 auto (64)",
     [](O& o, uint32_t v) { o.matmul.ffn_int8.rows_all = v; }},
    {"ffn_q8_pairs", 8, "... pairs per pass, at most: 1, 2, 4 or 8; 0 auto (4)", [](O& o, uint32_t v) { o.matmul.ffn_int8.pairs = v; }},
    {"ffn_q8_outs", 2, "... output rows a team computes at once: 1 or 2; 0 auto (2 in the downs, 1 in the gate-ups)", [](O& o, uint32_t v) { o.matmul.ffn_int8.outs = v; }},
    {"ffn_q8_unroll", 2, "... each lane's loop over a row's blocks: 1 unrolled, 2 a loop; 0 auto (a loop)",
     [](O& o, uint32_t v) { o.matmul.ffn_int8.unroll = v; }},
    {"matmul_groups", 4, "groups of 16 tokens per prefill matmul workgroup: 1, 2 or 4; 0 auto (4)", [](O& o, uint32_t v) { o.matmul.groups = v; }},
    {"moe_fused", 1, "1: the MoE down fused into the gate-up", [](O& o, uint32_t v) { o.fused_down = v != 0; }},
    {"head_q8", 1, "1: the LM head reads the output norm's int8 blocks", [](O& o, uint32_t v) { o.head_q8 = v != 0; }},
    {"dense_down", 1, "1, default: the dense FFN's down as the int8 matvec", [](O& o, uint32_t v) { o.dense_down_matvec = v != 0; }},
    {"step_local", 1, "1, default: the layers read a device copy of the per-token words",
     [](O& o, uint32_t v) { o.step_local = v != 0; }},
    {"pipeline", 1, "1, default: decode queues the next step before it waits for the last one", [](O& o, uint32_t v) { o.pipeline = v != 0; }},
    {"steps", 16, "decode steps per submission with pipeline=1, 1..16; default 8", [](O& o, uint32_t v) { o.steps_per_submit = v; }},
    {"early_vo", 1, "1, default: W_vo starts beside the attention and waits on its gate", [](O& o, uint32_t v) { o.early_vo = v != 0; }},
    {"early_down", 1, "1, default: the MoE down starts beside the gate-up where its slots are at most 2 blocks per lane",
     [](O& o, uint32_t v) { o.early_down = v != 0; }},
    {"early_next", 1, "1: the next layer's q_a / kv_a start beside the down; default 0", [](O& o, uint32_t v) { o.early_next = v != 0; }},
    {"early_qk", 1, "1: W_qk / q_b and kv_write start beside q_a / kv_a (the residual add after the attention then writes the other x buffer); 0: not; default: where q_a is Q4_0 / Q8_0", [](O& o, uint32_t v) { o.early_qk = v != 0 ? 1 : 0; }},
    {"early_gateup", 1, "1, default: the MoE gate-up starts beside W_vo", [](O& o, uint32_t v) { o.early_gateup = v != 0; }},
    {"early_attn", 1, "1, default: the attention starts beside W_qk and kv_write (single and mid ranges)",
     [](O& o, uint32_t v) { o.early_attn = v != 0; }},
    {"qk_q8", 2, "1: q_a hands W_qk / q_b its output as int8 half blocks and sums of squares (no staging); 2: as whole blocks; 0: off; default: 1 where q_a is Q4_0 / Q8_0",
     [](O& o, uint32_t v) {
       o.qk_q8 = v != 0 ? 1 : 0;
       o.qk_q8_halves = v != 2;
     }},
    {"gate_x", 3, "how a gated matvec reads x after the gate: 1 coherent per lane, 2 once per workgroup into shared memory, 3 plain per lane; 0 auto (3)",
     [](O& o, uint32_t v) { o.matvec.gate_x = v; }},
    {"gate_late", 1, "1: gated matvecs wait first and load nothing ahead; default 0", [](O& o, uint32_t v) { o.matvec.gate_late = v; }},
    {"gate_backoff", 4096, "integer steps between two polls of a gate; default 0", [](O& o, uint32_t v) { o.gate_backoff = v; }},
    {"mark_gates", 1, "1: with --timeline, a kernel's early mark is where its gated wait ended; default 0",
     [](O& o, uint32_t v) { o.mark_gates = v != 0; }},
    {"tc_phases", 4, "with --timeline: the tensor-core attention's early mark and mark are the summed time of two of its phases (1: staging a block's rows, the partial scores; 2: P, O's products; 3: the query into registers, the output; 4: the step words, the query staged); default 0",
     [](O& o, uint32_t v) { o.tc_phases = v; }},
    {"vb_q8", 1, "1, default: the factored value path on int8 kernels (attn_v_b per head, then attn_output, gated)",
     [](O& o, uint32_t v) { o.vb_q8 = v != 0; }},
    {"vb_teams", 16, "subgroups per attn_v_b workgroup on that path, 8 (default) or 16; 0: the matvec's own split",
     [](O& o, uint32_t v) { o.vb_teams = v; }},
    {"q8_raw", 1, "1, default: weight blocks held across a wait kept as loaded (Q4_0: half the registers)",
     [](O& o, uint32_t v) { o.q8_raw = v != 0; }},
    {"kq_pairs", 1, "1, default: Q4_K gate-ups (experts, dense FFN) read both sub-blocks of a lane's 32 quant bytes per step",
     [](O& o, uint32_t v) { o.kq_pairs = v != 0; }},
    {"gateup_consts", 1, "1, default: the early gate-up loads the norm weight and the expert bias before its wait",
     [](O& o, uint32_t v) { o.moe.gateup_consts = v != 0; }},
    {"gateup_stage_late", 1, "1, default: the router fold's gate-up (Q4_0 experts; Q8_0 with gateup_outs) loads its weights before it stages its input",
     [](O& o, uint32_t v) { o.moe.gateup_stage_late = v != 0; }},
    {"gateup_input_first", 1, "with gateup_stage_late: the input loaded before the routing; default 1",
     [](O& o, uint32_t v) { o.moe.gateup_input_first = v != 0; }},
    {"row_prefetch", 2, "1: W_qk reads the cache rows of the attention's single / mid range into the L2 before its wait; 2, default: the short range's too",
     [](O& o, uint32_t v) { o.row_prefetch = v; }},
    {"row_prefetch_short", kAnyCount, "with row_prefetch=2, the short range's first N rows (default 2048; 0: all)",
     [](O& o, uint32_t v) { o.row_prefetch_short_rows = v; }},
    {"row_prefetch_l1", 1, "1: the row prefetch's loads plain (they fill the L1 too); 0, default: coherent (the L2 only)",
     [](O& o, uint32_t v) { o.row_prefetch_l1 = v != 0; }},
    {"vo_preload", 8, "the early W_vo's weight blocks per lane and row loaded before its wait, the rest after it; default 3; 0: all",
     [](O& o, uint32_t v) { o.vo_preload = v; }},
    {"vo_preload_split", 8, "the same where the attention is split and merged (its short and long ranges); default 1",
     [](O& o, uint32_t v) { o.vo_preload_split = v; }},
    {"down_late", 1, "1, default: early MoE down workgroups that find h complete load it beside their weights",
     [](O& o, uint32_t v) { o.moe.down_late = v != 0; }},
    {"gate_stats", 1, "1: count and time the early W_vo's waits", [](O& o, uint32_t v) { o.gate_stats = v != 0; }},
    {"barrier", 2, "the barrier scope of the decode step and prefill: 0 full, 1 compute, 2 compute only (default)",
     [](O& o, uint32_t v) { o.barrier_scope = static_cast<vk::BarrierScope>(v); }},
};

// --attention (0 is automatic for the counts).
using A = vk::AttentionTuning;
const Knob<A> kAttentionKnobs[] = {
    {"heads", 32, "heads per workgroup of the split kernel", [](A& t, uint32_t v) { t.heads_per_group = v; }},
    {"tile", 16, "rows staged per step, 4, 8 or 16", [](A& t, uint32_t v) { t.tile = v; }},
    {"slice", 8, "vec4 of a row per score thread, 4 or 8", [](A& t, uint32_t v) { t.score_slice = v; }},
    {"groups", kAnyCount, "workgroups along the context", [](A& t, uint32_t v) { t.n_groups = v; }},
    {"min_chunk", kAnyCount, "fewest positions per chunk", [](A& t, uint32_t v) { t.min_chunk = v; }},
    {"short", 1, "0: no short-context variant", [](A& t, uint32_t v) { t.short_variant = v != 0; }},
    {"short_rows", 1, "the short variant as the rows kernel", [](A& t, uint32_t v) { t.short_rows = v != 0; }},
    {"short_groups", kAnyCount, "its workgroups along the context", [](A& t, uint32_t v) { t.short_groups = v; }},
    {"short_heads", 32, "its heads per workgroup (implies short_rows=0)", [](A& t, uint32_t v) { t.short_heads_per_group = v; }},
    {"short_max", kAnyCount, "the longest context it takes", [](A& t, uint32_t v) { t.short_max_kv = v; }},
    {"rows_subgroups", 16, "subgroups per rows-kernel workgroup", [](A& t, uint32_t v) { t.rows_subgroups = v; }},
    {"rows_round", 8, "rows a subgroup loads per round", [](A& t, uint32_t v) { t.rows_round = v; }},
    {"rows_heads", 4, "heads per rows-kernel workgroup", [](A& t, uint32_t v) { t.rows_heads = v; }},
    {"merge_sg", 1, "the merge with subgroup reductions", [](A& t, uint32_t v) { t.merge_subgroup = v != 0; }},
    {"merge_tail", 1, "the merge folded into the rows kernel's last workgroup", [](A& t, uint32_t v) { t.merge_tail = v != 0; }},
    {"merge_wait", 1, "1, default: the short range's merge started beside its partials, waiting on a gate they count",
     [](A& t, uint32_t v) { t.merge_wait = v != 0; }},
    {"direct", 1, "the split kernel as a direct dispatch", [](A& t, uint32_t v) { t.direct_partial = v != 0; }},
    {"short_wait", 1, "with early_attn, the short range's partials wait on W_qk's gate too; default 1",
     [](A& t, uint32_t v) { t.short_wait = v != 0; }},
    {"single", 1, "one workgroup per head for short contexts", [](A& t, uint32_t v) { t.single = v != 0; }},
    {"single_max", kAnyCount, "the longest context it takes", [](A& t, uint32_t v) { t.single_max_kv = v; }},
    {"single_subgroups", 16, "its subgroups per workgroup", [](A& t, uint32_t v) { t.single_subgroups = v; }},
    {"single_round", 8, "rows its subgroups load per round", [](A& t, uint32_t v) { t.single_round = v; }},
    {"single_early", 1, "its first rows loaded before the step word", [](A& t, uint32_t v) { t.single_early = v != 0; }},
    {"rows_coalesced", 1, "the rows kernels' loads, consecutive words per subgroup (0: per lane)",
     [](A& t, uint32_t v) { t.rows_coalesced = v != 0; }},
    {"rows_f16", 1, "the rows kernels' scores and value sums in packed halves (fp16 devices)",
     [](A& t, uint32_t v) { t.rows_f16 = v != 0; }},
    {"mid", 1, "the merging rows kernel for the next range", [](A& t, uint32_t v) { t.mid = v != 0; }},
    {"decode_tc", 2, "the long range on tensor cores: 0 never, 1 also in the plain form, 2 automatic (default)",
     [](A& t, uint32_t v) { t.decode_tc = v == 2 ? -1 : int(v); }},
    {"decode_tc_groups", 8, "its groups of 32 invocations per workgroup, 4 or 8", [](A& t, uint32_t v) { t.decode_tc_groups = v; }},
    {"decode_tc_prefetch", 1, "its next block's rows loaded during the current one: 1 (default) / 0", [](A& t, uint32_t v) { t.decode_tc_prefetch = v != 0; }},
    {"decode_tc_qreg", 1, "each group's query k-tiles in registers: 1 (default) / 0", [](A& t, uint32_t v) { t.decode_tc_qreg = v != 0; }},
    {"decode_tc_m_tiles", 2, "head tiles of 16 per workgroup, 1 (default) or 2 (4 groups each)",
     [](A& t, uint32_t v) { t.decode_tc_m_tiles = v; }},
    {"mid_max", kAnyCount, "the longest context it takes", [](A& t, uint32_t v) { t.mid_max_kv = v; }},
    {"mid_groups", kAnyCount, "its workgroups per head", [](A& t, uint32_t v) { t.mid_groups = v; }},
    {"mid_subgroups", 16, "its subgroups per workgroup", [](A& t, uint32_t v) { t.mid_subgroups = v; }},
};

// The keys of a knob table, comma-separated (errors), and "key=0..N (meaning); ..." (--help).
template <class T, size_t N>
std::string knob_keys(const Knob<T> (&knobs)[N]) {
  std::string k;
  for (const Knob<T>& t : knobs) k += (k.empty() ? "" : ", ") + std::string(t.key);
  return k;
}
template <class T, size_t N>
std::string knob_help(const Knob<T> (&knobs)[N]) {
  std::string h;
  for (const Knob<T>& t : knobs) h += cat(h.empty() ? "" : "; ", t.key, "=0..", t.most, " (", t.meaning, ")");
  return h;
}

// "KEY=N,..." against a knob table: each value within its knob's range, set into `target`.
template <class T, size_t N>
void parse_table(const std::string& text, const char* what, const Knob<T> (&knobs)[N], T& target) {
  const std::string keys = knob_keys(knobs);
  parse_knobs(text, what, keys.c_str(), [&](const std::string& k, uint32_t v) {
    for (const Knob<T>& t : knobs) {
      if (k != t.key) continue;
      if (v > t.most) usage_error(what, ": ", k, "=", v, " is outside 0..", t.most, " (", t.meaning, ")");
      t.set(target, v);
      return true;
    }
    return false;
  });
}

Action setup(CLI::App& sub, const Globals& globals) {
  auto a = std::make_shared<BenchArgs>();
  model::BenchOptions& b = a->bench;
  sub.add_option("MODEL", b.model_path, "Model file: .tsr (Vulkan) or .gguf (CPU reference); optional with --roofline");
  sub.add_option("-p,--n-prompt", b.prompt_sizes, "Prefill tests of N tokens (comma-separated list; 0: none)")
      ->delimiter(',')->capture_default_str();
  sub.add_option("-n,--n-gen", b.decode_sizes, "Decode tests of N tokens (comma-separated list; 0: none)")
      ->delimiter(',')->capture_default_str();
  sub.add_option("-d,--depth", b.depths, "Context depths: tokens cached (untimed) before each test (list)")
      ->delimiter(',')->capture_default_str();
  sub.add_option("-r,--repetitions", b.repetitions, "Timed runs per test, after the warm-up")
      ->check(CLI::PositiveNumber)->capture_default_str();
  sub.add_option("--warmup", b.warmup_seconds,
                 "Seconds of untimed runs before each test's timed ones, after a first one (the GPU's clocks come up; greedy decode tests: one run)")
      ->check(CLI::Range(0.0, 60.0))->capture_default_str();
  sub.add_option("-o,--output", a->output, "Output format")->check(CLI::IsMember({"md", "json", "csv"}))->capture_default_str();
  sub.add_option("--backend", b.backend, "vulkan or cpu (default: vulkan for .tsr, cpu for .gguf)")
      ->check(CLI::IsMember({"vulkan", "cpu"}));
  sub.add_option("--device", b.device, "Vulkan device number (default: the best one)")->check(CLI::NonNegativeNumber);
  sub.add_option("--threads", a->threads, "CPU reference threads (default: the global --threads, else all)");
  sub.add_option("--prefill-chunk", b.prefill_chunk,
                 "Vulkan: prompt tokens per batched prefill chunk (0: token by token; default 512 where tensor cores "
                 "run the prefill's matrices, else 64; a prompt's last tokens run in chunks of 64)")
      ->capture_default_str();
  sub.add_flag("--profile", b.profile, "Per-kernel GPU profile of a decoded token at each depth");
  sub.add_flag("--timeline", b.timeline,
               "Device-clock timeline of a decoded token at each depth: every kernel's workgroups record their start and "
               "end (the tests then run with that recording too); needs a shader clock");
  sub.add_flag("--f32-activations", a->f32_activations,
               "f32 inputs to every matvec (default: int8 activations with integer dot products for Q4_0/Q8_0/Q4_K/Q6_K)");
  sub.add_option("--attention", a->attention,
                 "Decode attention work split, for tuning; KEY=N,... (any subset, 0: automatic): " + knob_help(kAttentionKnobs));
  sub.add_option("--tune", a->tune,
                 "Kernels' work splits and decode-step choices, for tuning; KEY=N,... (any subset): " + knob_help(kTuneKnobs));
  sub.add_option("--profile-out", a->profile_out, "Also draw the profile as an SVG bar chart into FILE (implies --profile)");
  sub.add_option("--json", a->json_out, "Also write the JSON report into FILE");
  sub.add_flag("--roofline", b.roofline, "Measure the device's read bandwidth and dispatch costs");
  sub.add_flag("--forced-tokens", b.forced_tokens,
               "Decode fed fixed pseudo-random token ids instead of its own samples: the same experts in every "
               "variant of an A/B, whatever its rounding");
  sub.add_flag("--kernel-stats", b.kernel_stats,
               "Print the driver's statistics of every kernel the run compiled (registers, shared memory, ...; "
               "VK_KHR_pipeline_executable_properties)");
  sub.add_option("--roofline-mib", a->roofline_mib, "Buffer for the read-bandwidth test, MiB (default: 1024 on a GPU, 64 on a CPU device)")
      ->check(CLI::PositiveNumber);

  return [a, &globals]() -> int {
    model::BenchOptions& o = a->bench;
    o.threads = a->threads ? a->threads : globals.thread_count();
    o.roofline_options.read_bytes = a->roofline_mib << 20;
    if (!a->profile_out.empty()) o.profile = true;
    o.int8_activations = !a->f32_activations;
    if (!a->attention.empty()) parse_table(a->attention, "--attention", kAttentionKnobs, o.attention);
    if (!a->tune.empty()) parse_table(a->tune, "--tune", kTuneKnobs, o);
    o.log = [](const std::string& s) { std::fprintf(stderr, "bench: %s\n", s.c_str()); };
    const model::BenchReport r = model::run_bench(o);
    const std::string text = a->output == "json" ? model::bench_json(r)
                             : a->output == "csv" ? model::bench_csv(r)
                                                  : model::bench_markdown(r);
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
    if (!a->json_out.empty()) {
      std::ofstream json(a->json_out, std::ios::binary);
      if (!(json << model::bench_json(r))) runtime_error("--json ", a->json_out, ": cannot write the JSON file");
    }
    if (!a->profile_out.empty()) {
      std::ofstream svg(a->profile_out, std::ios::binary);
      const std::string title = "tessera bench --profile: " + r.header.model_path + " on " + r.header.device;
      if (!(svg << model::profile_svg(r.profiles, title)))
        runtime_error("--profile-out ", a->profile_out, ": cannot write the SVG file");
      std::fprintf(stderr, "bench: profile chart written to %s\n", a->profile_out.c_str());
    }
    return 0;
  };
}

CommandRegistrar reg("bench", "Measure prefill / decode speed (llama-bench style), profile kernels, measure the device",
                     &setup, 80);

}  // namespace
}  // namespace tessera::app
