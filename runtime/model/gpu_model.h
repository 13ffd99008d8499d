// GpuModel: a packed .tsr model on a Vulkan device, decoding with one pre-recorded command buffer.
//
// Load: the memory plan (weights + latent KV cache for n_ctx + scratch) is checked before any
// allocation; each decoder block's byte span is uploaded as one buffer (the file keeps a block's
// tensors together), the rest (token_embd, output) one buffer each.
//
// Decode step (docs/DECODE.md), recorded once at load and resubmitted for every token:
//   embed(step.token) -> for each block: attention (composed or factored, by what the file holds)
//   + dense FFN or MoE (routing on the GPU) -> output norm + LM head -> sample/argmax, which writes
//   the next token and position back into the step buffer: the GPU feeds itself.
// Per-token values live in a host-visible step buffer {token, position}; nothing is re-recorded.
// Prompts of more than one token take the batched prefill graph instead (gpu_prefill.cpp,
// docs/PREFILL.md): chunks of prefill_chunk tokens, one recording resubmitted per chunk.
//
//   GpuModel m(ctx, file, {.n_ctx = 4096});
//   std::vector<float> logits = m.forward(prompt_ids, /*last_only=*/true);   // prompt
//   int32_t t = m.sampled_token();            // chosen on the GPU from the last logits
//   while (...) { t = m.decode_step(); }      // one submit per token, token in, token out
//   m.decode_steps(n, {}, [](int32_t t) { ...; return true; });  // n tokens, two steps queued
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "format/model_config.h"
#include "format/tsr.h"
#include "runtime/cpu/generate.h"
#include "runtime/model/timeline.h"
#include "runtime/vulkan/context.h"
#include "runtime/vulkan/kernels_attention.h"
#include "runtime/vulkan/kernels_matmul.h"
#include "runtime/vulkan/kernels_matvec.h"
#include "runtime/vulkan/kernels_moe.h"
#include "runtime/vulkan/kernels_prefill.h"
#include "runtime/vulkan/kernels_sample.h"
#include "runtime/vulkan/memory.h"
#include "runtime/vulkan/recorder.h"
#include "runtime/vulkan/transfer.h"

namespace tessera::model {

// GpuModelOptions::prefetch bits: which weights are pulled into the L2 ahead of their stage.
constexpr uint32_t kPrefetchAttnOut = 1;  // W_vo (or v_b and attn_output), beside the attention
constexpr uint32_t kPrefetchFfnIn = 2;    // the router (read by its dispatch, or by the router fold's
                                          // epilogue of W_vo) and the shared expert, beside the attention
constexpr uint32_t kPrefetchQuery = 4;    // W_qk (or q_b), beside q_a / kv_a
constexpr uint32_t kPrefetchNextNorm = 8;  // the next layer's attn_norm (8 KB with GLM, read once per
                                           // layer and token: cold), beside the MoE down, so that q_a /
                                           // kv_a's first reads hit the L2 (session 39's next step)
constexpr uint32_t kPrefetchAll = 15;

// GpuModelOptions::prefill_moe_matmul -1: the FFN's matmul form from chunks of this many tokens.
constexpr uint32_t kMoeMatmulMinChunk = 256;
// GpuModelOptions::prefill_chunk: chosen by the device (512 with matmuls, else 64).
constexpr uint32_t kPrefillChunkAuto = 0xFFFFFFFFu;
constexpr uint32_t kPrefillChunkMatmul = 512, kPrefillChunkMatvec = 64;

// Whether the prefill's dense matrices run as matmuls under these options on this device
// (GpuModelOptions::prefill_matmul; gpu_prefill.cpp).
bool prefill_uses_matmul(int prefill_matmul, vk::Context& ctx);

struct GpuModelOptions {
  uint32_t n_ctx = 4096;          // KV-cache positions (clamped to the model's training context)
  vk::SampleParams sampling;      // the GPU sampler's parameters (temperature 0 = greedy)
  bool device_sampling = true;    // generate() takes the GPU's choice (false: the host samples
                                  // from downloaded logits, e.g. for repetition penalties)
  bool progress = false;          // upload progress bar on stderr
  vk::AttentionTuning attention;  // decode attention work split (0 = automatic; bench --attention)
  vk::MatvecTuning matvec;        // decode int8 matvec work split (0 = automatic; bench --tune)
  vk::MoeTuning moe;              // decode expert kernels' work split (0 = automatic; bench --tune)
  bool int8_activations = true;   // Q4_0/Q8_0/Q4_K/Q6_K matvecs and experts: int8 activations and integer
                                  // dot products where the device has them (q8_activations.glsl)
  uint64_t memory_limit = 0;      // refuse plans above this many bytes (0 = the device's heap)
  // L2 prefetch of a later stage's weights, recorded beside latency-bound kernels (PrefetchOp,
  // docs/DECODE.md): kPrefetch* bits; bench --tune prefetch=N.
  uint32_t prefetch = 0;
  // Prompt tokens per batched prefill submit (docs/PREFILL.md); 0 = prompts run token by token
  // through the decode graph. Clamped to the context. kPrefillChunkAuto: 512 where the dense
  // matrices run as matmuls (H100, GLM: pp512 2416 tok/s against 1236 in chunks of 64, pp2048
  // 1876 against 1049; session 19), else 64.
  uint32_t prefill_chunk = kPrefillChunkAuto;
  // A second, smaller recording for a prompt's last tokens: where at most prefill_tail_chunks
  // times this many remain (and it is below prefill_chunk), they run in chunks of this size, so
  // that a short prompt does not pay for a large chunk (session 19: pp16 563 tok/s in chunks of 64,
  // 335 in one of 512). 0: none.
  uint32_t prefill_tail_chunk = 64;
  // The most tail chunks a prompt's end runs in (bench --tune tail_chunks; 0: never). Default 2:
  // H200 GLM Q4_0 with 512-token chunks, session 23: pp128 2960 tok/s in two tail chunks against
  // 2700 in one large chunk, pp192 2952 in three against 3735; without the tail pp16 502 against
  // 997, pp64 1532 against 3002.
  uint32_t prefill_tail_chunks = 2;
  // A chunk of T tokens whose first position is at least this many times T runs a second
  // recording whose tensor-core attention splits each tile's walk along the context and merges
  // (vk::PrefillAttentionTuning::tc_split, automatic from the SM count unless set; 0: every chunk):
  // at depth the walks are long and come in whole rounds of the SMs, near the start the merge
  // only costs. H200 GLM Q4_0, session 29: split at 4096 / at 0, pp16 341 -> 654 / 1329 -> 1228,
  // pp64 1275 -> 2168 / 3589 -> 3280, pp512 2958 -> 3064 / 5818 -> 5290. bench --tune split_depth.
  uint32_t prefill_tc_split_depth = 8;
  // The FFN's int8 prefill kernels read h2 as int8 blocks written once per token by its RMSNorm
  // (bench --tune prefill_q8_input=0: each workgroup quantizes the f32 rows it stages).
  bool prefill_q8_input = true;
  // The prefill's dense matrices as matmuls (vk::MatmulOp: each matrix read once per 64 tokens,
  // f16 products with f32 sums; its input normalized into f16 rows first): -1 auto, where the
  // device has tensor cores (vk::matmul_coop_supported); 1 wherever f16 arithmetic runs (the
  // plain kernel elsewhere: the tests' path); 2 the plain kernel even where tensor cores are
  // (a diagnostic); 0 never (the batched matvec, 8 tokens per dispatch). bench --tune
  // prefill_matmul=0|1|2|3 (2 = auto, 3 = the plain kernel).
  int prefill_matmul = -1;
  vk::MatmulTuning matmul;        // its work split (0 = automatic; bench --tune matmul_rows / _step / _groups)
  // Where the dense matrices run as matmuls, the FFN kernels take their matmul form too
  // (shaders/moe_matmul.comp) with prefill_moe_matmul 1, or -1 (auto) in chunks of at least
  // kMoeMatmulMinChunk tokens: the experts and a dense FFN (leading layers; H100, GLM layer 0:
  // 1.6 -> 0.67 ms per 512-token chunk). In 64-token chunks (~4 tokens per expert) the experts
  // are a weight stream and the int8 kernels stream faster (H100 pp512 1215 vs 869 tok/s); in
  // chunks of 256 the matmul form wins (1817 -> 1972; 512: 2404; PERFORMANCE.md session 19); the
  // dense FFN of a 64-token chunk: 385 us in the matmul form, 291 in the int8 one (session 23).
  // bench --tune moe_matmul=0|1|2 (2 = auto).
  int prefill_moe_matmul = -1;
  // The experts' matmul form reads the router matmul's f16 copy of the normed rows (x16) instead
  // of the f32 rows, where the router ran as a matmul. bench --tune moe_f16_in=0|1.
  bool prefill_moe_f16_input = true;
  // The router logits of a MoE layer in a chunk: 1 the dense path (a matmul or batched matvecs
  // and, split along K, a sum; then the routing dispatch), 2 computed by the routing dispatch
  // itself from x, one workgroup per token (vk::PrefillRouteOp::router; no router dispatch, no
  // sum, two barriers fewer); 0 auto: 2 where the FFN does not take its matmul form (whose input
  // is the router's f16 rows) and the router allows it (session 25). bench --tune prefill_router.
  uint32_t prefill_router = 0;
  vk::RouteFromXTuning prefill_route_x;
  // The prefill's FFN sum into x fused with the next layer's attention norm where that layer's
  // first matrices run as matmuls (vk::RmsNormOp::add; session 25). bench --tune sum_norm=0|1.
  bool prefill_sum_norm = true;
  // The tensor-core prefill attention writes olat as the f16 rows the composed W_vo's matmul reads
  // (no conversion dispatch and barrier; session 25). bench --tune f16_olat=0|1.
  bool prefill_f16_olat = true;
  // q_a's split-K parts summed by the q_a norm that reads them, beside kv_a's sum (a dispatch and a
  // barrier fewer per layer; session 25). bench --tune split_norm=0|1.
  bool prefill_split_norm = true;  // that routing kernel's split (bench --tune route_x_wg / _lanes / _batch)
  // The prefill attention (vk::PrefillAttentionOp): chunks along the context per query (split-K;
  // 0: auto, 2048 / chunk tokens within 1..32) and their fewest positions (0: auto, 128), and the
  // kernel's query / head grouping (gpu_prefill.cpp prefill_attention_split), or the tensor-core
  // kernel (prefill_attention.tensor_cores; auto where cooperative matrices are). bench --tune
  // pattn_groups / pattn_min_chunk / pattn_queries / pattn_pairs / pattn_tc.
  uint32_t prefill_attention_groups = 0;
  uint32_t prefill_attention_min_chunk = 0;
  vk::PrefillAttentionTuning prefill_attention;
  // The router fold (docs/ARCHITECTURE.md "Router fold"): the decode step's MoE layers compute the
  // router logits in the epilogue of the matvec that writes x and route in the gate-up kernel (no
  // router dispatch, one barrier less). Off by itself where the device lacks 64-bit integer
  // buffer atomics or a layer's router is not a plain F32/F16/BF16 matrix of <= 256 experts: those
  // layers record the router dispatch. bench --tune router=0|1.
  bool fused_router = true;
  // What the barriers of the decode step and the prefill chunks order (vk::BarrierScope; both fit
  // all three; ComputeOnly is the cheapest, 2.2 against 4.8 us per barrier on an H100): bench
  // --tune barrier=0|1|2 (bench --roofline times each).
  vk::BarrierScope barrier_scope = vk::BarrierScope::ComputeOnly;
  // The attention merge also writes olat as int8 blocks, which W_vo's int8 kernel reads instead of
  // quantizing olat in every workgroup (composed files, int8 activations). bench --tune olat_q8=0|1.
  // With nothing staged, W_vo's rows are split over two subgroups each (MatvecTuning::ksplit auto):
  // on the H100 GLM tg128 280.5 -> 290.0 tok/s (W_vo 17.7 -> 13.7 us); olat_q8 alone, with one
  // subgroup per row, was neutral (279.5). PERFORMANCE.md.
  bool olat_q8 = true;
  // The output norm also writes its result as int8 blocks, which the int8 LM head reads instead of
  // quantizing it in each of its workgroups (bench --tune head_q8=0|1). Off: on the H100 the head
  // was no faster (its ~70 workgroups per SM hide their staging) and the norm 3.5 us slower.
  bool head_q8 = false;
  // Dense layers on the int8 path: the down projection as the int8 matvec reading the gate-up's
  // int8 h (matvec_q8.comp X_Q8, two subgroups per row) instead of moe_down.comp's dense form,
  // which holds a lane's share of h in registers. bench --tune dense_down=0|1.
  bool dense_down_matvec = true;
  // The MoE down fused into the gate-up (moe_gateup.comp FUSED_DOWN, MoeGateUpOp::down_acc): one
  // dispatch and one barrier less per MoE layer, where the router fold, int8 activations and
  // subgroups serve the layer and its tile is one weight type in one binding
  // (vk::moe_fused_down_supported); other layers keep the down dispatch. bench --tune
  // moe_fused=0|1. Off: neutral on the H100 (GLM tg128 277.1 / 274.5 -> 278.5 tok/s, inside the
  // spread; the fused kernel takes as long as the two: its strided down reads, 2048 atomics per
  // workgroup and the last workgroup's tail cost what the barrier saved; PERFORMANCE.md).
  bool fused_down = false;
  // The decode step's layers read the per-token words (position, KV length) from a device-local
  // copy made by a copy command at the step's start, not from the host-visible step buffer, whose
  // every read crosses the bus on a discrete GPU (kv_write, attention and merge of each layer).
  // bench --tune step_local=0|1.
  bool step_local = true;
  // Early start of W_vo (docs/DECODE.md "Early start"): where the attention range's kernel writes
  // olat's int8 blocks itself (single, mid), W_vo is recorded with no barrier after it; its
  // workgroups load their weight blocks while the attention runs and wait on a gate word the
  // attention's workgroups count up (attention_rows.comp GATE_SIGNAL, matvec_q8.comp WAIT_GATE).
  // A device that did not run the two side by side (the wait gives up) makes the model re-record
  // without it and run the step again, once, with a warning. bench --tune early_vo=0|1.
  bool early_vo = true;
  // The same for the MoE down after the gate-up (moe_gateup.comp GATE_SIGNAL, moe_down.comp
  // WAIT_GATE): the down's workgroups wait for the route, load their experts' weight blocks while
  // the gate-up runs, then wait for its h. On the H100 GLM gained 1.3-2 % (tg128 325.6 -> 329.6
  // at depth 0); DeepSeek-V2-Lite lost 6-8 % until MoeDownOp::gate_supported refused slots of more
  // than 2 blocks per lane (its 2816-wide shared slot: 106 registers). PERFORMANCE.md session 10.
  // bench --tune early_down=0|1.
  bool early_down = true;
  // With early_down: the next layer's q_a / kv_a wait on the down's gate instead of a barrier
  // (moe_down.comp X_SIGNAL, matvec_q8.comp WAIT_GATE on staged x). Off: on the H100 it lost
  // 1-1.6 % (GLM tg128 329.6 / 330.6 -> 324.9 / 324.0 at depth 0; PERFORMANCE.md session 10):
  // the down's 1024 workgroups all add to one word. That next layer keeps the barrier after its
  // stage 1 (early_qk off there). H200, session 34: -3.9 % (447.4 -> 429.9). bench --tune
  // early_next=0|1.
  bool early_next = false;
  // Stage 2 without the barrier after stage 1 (models with a q LoRA): the q LoRA matvec and kv_a
  // open gates as their workgroups finish (matvec_q8.comp SIGNAL_GATE); W_qk (or q_b) loads its
  // weight blocks while they run and waits on the first, kv_write on the second (kv_write.comp
  // WAIT_GATE). Since no barrier then separates stage 1's reads of x from the kernels that read x
  // after the attention's residual add (the gate-up, the down: early-started, plain loads), the
  // add writes the other of two x buffers (MatvecOp::residual): otherwise an SM that ran q_a may
  // serve x's old lines from its L1 — session 33's race on the H200 (other tokens from the same
  // inputs), found in session 34. Only where that matvec takes the residual (the int8 kernel).
  // Not after a layer whose down opened stage 1's gate (early_next): that layer's FFN read the
  // buffer this one's add writes, with no barrier since.
  // Session 34, H200, with qk_q8: GLM Q4_0 tg128 432.3-432.8 -> 445.7-447.5 (+3.1-3.4 %), 311.1
  // -> 315.2 at depth 4096; Q4_K_M (q_a in Q4_K) 362.3 -> 360.8 and 360.4 -> 357.6 (-0.4 / -0.8 %);
  // without qk_q8 -1.2 % / -4.7 % (PERFORMANCE.md). On the H100 (session 11, without qk_q8) it
  // lost 6.5 %: not measured there since. 1 on, 0 off, -1 (default) where q_a's weights have
  // 32-element blocks (Q4_0, Q8_0). bench --tune early_qk=0|1.
  int early_qk = -1;
  // The attention without the barrier after stage 2 (composed W_qk, a q LoRA, early_vo; the
  // single and mid ranges; with early_qk too since session 14, W_qk and kv_write then both wait
  // and signal): W_qk's workgroups and kv_write open a gate
  // (matvec_q8.comp SIGNAL_GATE, kv_write.comp SIGNAL_GATE), the attention's workgroups wait on it
  // (attention_rows.comp WAIT_GATE). H100, GLM Q4_0: +2.0 % tg128 at depth 0, +2.2 % at 512
  // (PERFORMANCE.md session 12). bench --tune early_attn=0|1.
  bool early_attn = true;
  // The MoE gate-up without the barrier after W_vo (with early_vo and the router fold; since
  // session 33 also where the down stays behind its barrier, e.g. DeepSeek-V2-Lite: H200 tg128
  // +0.4 %, Q4_K_M +0.7 %): W_vo's workgroups open a gate once their rows of x and their fold sums are written
  // (matvec_q8.comp SIGNAL_GATE), the gate-up's wait on it (moe_gateup.comp WAIT_GATE) and read x
  // and the accumulators with plain loads. Session 12: neutral to -1 %; session 15 (the routing's
  // shorter rounds, queued steps): +1.0 % tg128 on the H100 at depth 0, +0.8 % at 4096, two
  // interleaved pairs each (PERFORMANCE.md). bench --tune early_gateup=0|1.
  bool early_gateup = true;
  // The q LoRA matvec also writes its output times attn_q_a_norm as int8 blocks and its sums of
  // squares (matvec_q8.comp OUT_Q8, 32 rows per workgroup); W_qk (or q_b) reads them with no
  // staging (X_Q8 + X_SS), and with early_qk waits for them as W_vo waits for olat's blocks.
  // Session 12 (whole blocks): W_qk 8.0 -> 6.2 µs, q_a 4.1 -> 6.2: a tie. Session 14 (halves,
  // below): W_qk 8.2 -> 6.7 µs, q_a 4.0 -> 5.1; tg128 a tie at 0, -2 % at 512; with early_qk
  // (now chained to the early attention) +1 % / -1 %, q_a 8.5 µs beside W_qk's stream: off.
  // Session 34 (H200, with early_qk race-free): GLM Q4_0 +3.4 %, Q4_K_M -0.4 / -0.8 % (early_qk
  // alone: -1.2 % / -4.7 %). 1 on, 0 off, -1 (default) as early_qk's default. bench --tune
  // qk_q8=0|1|2.
  int qk_q8 = -1;
  // With qk_q8: q_a writes half blocks of 16 rows, each with its own scale, so it keeps its 48
  // workgroups of 16 rows (matvec_q8.comp OUT_HALVES / X_HALVES); off: whole blocks, 24
  // workgroups of 32 rows (session 12: q_a 4.1 -> 6.2 µs). bench --tune qk_q8=2 turns it off.
  bool qk_q8_halves = true;
  // With the attention started early in its single or mid range (early_attn) and W_qk early
  // (early_qk): W_qk's workgroups read one word of every 32-byte sector of the cache rows the
  // attention will read (all but the position's own) before their wait, so that those rows are in
  // the L2 when the attention reads them (MatvecOp::row_prefetch). Session 35, H200, GLM Q4_0
  // tg128 447.4 -> 453.1 (+1.3 %); a tie at depth 512 (the mid range). 2: also in the short range,
  // its first row_prefetch_short_rows rows (0: all, up to short_max_kv). Session 36, plain loads,
  // all rows: -0.4 % at 4096; session 37, coherent loads, all rows: +0.4 / +0.5 % at 1024 / 2048,
  // a tie at 4096, -0.35 % at 6000; the first 2048 rows: +0.6 / +0.7 / +0.4 % at 2048 / 4096 /
  // 6000 (H200, GLM Q4_0 tg64). 0: off. bench --tune row_prefetch=0|1|2, row_prefetch_short=N.
  uint32_t row_prefetch = 2;
  uint32_t row_prefetch_short_rows = 2048;
  // The row prefetch's loads plain (filling the L1 of W_qk's SMs too) instead of coherent (the
  // L2 only). Session 37, H200: with plain loads the mid range stretched past its defaults
  // (`--attention mid_max=6144,mid_groups=16|32` at 4096 positions) decoded nondeterministically
  // (session 36's race), with coherent ones deterministically; the same speed (tg128 460.0 both).
  // bench --tune row_prefetch_l1=0|1.
  bool row_prefetch_l1 = false;
  // The early W_vo's weight blocks per lane and row loaded before its wait, the rest after it
  // (MatvecTuning::preload_early); 0: all. Session 35, H200, with row_prefetch: GLM's Q8_0 W_vo
  // holds 5 blocks a lane, 63 registers; with 3 (40 registers) its 256 workgroups are all resident
  // beside the attention: Q4_0 tg128 453.2 -> 459.0 (+1.3 %; 4: 452.5, 2: 456.4, 1: 458.0),
  // Q4_K_M 360.4 -> 366.9 (+1.8 %), depth 4096 313.1 -> 314.7. bench --tune vo_preload=N.
  uint32_t vo_preload = 3;
  // The same where the attention is split over context workgroups and merged (the short and long
  // ranges: W_vo waits on the merge, whose reads of the partials queue behind its preload). Session
  // 36, H200, GLM Q4_0 tg64 with short_wait: 381.8 -> 386.2 at depth 1024 (+1.2 %), 322.2 -> 323.3
  // at 4096. bench --tune vo_preload_split=N.
  uint32_t vo_preload_split = 1;
  // decode_steps queues step i + 1 before it waits for step i (the sampler leaves the step buffer
  // ready for the next step: its input, position and attention counts), so the host's wait, read
  // and submit are off the GPU's path. Off: one submit and wait per step. bench --tune pipeline=0|1.
  bool pipeline = true;
  // With pipeline: decode steps per submission (1..16), where a run of steps stays inside one
  // attention range; the rest go one per submission. A recording of N steps (the step recorded N
  // times, full barriers between) spends one submission's start-up on N tokens; the host sees
  // the tokens N at a time. bench --tune steps=N.
  uint32_t steps_per_submit = 8;
  // Fault injection for tests: W_vo's gate target one above what the attention counts, so every
  // early-started W_vo's wait gives up and the model takes its fallback (re-records without early
  // starts and runs the step again).
  bool fault_gate_never_opens = false;
  // With early_vo: count the W_vo workgroups whose first poll found the gate closed (they ran
  // beside the attention) and all gated ones (GpuModel::early_start_counts). bench --tune gate_stats=1.
  bool gate_stats = false;
  // Dependent integer steps between two polls of every gate (gate.glsl GATE_BACKOFF; 0: none).
  // A process-wide shader define: set on the context's pipeline library by the constructor.
  // bench --tune gate_backoff=N.
  uint32_t gate_backoff = 0;
  // With timeline: a kernel's early mark is where its gated wait ended (gate.glsl), not its own
  // TS_MARK_EARLY (timeline.glsl TS_MARK_GATES; process-wide). bench --tune mark_gates=1.
  bool mark_gates = false;
  // With timeline: attention_prefill_tc.comp's two marks carry the summed time of two of its
  // phases (its define TS_TC_PHASES; process-wide): 1 staging a block's rows and its partial
  // scores, 2 P and O's products, 3 the query into registers and the output, 4 the step words and
  // the query staged. bench --tune tc_phases=N.
  uint32_t tc_phases = 0;
  // The factored value path (a file without attn_vo) on the int8 kernels: attn_v_b as one matvec
  // of stacked per-head matrices on the attention's int8 olat (MatvecOp::x_head_rows), writing o
  // as int8 blocks that attn_output reads; with early_vo each starts beside its producer and
  // waits on a gate. Off: the f32 absorb kernel and attn_output staging o. bench --tune vb_q8=0.
  bool vb_q8 = true;
  // Subgroups per attn_v_b workgroup on that path (8 or 16: 32 / vb_teams rows each; 0: the
  // matvec's own split). bench --tune vb_teams=N.
  uint32_t vb_teams = 8;
  // Weight blocks held across a wait or a staging kept as loaded (Q4_0: 5 registers instead of 10;
  // q8_activations.glsl Q8_RAW), unpacked at use. A process-wide shader define. bench --tune q8_raw=0.
  bool q8_raw = true;
  // Q4_K gate-ups (experts, dense FFN) on the int8 path: a lane takes both sub-blocks that share
  // its 32 quant bytes (low and high nibbles), each byte and scale word loaded once
  // (q8_activations.glsl KQ_PAIRS; H200 Q4_K_M tg128 +0.7 %, session 30). A process-wide shader
  // define. bench --tune kq_pairs=0.
  bool kq_pairs = true;
  // Every kernel of the model writes its workgroups' device-clock start and end
  // (shaders/timeline.glsl) for timeline_step (bench --timeline). The kernels are other pipelines
  // (one more binding, a barrier and two clock reads per workgroup). Needs a device clock in shaders.
  bool timeline = false;
};

// The batched prefill graph (docs/PREFILL.md), per chunk of up to `chunk` tokens.
struct PrefillStats {
  uint32_t chunk = 0;             // T (0: no prefill graph)
  uint32_t tail_chunk = 0;        // the second recording's chunk for a prompt's last tokens (0: none)
  uint32_t dispatches = 0;        // per chunk, without the LM head
  uint32_t barriers = 0;
  uint64_t weight_bytes = 0;      // weights read per chunk (declared by the kernels)
  uint64_t scratch_bytes = 0;     // device memory of the prefill buffers
  bool matmul = false;            // dense matrices as matmuls (GpuModelOptions::prefill_matmul)
  bool matmul_coop = false;       // ... on tensor cores
  bool attention_tc = false;      // the attention as attention_prefill_tc.comp (vk::PrefillAttentionOp::tensor_cores)
};

// What the early-started W_vo workgroups saw (GpuModelOptions::gate_stats), summed over the
// steps and layers: workgroups whose first poll found the gate closed (they ran beside the
// attention) and all of them; with a shader clock, per layer and step: from the first W_vo
// workgroup's start to the first that saw the gate open (the attention's remaining time as W_vo
// saw it), from the first to the last open, and from the first open to the last workgroup's end.
struct GateTrace {
  uint64_t closed = 0, workgroups = 0;
  uint64_t layers = 0;  // layer-steps with times
  uint64_t wait_ns = 0, open_spread_ns = 0, after_open_ns = 0;
};

struct DecodeStats {
  uint32_t dispatches = 0;        // per decoded token
  uint32_t barriers = 0;
  uint32_t layers = 0;
  bool composed_qk = false, composed_vo = false;
  bool int8_activations = false;  // some matvec / expert kernel runs the int8-activation path
  bool fused_router = false;      // some MoE layer routes through the router fold (no router dispatch)
  uint64_t weight_bytes = 0;      // bytes of weights read per token (declared by the kernels)
  uint64_t device_bytes = 0;      // device memory planned
};

class GpuModel : public LanguageModel {
 public:
  // Throws Error(BadInput) for a file that lacks a tensor or has an unexpected layout,
  // Error(Runtime) when the device cannot hold the plan (before allocating).
  GpuModel(vk::Context& ctx, const TsrFile& file, const GpuModelOptions& options);
  ~GpuModel() override;
  GpuModel(const GpuModel&) = delete;
  GpuModel& operator=(const GpuModel&) = delete;

  const ModelConfig& config() const { return config_; }
  int n_ctx() const override { return int(n_ctx_); }
  int n_past() const override { return int(n_past_); }
  uint32_t n_vocab() const override { return config_.n_vocab; }
  const DecodeStats& stats() const { return stats_; }
  // Whether the decode step is recorded with early starts (false once a wait gave up; early_attn
  // needs early_vo).
  bool early_starts() const { return options_.early_vo || options_.early_down || options_.early_qk != 0; }
  // GpuModelOptions::gate_stats: the early-started W_vo since the model was made (GateTrace).
  const GateTrace& gate_trace() const { return gate_trace_; }
  const PrefillStats& prefill_stats() const { return prefill_stats_; }

  // Runs tokens at positions n_past().. and returns their logits ([n x n_vocab], or only the last
  // row when last_only): more than one token through the batched prefill graph (chunks of
  // options.prefill_chunk; docs/PREFILL.md), one token through the decode graph. Either way the
  // GPU sampler then holds the next token (sampled_token()) and decode_step() continues. Throws
  // Error(Usage) when the context would overflow, Error(BadInput) for a token id outside the
  // vocabulary (both before any work).
  std::vector<float> forward(std::span<const int32_t> tokens, bool last_only) override;
  // The token the GPU sampler chose from the last step's logits.
  int32_t sampled_token() const;
  // One step on sampled_token() at position n_past(); returns the next sampled token.
  int32_t decode_step();
  // One step on `token` instead (bench --forced-tokens; Error(BadInput) outside the vocabulary).
  int32_t decode_step(int32_t token);
  // Decodes up to n tokens at positions n_past()..: step i is fed forced[i] (forced non-empty: at
  // least n ids) or the token the step before it sampled (the first: sampled_token()). With
  // GpuModelOptions::pipeline step i + 1 is queued before step i is waited for (forced inputs go
  // ahead into the step buffer's ring). on_token gets each step's sampled token in order, as its
  // step completes; returning false stops, and a step already queued is discarded: n_past()
  // counts the reported steps only and sampled_token() is the last reported token, as after as
  // many decode_step calls. Returns the steps reported. Error(Usage) when the context cannot hold
  // n more positions, Error(BadInput) for a forced id outside the vocabulary (both before any work).
  uint32_t decode_steps(uint32_t n, std::span<const int32_t> forced, const std::function<bool(int32_t)>& on_token);
  bool samples_on_device() const override { return options_.device_sampling; }
  int32_t device_token() const override { return sampled_token(); }
  int32_t device_step() override { return decode_step(); }
  int device_steps(int n, const std::function<bool(int32_t)>& on_token) override {
    return n > 0 ? int(decode_steps(uint32_t(n), {}, on_token)) : 0;
  }
  // Logits of the last step (downloaded on request).
  std::vector<float> last_logits() const;
  // Forgets the context (the cache is simply overwritten from position 0).
  void reset() override { n_past_ = 0; }
  // Forgets positions >= n, keeping the cache rows below n: the next step runs at position n
  // (n >= n_past() changes nothing). Lets a benchmark repeat a test at one context depth.
  void rewind(uint32_t n) { n_past_ = n < n_past_ ? n : n_past_; }

  // Runs one decode step with GPU timestamps (a second recording of the step, made on first use)
  // at position kv_len - 1 without advancing the session, and returns per-dispatch timings (label,
  // bytes, µs); *wall_us (if given): host time from submit to done of that step.
  std::vector<vk::DispatchTiming> profile_step(uint32_t kv_len, double* wall_us = nullptr);
  // Runs one full prefill chunk (prefill_stats().chunk deterministic tokens at positions n_past()..)
  // with GPU timestamps, without advancing the session (its cache rows are simply overwritten
  // later), and returns per-dispatch timings; *wall_us: submit to done. Error(Usage) without a
  // prefill graph or when the chunk does not fit the context. tail: the tail recording's chunk
  // instead (prefill_stats().tail_chunk tokens; Error(Usage) without one).
  std::vector<vk::DispatchTiming> profile_prefill(double* wall_us = nullptr, bool tail = false);
  // With GpuModelOptions::timeline: runs one decode step (the recording the decode runs for that
  // context, unchanged) at position kv_len - 1 without advancing the session, and returns every
  // dispatch's device-clock span (timeline.h); *wall_us: host time from submit to done.
  // Error(Usage) without the option or for kv_len outside 1..n_ctx().
  std::vector<DispatchSpan> timeline_step(uint32_t kv_len, double* wall_us = nullptr);
  // Dispatches of the step past the timeline's regions (their records are not their own).
  uint32_t timeline_untimed() const;

 private:
  struct Weights;
  struct Prefill;  // gpu_prefill.cpp
  struct PrefillDeleter {
    void operator()(Prefill* p) const;
  };
  // gpu_prefill.cpp: device bytes of the prefill buffers (counted by the memory plan), their
  // allocation (after the plan passed), and one prompt through the chunked prefill graph.
  uint64_t prefill_scratch_bytes() const;
  void create_prefill();
  std::vector<float> run_prefill(std::span<const int32_t> tokens, bool last_only);
  // head: gpu_prefill.cpp's Head; tail: the prefill_tail_chunk recording.
  // deep: the recording for chunks past prefill_tc_split_depth (its attention's walks split).
  std::unique_ptr<vk::CommandRecorder> record_prefill(int head, bool timestamps = false, bool tail = false,
                                                      bool deep = false);
  void write_step(uint32_t token, uint32_t pos);  // the decode step buffer's words
  // For gpu_prefill.cpp: tensors by name and the layers' KV caches.
  vk::MatrixRef weight_matrix(std::string_view name) const;
  vk::BufferSlice weight_vec(std::string_view name, uint64_t n) const;
  bool has_weight(std::string_view name) const;
  vk::MoeTileRef moe_tile(std::string_view name) const;
  vk::BufferSlice kv_cache(uint32_t layer) const;

  void plan_and_upload(const TsrFile& file);
  // The decode step for contexts of profile_kv_len's attention range (AttentionOp::decode_range),
  // its declared bytes for that length; record_steps: rec_ (and rec_more_) from attn_.
  void record_step(vk::CommandRecorder& rec, uint32_t profile_kv_len);
  void record_steps();
  // A recorder with the step's (and prefill's) barrier scope; record_aside: rec = the step for profile_kv_len,
  // stats_ left as they were (the stats describe rec_).
  std::unique_ptr<vk::CommandRecorder> step_recorder(bool timestamps) const;
  void record_aside(vk::CommandRecorder& rec, uint32_t profile_kv_len);
  // Whether MoE layer `layer` takes the router fold (options, device, router shape).
  bool fold_router(uint32_t layer) const;
  void run_step(int32_t token, uint32_t pos);
  void run_step(vk::CommandRecorder& rec, int32_t token, uint32_t pos);
  vk::CommandRecorder& step_recording(uint32_t pos);  // the recording run_step(token, pos) runs
  // Its twin (the same step, another command buffer: decode_steps queues two steps at once),
  // recorded on first use.
  vk::CommandRecorder& twin_recording(uint32_t pos);
  // options_.steps_per_submit steps for the range of `pos` in one recording (two: `twin` 0 or
  // 1), recorded on first use.
  vk::CommandRecorder& batch_recording(uint32_t pos, uint32_t twin);
  size_t step_range_index(uint32_t pos) const;  // of attn_->decode_ranges()
  // After a step: whether an early start's wait gave up (the step's results are wrong). If so,
  // the error word is cleared and the steps are recorded again without early starts.
  bool step_gave_up();
  // The LM head of one token, shared by the decode step and the prefill's last chunk:
  // normed = RMSNorm(x; output_norm) (its own dispatch), barrier, logits = W_out . normed, barrier,
  // the GPU sampler (the next token and position into the step buffer). `what` ends the labels.
  // Returns the weight bytes read.
  // step_in: where the sampler reads the step's words (the decode step's device copy; empty: the
  // host step buffer).
  uint64_t record_head(vk::CommandRecorder& rec, vk::BufferSlice x, vk::BufferSlice normed, const std::string& what,
                       vk::BufferSlice step_in = {});

  vk::Context& ctx_;
  GpuModelOptions options_;
  vk::PipelineLibrary::TimelineScope timeline_scope_;  // timeline mode while the model lives (options_.timeline)
  ModelConfig config_;
  uint32_t n_ctx_ = 0;
  uint32_t n_past_ = 0;
  DecodeStats stats_;
  std::unique_ptr<vk::MemoryPool> local_, host_;
  std::unique_ptr<Weights> w_;
  std::unique_ptr<vk::AttentionOp> attn_;           // the decode attention (its variant counts: write_step)
  std::unique_ptr<vk::CommandRecorder> rec_;       // the step for the first attention range (or every context)
  // The steps for the later ranges of attn_->decode_ranges(), in order (empty: one range).
  std::vector<std::unique_ptr<vk::CommandRecorder>> rec_more_;
  std::vector<std::unique_ptr<vk::CommandRecorder>> twins_;  // per range, made by twin_recording
  std::vector<std::unique_ptr<vk::CommandRecorder>> batches_;  // per range and twin, by batch_recording
  std::unique_ptr<vk::CommandRecorder> prof_rec_;  // the step with timestamps (profile_step)
  uint32_t prof_kv_len_ = 0;                        // the context length prof_rec_ was recorded for
  GateTrace gate_trace_;                            // GpuModelOptions::gate_stats
  void collect_gate_stats();  // adds the last step's W_vo gate statistics to gate_trace_
  std::unique_ptr<Prefill, PrefillDeleter> prefill_;
  PrefillStats prefill_stats_;
  mutable std::unique_ptr<vk::Transfer> xfer_;  // read-back of device buffers (made at first use)
  // Reads `bytes` from offset 0 of `b`: mapped where it is host-visible, else through xfer_.
  void read_back(const vk::Buffer& b, void* dst, size_t bytes) const;
};

}  // namespace tessera::model
