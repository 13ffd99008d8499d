#include "runtime/vulkan/kernels_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>

#include "format/error.h"
#include "runtime/vulkan/kernels_prefill.h"

namespace tessera::vk {
namespace {

constexpr uint32_t kKvWriteThreads = 256;  // workgroup of kv_write
constexpr uint32_t kMergeColumns = 64;  // latent columns per attention_merge workgroup
constexpr uint32_t kMergeLanes = 4;     // threads per column (each sums every 4th chunk)
constexpr uint32_t kMaxHeadsPerGroup = 32;  // attention_partial: one head per lane of a 32-thread group
constexpr uint32_t kMaxGroups = 1024;   // MAX_GROUPS of attention_merge (shared weights array)
constexpr uint32_t kDefaultGroups = 128;  // about one per SM of an H100/H200 (measured best of 132/264/528)
// Contexts up to this run the short variant. attention_partial.comp with a quarter of the heads:
// 1024 (it loses past that); attention_rows.comp (H100, GLM, tg128 at depth 4096: 170.0 tok/s vs
// 161.6 with the 20-head kernel there); at depth 8192 too (149.7 vs 139.4 tok/s with the 20-head
// kernel): 16384.
constexpr uint32_t kDefaultShortMaxKv = 1024;
constexpr uint32_t kDefaultRowsMaxKv = 16384;
// ... where the long range runs on tensor cores (AttentionTuning::decode_tc; H100, GLM tg32, the
// rows kernel against the tensor cores: 285.1 / 273.1 tok/s at 4096 positions, 273.3 / 271.5 at
// 5120, 262.1 / 262.5 at 6144, 242.7 / 254.2 at 8192; session 26).
constexpr uint32_t kTcRowsMaxKv = 6144;
constexpr uint32_t kDefaultMinChunk = 8;  // measured: small chunks win at short contexts
// Context workgroups of the rows kernel's decode range (H100, GLM, tg128 with direct dispatches:
// 128 groups 277.9 tok/s at depth 0 and 201.8 at 4096, 32 groups 280.2 / 219.8).
constexpr uint32_t kDefaultShortGroups = 32;
// attention_rows.comp: subgroups per workgroup and rows each loads per round (H100, GLM, tg128 at
// depth 0 / 768: 4 x 2 214.1 / 185.5 tok/s, 4 x 4 213.5 / 182.7, 8 x 4 202.7 / 156.3, 2 x 8
// 195.0 / 164.7; attention_partial.comp with 5 heads per workgroup 198.0 / 160.8).
// The single range (attention_rows.comp SINGLE): one workgroup per head over the whole context,
// 16 subgroups x 2 rows per round (H100, GLM tg128: 2 rows 321.6 / 323.0 tok/s, 3 rows 316.9,
// 4 rows 312.6 / 313.5; PERFORMANCE.md session 9).
constexpr uint32_t kDefaultSingleMaxKv = 256;
constexpr uint32_t kSingleSubgroups = 16;
constexpr uint32_t kSingleRound = 2;
// The mid range (attention_rows.comp MERGE_TAIL + Q8_OUT): 4 workgroups of 16 subgroups per
// head up to 768 positions (H100, GLM tg128: +2.4 % at 257-384 positions, +0.5 % at 701-828,
// where the one kernel (18.7 µs) costs what the split pair saves (18.2 µs + a barrier);
// 2 / 8 groups and 8 subgroups were slower there; PERFORMANCE.md session 9).
constexpr uint32_t kDefaultMidMaxKv = 768;
constexpr uint32_t kMidGroups = 4;
constexpr uint32_t kMidSubgroups = 16;
constexpr uint32_t kMidRound = 2;
constexpr uint32_t kRowsSubgroups = 4;
constexpr uint32_t kRowsPerRound = 2;

uint32_t ceil_div(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

// "%.9e" keeps a float exact through the GLSL compiler.
std::string float_literal(float f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9e", double(f));
  return buf;
}

ShaderDefines merged(ShaderDefines a, const ShaderDefines& b) {
  for (const auto& [k, v] : b) a[k] = v;
  return a;
}

// Thread layout and shared memory of attention_partial.comp for HW heads and a tile of rows.
struct PartialLayout {
  uint32_t wg = 0, sv = 0, oh = 0;  // threads, vec4 per score slice, heads per value thread
  uint64_t shared_bytes = 0;
};
PartialLayout partial_layout(const AttentionShape& s, uint32_t heads, uint32_t tile, uint32_t sv) {
  PartialLayout l;
  l.sv = sv;
  const uint32_t row_v = s.row() / 4, quads = s.kv_lora / 4, hwp = ceil_div(heads, 4) * 4;
  const uint32_t value_groups = std::max(1u, 256 / quads);  // head groups that fill ~256 threads
  l.oh = ceil_div(ceil_div(heads, value_groups), 4) * 4;
  const uint32_t slices = ceil_div(row_v, sv);
  const uint32_t threads = std::max({slices * ceil_div(heads, 4), quads * ceil_div(heads, l.oh), heads, 32u});
  l.wg = ceil_div(threads, 32) * 32;
  l.shared_bytes = uint64_t(tile) * s.row() * 4 + (uint64_t(slices) * tile * hwp + l.oh) * 4 + 2ull * hwp * 4;
  return l;
}
// The first (tile, slice width) choice, in order of preference, that fits the device.
std::optional<PartialLayout> choose_layout(const AttentionShape& s, uint32_t heads, uint32_t tile, uint32_t slice,
                                           const DeviceInfo& info, uint32_t* chosen_tile) {
  const std::pair<uint32_t, uint32_t> prefs[] = {{16, 4}, {8, 4}, {4, 4}, {16, 8}, {8, 8}, {4, 8}};
  for (auto [t, sv] : prefs) {
    if ((tile && t != tile) || (slice && sv != slice)) continue;
    const PartialLayout l = partial_layout(s, heads, t, sv);
    if (l.shared_bytes <= info.max_compute_shared_memory && l.wg <= std::min(1024u, info.max_compute_workgroup_invocations)) {
      *chosen_tile = t;
      return l;
    }
  }
  return std::nullopt;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// RopeParams

RopeParams RopeParams::from_config(const ModelConfig& c) {
  RopeParams p;
  p.n_rot = c.n_rot;
  p.base = c.rope_base;
  p.freq_scale = c.rope_freq_scale;
  p.ext_factor = c.yarn_ext_factor();
  p.attn_factor = c.rope_attn_factor();
  if (c.yarn) {
    // ggml_rope_yarn_corr_dims (forward.md §3.2)
    auto corr = [&](double b) {
      return double(c.n_rot) * std::log(double(c.yarn_n_ctx_orig) / (b * 2.0 * M_PI)) / (2.0 * std::log(double(c.rope_base)));
    };
    p.corr_low = std::max(0.0, std::floor(corr(c.yarn_beta_fast)));
    p.corr_high = std::min(double(c.n_rot) - 1.0, std::ceil(corr(c.yarn_beta_slow)));
  }
  return p;
}

double RopeParams::frequency(uint32_t k) const {
  const double extrap = std::pow(base, -2.0 * double(k) / double(n_rot));
  if (ext_factor == 0) return freq_scale * extrap;
  const double y = (double(k) - corr_low) / std::max(0.001, corr_high - corr_low);
  const double mix = (1.0 - std::clamp(y, 0.0, 1.0)) * ext_factor;
  return extrap * (freq_scale * (1.0 - mix) + mix);
}

double RopeParams::mscale() const {
  return ext_factor != 0 ? attn_factor * (1.0 + 0.1 * std::log(1.0 / freq_scale)) : attn_factor;
}

ShaderDefines RopeParams::defines() const {
  std::string hi, lo;
  for (uint32_t k = 0; k < n_rot / 2; ++k) {
    const double turns = frequency(k) / (2.0 * M_PI);
    uint32_t bits;
    const float f = float(turns);
    std::memcpy(&bits, &f, 4);
    bits &= ~0xFFFu;  // 12 significant bits: products with 12-bit position parts are exact
    float g_hi;
    std::memcpy(&g_hi, &bits, 4);
    const float g_lo = float(turns - double(g_hi));
    hi += (k ? "," : "") + float_literal(g_hi);
    lo += (k ? "," : "") + float_literal(g_lo);
  }
  return {{"N_ROT", std::to_string(n_rot)},
          {"ROPE_TURNS_HI", hi},
          {"ROPE_TURNS_LO", lo},
          {"ROPE_MSCALE", float_literal(float(mscale()))}};
}

// ---------------------------------------------------------------------------------------------
// AttentionShape

AttentionShape AttentionShape::from_config(const ModelConfig& c, uint32_t n_ctx) {
  AttentionShape s;
  s.n_head = c.n_head;
  s.kv_lora = c.kv_lora_rank;
  s.n_ctx = n_ctx;
  s.eps = c.eps;
  s.kq_scale = c.kq_scale();
  s.rope = RopeParams::from_config(c);
  return s;
}

void AttentionShape::validate() const {
  if (n_head == 0) runtime_error("attention: head count is 0");
  if (kv_lora == 0 || kv_lora % 8 != 0)
    runtime_error("attention: kv_lora_rank must be a positive multiple of 8, found ", kv_lora);
  if (rope.n_rot == 0 || rope.n_rot % 8 != 0)
    runtime_error("attention: rope dimension count must be a positive multiple of 8, found ", rope.n_rot);
  if (n_ctx == 0) runtime_error("attention: context size is 0");
  if (uint64_t(n_ctx) * row() >= (1ull << 32))
    runtime_error("attention: context of ", n_ctx, " rows x ", row(), " values exceeds 2^32 cache elements");
  if (!(kq_scale > 0)) runtime_error("attention: kq_scale must be positive, found ", kq_scale);
}

// ---------------------------------------------------------------------------------------------
// KvWriteOp

namespace {
PipelineDesc kv_write_desc(const AttentionShape& shape) {
  PipelineDesc d;
  d.name = "kv_write";
  d.file = "kv_write.comp";
  d.defines = merged({{"KV_LORA", std::to_string(shape.kv_lora)}, {"WG", std::to_string(kKvWriteThreads)}},
                     shape.rope.defines());
  d.num_buffers = 4;
  d.push_bytes = sizeof(gpu::KvWriteArgs);
  return d;
}
}  // namespace

KvWriteOp::KvWriteOp(Context& ctx, const AttentionShape& shape) : ctx_(ctx), shape_(shape) {
  shape.validate();
  pipeline_ = &ctx.pipeline(kv_write_desc(shape));
}

bool KvWriteOp::gate_supported(Context& ctx) { return ctx.pipelines().use_subgroup(); }

void KvWriteOp::record(CommandRecorder& rec, BufferSlice kv, BufferSlice kv_norm_w, BufferSlice step, uint32_t pos_word,
                       BufferSlice cache, std::string_view label, const GateWait& gate, BufferSlice signal,
                       uint32_t signal_word) const {
  const bool signals = signal.buffer != VK_NULL_HANDLE;
  if (!gate.enabled() && !signals) return record_rows(rec, kv, kv_norm_w, step, pos_word, {}, cache, label);
  if (!gate_supported(ctx_)) runtime_error(label, ": no early start for kv_write here (it needs subgroups)");
  PipelineDesc d = kv_write_desc(shape_);
  std::vector<BufferSlice> b = {kv, kv_norm_w, step, cache};
  d.name = "kv_write";
  if (gate.enabled()) {  // WAIT_GATE: bindings 4, 5 = the gate words, the error words
    if (!gate.valid()) runtime_error(label, ": early start needs a gate word, an error word and a target above 0");
    d.name += ".gate";
    d.defines["WAIT_GATE"] = "1";
    d.defines["GATE_WORD"] = std::to_string(gate.word);
    d.defines["GATE_TARGET"] = std::to_string(gate.target);
    d.full_subgroups = true;
    b.insert(b.end(), {gate.words, gate.error});
  }
  if (signals) {  // SIGNAL_GATE: binding 4 = the gate words (6 after a wait's two)
    if (signal.size < (signal_word + 1) * 4ull) runtime_error(label, ": gate binding has no word ", signal_word);
    d.name += ".signal";
    d.defines["SIGNAL_GATE"] = "1";
    d.defines["SIGNAL_WORD"] = std::to_string(signal_word);
    b.push_back(signal);
  }
  d.num_buffers = uint32_t(b.size());
  if (kv.size < uint64_t(shape_.row()) * 4)
    runtime_error(label, ": kv binding holds ", kv.size, " bytes, needs ", uint64_t(shape_.row()) * 4);
  if (kv_norm_w.size < uint64_t(shape_.kv_lora) * 4 || step.size < uint64_t(pos_word + 1) * 4 ||
      cache.size < shape_.cache_bytes())
    runtime_error(label, ": kv norm, step or cache binding too small");
  const gpu::KvWriteArgs args{pos_word, shape_.n_ctx, shape_.eps, QueryBatch{}.word(), shape_.row(), 0, 0, 0};
  rec.dispatch(ctx_.pipeline(d), b, args, 1, 1, 1, label, bytes());
}

void KvWriteOp::record_rows(CommandRecorder& rec, BufferSlice kv, BufferSlice kv_norm_w, BufferSlice step,
                            uint32_t pos_word, const QueryBatch& batch, BufferSlice cache, std::string_view label) const {
  const uint32_t n = batch.checked(label);
  if (kv.size < uint64_t(n) * shape_.row() * 4)
    runtime_error(label, ": kv binding holds ", kv.size, " bytes, needs ", uint64_t(n) * shape_.row() * 4);
  if (kv_norm_w.size < uint64_t(shape_.kv_lora) * 4)
    runtime_error(label, ": kv norm binding holds ", kv_norm_w.size, " bytes, needs ", shape_.kv_lora * 4);
  if (step.size < uint64_t(std::max(pos_word, batch.n > 1 ? batch.count_word : 0) + 1) * 4)
    runtime_error(label, ": step binding has no word ", pos_word, " / ", batch.count_word);
  if (cache.size < shape_.cache_bytes())
    runtime_error(label, ": cache binding holds ", cache.size, " bytes, needs ", shape_.cache_bytes(), " (", shape_.n_ctx,
                  " rows)");
  const gpu::KvWriteArgs args{pos_word, shape_.n_ctx, shape_.eps, batch.word(), shape_.row(), 0, 0, 0};
  const BufferSlice b[] = {kv, kv_norm_w, step, cache};
  rec.dispatch(*pipeline_, b, args, 1, n, 1, label, bytes() * n);
}

uint64_t KvWriteOp::bytes() const { return uint64_t(shape_.row()) * 4 + shape_.kv_lora * 4 + 4 + shape_.row() * 2; }

// ---------------------------------------------------------------------------------------------
// AttentionOp

namespace {

// Subgroups per workgroup of a one-head rows-kernel variant that writes olat (SINGLE, or
// MERGE_TAIL with Q8_OUT): shared memory for the subgroups' (m, l, o), the head's olat for its
// int8 blocks and the arrival flag. `asked` must fit (Error(Usage) naming `what` otherwise);
// 0 asks for the most, from `most` halving, that the device's limits allow. 0: none fits.
uint32_t fit_olat_subgroups(uint32_t asked, uint32_t most, const AttentionShape& shape, const DeviceInfo& info,
                            const char* what) {
  auto shared_bytes = [&](uint32_t nsg) { return uint64_t(nsg) * (shape.kv_lora + 2) * 4 + shape.kv_lora * 4 + 4; };
  auto fits = [&](uint32_t nsg) {
    return shared_bytes(nsg) <= info.max_compute_shared_memory &&
           nsg * info.subgroup_size <= info.max_compute_workgroup_invocations;
  };
  if (asked) {
    if (!fits(asked))
      usage_error("attention ", what, ": ", asked, " subgroups need ", shared_bytes(asked), " bytes of shared memory and ",
                  asked * info.subgroup_size, " threads; ", info.name, " has ", info.max_compute_shared_memory, " and ",
                  info.max_compute_workgroup_invocations);
    return asked;
  }
  for (uint32_t nsg = most; nsg >= 1; nsg /= 2)
    if (fits(nsg)) return nsg;
  return 0;
}

}  // namespace

AttentionOp::OlatPipelines AttentionOp::olat_pipelines(Context& ctx, PipelineDesc d, const AttentionShape& shape, bool gate) {
  d.push_bytes = sizeof(gpu::AttnPartialArgs);
  d.full_subgroups = true;
  OlatPipelines p;
  p.plain = &ctx.pipeline(d);
  if (shape.kv_lora % 32 != 0) return p;
  d.name += ".q8out";
  d.defines["Q8_OUT"] = "1";
  d.num_buffers += 1;
  p.q8 = &ctx.pipeline(d);
  if (!gate) return p;
  d.name += ".gate";
  d.defines["GATE_SIGNAL"] = "1";
  d.num_buffers += 1;
  p.gate = &ctx.pipeline(d);
  p.gate_desc = d;
  return p;
}

PipelineDesc AttentionOp::waiting_desc(PipelineDesc d, const GateWait& wait) {
  d.name += ".wait";
  d.defines["WAIT_GATE"] = "1";
  d.defines["GATE_WORD"] = std::to_string(wait.word);
  d.defines["GATE_TARGET"] = std::to_string(wait.target);
  d.num_buffers += 2;  // the polled words, the error words
  return d;
}

PipelineDesc AttentionOp::signalling_desc(PipelineDesc d, uint32_t word) {
  d.name += ".signal";
  d.defines["PARTIAL_SIGNAL"] = "1";
  d.defines["SIGNAL_WORD"] = std::to_string(word);
  d.num_buffers += 1;  // the gate words
  return d;
}

const Pipeline& AttentionOp::wait_pipeline(Context& ctx, const OlatPipelines& p, const GateWait& wait) {
  return ctx.pipeline(waiting_desc(p.gate_desc, wait));
}

AttentionOp::AttentionOp(Context& ctx, const AttentionShape& shape, const AttentionTuning& tuning) : shape_(shape) {
  shape.validate();
  const DeviceInfo& info = ctx.info();
  heads_per_group_ = tuning.heads_per_group ? std::min(tuning.heads_per_group, shape.n_head) : shape.n_head;
  if (heads_per_group_ > kMaxHeadsPerGroup) {
    if (tuning.heads_per_group) usage_error("attention: at most ", kMaxHeadsPerGroup, " heads per workgroup, asked for ", tuning.heads_per_group);
    heads_per_group_ = ceil_div(shape.n_head, ceil_div(shape.n_head, kMaxHeadsPerGroup));  // even split
  }
  if (tuning.tile && tuning.tile != 4 && tuning.tile != 8 && tuning.tile != 16)
    usage_error("attention tile must be 4, 8 or 16, found ", tuning.tile);
  if (tuning.score_slice && tuning.score_slice != 4 && tuning.score_slice != 8)
    usage_error("attention score slice must be 4 or 8 vec4, found ", tuning.score_slice);
  const std::optional<PartialLayout> layout =
      choose_layout(shape, heads_per_group_, tuning.tile, tuning.score_slice, info, &tile_);
  if (!layout) {
    const PartialLayout smallest =
        partial_layout(shape, heads_per_group_, tuning.tile ? tuning.tile : 4, tuning.score_slice ? tuning.score_slice : 8);
    runtime_error("attention: ", heads_per_group_, " heads x ", shape.row(), "-value rows need ", smallest.shared_bytes,
                  " bytes of shared memory and ", smallest.wg, " threads per workgroup; ", info.name, " has ",
                  info.max_compute_shared_memory, " bytes and ", info.max_compute_workgroup_invocations, " threads");
  }
  min_chunk_ = ceil_div(tuning.min_chunk ? tuning.min_chunk : kDefaultMinChunk, tile_) * tile_;
  n_groups_ = tuning.n_groups ? tuning.n_groups : std::min(kDefaultGroups, ceil_div(shape.n_ctx, min_chunk_));
  if (n_groups_ == 0 || n_groups_ > kMaxGroups || n_groups_ > info.max_workgroup_count[0])
    usage_error("attention: ", n_groups_, " context workgroups, expected 1..",
                std::min(kMaxGroups, info.max_workgroup_count[0]));
  if (uint64_t(n_groups_) * shape.n_head * (shape.kv_lora + 2) >= (1ull << 32))
    runtime_error("attention: partials of ", n_groups_, " groups exceed 2^32 floats");
  profile_kv_len_ = shape.n_ctx;
  direct_partial_ = tuning.direct_partial;

  const ShaderDefines common = merged({{"N_HEAD", std::to_string(shape.n_head)}, {"KV_LORA", std::to_string(shape.kv_lora)},
                                       {"TILE", std::to_string(tile_)}},
                                      shape.rope.defines());
  // The rows kernels' lane layout and arithmetic (attention_rows.comp ROWS_COALESCED, ROWS_F16:
  // packed halves where the device has fp16 arithmetic).
  const bool rows_f16 = tuning.rows_f16 && ctx.device().enabled().shader_float16;
  const ShaderDefines rows_common =
      merged(common, {{"ROWS_COALESCED", tuning.rows_coalesced ? "1" : "0"}, {"ROWS_F16", rows_f16 ? "1" : "0"}});
  PipelineDesc p;
  p.name = "attention_partial";
  p.file = "attention_partial.comp";
  p.defines = merged(common, {{"WG", std::to_string(layout->wg)},
                              {"HW", std::to_string(heads_per_group_)},
                              {"SV", std::to_string(layout->sv)},
                              {"OH", std::to_string(layout->oh)}});
  p.num_buffers = 4;
  p.push_bytes = sizeof(gpu::AttnPartialArgs);
  partial_ = &ctx.pipeline(p);
  partial_desc_ = p;

  // The short-context variant: fewer heads per workgroup, same tile (so the same chunking, the
  // same partials layout and one merge for both).
  // Automatic: a quarter of the heads, at least 4 (H200, GLM 20 heads, tg128 at depth 0: 5 heads
  // 202.1 tok/s, 10 heads 199.8, one kernel of 20 heads 192.4).
  const uint32_t quarter = std::max(4u, ceil_div(heads_per_group_, 4));
  if (tuning.short_variant && tuning.short_rows && !tuning.short_heads_per_group && ctx.pipelines().use_subgroup()) {
    // Few heads per workgroup (default one), the chunk's rows over its subgroups (attention_rows.comp).
    const uint32_t rh = tuning.rows_heads ? std::min(tuning.rows_heads, shape.n_head) : 1u;
    if (rh > 4) usage_error("attention rows kernel: ", rh, " heads per workgroup outside 1..4");
    short_heads_ = rh;
    short_max_kv_ = tuning.short_max_kv ? tuning.short_max_kv : kDefaultRowsMaxKv;
    PipelineDesc pr;
    pr.name = "attention_rows";
    pr.file = "attention_rows.comp";
    const uint32_t nsg = tuning.rows_subgroups ? tuning.rows_subgroups : kRowsSubgroups;
    const uint32_t rb = tuning.rows_round ? tuning.rows_round : kRowsPerRound;
    if (nsg > 16 || rb > 8) usage_error("attention rows kernel: ", nsg, " subgroups, ", rb, " rows per round outside 1..16 / 1..8");
    const uint64_t shared_bytes = uint64_t(nsg) * rh * (shape.kv_lora + 2) * 4;  // the subgroups' (m, l, o)
    if (shared_bytes > info.max_compute_shared_memory || nsg * info.subgroup_size > info.max_compute_workgroup_invocations)
      usage_error("attention rows kernel: ", nsg, " subgroups need ", shared_bytes, " bytes of shared memory and ",
                  nsg * info.subgroup_size, " threads; ", info.name, " has ", info.max_compute_shared_memory, " and ",
                  info.max_compute_workgroup_invocations);
    pr.defines = merged(rows_common, {{"NSG", std::to_string(nsg)}, {"RB", std::to_string(rb)}, {"RH", std::to_string(rh)}});
    pr.num_buffers = 4;
    pr.push_bytes = sizeof(gpu::AttnPartialArgs);
    pr.full_subgroups = true;
    partial_short_ = &ctx.pipeline(pr);
    short_rows_desc_ = pr;
    short_wait_ = tuning.short_wait;
    short_groups_ = tuning.short_groups ? tuning.short_groups : std::min(n_groups_, kDefaultShortGroups);
    if (short_groups_ > kMaxGroups || short_groups_ > info.max_workgroup_count[0])
      usage_error("attention: ", short_groups_, " short-range context workgroups, expected 1..",
                  std::min(kMaxGroups, info.max_workgroup_count[0]));
    // The decode step's variant with the merge folded in: its chunk weights live in the
    // subgroups' o arrays, which must hold one per workgroup along the context.
    if (tuning.merge_tail && uint64_t(nsg) * rh * shape.kv_lora >= short_groups_) {
      PipelineDesc pt = pr;
      pt.name = "attention_rows.merge";
      pt.defines = merged(pr.defines, {{"MERGE_TAIL", "1"}});
      pt.num_buffers = 6;
      partial_short_tail_ = &ctx.pipeline(pt);
    }
  }
  if (tuning.single && ctx.pipelines().use_subgroup()) {
    const uint32_t rb = tuning.single_round ? tuning.single_round : kSingleRound;
    if (tuning.single_subgroups > 16 || rb > 8)
      usage_error("attention single kernel: ", tuning.single_subgroups, " subgroups, ", rb, " rows per round outside 1..16 / 1..8");
    if (const uint32_t nsg = fit_olat_subgroups(tuning.single_subgroups, kSingleSubgroups, shape, info, "single kernel")) {
      PipelineDesc ps;
      ps.name = "attention_single";
      ps.file = "attention_rows.comp";
      ps.defines = merged(rows_common, {{"NSG", std::to_string(nsg)}, {"RB", std::to_string(rb)}, {"RH", "1"}, {"SINGLE", "1"},
                                   {"SINGLE_EARLY", tuning.single_early ? "1" : "0"}});
      ps.num_buffers = 4;
      single_ = olat_pipelines(ctx, ps, shape, tuning.gate_signal);
      single_max_kv_ = std::min(tuning.single_max_kv ? tuning.single_max_kv : kDefaultSingleMaxKv, shape.n_ctx);
    }
  }
  if (single_ && tuning.mid) {
    const uint32_t groups = tuning.mid_groups ? tuning.mid_groups : kMidGroups;
    if (groups == 0 || groups > 256 || tuning.mid_subgroups > 16)
      usage_error("attention mid range: ", groups, " groups, ", tuning.mid_subgroups, " subgroups outside 1..256 / 1..16");
    const uint32_t nsg = fit_olat_subgroups(tuning.mid_subgroups, kMidSubgroups, shape, info, "mid range");
    const uint32_t max_kv = std::min(tuning.mid_max_kv ? tuning.mid_max_kv : kDefaultMidMaxKv, shape.n_ctx);
    // The merging workgroup keeps a weight per chunk in its subgroups' o arrays.
    if (nsg && uint64_t(nsg) * shape.kv_lora >= groups && max_kv > single_max_kv_) {
      PipelineDesc pm;
      pm.name = "attention_mid";
      pm.file = "attention_rows.comp";
      pm.defines = merged(rows_common, {{"NSG", std::to_string(nsg)}, {"RB", std::to_string(kMidRound)}, {"RH", "1"},
                                   {"MERGE_TAIL", "1"}});
      pm.num_buffers = 6;
      mid_ = olat_pipelines(ctx, pm, shape, tuning.gate_signal);
      mid_max_kv_ = max_kv;
      mid_groups_ = groups;
    }
  }
  const uint32_t short_heads = !tuning.short_variant         ? 0
                               : tuning.short_heads_per_group ? std::min(tuning.short_heads_per_group, heads_per_group_)
                               : quarter < heads_per_group_   ? quarter
                                                              : 0;
  if (!partial_short_ && short_heads > 0 && short_heads < heads_per_group_) {
    uint32_t short_tile = 0;
    const std::optional<PartialLayout> sl = choose_layout(shape, short_heads, tile_, tuning.score_slice, info, &short_tile);
    if (sl) {
      short_heads_ = short_heads;
      short_max_kv_ = tuning.short_max_kv ? tuning.short_max_kv : kDefaultShortMaxKv;
      short_groups_ = n_groups_;
      PipelineDesc ps = p;
      ps.defines = merged(common, {{"WG", std::to_string(sl->wg)},
                                   {"HW", std::to_string(short_heads)},
                                   {"SV", std::to_string(sl->sv)},
                                   {"OH", std::to_string(sl->oh)}});
      partial_short_ = &ctx.pipeline(ps);
    }
  }

  if (tuning.decode_tc < -1 || tuning.decode_tc > 1)
    usage_error("attention: decode_tc ", tuning.decode_tc, ", expected -1 (automatic), 0 or 1");
  if (tuning.decode_tc != 0) {
    if (tuning.decode_tc_groups != 4 && tuning.decode_tc_groups != 8)
      usage_error("attention: ", tuning.decode_tc_groups, " tensor-core groups per workgroup, expected 4 or 8");
    std::optional<PipelineDesc> tc = attention_tc_desc(ctx, shape, decode_tc_tuning(tuning), tuning.decode_tc == 1);
    if (tc) {
      tc->name = "attention_decode_tc";
      tc->defines["SPLIT"] = "1";
      tc->defines["TILE"] = std::to_string(tile_);
      tc_ = &ctx.pipeline(*tc);
      tc_desc_ = *tc;
      tc_m_tiles_ = attention_tc_m_tiles(*tc);
      // The rows kernel's range ends where the tensor cores pass it.
      if (short_rows_desc_ && !tuning.short_max_kv) short_max_kv_ = kTcRowsMaxKv;
    }
  }

  PipelineDesc m;
  m.name = "attention_merge";
  m.file = "attention_merge.comp";
  const bool merge_sg = tuning.merge_subgroup && ctx.pipelines().use_subgroup() &&
                        (kMergeColumns * kMergeLanes) % info.subgroup_size == 0;
  m.full_subgroups = merge_sg;
  m.defines = merged(common, {{"COLS", std::to_string(kMergeColumns)},
                              {"LANES", std::to_string(kMergeLanes)},
                              {"MERGE_SG", merge_sg ? "1" : "0"},
                              {"MAX_GROUPS", std::to_string(kMaxGroups)}});
  m.num_buffers = 3;
  m.push_bytes = sizeof(gpu::AttnMergeArgs);
  merge_ = &ctx.pipeline(m);
  if (shape.kv_lora % 32 == 0 && kMergeColumns % 32 == 0) {
    PipelineDesc mq = m;
    mq.name = "attention_merge.q8out";
    mq.defines["Q8_OUT"] = "1";
    mq.num_buffers = 4;
    merge_q8_ = &ctx.pipeline(mq);
    if (tuning.merge_wait && merge_sg) merge_q8_wait_desc_ = mq;
    if (tuning.gate_signal) {
      mq.name += ".gate";
      mq.defines["GATE_SIGNAL"] = "1";
      mq.num_buffers = 5;
      merge_gate_ = &ctx.pipeline(mq);
      if (tuning.merge_wait && merge_sg) merge_gate_wait_desc_ = mq;
    }
  }
}

uint32_t AttentionOp::decode_merge_target(DecodeRange range) const {
  if (range == DecodeRange::Short) return short_heads_ ? short_groups_ * ceil_div(shape_.n_head, short_heads_) : 0;
  return n_groups_ * (tc_ ? tc_head_groups() : ceil_div(shape_.n_head, heads_per_group_));
}

uint64_t AttentionOp::partials_bytes() const {
  return uint64_t(std::max({n_groups_, short_groups_, mid_groups_})) * shape_.n_head * (shape_.kv_lora + 2) * 4;
}

uint32_t AttentionOp::decode_gate_target(DecodeRange range) const {
  if (range == DecodeRange::Single || range == DecodeRange::Mid) return shape_.n_head;
  return shape_.n_head * ceil_div(shape_.kv_lora, kMergeColumns);
}

uint32_t AttentionOp::num_chunks(uint32_t kv_len, uint32_t groups) const {
  return gpu::ts_attn_num_chunks(std::min(kv_len, shape_.n_ctx), groups ? groups : n_groups_, min_chunk_, tile_);
}

uint64_t AttentionOp::partial_bytes(uint32_t kv_len, uint32_t groups) const {
  const uint64_t len = std::min(kv_len, shape_.n_ctx);
  return len * shape_.row() * 2 + uint64_t(shape_.n_head) * shape_.row() * 4 +
         uint64_t(num_chunks(kv_len, groups)) * shape_.n_head * (shape_.kv_lora + 2) * 4;
}

uint64_t AttentionOp::merge_bytes(uint32_t kv_len, uint32_t groups) const {
  return uint64_t(num_chunks(kv_len, groups)) * shape_.n_head * (shape_.kv_lora + 2) * 4 + uint64_t(shape_.n_head) * shape_.kv_lora * 4;
}

gpu::AttnPartialArgs AttentionOp::partial_args(uint32_t pos_word, uint32_t count_word, Variant v, uint32_t groups) const {
  // The context bounds of a variant: the short one up to short_max_kv_, the long one above.
  const uint32_t kv_min = v == Variant::Long ? short_max_kv_ + 1 : 0, kv_max = v == Variant::Short ? short_max_kv_ : 0;
  return {pos_word, shape_.n_ctx, groups ? groups : n_groups_, min_chunk_, shape_.kq_scale, count_word, kv_min, kv_max};
}

uint32_t AttentionOp::check_partial_bindings(BufferSlice q, BufferSlice cache, BufferSlice step, uint32_t pos_word,
                                             BufferSlice partials, const QueryBatch& batch, std::string_view label) const {
  const uint32_t n = batch.checked(label);
  if (q.size < uint64_t(n) * shape_.n_head * shape_.row() * 4)
    runtime_error(label, ": q binding holds ", q.size, " bytes, needs ", uint64_t(n) * shape_.n_head * shape_.row() * 4);
  if (cache.size < shape_.cache_bytes())
    runtime_error(label, ": cache binding holds ", cache.size, " bytes, needs ", shape_.cache_bytes());
  if (step.size < uint64_t(std::max(pos_word, n > 1 ? batch.count_word : 0) + 1) * 4)
    runtime_error(label, ": step binding has no word ", pos_word, " / ", batch.count_word);
  if (partials.size < n * partials_bytes())
    runtime_error(label, ": partials binding holds ", partials.size, " bytes, needs ", n * partials_bytes());
  return n;
}

void AttentionOp::record_partial(CommandRecorder& rec, BufferSlice q, BufferSlice cache, BufferSlice step, uint32_t pos_word,
                                 BufferSlice partials, std::string_view label, const QueryBatch& batch) const {
  const uint32_t n = check_partial_bindings(q, cache, step, pos_word, partials, batch, label);
  const BufferSlice b[] = {q, cache, step, partials};
  if (!partial_short_) {
    rec.dispatch(*partial_, b, partial_args(pos_word, batch.word(), Variant::Only), n_groups_, ceil_div(shape_.n_head, heads_per_group_), n, label,
                 n * partial_bytes(profile_kv_len_));
    return;
  }
  // Two dispatches, no barrier between them: for a given context exactly one of them works (its
  // workgroups check kv_len against the bounds), both write the same partials layout. The bytes
  // go to the one the profiled context length selects.
  const bool short_ctx = profile_kv_len_ <= short_max_kv_;
  rec.dispatch(*partial_short_, b, partial_args(pos_word, batch.word(), Variant::Short), n_groups_,
               ceil_div(shape_.n_head, short_heads_), n, std::string(label) + " short",
               short_ctx ? n * partial_bytes(profile_kv_len_) : 0);
  rec.dispatch(*partial_, b, partial_args(pos_word, batch.word(), Variant::Long), n_groups_,
               ceil_div(shape_.n_head, heads_per_group_), n, label, short_ctx ? 0 : n * partial_bytes(profile_kv_len_));
}

void AttentionOp::record_merge(CommandRecorder& rec, BufferSlice partials, BufferSlice step, uint32_t pos_word,
                               BufferSlice olat, std::string_view label, const QueryBatch& batch,
                               BufferSlice olat_q8, uint32_t groups) const {
  if (groups > n_groups_) runtime_error(label, ": a merge of ", groups, " chunks, more than the op's ", n_groups_);
  merge_groups(rec, partials, step, pos_word, olat, label, batch, olat_q8, groups ? groups : n_groups_, {});
}

void AttentionOp::merge_groups(CommandRecorder& rec, BufferSlice partials, BufferSlice step, uint32_t pos_word,
                               BufferSlice olat, std::string_view label, const QueryBatch& batch, BufferSlice olat_q8,
                               uint32_t groups, BufferSlice gate, const GateWait& wait) const {
  const uint32_t n = batch.checked(label);
  if (partials.size < n * partials_bytes())
    runtime_error(label, ": partials binding holds ", partials.size, " bytes, needs ", n * partials_bytes());
  if (step.size < uint64_t(std::max(pos_word, n > 1 ? batch.count_word : 0) + 1) * 4)
    runtime_error(label, ": step binding has no word ", pos_word, " / ", batch.count_word);
  if (olat.size < uint64_t(n) * shape_.n_head * shape_.kv_lora * 4)
    runtime_error(label, ": olat binding holds ", olat.size, " bytes, needs ", uint64_t(n) * shape_.n_head * shape_.kv_lora * 4);
  const gpu::AttnMergeArgs args{pos_word, shape_.n_ctx, groups, min_chunk_, batch.word(), 0, 0, 0};
  if (olat_q8.buffer != VK_NULL_HANDLE) {
    if (!merge_q8_) runtime_error(label, ": no int8 olat for a latent width of ", shape_.kv_lora, " (not a multiple of 32)");
    if (olat_q8.size < n * olat_q8_bytes())
      runtime_error(label, ": int8 olat binding holds ", olat_q8.size, " bytes, needs ", n * olat_q8_bytes());
    const bool gated = gate.buffer != VK_NULL_HANDLE;
    if (gated && (!merge_gate_ || n != 1 || gate.size < 4))
      runtime_error(label, ": no gate-opening merge here (it needs gate_signal, one query and a gate word)");
    const BufferSlice b[] = {partials, step, olat, olat_q8, gate, wait.words, wait.error};
    const BufferSlice b_ungated[] = {partials, step, olat, olat_q8, wait.words, wait.error};
    const Pipeline* pipe = gated ? merge_gate_ : merge_q8_;
    if (wait.enabled()) {
      const std::optional<PipelineDesc>& d = gated ? merge_gate_wait_desc_ : merge_q8_wait_desc_;
      if (!d || n != 1 || !wait.valid())
        runtime_error(label, ": no waiting merge here (it needs merge_wait, the subgroup merge, one query, a gate "
                      "word, error words and a target above 0)");
      pipe = &rec.context().pipeline(waiting_desc(*d, wait));
    }
    const uint32_t bindings = (gated ? 5 : 4) + (wait.enabled() ? 2 : 0);
    rec.dispatch(*pipe, std::span<const BufferSlice>(gated ? b : b_ungated, bindings), &args, sizeof args,
                 ceil_div(shape_.kv_lora, kMergeColumns), shape_.n_head, n,
                 std::string(label) + (gated ? ".q8out.gate" : ".q8out") + (wait.enabled() ? ".wait" : ""),
                 n * (merge_bytes(profile_kv_len_, groups) + olat_q8_bytes()));
    return;
  }
  if (wait.enabled()) runtime_error(label, ": the waiting merge writes olat's int8 blocks (olat_q8 unset)");
  const BufferSlice b[] = {partials, step, olat};
  rec.dispatch(*merge_, b, args, ceil_div(shape_.kv_lora, kMergeColumns), shape_.n_head, n, label,
               n * merge_bytes(profile_kv_len_, groups));
}

void AttentionOp::record(CommandRecorder& rec, BufferSlice q, BufferSlice cache, BufferSlice step, uint32_t pos_word,
                         BufferSlice partials, BufferSlice olat, std::string_view label, const QueryBatch& batch) const {
  record_partial(rec, q, cache, step, pos_word, partials, std::string(label) + " partial", batch);
  rec.barrier();
  record_merge(rec, partials, step, pos_word, olat, std::string(label) + " merge", batch);
}

uint32_t QueryBatch::word() const { return n > 1 ? count_word : TS_ATTN_NO_COUNT; }

uint32_t QueryBatch::checked(std::string_view label) const {
  if (n == 0 || n > 65535) runtime_error(label, ": ", n, " queries per dispatch, expected 1..65535");
  if (n > 1 && count_word == TS_ATTN_NO_COUNT) runtime_error(label, ": ", n, " queries need a count word");
  return n;
}

// ---------------------------------------------------------------------------------------------
// AbsorbOp

namespace {
constexpr uint32_t kAbsorbRowsPerWorkgroup = 4;
constexpr uint32_t kAbsorbSharedThreadsPerRow = 32;  // row width of the shared-memory reduction path

bool absorb_vec8(const AbsorbOp& op) {
  return op.w.layout == WeightLayout::Plain && op.w.cols % 8 == 0 && op.x_stride % 4 == 0 && op.x_offset % 4 == 0;
}
}  // namespace

AbsorbOp AbsorbOp::query(const MatrixRef& k_b, uint32_t n_head, uint32_t n_rot, BufferSlice q_in, BufferSlice q_out) {
  AbsorbOp op;
  op.w = k_b;
  op.n_head = n_head;
  op.x = q_in;
  op.y = q_out;
  const uint32_t n_nope = k_b.cols, kv_lora = n_head ? k_b.rows / n_head : 0;
  op.x_stride = n_nope + n_rot;
  op.y_stride = kv_lora + n_rot;
  op.copy_n = n_rot;
  op.copy_src = n_nope;
  op.copy_dst = kv_lora;
  return op;
}

AbsorbOp AbsorbOp::value(const MatrixRef& v_b, uint32_t n_head, BufferSlice olat, BufferSlice o) {
  AbsorbOp op;
  op.w = v_b;
  op.n_head = n_head;
  op.x = olat;
  op.y = o;
  op.x_stride = v_b.cols;
  op.y_stride = n_head ? v_b.rows / n_head : 0;
  return op;
}

std::string AbsorbOp::kernel_name() const {
  return cat("absorb.", type_name(w.type), absorb_vec8(*this) ? ".v8" : "");
}

uint64_t AbsorbOp::bytes() const {
  return w.read_bytes() +
         uint64_t(std::max(n_tokens, 1u)) * (uint64_t(n_head) * w.cols * 4 + uint64_t(w.rows) * 4 + uint64_t(n_head) * copy_n * 8);
}

void AbsorbOp::record(CommandRecorder& rec) const {
  Context& ctx = rec.context();
  const std::string name = kernel_name();
  const std::string what = label.empty() ? name : label;
  w.validate(what.c_str());
  if (n_head == 0 || w.rows % n_head != 0)
    runtime_error(what, ": ", w.rows, " weight rows do not split into ", n_head, " heads");
  const uint32_t rows = w.rows / n_head;
  if (x_stride % 4 != 0 || x_offset % 4 != 0)
    runtime_error(what, ": x stride ", x_stride, " and offset ", x_offset, " must be multiples of 4");
  if (x_offset + w.cols > x_stride || (copy_n && copy_src + copy_n > x_stride))
    runtime_error(what, ": a head's input (offset ", x_offset, " + ", w.cols, ", copy ", copy_src, " + ", copy_n,
                  ") does not fit the x stride ", x_stride);
  if (y_offset + rows > y_stride || (copy_n && copy_dst + copy_n > y_stride))
    runtime_error(what, ": a head's output (offset ", y_offset, " + ", rows, ", copy ", copy_dst, " + ", copy_n,
                  ") does not fit the y stride ", y_stride);
  if (n_tokens == 0 || n_tokens > ctx.info().max_workgroup_count[2])
    runtime_error(what, ": ", n_tokens, " tokens outside 1..", ctx.info().max_workgroup_count[2]);
  const uint32_t xts = x_token_stride ? x_token_stride : n_head * x_stride;
  const uint32_t yts = y_token_stride ? y_token_stride : n_head * y_stride;
  if (n_tokens > 1 && (xts < n_head * x_stride || yts < n_head * y_stride || xts % 4 != 0))
    runtime_error(what, ": token strides ", xts, " / ", yts, " overlap the heads (or x's is not a multiple of 4)");
  const uint64_t x_need = (uint64_t(n_tokens - 1) * xts + uint64_t(n_head) * x_stride) * 4;
  const uint64_t y_need = (uint64_t(n_tokens - 1) * yts + uint64_t(n_head) * y_stride) * 4;
  if (x.size < x_need) runtime_error(what, ": x binding has ", x.size, " bytes, needs ", x_need);
  if (y.size < y_need) runtime_error(what, ": y binding has ", y.size, " bytes, needs ", y_need);

  PipelineLibrary& lib = ctx.pipelines();
  const bool sg = lib.use_subgroup();
  const uint32_t tpr = sg ? ctx.info().subgroup_size : kAbsorbSharedThreadsPerRow;
  PipelineDesc desc;
  desc.name = name;
  desc.file = "absorb.comp";
  desc.defines = {{"WTYPE", std::to_string(static_cast<uint32_t>(w.type))},
                  {"WG_SIZE", std::to_string(tpr * kAbsorbRowsPerWorkgroup)},
                  {"THREADS_PER_ROW", std::to_string(tpr)},
                  {"PLAIN_VEC8", absorb_vec8(*this) ? "1" : "0"}};
  desc.num_buffers = 4;
  desc.push_bytes = sizeof(gpu::AbsorbArgs);
  desc.full_subgroups = sg;
  const Pipeline& pipe = lib.get(desc);

  const std::vector<RowChunk> chunks = row_chunks(w, ctx.info());
  for (const RowChunk& c : chunks) {
    gpu::AbsorbArgs a{};
    a.row_begin = c.row_begin;
    a.n_rows = c.rows;
    a.rows = rows;
    a.cols = w.cols;
    a.x_stride = x_stride;
    a.x_offset = x_offset;
    a.y_stride = y_stride;
    a.y_offset = y_offset;
    a.n_head = n_head;
    a.copy_n = copy_n;
    a.copy_src = copy_src;
    a.copy_dst = copy_dst;
    a.x_token_stride = xts;
    a.y_token_stride = yts;
    const BufferSlice bufs[4] = {c.q, c.m, x, y};
    const GroupCounts g = split_workgroups(ceil_div(c.rows, kAbsorbRowsPerWorkgroup), ctx.info());
    rec.dispatch(pipe, bufs, a, g.x, g.y, n_tokens, what, chunks.size() == 1 ? bytes() : bytes() * c.rows / w.rows);
  }
}

}  // namespace tessera::vk
