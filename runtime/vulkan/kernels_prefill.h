// Feed-forward kernels of the batched prefill (docs/PREFILL.md; math: shared/spec/forward.md §5):
// a chunk of up to T tokens, n = step[count_word] of them live (one recording serves every
// chunk length). Expert-major: each expert's weights are read once per chunk, not once per token.
// Buffer layouts (pairs, route, lists, h, y): shaders/prefill_args.h.
//
// API — one MoE block of a chunk (barriers as shown; h2 = RMSNorm(x; ffn_norm) per token and the
// router logits [T][E] come from RmsNormOp / a batched MatvecOp before):
//
//   PrefillRouteOp route;  route.n_expert = E; route.routing = MoeRouting::from_config(c);
//   route.t_max = T; route.logits = logits; route.bias = exp_probs_b (or {});
//   route.step = step; route.count_word = w; route.route = route_buf; route.lists = lists;
//   route.record(rec);  rec.barrier();
//   MoePrefillOp moe;  moe.tile = tile; moe.n_used = K; moe.t_max = T; moe.step/count_word;
//   moe.h2 = h2; moe.route = route_buf; moe.lists = lists; moe.h = h; moe.y = y;
//   moe.record_gateup(rec);  rec.barrier();     // routed experts + shared expert: h
//   moe.record_down(rec);    rec.barrier();     // y[p] = w_p * down . h[p]
//   PrefillSumOp sum;  ... sum.record(rec);      // x[t] += sum of its pairs' y (fixed order)
//
// Dense FFN block: DensePrefillOp (gate, up, down matrices; all tokens), then PrefillSumOp with
// n_used = 0. PrefillGatherOp copies the last live token's row (for the LM head).
//
// Attention of a chunk: PrefillAttentionOp (attention_prefill.comp: groups of queries share each
// staged cache tile) + AttentionOp's merge (QueryBatch form); same partials layout and result as
// AttentionOp::record with a QueryBatch, fewer cache reads.
#pragma once
#include <cstdint>
#include <string>

#include "runtime/vulkan/kernels_attention.h"
#include "runtime/vulkan/kernels_basic.h"
#include "runtime/vulkan/kernels_matmul.h"
#include "runtime/vulkan/kernels_moe.h"
#include "runtime/vulkan/recorder.h"
#include "runtime/vulkan/split1.h"

namespace tessera::vk {

// Scratch sizes of a chunk of t_max tokens with K routed experts (K = 0: dense FFN).
inline uint64_t prefill_pairs(uint32_t t_max, uint32_t n_used) { return uint64_t(t_max) * n_used + t_max; }
inline uint64_t prefill_route_bytes(uint32_t t_max, uint32_t n_used) { return 2ull * t_max * n_used * 4; }
inline uint64_t prefill_list_bytes(uint32_t t_max, uint32_t n_expert) { return uint64_t(n_expert) * (t_max + 1) * 4; }

// Routing of every live token and the per-expert pair lists (one dispatch of t_max workgroups).
// The work split of PrefillRouteOp's logits from x (0s: automatic).
struct RouteFromXTuning {
  uint32_t wg = 0;     // invocations per workgroup (one token): a power of two from 64, at most
                       // the device's; 0 auto (1024, or the device's limit)
  uint32_t lanes = 0;  // invocations per router row: 4, 8, 16 or 32; 0 auto (16)
  uint32_t batch = 0;  // a lane's router loads issued together: 4, 8 or 16; 0 auto (8)
};

struct PrefillRouteOp {
  uint32_t n_expert = 0;
  MoeRouting routing;
  uint32_t t_max = 0;
  BufferSlice logits;   // f32 [t_max][E]
  BufferSlice bias;     // f32 [E] exp_probs_b, or empty
  BufferSlice step;     // uint words
  uint32_t count_word = 0;
  BufferSlice route;    // uint [prefill_route_bytes] (out)
  BufferSlice lists;    // uint [prefill_list_bytes] (out)
  std::string label;    // empty = "moe_prefill_route"
  // Set (router.buffer): the routing dispatch computes the logits itself and writes them to
  // `logits`: logits[t] = router . RMSNorm(x[t]; norm, eps) in f32 (moe_prefill_route.comp
  // FROM_X; where route_from_x_supported). Else `logits` is read.
  MatrixRef router;     // [E rows][n_embd] plain F32 / F16 (ffn_gate_inp)
  BufferSlice x;        // f32 [t_max][n_embd]
  BufferSlice norm;     // f32 [n_embd] (ffn_norm)
  float eps = 0;
  RouteFromXTuning tuning;  // that kernel's work split

  uint64_t bytes() const;
  // Two dispatches (the routing per token, a barrier, the lists per expert), no barrier after.
  // Validates sizes and the routing parameters (Error(Runtime)).
  void record(CommandRecorder& rec) const;
};

// Whether PrefillRouteOp can compute the logits from x with this router matrix: plain F32 or F16,
// rows of a multiple of 4 values, at most kRouteFromXMaxEmbd (x's row is staged in shared memory).
constexpr uint32_t kRouteFromXMaxEmbd = 4096;
bool route_from_x_supported(const MatrixRef& router);

// How the FFN kernels of MoePrefillOp and DensePrefillOp run.
struct FfnForm {
  bool int8_activations = true;  // Q4_0/Q8_0/Q4_K/Q6_K: inputs staged as int8 blocks, integer dot products
  FfnInt8Tuning int8_tuning;     // that path's work split
  // Set: the matmul form (shaders/moe_matmul.comp: 16 x 16 x 16 f16 products on tensor cores, or
  // with matmul_kernel Plain / no tensor cores the same with plain FMAs) for every part whose input
  // rows are a multiple of 32 values; else moe_prefill.comp.
  bool matmul = false;
  MatmulKernel matmul_kernel = MatmulKernel::Auto;
  FfnMatmulTuning matmul_tuning;
};

// Gate-up and down of a MoE block's routed experts and shared expert for a chunk, from the
// MOE_TILE1 tile. One dispatch per binding-sized expert range plus one for the shared expert;
// no barriers needed between them (each writes its own pairs).
struct MoePrefillOp {
  MoeTileRef tile;
  uint32_t n_used = 0;  // K
  uint32_t t_max = 0;   // T
  BufferSlice step;
  uint32_t count_word = 0;
  BufferSlice h2;       // f32 [T][n_embd]: RMSNorm(x; ffn_norm) per token
  // Set: the same rows as f16 (the router matmul's input, x16): the gate-up's matmul form reads
  // them instead of h2 (half the bytes, no conversion). n_embd a multiple of 8.
  BufferSlice h2_f16;
  // Set: the same rows as int8 blocks (RmsNormOp::y_q8 of h2; n_embd a multiple of 32): the
  // gate-up's int8 path copies them instead of quantizing h2 in every workgroup.
  BufferSlice h2_q8;
  BufferSlice route;    // PrefillRouteOp::route
  BufferSlice lists;    // PrefillRouteOp::lists
  BufferSlice h;        // f32 [prefill_pairs][moe_h_stride(g)]
  BufferSlice y;        // f32 [prefill_pairs][n_embd]
  std::string label;    // dispatch labels: label + " gateup" / " down" (+ " shared")
  uint64_t max_binding_bytes = 0;  // 0 = device maxStorageBufferRange (lower: tests of expert ranges)
  FfnForm form;

  // Bytes of one call, counting every expert's weights once (the chunk's upper bound).
  uint64_t gateup_bytes() const;
  uint64_t down_bytes() const;
  void record_gateup(CommandRecorder& rec) const;  // h of every live pair, no barrier
  void record_down(CommandRecorder& rec) const;    // y of every live pair, no barrier
};

// Dense FFN (leading layers) for a chunk: h[t] = silu(gate . h2_t) * (up . h2_t), y[t] = down . h[t].
struct DensePrefillOp {
  MatrixRef gate, up;   // [F][n_embd], same type, same buffer (one binding spans both)
  MatrixRef down;       // [n_embd][F]
  uint32_t t_max = 0;
  BufferSlice step;
  uint32_t count_word = 0;
  BufferSlice h2;       // f32 [T][n_embd]
  BufferSlice h2_q8;    // as MoePrefillOp
  BufferSlice h;        // f32 [T][F]
  BufferSlice y;        // f32 [T][n_embd]
  std::string label;
  FfnForm form;

  uint64_t gateup_bytes() const;
  uint64_t down_bytes() const;
  void record_gateup(CommandRecorder& rec) const;
  void record_down(CommandRecorder& rec) const;
};

// x[t] += y of token t's pairs (routed slots in order, then the shared / dense pair), t < n.
struct PrefillSumOp {
  uint32_t n_embd = 0, n_used = 0, t_max = 0;
  bool has_shared = true;  // add pair t_max*n_used + t (the shared expert; the dense FFN's only pair)
  BufferSlice x, y, step;
  uint32_t count_word = 0;
  std::string label = "prefill_sum";

  uint64_t bytes() const;
  void record(CommandRecorder& rec) const;
  // The same sum as RmsNormOp::add's rows (an RmsNormOp over x then does it instead of record).
  RmsNormOp::ResidualSum residual_sum() const;
};

// out = x[n - 1] (n_embd floats): the last live token's row.
struct PrefillGatherOp {
  uint32_t n_embd = 0;
  BufferSlice x, out, step;
  uint32_t count_word = 0;
  std::string label = "prefill_gather";

  uint64_t bytes() const { return uint64_t(n_embd) * 8 + 4; }
  void record(CommandRecorder& rec) const;
};

// Causal attention of the T queries of a chunk (query t at position step[pos_word] + t sees
// rows [0, that position]; t >= step[batch.count_word] skipped) over a layer's cache. Where
// tensor cores run it (tensor_cores()): one dispatch of attention_prefill_tc.comp, 16 (query,
// head) rows per workgroup, olat written directly. Otherwise in workgroups of (KV chunk, head
// group, query group): each staged tile of cache rows serves queries_per_group() queries x
// heads_per_group() heads, so the cache is read once per (query group, head group), not once per
// query; the partials (per query: partials_bytes(), the layout of AttentionOp) are then combined
// by the merge of attention() (unchanged).
struct PrefillAttentionTuning {
  uint32_t queries_per_group = 0;  // GQ (1..64); auto: 8
  uint32_t max_pairs = 0;          // (query, head) pairs per workgroup, 32 or 64; auto: 32 (64 doubles
                                   // the threads and the registers, see attention_prefill.comp)
  uint32_t tile = 0;               // rows staged per step (2, 4 or 8, dividing attention().tile());
                                   // auto: the largest that fits the device
  // The tensor-core kernel (attention_prefill_tc.comp: no split along the context, olat written
  // directly): -1 auto, where attention_tc_supported(ctx, false); 0 never; 1 wherever
  // attention_tc_supported(ctx, true) (its plain-FMA form where there are no cooperative
  // matrices: the tests' path).
  int tensor_cores = -1;
  // Its next block of cache rows loaded during the current one (TC_PREFETCH; H100, GLM pp512:
  // +1.1 % at depth 0, +11.3 % at 4096, session 20).
  bool tc_prefetch = true;
  // Nats a row's running maximum may grow before its O is rescaled (0: at every growth; <= 10;
  // H100, GLM pp512 @4096: 8 is 7 % faster than 0, session 21).
  uint32_t tc_margin = 8;
  // Two buffers of cache rows, so a block needs 3 barriers, not 4 (where the shared memory holds
  // them; H100, GLM pp512 @4096: 12 % slower, 42 KB of shared memory a workgroup against 23 KB,
  // session 21); each group's query tiles held in registers where there are tensor cores (QREG;
  // with one buffer, +13 % there).
  bool tc_double_k = false;
  bool tc_qreg = true;
  // Each workgroup walks the cache from its own block on, around to the start (STAGGER), so the
  // resident workgroups do not all read the same rows at the same time (H100, GLM pp512 @4096:
  // +2.9 / +3.0 %, session 28; the decode form's chunks are disjoint already).
  bool tc_stagger = true;
  // Tiles of 16 (query, head) rows per workgroup (M_TILES, 1 or 2; 2 with 4 groups each, one
  // where two do not fit the shared memory): each staged block of cache rows serves both, so its
  // L2 reads per row halve (H100, GLM pp512 @4096: +6.5 %, session 28; the decode form's heads:
  // a tie at 8192 and 16000 positions, AttentionTuning::decode_tc_m_tiles 1).
  uint32_t tc_m_tiles = 2;
  // Each (query, head) tile's walk split into this many chunks of the context (SPLIT_Q: a second
  // dispatch along y, then the merge; the decode's partials layout, f32 olat): 1 none, 2..8, 0
  // automatic (prefill_tc_split: the fewest rounds of the device's SMs, one or two workgroups
  // each, for chunk_queries queries; 1 where the SM count is unknown). At depth the walks are
  // about equally long, so the attention costs whole rounds (H200, 4096 positions: 0.6 ms a layer
  // per round for chunks of 256 to 640 tokens; session 29).
  uint32_t tc_split = 0;
  uint32_t chunk_queries = 0;  // the recording's queries per chunk (T), for the automatic tc_split
  // Also build the tensor-core kernel's variant that writes olat as f16 (record's olat_f16: the
  // rows a following matmul reads, so no f32 -> f16 conversion dispatch and barrier; session 25).
  bool tc_f16_olat = false;
  uint32_t tc_groups = 4;  // groups of 32 invocations per tile of 16 rows (4 or 8; 4 with two
                           // tiles): S's k-tiles and O's column tiles split over them
};

// Whether the tensor-core prefill attention can run here: with cooperative matrices
// (matmul_coop_supported), or (plain) in its plain-FMA form; both need subgroup shuffles of >= 8
// lanes. Its shape needs R and R + Dr multiples of 16, R <= 512, R + Dr <= 576, and its shared
// memory (attention_tc_shared_bytes: for GLM's rows ~23 KB with tensor cores, the query in
// registers, ~28 KB with two tiles of 16 rows; ~42 KB in the plain form, one tile) within the
// device's (attention_tc_fits: with one buffer of cache rows where two do not fit, one tile of
// rows where two do not).
bool attention_tc_supported(Context& ctx, bool plain);
uint64_t attention_tc_shared_bytes(Context& ctx, const AttentionShape& shape, const PrefillAttentionTuning& tuning = {});
bool attention_tc_fits(Context& ctx, const AttentionShape& shape, const PrefillAttentionTuning& tuning = {});
// attention_prefill_tc.comp's pipeline for `shape` with tuning's tc_* choices, where it can run
// (attention_tc_supported(ctx, plain), attention_tc_fits); nullopt elsewhere. Also the decode
// step's split form (AttentionOp, AttentionTuning::decode_tc: SPLIT and TILE added).
std::optional<PipelineDesc> attention_tc_desc(Context& ctx, const AttentionShape& shape,
                                              const PrefillAttentionTuning& tuning, bool plain);
// The tiles of 16 rows per workgroup a description from attention_tc_desc has (one where the
// tuning's two did not fit): its workgroups' rows, or head tiles, are 16 times that.
uint32_t attention_tc_m_tiles(const PipelineDesc& tc);
// The automatic tc_split: the smallest of 1 .. max_split whose rounds of `slots` resident
// workgroups for `workgroups` equally long walks (ceil(workgroups s / slots) / s walks) are within
// 5 % of the fewest (each chunk costs a workgroup prologue and partials); 1 where slots is 0
// (unknown).
uint32_t prefill_tc_split(uint32_t workgroups, uint32_t slots, uint32_t max_split);
// The tensor-core kernel's choices of the decode step's form, from its decode_tc_* knobs (the rest
// at their defaults): what AttentionOp builds it with, and what attention_tc_fits must be asked.
PrefillAttentionTuning decode_tc_tuning(const AttentionTuning& t);

class PrefillAttentionOp {
 public:
  // split: the split-K choices (n_groups, min_chunk, tile) shared with the merge; its
  // heads_per_group is ignored (this kernel picks its own from the pair budget).
  PrefillAttentionOp(Context& ctx, const AttentionShape& shape, const AttentionTuning& split = {},
                     const PrefillAttentionTuning& tuning = {});

  const AttentionOp& attention() const { return attn_; }  // the merge and the split-K parameters
  uint64_t partials_bytes() const { return attn_.partials_bytes(); }  // per query
  // Partials of batch.n queries (q: [n][H][R+Dr], partials: n * partials_bytes()); no barrier.
  void record_partial(CommandRecorder& rec, BufferSlice q, BufferSlice cache, BufferSlice step, uint32_t pos_word,
                      BufferSlice partials, std::string_view label, const QueryBatch& batch) const;
  // record_partial, barrier, attention().record_merge (olat: [n][H][R]); with tensor cores the
  // one dispatch that writes olat (partials unused), or with tc_split() > 1 its split walks, a
  // barrier and the merge (partials: n * partials_bytes()). olat_f16: olat holds f16 (the
  // tensor-core kernel built with tuning.tc_f16_olat, unsplit; else Error(Runtime)).
  void record(CommandRecorder& rec, BufferSlice q, BufferSlice cache, BufferSlice step, uint32_t pos_word,
              BufferSlice partials, BufferSlice olat, std::string_view label, const QueryBatch& batch,
              bool olat_f16 = false) const;

  // Bytes of record_partial for n queries whose last sees kv_len rows: the cache rows once per
  // (query group, head group), the queries, the partials written.
  uint64_t partial_bytes(uint32_t kv_len, uint32_t n) const;
  // Context length the declared bytes assume (default n_ctx); set before recording.
  void set_profile_kv_len(uint32_t kv_len) {
    profile_kv_len_ = kv_len;
    attn_.set_profile_kv_len(kv_len);
  }

  bool tensor_cores() const { return tc_ != nullptr; }
  bool writes_f16_olat() const { return tc16_ != nullptr; }
  // The tensor-core kernel's context chunks per tile (1: no split, no merge).
  uint32_t tc_split() const { return tc_split_; }
  // Partials bytes per query the recording needs (0: none, the tensor-core kernel unsplit).
  uint64_t needed_partials_bytes() const { return tc_ && tc_split_ == 1 ? 0 : partials_bytes(); }
  // The grouped kernel's work split (all 0 where the tensor-core kernel runs instead).
  uint32_t queries_per_group() const { return gq_; }
  uint32_t heads_per_group() const { return hw_; }
  uint32_t tile() const { return tile_; }
  uint32_t threads() const { return wg_; }

 private:
  // The batch's query count after checking it and the q, cache and step bindings (both kernels).
  uint32_t check_inputs(BufferSlice q, BufferSlice cache, BufferSlice step, uint32_t pos_word, const std::string& what,
                        const QueryBatch& batch) const;

  AttentionOp attn_;
  const Pipeline* pipeline_ = nullptr;
  const Pipeline* tc_ = nullptr;    // attention_prefill_tc.comp
  const Pipeline* tc16_ = nullptr;  // ... OUT_F16 (tuning.tc_f16_olat)
  const Pipeline* tc_split_pipe_ = nullptr;  // ... SPLIT_Q (tc_split_ > 1)
  uint32_t tc_split_ = 1;
  uint32_t tc_rows_ = 16;           // ... (query, head) rows per workgroup (16 tc_m_tiles)
  AttentionShape shape_;
  uint32_t gq_ = 0, hw_ = 0, tile_ = 0, wg_ = 0;
  uint32_t profile_kv_len_ = 0;
};

}  // namespace tessera::vk
