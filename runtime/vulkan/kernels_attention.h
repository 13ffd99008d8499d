// Attention kernels of the decode step (docs/DECODE.md D3', D4, D5, D6, D7'), absorbed MLA
// over the latent f16 cache (forward.md §2-4).
//
// API (what the decode graph records, per layer; shapes from AttentionShape::from_config):
//
//   KvWriteOp kv_write(ctx, shape);                       // D4, one workgroup
//   kv_write.record(rec, kv, kv_norm_w, step, pos_word, cache_l, "kv_write blk.L");
//       kv      f32 [R + Dr]       output of the kv_a matvec (latent, then k_pe unroped)
//       kv_norm_w f32 [R]          attn_kv_a_norm
//       step    uint words; step[pos_word] = position p of this token
//       cache_l f16 [n_ctx][R+Dr]  this layer's cache; row p = [RMSNorm(kv[0:R]) | rope(kv[R:], p)]
//
//   AttentionOp attn(ctx, shape);                         // D5 + D6
//   partials = pool.create_buffer(attn.partials_bytes(), ...)   // scratch, may be shared by layers
//   attn.record(rec, q, cache_l, step, pos_word, partials, olat, "attn blk.L");
//       = record_partial(...); rec.barrier(); record_merge(...)
//       q       f32 [H][R + Dr]    per head: q_lat (absorbed query), then q_pe UNROPED — the
//                                  partial kernel ropes q_pe at position p while loading it
//       olat    f32 [H][R]         softmax(kq_scale * q.K_j, j <= p) weighted sum of cached latents
//     The cache rows read are [0, p]: p comes from step at run time; the dispatch is sized at
//     record time for n_ctx (chunks past p+1 exit at once), so one recording serves every
//     position and the number of chunks (and so the parallelism) follows the context length.
//
//   AbsorbOp::query(k_b, H, Dr, q_b_out, q).record(rec);   // D3' (factored path)
//       q_b_out f32 [H][Dn + Dr]  output of the attn_q_b (attn_q) matvec
//       q       f32 [H][R + Dr]   q_lat_h = Kb_h q_nope_h, then q_pe copied unroped
//   AbsorbOp::value(v_b, H, olat, o).record(rec);          // D7'
//       o       f32 [H][Dv]       o_h = Vb_h olat_h, then attn_output (a matvec with residual add)
//     k_b / v_b: MatrixRef of attn_k_b {Dn, R, H} as H*R rows x Dn, attn_v_b {R, Dv, H} as H*Dv
//     rows x R; any readable type, SPLIT1 or plain.
//
// Every op has bytes() (what one call moves, for the profiler); record() declares it
// (AttentionOp: for set_profile_kv_len(), default n_ctx, since its bytes follow the context).
//
// Choices (measured on an H200, GLM shape H=20 R=512 Dr=64, Vulkan timestamps, each figure
// including ~5.9 us of dispatch + barrier + timestamp cost, which is what an empty-ish kernel such
// as kv_write measures there):
//  - Rope of the query: done by attention_partial while it loads q (no extra dispatch: the q
//    projection (D3) and kv_write (D4) share a barrier stage, so nothing else could rope q).
//  - Rope angles: a per-pair frequency table computed on the host in double (YaRN blend folded
//    in) and compiled into the shaders; the angle is reduced modulo 2*pi exactly (rope.glsl), so
//    positions up to 2^24 keep full accuracy on GPUs whose sin/cos are only accurate near 0.
//  - Split-K: a fixed grid of n_groups workgroups (record time); at run time the chunk length
//    is max(min_chunk, ceil(kv_len / n_groups)) so short contexts use few small chunks and long
//    ones every group; surplus workgroups exit at once. No indirect dispatch, no host work.
//    Defaults n_groups 128, min_chunk 8: partial + merge ~19 us at 1-1024 positions, 36 us at
//    4096, 84 us at 16384, 289 us at 65536 (the partial kernel is FMA/latency bound: H*(2R+Dr)
//    FMAs per cached position; two cooperative-matrix versions, sessions 17-18 of
//    docs/PERFORMANCE.md, were no faster).
//  - f32 everywhere except the f16 cache; the cache row is converted to f32 once per workgroup.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "format/model_config.h"
#include "runtime/vulkan/context.h"
#include "runtime/vulkan/gate.h"
#include "runtime/vulkan/memory.h"
#include "runtime/vulkan/recorder.h"
#include "runtime/vulkan/split1.h"
#include "shaders/attention_args.h"

namespace tessera::vk {

// RoPE parameters (forward.md §3: NORMAL pairs, optional YaRN) in the form the kernels compile in.
struct RopeParams {
  uint32_t n_rot = 0;         // Dr (even, >= 2)
  double base = 10000;        // rope.freq_base
  double freq_scale = 1;      // 1 / rope scaling factor
  double ext_factor = 0;      // 1 with YaRN, else 0
  double attn_factor = 1;     // ModelConfig::rope_attn_factor()
  double corr_low = 0, corr_high = 0;  // YaRN correction dims (forward.md §3.2)

  static RopeParams from_config(const ModelConfig& c);
  // theta_k(p) / p: radians per position of pair k (YaRN blend included).
  double frequency(uint32_t k) const;
  // Magnitude applied to cos and sin.
  double mscale() const;
  // The rope.glsl defines: ROPE_TURNS_HI, ROPE_TURNS_LO, ROPE_MSCALE, N_ROT.
  ShaderDefines defines() const;
};

// Sizes of one layer's attention.
struct AttentionShape {
  uint32_t n_head = 0;   // H
  uint32_t kv_lora = 0;  // R (multiple of 8)
  uint32_t n_ctx = 0;    // rows of each layer's cache
  float eps = 1e-6f;     // RMSNorm epsilon of attn_kv_a_norm
  float kq_scale = 0;    // score scale (ModelConfig::kq_scale())
  RopeParams rope;       // rope.n_rot = Dr (multiple of 8)

  static AttentionShape from_config(const ModelConfig& c, uint32_t n_ctx);
  uint32_t row() const { return kv_lora + rope.n_rot; }  // values per cache row
  uint64_t cache_bytes() const { return uint64_t(n_ctx) * row() * 2; }  // one layer's f16 cache
  // Throws Error(Runtime) naming the field if a size is unusable (0, odd, not a multiple of 8).
  void validate() const;
};

// Several consecutive tokens in one dispatch (the prefill chunk): token t < n sits at position
// step[pos_word] + t; tokens t >= step[count_word] are skipped at run time (one recording serves
// every chunk length up to n). Per-token data is the decode step's layout repeated: kv rows of
// R+Dr floats, q of H*(R+Dr), olat of H*R, partials of partials_bytes() each. The default (n = 1,
// no count word) is the decode step.
struct QueryBatch {
  uint32_t n = 1;                           // tokens dispatched (workgroups along z / y)
  uint32_t count_word = TS_ATTN_NO_COUNT;   // step word holding the live token count (needed when n > 1)

  uint32_t word() const;  // the count word as the kernels get it
  // n, after checking 1 <= n <= 65535 and that n > 1 comes with a count word (Error(Runtime)).
  uint32_t checked(std::string_view label) const;
};

// Appends this token's latent row to a layer's cache (D4).
class KvWriteOp {
 public:
  KvWriteOp(Context& ctx, const AttentionShape& shape);
  // Records the kernel; bindings as in the header comment. cache must hold n_ctx rows. With a
  // gate (decode; gate_supported): recorded with no barrier after the kv_a matvec that opens it;
  // the workgroup waits on it before reading kv.
  // With `signal` (decode; gate_supported; with a gate too: a chain): once the row is written the workgroup
  // adds 1 to word signal_word of it, so that the attention can be recorded with no barrier after
  // (AttentionOp::record_decode's `wait`).
  void record(CommandRecorder& rec, BufferSlice kv, BufferSlice kv_norm_w, BufferSlice step, uint32_t pos_word,
              BufferSlice cache, std::string_view label, const GateWait& gate = {}, BufferSlice signal = {},
              uint32_t signal_word = 0) const;
  // The gated kernel runs here (subgroups).
  static bool gate_supported(Context& ctx);
  // The rows of batch.n tokens (kv: [n][R+Dr] floats), token t at position step[pos_word] + t.
  void record_rows(CommandRecorder& rec, BufferSlice kv, BufferSlice kv_norm_w, BufferSlice step, uint32_t pos_word,
                   const QueryBatch& batch, BufferSlice cache, std::string_view label) const;
  uint64_t bytes() const;

 private:
  const Pipeline* pipeline_;
  Context& ctx_;
  AttentionShape shape_;
};

// Split-K choices of AttentionOp; 0 = automatic.
struct AttentionTuning {
  uint32_t n_groups = 0;         // workgroups along the context (max chunks); auto: <= 256
  uint32_t min_chunk = 0;        // fewest positions per chunk; auto: 64 (rounded to the tile)
  uint32_t heads_per_group = 0;  // heads per workgroup (<= 32); auto: all (each cache row read once),
                                 // split evenly when there are more than 32
  uint32_t tile = 0;             // rows staged per step (4, 8, 16); auto: the largest that fits
  uint32_t score_slice = 0;      // vec4 of a row per score thread (4 or 8); auto: 4 where it fits
  // Short contexts (kv_len <= short_max_kv) run a second partial kernel with fewer heads per
  // workgroup: more workgroups share the little work there is (the cache is then read once per
  // head group, which costs at long contexts). H200, GLM, tg128: 20 heads per workgroup 162.5
  // tok/s at depth 0 and 143.9 at 4096, 10 heads 172.5 / 130.3. Both recorded with fixed group
  // counts, the idle one's empty workgroups cost 3-6 us per layer (166.1 / 138.4); so the decode
  // step records both as indirect dispatches whose group counts the host writes per token
  // (record_decode, decode_counts): the idle one has none.
  bool short_variant = true;           // false: one partial kernel
  uint32_t short_heads_per_group = 0;  // 0: a quarter of the heads per workgroup, at least 4 (none
                                       // when that is all of them)
  uint32_t short_max_kv = 0;           // 0: 16384 with short_rows (6144 with decode_tc), else 1024
  // The short variant's kernel: attention_rows.comp (one head per workgroup, the chunk's rows
  // spread over its subgroups; needs subgroup arithmetic) instead of attention_partial.comp with
  // short_heads_per_group heads per workgroup.
  bool short_rows = true;
  uint32_t rows_subgroups = 0;  // attention_rows.comp: subgroups per workgroup, 1..16; auto 4
  uint32_t rows_round = 0;      // rows a subgroup loads per round, 1..8; auto 2
  uint32_t rows_heads = 0;      // heads per workgroup (each loaded row serves them all), 1..4; auto 1
  // The merge with subgroup reductions (attention_merge.comp MERGE_SG: 2 barriers instead of ~18)
  // where the device has subgroup arithmetic.
  bool merge_subgroup = true;
  // The decode step's rows kernel merges in its last workgroup per head (attention_rows.comp
  // MERGE_TAIL): no merge dispatch and one barrier less per layer where the short variant runs,
  // but the merge then runs on one workgroup per head after the slowest chunk. Off: it lost on
  // the H100 (GLM tg128 279.0 -> 274.0 tok/s at depth 0, 198.4 -> 162.0 at 4096; PERFORMANCE.md).
  bool merge_tail = false;
  // The decode step's short range: the merge dispatch recorded with no barrier after the rows
  // partials, waiting on a gate word every partial workgroup counts (attention_rows.comp
  // PARTIAL_SIGNAL, attention_merge.comp WAIT_GATE; record_decode's merge_wait): one barrier less
  // per layer, and the merge's workgroups start as the partials' leave. Needs the rows kernel,
  // direct partials and the subgroup merge (with short_wait the partials both wait and signal).
  // Session 36, H200 tg64 (before short_wait): GLM-4.7-Flash Q4_0 374.1 -> 377.6 at depth 1024,
  // 316.0 -> 317.4 at 4096; DeepSeek-V2-Lite 501.6 -> 510.2 at 4096 (bench --attention merge_wait=0|1).
  bool merge_wait = true;
  // The decode step's partial kernel as a direct dispatch of all n_groups context workgroups (the
  // ones past the context exit at once) instead of an indirect dispatch of exactly the context's
  // chunks. On the H100: 277.5 -> 277.9 tok/s at depth 0, 199.0 -> 201.8 at 4096 (an indirect
  // dispatch itself costs 0.25 against 0.21 us, bench --roofline; the saving is the exact count).
  bool direct_partial = true;
  // Context workgroups of the decode step's short range with the rows kernel (record_decode; the
  // long range and record() use n_groups); auto: min(n_groups, 32).
  uint32_t short_groups = 0;
  // With the decode step's early_attn: the short range's rows partials also start beside W_qk and
  // kv_write and wait on their gate (attention_rows.comp WAIT_GATE), where the merge opens W_vo's.
  // On the H100 of session 15 it lost 2 % at 1024 positions and 1.6 % at 4096 (its 640 polling
  // workgroups beside W_qk's stream); with merge_wait and W_qk's early start, on the H200 of
  // session 36: GLM-4.7-Flash Q4_0 tg64 +1.4 % at 1024, +1.5 % at 4096 (the default since).
  bool short_wait = true;
  // The decode step's shortest contexts (kv_len <= single_max_kv): the rows kernel with one
  // workgroup per head over the whole context, writing olat (and its int8 blocks) itself
  // (attention_rows.comp SINGLE): no partials, no merge dispatch, one barrier less per layer.
  // Needs subgroup arithmetic (the rows kernel). single_max_kv 0: auto (kDefaultSingleMaxKv).
  bool single = true;
  uint32_t single_max_kv = 0;
  uint32_t single_subgroups = 0;  // subgroups per workgroup, 1..16; auto 16
  uint32_t single_round = 0;      // rows a subgroup loads per round, 1..8; auto 2
  bool single_early = true;       // the first round's rows loaded before the step word
  // The rows kernels' (single, mid, short) lane layout: lane l of a subgroup holds words l,
  // l + subgroup size, ... of a cache row, so each load instruction reads consecutive words;
  // false: the layout until session 20 (a lane's 9 words consecutive, 36-byte strides between lanes).
  bool rows_coalesced = true;
  // The rows kernels' scores and value sums in packed halves (attention_rows.comp ROWS_F16) where
  // the device has fp16 arithmetic: fewer instructions per (cache row, head), f16 partial sums.
  bool rows_f16 = false;
  // The next range (single_max_kv < kv_len <= mid_max_kv): the rows kernel on mid_groups
  // workgroups per head of mid_subgroups subgroups, the last to finish merging the head into olat
  // and its int8 blocks (attention_rows.comp MERGE_TAIL + Q8_OUT): one dispatch, no barrier, no
  // merge dispatch. Needs subgroup arithmetic. 0: auto (768 positions, 4 groups, 16 subgroups).
  bool mid = true;
  uint32_t mid_max_kv = 0;
  uint32_t mid_groups = 0;
  uint32_t mid_subgroups = 0;
  // The decode step's long range on tensor cores (attention_prefill_tc.comp SPLIT: the context's
  // n_groups chunks x tiles of 16 heads, each cache row read once per tile, the same partials and
  // merge; session 26): -1 automatic (where the device has cooperative matrices), 0 never, 1
  // wherever its plain-FMA form runs too (the tests' path). Where it is built, the rows kernel's
  // short range ends at 6144 positions unless short_max_kv says otherwise (H100, GLM tg64: 190.5
  // tok/s at 32000 positions against the split kernel's 101.9, 231.1 at 16000 against the rows
  // kernel's 188.3; 254.2 against 242.7 at 8192, a tie at 6144, the rows kernel ahead at 4096).
  int decode_tc = -1;
  uint32_t decode_tc_groups = 4;  // its groups of 32 invocations per workgroup (4 or 8)
  bool decode_tc_prefetch = true;  // its next block's rows loaded during the current one (tc_prefetch)
  bool decode_tc_qreg = true;      // each group's query k-tiles in registers (tc_qreg)
  uint32_t decode_tc_m_tiles = 1;  // head tiles per workgroup, 1 or 2 (tc_m_tiles): the cache read once per pair
  // Also build the single and mid kernels that open a gate for an early-started W_vo
  // (attention_rows.comp GATE_SIGNAL; record_decode's `gate`). Set by the decode step where it
  // starts W_vo early (GpuModelOptions::early_vo).
  bool gate_signal = false;
};

// Which contexts a decode recording serves (AttentionOp::record_decode): the single-workgroup
// kernel's (kv_len <= single_max_kv), the merging rows kernel's (<= mid_max_kv), the short
// variant's (kv_len <= short_max_kv) or the long one's. The decode step keeps one recording per
// range.
enum class DecodeRange { Single, Mid, Short, Long };

// Absorbed MLA attention of one query over a layer's cache: split-K partials + merge (D5, D6).
class AttentionOp {
 public:
  AttentionOp(Context& ctx, const AttentionShape& shape, const AttentionTuning& tuning = {});

  // Bytes of the partials scratch buffer record() needs per query (n_groups x H x (R + 2) floats).
  uint64_t partials_bytes() const;
  // D5: per-chunk partials. q, cache, step, pos_word, partials as in the header comment.
  // batch: several causal queries (query t at position step[pos_word] + t sees [0, that
  // position]); q, partials (batch.n * partials_bytes()) and olat hold one block per query.
  void record_partial(CommandRecorder& rec, BufferSlice q, BufferSlice cache, BufferSlice step, uint32_t pos_word,
                      BufferSlice partials, std::string_view label, const QueryBatch& batch = {}) const;
  // D6: olat from the partials of the same step. olat_q8 (set, where writes_olat_q8()): olat also
  // as int8 blocks of 32 (3 uvec4 each, q8_quantize.glsl), for MatvecOp::x_q8 of W_vo. groups:
  // the chunking the partials were written with (0: n_groups(); at most n_groups()).
  void record_merge(CommandRecorder& rec, BufferSlice partials, BufferSlice step, uint32_t pos_word, BufferSlice olat,
                    std::string_view label, const QueryBatch& batch = {}, BufferSlice olat_q8 = {},
                    uint32_t groups = 0) const;
  bool writes_olat_q8() const { return merge_q8_ != nullptr; }
  // Bytes of olat_q8 per query (n_head * kv_lora / 32 blocks of 48 bytes).
  uint64_t olat_q8_bytes() const { return uint64_t(shape_.n_head) * shape_.kv_lora / 32 * 48; }
  // record_partial, barrier, record_merge.
  void record(CommandRecorder& rec, BufferSlice q, BufferSlice cache, BufferSlice step, uint32_t pos_word,
              BufferSlice partials, BufferSlice olat, std::string_view label, const QueryBatch& batch = {}) const;
  // The decode step (one query) for the contexts of `range`: the partial kernel of that range as an
  // indirect dispatch whose group counts are read from `counts` (kDecodeCountWords words, written
  // by the host before each submission with decode_counts: as many workgroups as the context has
  // chunks), then the merge: folded into the rows kernel where merge_folded(range) (its arrival
  // counters in `arrivals`, arrivals_bytes(), zero before the first submission and left zero by
  // every dispatch; olat_q8 must then be unset: Error(Runtime)), else a barrier and the merge
  // dispatch (which also writes olat_q8 where set).
  // Run it only for contexts in `range`. gate (set, where decode_signals_gate(range); olat_q8 set
  // too): each workgroup that finishes heads adds their number to the word at `gate` after writing
  // olat and its int8 blocks, so that W_vo can be recorded with no barrier before it
  // (MatvecOp::gate, target n_head); the word must be zero before the dispatch.
  // wait (enabled, with gate, where decode_waits(range)): recorded with no barrier after the
  // kernels that write q and the cache row, which count wait's word up to its target; every
  // workgroup waits for it before reading them.
  // merge_wait (enabled, where decode_chains_merge(range); olat_q8 set): the merge is recorded
  // with no barrier after the partials and waits until merge_wait's word reaches its target,
  // decode_merge_target(range): every partial workgroup adds 1 to it (the word must be zero before).
  void record_decode(CommandRecorder& rec, BufferSlice q, BufferSlice cache, BufferSlice step, uint32_t pos_word,
                     BufferSlice counts, BufferSlice partials, BufferSlice arrivals, BufferSlice olat,
                     DecodeRange range, std::string_view label, BufferSlice olat_q8 = {},
                     BufferSlice gate = {}, const GateWait& wait = {}, const GateWait& merge_wait = {}) const;
  // Whether record_decode for `range` can chain its merge to the partials by a gate
  // (AttentionTuning::merge_wait: the short range's rows partials, the long range's partials on
  // tensor cores or not; recorded as direct dispatches), and the count that gate reaches (the
  // partial dispatch's workgroups).
  bool decode_chains_merge(DecodeRange range) const {
    if (!direct_partial_ || !merge_q8_wait_desc_) return false;  // (the desc is kept only with merge_wait)
    if (range == DecodeRange::Short) return short_rows_desc_ && !merge_folded(range);
    return range == DecodeRange::Long;
  }
  uint32_t decode_merge_target(DecodeRange range) const;
  // Whether record_decode for `range` can wait on a gate: the single and mid kernels that open
  // one, and (AttentionTuning::short_wait) the short range's rows partials where their merge
  // dispatch opens it.
  bool decode_waits(DecodeRange range) const {
    return (range == DecodeRange::Single && single_.gate) || (range == DecodeRange::Mid && mid_.gate) ||
           (range == DecodeRange::Short && short_wait_ && short_rows_desc_ && decode_signals_gate(range));
  }
  static constexpr uint32_t kDecodeCountWords = 6;
  // The group counts of record_decode's dispatch for a context of kv_len positions: words 0-2 for
  // the short range's recording, 3-5 for the long one's (the range kv_len is not in gets none;
  // the single and mid ranges are direct dispatches and read no counts).
  void decode_counts(uint32_t kv_len, uint32_t words[kDecodeCountWords]) const;
  // The rule decode_counts follows (attention_args.h), for a kernel that writes the next step's
  // counts on the GPU (SampleOp::counts_word).
  gpu::AttnDecodeRule decode_rule() const;
  // The range a context of kv_len positions falls in (single, mid, short, else long).
  DecodeRange decode_range(uint32_t kv_len) const;
  // Whether record_decode for `range` merges in the partial kernel (no merge dispatch).
  bool merge_folded(DecodeRange range) const {
    return range == DecodeRange::Short && partial_short_tail_ != nullptr;
  }
  // Whether record_decode runs the long range's partials on tensor cores (AttentionTuning::
  // decode_tc), and its workgroups along the heads (tiles of 16) then.
  bool decode_uses_tc() const { return tc_ != nullptr; }
  uint32_t tc_head_tiles() const { return (shape_.n_head + 15) / 16; }
  // Workgroups along the heads of the long range on tensor cores (tc_m_tiles_ head tiles each).
  uint32_t tc_head_groups() const { return (tc_head_tiles() + tc_m_tiles_ - 1) / tc_m_tiles_; }
  // Whether record_decode for `range` can write olat_q8 (the merge dispatch or the single kernel).
  bool decode_writes_olat_q8(DecodeRange range) const {
    if (range == DecodeRange::Single) return single_.q8 != nullptr;
    if (range == DecodeRange::Mid) return mid_.q8 != nullptr;
    return writes_olat_q8() && !merge_folded(range);
  }
  // Whether record_decode for `range` can open a gate (the single and mid kernels or the merge,
  // built with AttentionTuning::gate_signal and writing olat's int8 blocks).
  bool decode_signals_gate(DecodeRange range) const {
    if (range == DecodeRange::Single) return single_.gate != nullptr;
    if (range == DecodeRange::Mid) return mid_.gate != nullptr;
    return merge_gate_ != nullptr && !merge_folded(range);
  }
  // The count the gate of `range` reaches (MatvecOp::gate_target): a head per single / mid
  // workgroup's head, a merge workgroup per block of latent columns of each head otherwise.
  uint32_t decode_gate_target(DecodeRange range) const;
  // The mid range's largest context and its workgroups along the context (0, 0: no mid range).
  uint32_t mid_max_kv() const { return mid_max_kv_; }
  uint32_t mid_groups() const { return mid_groups_; }
  // The largest context of the single range (0: no single range) and the bytes it moves.
  uint32_t single_max_kv() const { return single_max_kv_; }
  uint64_t single_bytes(uint32_t kv_len) const;
  // The upper context bound of each range the decode step records, in order (the last: n_ctx).
  std::vector<std::pair<DecodeRange, uint32_t>> decode_ranges() const;
  // Bytes of the arrival counters record_decode needs (at least 4).
  uint64_t arrivals_bytes() const;

  // Bytes moved at a context of kv_len positions (record() declares them for profile_kv_len),
  // chunked over `groups` context workgroups (0: n_groups).
  uint64_t partial_bytes(uint32_t kv_len, uint32_t groups = 0) const;
  uint64_t merge_bytes(uint32_t kv_len, uint32_t groups = 0) const;
  // Context length the declared bytes assume (default n_ctx); set before recording.
  void set_profile_kv_len(uint32_t kv_len) { profile_kv_len_ = kv_len; }

  // The resolved split-K parameters (n_groups: record() and the long decode range; the short
  // decode range splits the context over decode_groups(Short) workgroups).
  uint32_t n_groups() const { return n_groups_; }
  uint32_t decode_groups(DecodeRange range) const { return range == DecodeRange::Short ? short_groups_ : n_groups_; }
  uint32_t min_chunk() const { return min_chunk_; }
  uint32_t tile() const { return tile_; }
  uint32_t heads_per_group() const { return heads_per_group_; }
  // The short-context variant's heads per workgroup and its context bound (0, 0: none).
  uint32_t short_heads_per_group() const { return short_heads_; }
  uint32_t short_max_kv() const { return short_max_kv_; }
  // Chunks used at a context of kv_len positions over `groups` context workgroups (0: n_groups;
  // same rule as the kernels).
  uint32_t num_chunks(uint32_t kv_len, uint32_t groups = 0) const;

 private:
  // The partial kernel's arguments: the only kernel, or the short / long variant (its context bounds).
  enum class Variant { Only, Short, Long };
  gpu::AttnPartialArgs partial_args(uint32_t pos_word, uint32_t count_word, Variant v, uint32_t groups = 0) const;
  // record_merge over a chunking of `groups` context workgroups.
  // wait (enabled: one query, olat_q8 set): the merge's waiting variant (WAIT_GATE).
  void merge_groups(CommandRecorder& rec, BufferSlice partials, BufferSlice step, uint32_t pos_word, BufferSlice olat,
                    std::string_view label, const QueryBatch& batch, BufferSlice olat_q8, uint32_t groups,
                    BufferSlice gate, const GateWait& wait = {}) const;
  // Checks the partial kernel's bindings for batch.n queries (Error(Runtime) naming the label); n.
  uint32_t check_partial_bindings(BufferSlice q, BufferSlice cache, BufferSlice step, uint32_t pos_word,
                                  BufferSlice partials, const QueryBatch& batch, std::string_view label) const;
  // Checks the olat binding of one query and the int8 olat one where set (have_q8: the variant
  // writes it); Error(Runtime) naming `name`. Whether olat_q8 is set.
  bool check_olat_bindings(const std::string& name, BufferSlice olat, BufferSlice olat_q8, bool have_q8) const;
  const Pipeline* partial_ = nullptr;
  const Pipeline* partial_short_ = nullptr;  // the short-context variant (or null)
  const Pipeline* partial_short_tail_ = nullptr;  // the same rows kernel with the merge folded in (or null)
  std::optional<PipelineDesc> short_rows_desc_;    // partial_short_'s, where it is the rows kernel (it can wait)
  bool short_wait_ = false;                        // AttentionTuning::short_wait
  PipelineDesc partial_desc_;     // partial_'s (its signalling variant for a chained merge)
  const Pipeline* tc_ = nullptr;  // the long range's partials on tensor cores (or null)
  std::optional<PipelineDesc> tc_desc_;  // tc_'s
  uint32_t tc_m_tiles_ = 1;       // ... head tiles per workgroup
  const Pipeline* merge_ = nullptr;
  const Pipeline* merge_q8_ = nullptr;  // the merge that also writes olat as int8 blocks (or null)
  const Pipeline* merge_gate_ = nullptr;  // ... and opens a gate after them (or null)
  // merge_q8_'s and merge_gate_'s descriptions, where their waiting variants can be made
  // (AttentionTuning::merge_wait with the subgroup merge; record_decode makes them).
  std::optional<PipelineDesc> merge_q8_wait_desc_, merge_gate_wait_desc_;
  // The pipelines of a kernel that writes olat: plain; also writing olat's int8 blocks (Q8_OUT,
  // one binding more); that one also opening W_vo's gate (GATE_SIGNAL, one more). Null where not
  // built.
  struct OlatPipelines {
    const Pipeline *plain = nullptr, *q8 = nullptr, *gate = nullptr;
    PipelineDesc gate_desc;  // gate's: its waiting variant (WAIT_GATE) is made by record_decode
    explicit operator bool() const { return plain != nullptr; }
  };
  // The waiting variant of p.gate for `wait` (its word and target as defines).
  static const Pipeline& wait_pipeline(Context& ctx, const OlatPipelines& p, const GateWait& wait);
  // `d` waiting on `wait` (WAIT_GATE, its word and target; the polled and error words as two more
  // bindings), and `d` counting its workgroups in word `word` of one more binding (PARTIAL_SIGNAL).
  static PipelineDesc waiting_desc(PipelineDesc d, const GateWait& wait);
  static PipelineDesc signalling_desc(PipelineDesc d, uint32_t word);
  // The variant of `p` that record_decode dispatches: its pipeline, its bindings (`base` and the
  // int8 / gate ones) and its profile name suffix.
  struct OlatVariant {
    const Pipeline* pipe;
    uint32_t bindings;
    const char* suffix;
  };
  static OlatVariant olat_variant(const OlatPipelines& p, bool q8, bool gated, uint32_t base);
  // The OlatPipelines of the kernel `d`: the int8 one where the latent is a multiple of 32, the
  // gate-opening one with `gate` too.
  static OlatPipelines olat_pipelines(Context& ctx, PipelineDesc d, const AttentionShape& shape, bool gate);
  OlatPipelines single_;  // the rows kernel over the whole context, writing olat
  uint32_t single_max_kv_ = 0;
  OlatPipelines mid_;  // the rows kernel that merges in its last workgroup
  uint32_t mid_max_kv_ = 0, mid_groups_ = 0;
  AttentionShape shape_;
  uint32_t n_groups_ = 0, min_chunk_ = 0, tile_ = 0, heads_per_group_ = 0;
  uint32_t short_heads_ = 0, short_max_kv_ = 0, short_groups_ = 0;
  bool direct_partial_ = false;
  uint32_t profile_kv_len_ = 0;
};

// Per-head matvecs of the factored MLA path (D3', D7'): y_h = W_h x_h for all heads in one
// dispatch (one per row chunk where a binding must be split), W = n_head stacked
// (w.rows / n_head) x w.cols matrices of any readable type (SPLIT1 or plain), f32 accumulation.
struct AbsorbOp {
  MatrixRef w;             // [n_head * rows_per_head][cols]; head h owns rows h*rows_per_head..
  uint32_t n_head = 0;
  BufferSlice x;           // head h's input at float h*x_stride + x_offset (cols values)
  BufferSlice y;           // head h's output at float h*y_stride + y_offset (rows_per_head values)
  uint32_t x_stride = 0, x_offset = 0;  // multiples of 4
  uint32_t y_stride = 0, y_offset = 0;
  uint32_t copy_n = 0;     // also copy x[h*x_stride + copy_src + i] to y[h*y_stride + copy_dst + i], i < copy_n
  uint32_t copy_src = 0, copy_dst = 0;
  uint32_t n_tokens = 1;   // tokens (prefill): token t's x / y start at t*x_token_stride / t*y_token_stride
  uint32_t x_token_stride = 0, y_token_stride = 0;  // floats; 0 = n_head * x_stride / n_head * y_stride
  std::string label;       // profile label; empty = kernel_name()

  // D3': q_lat_h = Kb_h q_nope_h and q_pe copied: x = q from attn_q_b / attn_q ([H][Dn + Dr]),
  // y = the attention query ([H][R + Dr], q_pe unroped). k_b: attn_k_b as H*R rows x Dn.
  static AbsorbOp query(const MatrixRef& k_b, uint32_t n_head, uint32_t n_rot, BufferSlice q_in, BufferSlice q_out);
  // D7': o_h = Vb_h olat_h: x = olat ([H][R]), y = o ([H][Dv]). v_b: attn_v_b as H*Dv rows x R.
  static AbsorbOp value(const MatrixRef& v_b, uint32_t n_head, BufferSlice olat, BufferSlice o);

  uint32_t rows_per_head() const { return n_head ? w.rows / n_head : 0; }
  // Bytes moved: the weights once, every head's input, the outputs and the copied values (per token).
  uint64_t bytes() const;
  // Records the dispatch(es), no barrier. Validates shapes, strides and binding sizes first and
  // throws Error(Runtime) naming the label and the problem.
  void record(CommandRecorder& rec) const;
  // Pipeline name of this variant, e.g. "absorb.q8_0".
  std::string kernel_name() const;
};

}  // namespace tessera::vk
