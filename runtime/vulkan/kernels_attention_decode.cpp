// AttentionOp, the decode step's side: its context ranges (single, mid, short, long) and the
// recording of one range (record_decode). The kernels and the split-K chunking:
// kernels_attention.cpp; the ranges' design: docs/DECODE.md D5.
#include "runtime/vulkan/kernels_attention.h"

#include <algorithm>
#include <string>

#include "format/error.h"

namespace tessera::vk {
namespace {
uint32_t ceil_div(uint32_t a, uint32_t b) { return (a + b - 1) / b; }
}  // namespace

AttentionOp::OlatVariant AttentionOp::olat_variant(const OlatPipelines& p, bool q8, bool gated, uint32_t base) {
  if (gated) return {p.gate, base + 2, ".q8out.gate"};
  return q8 ? OlatVariant{p.q8, base + 1, ".q8out"} : OlatVariant{p.plain, base, ""};
}

bool AttentionOp::check_olat_bindings(const std::string& name, BufferSlice olat, BufferSlice olat_q8, bool have_q8) const {
  if (olat.size < uint64_t(shape_.n_head) * shape_.kv_lora * 4)
    runtime_error(name, ": olat binding holds ", olat.size, " bytes, needs ", uint64_t(shape_.n_head) * shape_.kv_lora * 4);
  const bool q8 = olat_q8.buffer != VK_NULL_HANDLE;
  if (q8 && !have_q8) runtime_error(name, ": no int8 olat for a latent width of ", shape_.kv_lora, " (not a multiple of 32)");
  if (q8 && olat_q8.size < olat_q8_bytes())
    runtime_error(name, ": int8 olat binding holds ", olat_q8.size, " bytes, needs ", olat_q8_bytes());
  return q8;
}

uint64_t AttentionOp::single_bytes(uint32_t kv_len) const {
  const uint64_t len = std::min(kv_len, shape_.n_ctx);
  return len * shape_.row() * 2 + uint64_t(shape_.n_head) * shape_.row() * 4 + uint64_t(shape_.n_head) * shape_.kv_lora * 4;
}

std::vector<std::pair<DecodeRange, uint32_t>> AttentionOp::decode_ranges() const {
  std::vector<std::pair<DecodeRange, uint32_t>> r;
  uint32_t covered = 0;
  if (single_) r.push_back({DecodeRange::Single, covered = std::min(single_max_kv_, shape_.n_ctx)});
  if (covered < shape_.n_ctx && mid_) r.push_back({DecodeRange::Mid, covered = mid_max_kv_});
  if (covered < shape_.n_ctx && partial_short_ && short_max_kv_ > covered)
    r.push_back({DecodeRange::Short, covered = std::min(short_max_kv_, shape_.n_ctx)});
  if (covered < shape_.n_ctx) r.push_back({DecodeRange::Long, shape_.n_ctx});
  return r;
}

void AttentionOp::record_decode(CommandRecorder& rec, BufferSlice q, BufferSlice cache, BufferSlice step,
                                uint32_t pos_word, BufferSlice counts, BufferSlice partials, BufferSlice arrivals,
                                BufferSlice olat, DecodeRange range, std::string_view label,
                                BufferSlice olat_q8, BufferSlice gate, const GateWait& wait,
                                const GateWait& merge_wait) const {
  const std::string what = std::string(label) + " partial";
  const bool gated = gate.buffer != VK_NULL_HANDLE;
  if (gated && (!decode_signals_gate(range) || olat_q8.buffer == VK_NULL_HANDLE || gate.size < 4))
    runtime_error(label, ": no gate-opening attention kernel for this range (it needs gate_signal, a range that "
                  "writes olat's int8 blocks in its last dispatch, and a gate word)");
  if (wait.enabled() && (!gated || !decode_waits(range) || !wait.valid()))
    runtime_error(label, ": the attention waits on a gate only in the single, mid and short (rows kernel) ranges, "
                  "opening W_vo's, with a gate word, error words and a target above 0");
  const bool chained = merge_wait.enabled();
  if (chained && (!decode_chains_merge(range) || !merge_wait.valid() ||
                  merge_wait.target != decode_merge_target(range) || olat_q8.buffer == VK_NULL_HANDLE))
    runtime_error(label, ": the merge waits on the partials only with merge_wait, in the short range's rows kernel or "
                  "the long range (olat_q8 set), on a gate word with error words and target ",
                  decode_merge_target(range));
  // The waiting variant: the gate-opening one plus the polled words and the error words.
  const auto variant = [&](const OlatPipelines& p, bool q8, uint32_t base) {
    OlatVariant v = olat_variant(p, q8, gated, base);
    if (wait.enabled()) v = {&wait_pipeline(rec.context(), p, wait), base + 4, ".q8out.gate.wait"};
    return v;
  };
  if (range == DecodeRange::Single) {
    const std::string name = std::string(label) + " single";
    if (!single_) runtime_error(name, ": no single-workgroup variant to record");
    check_partial_bindings(q, cache, step, pos_word, partials, {}, name);
    const bool q8 = check_olat_bindings(name, olat, olat_q8, single_.q8 != nullptr);
    // The whole context is one chunk: n_groups 1. Contexts past the range leave the workgroups idle.
    const gpu::AttnPartialArgs args{pos_word, shape_.n_ctx, 1, min_chunk_, shape_.kq_scale, TS_ATTN_NO_COUNT, 0, single_max_kv_};
    const BufferSlice b[] = {q, cache, step, olat, olat_q8, gate, wait.words, wait.error};
    const OlatVariant v = variant(single_, q8, 4);
    rec.dispatch(*v.pipe, std::span<const BufferSlice>(b, v.bindings), &args, sizeof args, 1, shape_.n_head, 1,
                 name + v.suffix, single_bytes(profile_kv_len_) + (q8 ? olat_q8_bytes() : 0));
    return;
  }
  if (range == DecodeRange::Mid) {
    const std::string name = std::string(label) + " mid";
    if (!mid_) runtime_error(name, ": no mid-range variant to record");
    check_partial_bindings(q, cache, step, pos_word, partials, {}, name);
    if (arrivals.size < arrivals_bytes()) runtime_error(name, ": arrival-counter binding holds ", arrivals.size, " bytes, needs ", arrivals_bytes());
    const bool q8 = check_olat_bindings(name, olat, olat_q8, mid_.q8 != nullptr);
    // Contexts past the range leave the workgroups idle (and the counters untouched).
    const gpu::AttnPartialArgs args{pos_word, shape_.n_ctx, mid_groups_, min_chunk_, shape_.kq_scale, TS_ATTN_NO_COUNT, 0, mid_max_kv_};
    const BufferSlice b[] = {q, cache, step, partials, arrivals, olat, olat_q8, gate, wait.words, wait.error};
    const OlatVariant v = variant(mid_, q8, 6);
    rec.dispatch(*v.pipe, std::span<const BufferSlice>(b, v.bindings), &args, sizeof args, mid_groups_, shape_.n_head, 1,
                 name + v.suffix,
                 partial_bytes(profile_kv_len_, mid_groups_) + merge_bytes(profile_kv_len_, mid_groups_) +
                     (q8 ? olat_q8_bytes() : 0));
    return;
  }
  if (counts.size < kDecodeCountWords * 4) runtime_error(what, ": group-count binding holds ", counts.size, " bytes");
  check_partial_bindings(q, cache, step, pos_word, partials, {}, what);
  const bool short_range = range == DecodeRange::Short;
  if (short_range && !partial_short_) runtime_error(what, ": no short-context variant to record");
  const uint32_t groups = decode_groups(range);
  const uint64_t bytes = partial_bytes(profile_kv_len_, groups);
  // The kv bounds stay: a workgroup run for the wrong range (bad counts) still does nothing.
  const gpu::AttnPartialArgs args = partial_args(
      pos_word, TS_ATTN_NO_COUNT, !partial_short_ ? Variant::Only : short_range ? Variant::Short : Variant::Long, groups);
  const BufferSlice slot = counts.sub(short_range ? 0 : 12, 12);
  const uint32_t head_groups = ceil_div(shape_.n_head, short_range ? short_heads_ : heads_per_group_);
  const bool folded = merge_folded(range);  // the kernel takes arrivals and olat as bindings 4, 5
  if (folded) {
    if (olat_q8.buffer != VK_NULL_HANDLE)
      runtime_error(what, ": no int8 olat where the merge is folded into the rows kernel (only the merge dispatch "
                    "writes it; leave olat_q8 unset for this range)");
    if (arrivals.size < arrivals_bytes()) runtime_error(what, ": arrival-counter binding holds ", arrivals.size, " bytes, needs ", arrivals_bytes());
    check_olat_bindings(what, olat, {}, false);
  }
  const BufferSlice b[] = {q, cache, step, partials, arrivals, olat};
  const BufferSlice b_wait[] = {q, cache, step, partials, wait.words, wait.error, merge_wait.words};
  const BufferSlice b_signal[] = {q, cache, step, partials, merge_wait.words};
  const std::span<const BufferSlice> bufs = wait.enabled() ? std::span<const BufferSlice>(b_wait, chained ? 7 : 6)
                                            : chained      ? std::span<const BufferSlice>(b_signal, 5)
                                                           : std::span<const BufferSlice>(b, folded ? 6 : 4);
  // The short range's rows partials that wait (decode_waits: WAIT_GATE with the polled word and
  // target) and / or signal (chained: every workgroup counts itself in merge_wait's word).
  const auto short_variant = [&]() -> const Pipeline& {
    PipelineDesc d = *short_rows_desc_;
    if (wait.enabled()) d = waiting_desc(d, wait);
    if (chained) d = signalling_desc(d, merge_wait.word);
    return rec.context().pipeline(d);
  };
  const bool tc = tc_ && range == DecodeRange::Long;
  // The long range's signalling variant (chained), on tensor cores or not.
  const auto long_signal = [&]() -> const Pipeline& {
    return rec.context().pipeline(signalling_desc(tc ? *tc_desc_ : partial_desc_, merge_wait.word));
  };
  const Pipeline& pipe = !short_range && chained        ? long_signal()
                         : tc                           ? *tc_
                         : folded                       ? *partial_short_tail_
                         : wait.enabled() || chained    ? short_variant()
                         : short_range                  ? *partial_short_
                                                        : *partial_;
  const std::string name = folded        ? what + " short+merge"
                           : short_range ? what + " short" + (wait.enabled() ? ".wait" : "") + (chained ? ".signal" : "")
                           : tc          ? what + ".tc" + (chained ? ".signal" : "")
                                         : what + (chained ? ".signal" : "");
  // The tensor-core kernel reads each cache row once per workgroup along the heads.
  const uint64_t moved = folded ? bytes + merge_bytes(profile_kv_len_, groups)
                         : tc   ? bytes + uint64_t(tc_head_groups() - 1) * std::min(profile_kv_len_, shape_.n_ctx) * shape_.row() * 2
                                : bytes;
  const uint32_t y_groups = tc ? tc_head_groups() : head_groups;
  if (direct_partial_) rec.dispatch(pipe, bufs, &args, sizeof args, groups, y_groups, 1, name, moved);
  else rec.dispatch_indirect(pipe, bufs, &args, sizeof args, slot, name, moved);
  if (folded) return;
  if (!chained) rec.barrier();
  merge_groups(rec, partials, step, pos_word, olat, std::string(label) + " merge", {}, olat_q8, groups, gate, merge_wait);
}


gpu::AttnDecodeRule AttentionOp::decode_rule() const {
  gpu::AttnDecodeRule r{};
  r.single_max = single_ ? single_max_kv_ : 0;
  r.mid_max = mid_ ? mid_max_kv_ : 0;
  r.short_max = partial_short_ ? short_max_kv_ : 0;
  r.short_groups = decode_groups(DecodeRange::Short) ? decode_groups(DecodeRange::Short) : n_groups_;
  r.long_groups = n_groups_;
  r.short_y = short_heads_ ? ceil_div(shape_.n_head, short_heads_) : 1u;
  r.long_y = tc_ ? tc_head_groups() : ceil_div(shape_.n_head, heads_per_group_);
  r.n_ctx = shape_.n_ctx;
  r.min_chunk = min_chunk_;
  r.tile = tile_;
  return r;
}

void AttentionOp::decode_counts(uint32_t kv_len, uint32_t words[kDecodeCountWords]) const {
  const gpu::AttnDecodeRule r = decode_rule();
  for (uint32_t i = 0; i < kDecodeCountWords; ++i) words[i] = gpu::ts_attn_decode_count(r, kv_len, i);
}

DecodeRange AttentionOp::decode_range(uint32_t kv_len) const {
  if (single_ && kv_len <= single_max_kv_) return DecodeRange::Single;
  if (mid_ && kv_len <= mid_max_kv_) return DecodeRange::Mid;
  return partial_short_ && kv_len <= short_max_kv_ ? DecodeRange::Short : DecodeRange::Long;
}

uint64_t AttentionOp::arrivals_bytes() const {
  const uint32_t short_counters = short_heads_ ? ceil_div(shape_.n_head, short_heads_) : 1u;
  return uint64_t(std::max(short_counters, mid_ ? shape_.n_head : 0u)) * 4;  // one per head group
}

}  // namespace tessera::vk
