#include "runtime/vulkan/kernels_sample.h"

#include <algorithm>

#include "format/error.h"
#include "shaders/moe_args.h"

namespace tessera::vk {
namespace {

constexpr uint32_t kWgSize = 256;          // phase 1 and merge workgroup; >= the group count
constexpr uint32_t kLogitsPerThread = 8;   // phase-1 logits per invocation (sets the group count)

static_assert(SampleOp::kMaxTopK == TS_SAMPLE_MAX_K);
static_assert(TS_SAMPLE_MAX_CAND / TS_SAMPLE_MAX_K <= kWgSize);

bool greedy(const SampleParams& p) { return p.temperature <= 0.f || p.top_k == 1; }

}  // namespace

uint32_t SampleOp::groups_for(uint32_t n_vocab, uint32_t top_k) {
  const uint64_t per_wg = uint64_t(kWgSize) * kLogitsPerThread;
  const uint64_t g = (uint64_t(n_vocab) + per_wg - 1) / per_wg;
  // Sampling: the merge keeps every list in shared memory (groups * k <= TS_SAMPLE_MAX_CAND); one
  // group count for every k > 1, so that one pipeline serves them all.
  const uint64_t cap = top_k <= 1 ? kWgSize : TS_SAMPLE_MAX_CAND / TS_SAMPLE_MAX_K;
  const uint32_t groups = uint32_t(std::clamp<uint64_t>(g, 1, cap));
  const uint32_t per_group = (n_vocab + groups - 1) / groups;
  return (n_vocab + per_group - 1) / per_group;  // every group gets >= 1 logit
}

uint64_t SampleOp::scratch_bytes(uint32_t n_vocab) {
  const uint32_t groups = std::max(groups_for(n_vocab, 1), groups_for(n_vocab, 2));
  return (uint64_t(TS_SAMPLE_PARTIALS) + 2ull * groups * TS_SAMPLE_MAX_K) * 4;
}

uint32_t SampleOp::effective_top_k(const SampleParams& p) {
  if (greedy(p)) return 1;  // the argmax alone (the kept set reported is then just that token)
  if (p.top_k <= 0 || uint32_t(p.top_k) > kMaxTopK) return kMaxTopK;
  return uint32_t(p.top_k);
}

bool SampleOp::exact(const SampleParams& p, uint32_t n_vocab) {
  if (greedy(p)) return true;
  const uint64_t k = p.top_k <= 0 ? n_vocab : std::min<uint64_t>(uint64_t(p.top_k), n_vocab);
  return k <= kMaxTopK;
}

SampleStats SampleOp::read_stats(std::span<const uint32_t> w) {
  if (w.size() < TS_SAMPLE_KEPT + TS_SAMPLE_MAX_K)
    runtime_error("sample statistics: ", w.size(), " words given, need ", TS_SAMPLE_KEPT + TS_SAMPLE_MAX_K);
  SampleStats s;
  s.token = w[TS_SAMPLE_STATS];
  s.candidates = w[TS_SAMPLE_STATS + 1];
  const uint32_t kept = std::min<uint32_t>(w[TS_SAMPLE_STATS + 2], TS_SAMPLE_MAX_K);
  s.kept.assign(w.begin() + TS_SAMPLE_KEPT, w.begin() + TS_SAMPLE_KEPT + kept);
  return s;
}

uint64_t SampleOp::bytes() const {
  const uint64_t k = effective_top_k(params);
  return uint64_t(n_vocab) * 4 + 2ull * groups_for(n_vocab, k) * k * 8 + (TS_SAMPLE_KEPT + k) * 4 + 16;
}

void SampleOp::record(CommandRecorder& rec) const {
  Context& ctx = rec.context();
  const bool argmax = effective_top_k(params) == 1;
  const std::string what = label.empty() ? (argmax ? "argmax" : "sample") : label;
  if (n_vocab == 0) runtime_error(what, ": empty vocabulary");
  auto need = [&](const BufferSlice& s, uint64_t bytes, const char* binding) {
    if (s.buffer == VK_NULL_HANDLE) runtime_error(what, ": binding '", binding, "' is not set");
    if (s.size < bytes) runtime_error(what, ": binding '", binding, "' has ", s.size, " bytes, needs ", bytes);
  };
  need(logits, uint64_t(n_vocab) * 4, "logits");
  need(scratch, scratch_bytes(n_vocab), "scratch");
  need(step, (uint64_t(std::max(token_word, pos_word)) + 1) * 4, "step");
  if (token_word == pos_word) runtime_error(what, ": token and position share step word ", token_word);
  const bool write_out = tokens_out.buffer != VK_NULL_HANDLE;
  if (write_out) {
    if (out_ring == 0) runtime_error(what, ": tokens_out is set but out_ring is 0");
    need(tokens_out, uint64_t(out_ring) * 4, "tokens_out");
  }
  const bool counts = counts_word != kNoWord, input_ring = input_word != kNoWord;
  if (counts != (rule_word != kNoWord)) runtime_error(what, ": counts_word and rule_word are set together");
  if (counts && !advance_pos) runtime_error(what, ": the next step's counts need advance_pos");
  if (counts) need(step, (uint64_t(std::max(counts_word + 6, rule_word + 12))) * 4, "step");
  if (input_ring && !write_out) runtime_error(what, ": forced inputs (input_word) need tokens_out's ring");
  if (input_ring) need(step, (uint64_t(input_word) + 1 + out_ring) * 4, "step");
  if (step_in.buffer != VK_NULL_HANDLE && step_in.size < step.size)
    runtime_error(what, ": step_in has ", step_in.size, " bytes, fewer than step's ", step.size);
  if (!(params.top_p == params.top_p) || !(params.min_p == params.min_p) || !(params.temperature == params.temperature))
    runtime_error(what, ": sampling parameters must not be NaN");

  const uint32_t k = effective_top_k(params);
  const uint32_t groups = groups_for(n_vocab, k);
  const uint32_t per_group = (n_vocab + groups - 1) / groups;
  PipelineDesc desc;
  desc.name = argmax ? "argmax" : "sample";
  desc.file = "sample.comp";
  desc.defines = {{"WG_SIZE", std::to_string(kWgSize)}, {"ELEMS", std::to_string((per_group + kWgSize - 1) / kWgSize)}};
  desc.num_buffers = 5;
  desc.push_bytes = sizeof(gpu::SampleArgs);
  const Pipeline& pipe = ctx.pipelines().get(desc);

  gpu::SampleArgs a{};
  a.n_vocab = n_vocab;
  a.per_group = per_group;
  a.n_groups = groups;
  a.top_k = k;
  a.top_p = params.top_p;
  a.min_p = params.min_p;
  a.temperature = greedy(params) ? 0.f : params.temperature;
  a.seed_lo = uint32_t(params.seed);
  a.seed_hi = uint32_t(params.seed >> 32);
  a.token_word = token_word;
  a.pos_word = pos_word;
  a.flags = (advance_pos ? TS_SAMPLE_ADVANCE_POS : 0u) | (write_out ? TS_SAMPLE_WRITE_OUT : 0u) |
            (counts ? TS_SAMPLE_ADVANCE_COUNTS : 0u) | (input_ring ? TS_SAMPLE_INPUT_RING : 0u);
  a.out_ring = write_out ? out_ring : 1;
  a.counts_word = counts ? counts_word : 0;
  a.rule_word = counts ? rule_word : 0;
  a.input_word = input_ring ? input_word : 0;
  const BufferSlice in = step_in.buffer != VK_NULL_HANDLE ? step_in : step;
  const BufferSlice bufs[5] = {logits, scratch, step, write_out ? tokens_out : step, in};
  rec.dispatch(pipe, std::span<const BufferSlice>(bufs, 5), a, a.n_groups, 1, 1, what, bytes());
}

}  // namespace tessera::vk
