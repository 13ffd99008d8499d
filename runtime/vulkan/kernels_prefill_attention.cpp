// PrefillAttentionOp (kernels_prefill.h): the prefill chunk's attention over the latent cache,
// split along the context with the decode merge, or on tensor cores in one pass
// (attention_prefill.comp / attention_prefill_tc.comp; docs/PREFILL.md D3-D4).
#include <algorithm>
#include <optional>
#include <string>

#include "format/error.h"
#include "runtime/vulkan/kernels_prefill.h"
#include "shaders/attention_args.h"

namespace tessera::vk {
namespace {

uint32_t ceil_div(uint64_t a, uint64_t b) { return uint32_t((a + b - 1) / b); }

void need(const BufferSlice& s, uint64_t bytes, const std::string& what, const char* binding) {
  if (s.buffer == VK_NULL_HANDLE) runtime_error(what, ": binding '", binding, "' is not set");
  if (s.size < bytes) runtime_error(what, ": binding '", binding, "' has ", s.size, " bytes, needs ", bytes);
}

constexpr uint32_t kDefaultQueriesPerGroup = 8;
constexpr uint32_t kDefaultMaxPairs = 32;
constexpr uint32_t kMaxTcSplit = 8;      // chunks of a tensor-core walk (PrefillAttentionTuning::tc_split)
constexpr uint32_t kMaxAutoTcSplit = 4;  // ... chosen automatically (each chunk: a prologue, partials)
constexpr uint32_t kMaxValueQuadsPerThread = 16;  // OH: accumulator vec4 per value thread

// Thread layout and shared memory of attention_prefill.comp for P pairs (same formulas as its
// header: score threads NS * ceil(P/4), value threads (R/4) * ceil(P/OH)).
struct PrefillAttnLayout {
  uint32_t wg = 0, sv = 0, oh = 0, tile = 0;
  uint64_t shared_bytes = 0;
};
PrefillAttnLayout prefill_attn_layout(const AttentionShape& s, uint32_t pairs, uint32_t tile, uint32_t sv) {
  PrefillAttnLayout l;
  l.sv = sv;
  l.tile = tile;
  const uint32_t row_v = s.row() / 4, quads = s.kv_lora / 4, pp = ceil_div(pairs, 4) * 4;
  l.oh = std::min(kMaxValueQuadsPerThread, pp);
  const uint32_t slices = ceil_div(row_v, sv);
  const uint32_t threads = std::max({slices * ceil_div(pairs, 4), quads * ceil_div(pairs, l.oh), pairs, 32u});
  l.wg = ceil_div(threads, 32) * 32;
  l.shared_bytes = uint64_t(tile) * s.row() * 4 + (uint64_t(slices) * tile * pp + l.oh) * 4 + 2ull * pp * 4;
  return l;
}

ShaderDefines with(ShaderDefines a, const ShaderDefines& b) {
  for (const auto& [k, v] : b) a[k] = v;
  return a;
}

}  // namespace

bool attention_tc_supported(Context& ctx, bool plain) {
  const DeviceFeatures& f = ctx.device().enabled();
  const bool lanes = ctx.pipelines().use_subgroup() && f.subgroup_shuffle && ctx.info().subgroup_size >= 8;
  return lanes && (plain || matmul_coop_supported(ctx));
}

namespace {
// attention_prefill_tc.comp's layout: the query in registers (QREG, with tensor cores) or in
// shared memory, one or two buffers of 16 cache rows.
struct TcLayout {
  bool qreg = false, double_k = false;
  uint32_t groups = 4;   // per M tile
  uint32_t m_tiles = 1;  // M tiles (16 rows each) per workgroup
};

TcLayout tc_layout(Context& ctx, const PrefillAttentionTuning& tuning, bool double_k) {
  if (tuning.tc_groups != 4 && tuning.tc_groups != 8)
    usage_error("prefill attention: ", tuning.tc_groups, " groups per workgroup, expected 4 or 8");
  if (tuning.tc_m_tiles != 1 && tuning.tc_m_tiles != 2)
    usage_error("prefill attention: ", tuning.tc_m_tiles, " tiles of 16 rows per workgroup, expected 1 or 2");
  if (tuning.tc_m_tiles == 2 && tuning.tc_groups != 4)
    usage_error("prefill attention: 2 tiles of 16 rows per workgroup take 4 groups each, not ", tuning.tc_groups);
  return TcLayout{tuning.tc_qreg && matmul_coop_supported(ctx), double_k, tuning.tc_groups, tuning.tc_m_tiles};
}

uint64_t tc_shared_bytes(const AttentionShape& shape, const TcLayout& l) {
  // sh: [query rows] + K buffers (16 rows of RS uvec4 each) + a partial S tile per group + P per
  // M tile; then the rows' sums and scales (and SPLIT's maxima: counted always).
  const uint64_t rows16 = 16 * (shape.row() / 8 + 1);
  return ((l.qreg ? 0 : l.m_tiles * rows16) + (l.double_k ? 2 : 1) * rows16 + 64 * l.groups * l.m_tiles + 32 * l.m_tiles) * 16 +
         3 * 16 * 4 * l.m_tiles;
}

// The layout that fits the device: two K buffers where asked and they fit, else one; two M tiles
// where asked and they fit, else one; nullopt where not even the smallest fits or the shape is
// not the kernel's.
std::optional<TcLayout> tc_fitting_layout(Context& ctx, const AttentionShape& shape, const PrefillAttentionTuning& tuning) {
  if (shape.kv_lora % 16 != 0 || shape.row() % 16 != 0 || shape.kv_lora > 512 || shape.row() > 576) return std::nullopt;
  for (uint32_t m : {tuning.tc_m_tiles, 1u}) {
    PrefillAttentionTuning t = tuning;
    t.tc_m_tiles = m;
    for (bool dk : {tuning.tc_double_k, false}) {
      const TcLayout l = tc_layout(ctx, t, dk);
      if (tc_shared_bytes(shape, l) <= ctx.info().max_compute_shared_memory) return l;
    }
  }
  return std::nullopt;
}
}  // namespace

uint64_t attention_tc_shared_bytes(Context& ctx, const AttentionShape& shape, const PrefillAttentionTuning& tuning) {
  const std::optional<TcLayout> l = tc_fitting_layout(ctx, shape, tuning);
  if (l) return tc_shared_bytes(shape, *l);
  PrefillAttentionTuning smallest = tuning;  // what it would need at the least: one tile, one K buffer
  smallest.tc_m_tiles = 1;
  return tc_shared_bytes(shape, tc_layout(ctx, smallest, false));
}

bool attention_tc_fits(Context& ctx, const AttentionShape& shape, const PrefillAttentionTuning& tuning) {
  return tc_fitting_layout(ctx, shape, tuning).has_value();
}

std::optional<PipelineDesc> attention_tc_desc(Context& ctx, const AttentionShape& shape,
                                              const PrefillAttentionTuning& tuning, bool plain) {
  if (tuning.tc_margin > 10) usage_error("prefill attention: margin of ", tuning.tc_margin, " nats, expected 0..10");
  const std::optional<TcLayout> tc_layout = tc_fitting_layout(ctx, shape, tuning);
  if (!tc_layout || !attention_tc_supported(ctx, plain)) return std::nullopt;
  PipelineDesc p;
  p.name = "attention_prefill_tc";
  p.file = "attention_prefill_tc.comp";
  const bool coop = matmul_coop_supported(ctx);
  p.defines = with({{"N_HEAD", std::to_string(shape.n_head)},
                    {"KV_LORA", std::to_string(shape.kv_lora)},
                    {"COOP", coop ? "1" : "0"},
                    {"TC_PREFETCH", tuning.tc_prefetch ? "1" : "0"},
                    {"MARGIN", std::to_string(tuning.tc_margin) + ".0"},
                    {"DOUBLE_K", tc_layout->double_k ? "1" : "0"},
                    {"QREG", tc_layout->qreg ? "1" : "0"},
                    {"STAGGER", tuning.tc_stagger ? "1" : "0"},
                    {"N_GROUPS", std::to_string(tc_layout->groups * tc_layout->m_tiles)},
                    {"M_TILES", std::to_string(tc_layout->m_tiles)}},
                   shape.rope.defines());
  p.num_buffers = 4;
  p.push_bytes = sizeof(gpu::AttnPartialArgs);
  p.full_subgroups = true;
  return p;
}

uint32_t attention_tc_m_tiles(const PipelineDesc& tc) { return uint32_t(std::stoul(tc.defines.at("M_TILES"))); }

uint32_t prefill_tc_split(uint32_t workgroups, uint32_t slots, uint32_t max_split) {
  if (slots == 0 || workgroups == 0) return 1;
  auto rounds = [&](uint32_t s) { return double(ceil_div(workgroups * s, slots)) / s; };
  double fewest = rounds(1);
  for (uint32_t s = 2; s <= max_split; ++s) fewest = std::min(fewest, rounds(s));
  for (uint32_t s = 1;; ++s)
    if (rounds(s) <= fewest * 1.05) return s;
}

PrefillAttentionTuning decode_tc_tuning(const AttentionTuning& t) {
  PrefillAttentionTuning p;
  p.tc_groups = t.decode_tc_groups;
  p.tc_prefetch = t.decode_tc_prefetch;
  p.tc_qreg = t.decode_tc_qreg;
  p.tc_stagger = false;  // (each chunk is its own; STAGGER does nothing with SPLIT)
  p.tc_m_tiles = t.decode_tc_m_tiles;
  return p;
}

namespace {
// The split-K choices of the prefill's partials and merge: the decode step's tensor-core long
// range (and the short range's bound it moves) is not theirs.
AttentionTuning prefill_split(AttentionTuning t) {
  t.decode_tc = 0;
  return t;
}
}  // namespace

PrefillAttentionOp::PrefillAttentionOp(Context& ctx, const AttentionShape& shape, const AttentionTuning& split,
                                       const PrefillAttentionTuning& tuning)
    : attn_(ctx, shape, prefill_split(split)), shape_(shape) {
  const DeviceInfo& info = ctx.info();
  // attention_tc_desc checks the tensor-core kernel's choices (margin, groups) whether or not the
  // kernel is asked for.
  std::optional<PipelineDesc> tc = attention_tc_desc(ctx, shape, tuning, tuning.tensor_cores == 1);
  if (tuning.tensor_cores == 0) tc.reset();
  if (tuning.tc_split > kMaxTcSplit)
    usage_error("prefill attention: the tensor-core walk split into ", tuning.tc_split, " chunks, expected 0 (automatic) .. ",
                kMaxTcSplit);
  if (tc) {
    PipelineDesc& p = *tc;
    tc_ = &ctx.pipeline(p);
    tc_rows_ = 16 * attention_tc_m_tiles(p);
    // The walk's split: resident workgroups per SM from the driver's statistics on the H100 /
    // H200 (two tiles of rows: 256 invocations x 194 registers, one; one tile: two).
    const uint32_t slots = info.sm_count * (tc_rows_ == 32 ? 1 : 2);
    const uint32_t wgs = ceil_div(tuning.chunk_queries * shape.n_head, tc_rows_);
    tc_split_ = std::min(tuning.tc_split ? tuning.tc_split : prefill_tc_split(wgs, slots, kMaxAutoTcSplit), attn_.n_groups());
    if (tc_split_ > 1) {
      PipelineDesc ps = p;
      ps.name += ".splitq";
      ps.defines["SPLIT_Q"] = "1";
      ps.defines["TILE"] = std::to_string(attn_.tile());
      tc_split_pipe_ = &ctx.pipeline(ps);
      profile_kv_len_ = shape.n_ctx;
      return;  // olat as f32 from the merge: no OUT_F16 variant
    }
    if (tuning.tc_f16_olat && ctx.device().enabled().shader_float16) {
      p.name += ".f16out";
      p.defines["OUT_F16"] = "1";
      tc16_ = &ctx.pipeline(p);
    }
    profile_kv_len_ = shape.n_ctx;
    return;
  }
  const uint32_t max_pairs = tuning.max_pairs ? tuning.max_pairs : kDefaultMaxPairs;
  if (max_pairs != 32 && max_pairs != 64) usage_error("prefill attention: max pairs must be 32 or 64, found ", max_pairs);
  gq_ = tuning.queries_per_group ? tuning.queries_per_group : kDefaultQueriesPerGroup;
  if (gq_ > max_pairs) usage_error("prefill attention: ", gq_, " queries per group, expected 1..", max_pairs);
  // Heads per group: as many as the pair budget allows, split evenly.
  const uint32_t hw_max = std::min(shape.n_head, std::max(1u, max_pairs / gq_));
  hw_ = ceil_div(shape.n_head, ceil_div(shape.n_head, hw_max));
  const uint32_t pairs = gq_ * hw_;
  if (tuning.tile && tuning.tile != 2 && tuning.tile != 4 && tuning.tile != 8)
    usage_error("prefill attention tile must be 2, 4 or 8, found ", tuning.tile);
  std::optional<PrefillAttnLayout> layout;
  const std::pair<uint32_t, uint32_t> prefs[] = {{8, 4}, {4, 4}, {8, 8}, {4, 8}, {2, 4}, {2, 8}};
  for (auto [t, sv] : prefs) {
    if ((tuning.tile && t != tuning.tile) || attn_.tile() % t != 0) continue;
    const PrefillAttnLayout l = prefill_attn_layout(shape, pairs, t, sv);
    if (l.shared_bytes <= info.max_compute_shared_memory && l.wg <= std::min(1024u, info.max_compute_workgroup_invocations)) {
      layout = l;
      break;
    }
  }
  if (!layout)
    runtime_error("prefill attention: ", pairs, " (query, head) pairs x ", shape.row(), "-value rows fit no tile in ",
                  info.max_compute_shared_memory, " bytes of shared memory / ", info.max_compute_workgroup_invocations,
                  " threads of ", info.name);
  tile_ = layout->tile;
  wg_ = layout->wg;
  profile_kv_len_ = shape.n_ctx;
  PipelineDesc p;
  p.name = "attention_prefill";
  p.file = "attention_prefill.comp";
  p.defines = with({{"N_HEAD", std::to_string(shape.n_head)},
                    {"KV_LORA", std::to_string(shape.kv_lora)},
                    {"TILE", std::to_string(tile_)},
                    {"CHUNK_TILE", std::to_string(attn_.tile())},
                    {"GQ", std::to_string(gq_)},
                    {"HW", std::to_string(hw_)},
                    {"WG", std::to_string(wg_)},
                    {"SV", std::to_string(layout->sv)},
                    {"OH", std::to_string(layout->oh)}},
                   shape.rope.defines());
  p.num_buffers = 4;
  p.push_bytes = sizeof(gpu::AttnPartialArgs);
  pipeline_ = &ctx.pipeline(p);
}

uint64_t PrefillAttentionOp::partial_bytes(uint32_t kv_len, uint32_t n) const {
  if (tc_) return 0;  // no partials
  const uint64_t len = std::min(kv_len, shape_.n_ctx);
  const uint64_t reads = uint64_t(ceil_div(n, gq_)) * ceil_div(shape_.n_head, hw_);  // cache passes
  return reads * len * shape_.row() * 2 + uint64_t(n) * shape_.n_head * shape_.row() * 4 +
         uint64_t(n) * attn_.num_chunks(kv_len) * shape_.n_head * (shape_.kv_lora + 2) * 4;
}

uint32_t PrefillAttentionOp::check_inputs(BufferSlice q, BufferSlice cache, BufferSlice step, uint32_t pos_word,
                                          const std::string& what, const QueryBatch& batch) const {
  const uint32_t n = batch.checked(what);
  if (batch.count_word == TS_ATTN_NO_COUNT) runtime_error(what, ": the prefill attention needs a count word");
  need(q, uint64_t(n) * shape_.n_head * shape_.row() * 4, what, "q");
  need(cache, shape_.cache_bytes(), what, "cache");
  need(step, uint64_t(std::max(pos_word, batch.count_word) + 1) * 4, what, "step");
  return n;
}

void PrefillAttentionOp::record_partial(CommandRecorder& rec, BufferSlice q, BufferSlice cache, BufferSlice step,
                                        uint32_t pos_word, BufferSlice partials, std::string_view label,
                                        const QueryBatch& batch) const {
  const std::string what(label);
  if (tc_) runtime_error(what, ": the tensor-core prefill attention writes olat directly (record), no partials");
  const uint32_t n = check_inputs(q, cache, step, pos_word, what, batch);
  need(partials, n * partials_bytes(), what, "partials");
  const gpu::AttnPartialArgs args{pos_word, shape_.n_ctx, attn_.n_groups(), attn_.min_chunk(), shape_.kq_scale,
                                  batch.count_word, 0, 0};
  const BufferSlice b[] = {q, cache, step, partials};
  rec.dispatch(*pipeline_, b, args, attn_.n_groups(), ceil_div(shape_.n_head, hw_), ceil_div(n, gq_), label,
               partial_bytes(profile_kv_len_, n));
}

void PrefillAttentionOp::record(CommandRecorder& rec, BufferSlice q, BufferSlice cache, BufferSlice step, uint32_t pos_word,
                                BufferSlice partials, BufferSlice olat, std::string_view label,
                                const QueryBatch& batch, bool olat_f16) const {
  if (olat_f16 && !tc16_) runtime_error(label, ": no attention kernel built to write f16 olat");
  if (tc_) {
    const std::string what(label);
    const uint32_t n = check_inputs(q, cache, step, pos_word, what, batch);
    need(olat, uint64_t(n) * shape_.n_head * shape_.kv_lora * (olat_f16 ? 2 : 4), what, "olat");
    const gpu::AttnPartialArgs args{pos_word, shape_.n_ctx, 1, 1, shape_.kq_scale, batch.count_word, 0, 0};
    const BufferSlice b[] = {q, cache, step, olat};
    // Bytes: each workgroup's cache rows (one pass), the queries, olat.
    const uint64_t wgs = ceil_div(uint64_t(n) * shape_.n_head, tc_rows_);
    const uint64_t bytes = wgs * std::min(profile_kv_len_, shape_.n_ctx) * shape_.row() * 2 +
                           uint64_t(n) * shape_.n_head * (shape_.row() + shape_.kv_lora) * 4;
    if (tc_split_ > 1) {  // the walks in tc_split_ chunks, then the merge (f32 olat)
      need(partials, n * partials_bytes(), what, "partials");
      const gpu::AttnPartialArgs split_args{pos_word, shape_.n_ctx, tc_split_, attn_.min_chunk(), shape_.kq_scale,
                                            batch.count_word, 0, 0};
      const BufferSlice bs[] = {q, cache, step, partials};
      const uint64_t partials_written = uint64_t(n) * tc_split_ * shape_.n_head * (shape_.kv_lora + 2) * 4;
      rec.dispatch(*tc_split_pipe_, bs, split_args, uint32_t(wgs), tc_split_, 1, what + " tc.splitq",
                   bytes - uint64_t(n) * shape_.n_head * shape_.kv_lora * 4 + partials_written);
      rec.barrier();
      attn_.record_merge(rec, partials, step, pos_word, olat, what + " merge", batch, {}, tc_split_);
      return;
    }
    rec.dispatch(olat_f16 ? *tc16_ : *tc_, b, args, uint32_t(wgs), 1, 1, what + (olat_f16 ? " tc.f16out" : " tc"), bytes);
    return;
  }
  record_partial(rec, q, cache, step, pos_word, partials, std::string(label) + " partial", batch);
  rec.barrier();
  attn_.record_merge(rec, partials, step, pos_word, olat, std::string(label) + " merge", batch);
}

}  // namespace tessera::vk
