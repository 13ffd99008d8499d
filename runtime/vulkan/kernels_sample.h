// Next-token choice on the GPU (docs/DECODE.md "Final"; shaders/sample.comp): argmax, or
// top-k / top-p / min-p / temperature sampling, in one dispatch, writing the token where the next
// decode step reads it, so the GPU feeds itself and the host only streams tokens.
//
// API:
//   vk::SampleOp sample;
//   sample.n_vocab = V;
//   sample.params  = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .seed = 42};
//   sample.logits  = logits;      // f32 [V] (the LM head's output)
//   sample.scratch = scratch;     // device buffer of SampleOp::scratch_bytes(V): zero it ONCE after
//                                 // allocation (rec.fill(scratch, 0) + barrier, or a host memset);
//                                 // the kernel leaves its arrival counter at 0 for the next call
//   sample.step    = step;        // uint32 words: step[token_word] <- token (the next step's input),
//   sample.token_word = 0;        //   position p = step[pos_word] seeds the draw;
//   sample.pos_word = 1;          //   advance_pos: step[pos_word] <- p + 1
//   sample.advance_pos = true;
//   sample.tokens_out = ring;     // optional host-visible uint32 [out_ring]: ring[p % out_ring] = token
//   sample.out_ring = 64;
//   sample.counts_word = 4;       // optional: the next step's attention counts (rule at rule_word)
//   sample.rule_word = 16;
//   sample.input_word = 128;      // optional: forced inputs while step[128] != 0
//   sample.record(rec);           // one dispatch, no barrier
//   ... after rec.wait(): SampleOp::read_stats(scratch words) for the token and the kept set.
//
// Semantics follow runtime/text/sampler.h without the penalties: top-k (ties: lower id) ->
// top-p -> min-p (both at temperature 1) -> softmax(logit / temperature) -> draw with
// u = hash(seed, p) in [0, 1). temperature <= 0 or top_k == 1 = greedy argmax (lowest id on ties).
// Differences from the host sampler: at most kMaxTopK candidates (top_k <= 0 or > kMaxTopK means
// kMaxTopK), float instead of double sums, and a counter-based RNG (same seed and position ->
// same token; a different draw sequence than std::mt19937_64). SampleOp::exact() says whether a
// parameter set keeps every token the host sampler would keep.
// Parameters are push constants: changing them means recording again (they are per session).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/vulkan/recorder.h"

namespace tessera::vk {

struct SampleParams {
  float temperature = 0.f;  // <= 0: greedy
  int32_t top_k = 40;       // <= 0 or > kMaxTopK: kMaxTopK
  float top_p = 1.f;        // >= 1: off
  float min_p = 0.f;        // <= 0: off
  uint64_t seed = 0;
};

// What the last call left in the scratch buffer (for tests and verbose output).
struct SampleStats {
  uint32_t token = 0;
  uint32_t candidates = 0;      // after top-k (min(k, n_vocab))
  std::vector<uint32_t> kept;   // survivors of top-p/min-p, most likely first
};

struct SampleOp {
  static constexpr uint32_t kMaxTopK = 128;  // = TS_SAMPLE_MAX_K

  uint32_t n_vocab = 0;
  SampleParams params;
  BufferSlice logits;      // f32 [n_vocab]
  BufferSlice scratch;     // scratch_bytes(n_vocab), zeroed once before the first call
  BufferSlice step;        // uint32 words
  BufferSlice step_in;     // optional: the words read (position, rule, forced inputs) from this copy
                           // of step (a device-local one; empty: step itself)
  uint32_t token_word = 0;
  uint32_t pos_word = 1;
  bool advance_pos = false;
  BufferSlice tokens_out;  // optional uint32 ring (empty buffer: not written)
  uint32_t out_ring = 0;
  // Optional (kNoWord: off): the next step's attention group counts into step[counts_word ..+6),
  // by the AttnDecodeRule the host keeps at step[rule_word ..+12) (needs advance_pos) ...
  static constexpr uint32_t kNoWord = 0xFFFFFFFFu;
  uint32_t counts_word = kNoWord, rule_word = kNoWord;
  // ... and forced inputs: while step[input_word] != 0 the next step's input is
  // step[input_word + 1 + (p + 1) % out_ring], not the sample (needs tokens_out's out_ring).
  uint32_t input_word = kNoWord;
  std::string label;       // empty = "sample" / "argmax"

  // Workgroups of phase 1 for a vocabulary and k, and the scratch bytes any k needs.
  static uint32_t groups_for(uint32_t n_vocab, uint32_t top_k);
  static uint64_t scratch_bytes(uint32_t n_vocab);
  // The k the kernel uses for these parameters (1 when greedy: the kept set is then the argmax).
  static uint32_t effective_top_k(const SampleParams& p);
  // True when the GPU's choice follows the host sampler's candidate set exactly (greedy, or
  // sampling whose top-k needs no clamp to kMaxTopK).
  static bool exact(const SampleParams& p, uint32_t n_vocab);
  // Decodes the statistics from the scratch buffer's first words (at least 8 + kMaxTopK).
  static SampleStats read_stats(std::span<const uint32_t> scratch_words);

  uint64_t bytes() const;  // logits read k times (from cache after the first), partials, outputs
  // Records one dispatch (no barrier). Throws Error(Runtime) naming the label and the problem.
  void record(CommandRecorder& rec) const;
};

}  // namespace tessera::vk
