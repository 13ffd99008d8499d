// Text generation over any backend: prompt -> logits -> sample -> stream text, with timing.
// Backends (the CPU reference here, the Vulkan runtime later) implement LanguageModel.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/text/sampler.h"
#include "runtime/text/tokenizer.h"

namespace tessera {

// A model that turns tokens into next-token logits, keeping its own KV cache.
class LanguageModel {
 public:
  virtual ~LanguageModel();
  // Append `tokens` at positions n_past().. and return logits [n x n_vocab] for every token, or
  // [1 x n_vocab] for the last one when last_only. Throws Error(Usage) when the context is full.
  virtual std::vector<float> forward(std::span<const int32_t> tokens, bool last_only) = 0;
  virtual void reset() = 0;
  virtual int n_past() const = 0;
  virtual int n_ctx() const = 0;
  virtual uint32_t n_vocab() const = 0;
  // Models that choose the next token on the device (the GPU feeds itself): after forward(),
  // device_token() is the token chosen from the last position's logits, and device_step() runs
  // one step on it and returns the next choice. Default: the host samples from the logits.
  virtual bool samples_on_device() const { return false; }
  virtual int32_t device_token() const;
  virtual int32_t device_step();
  // Up to n device steps, each sampled token handed to on_token as it comes (false: stop); returns
  // the steps whose tokens were handed over. Default: device_step() n times; a model may queue
  // steps ahead (GpuModel::decode_steps) as long as n_past() counts only the handed-over ones.
  virtual int device_steps(int n, const std::function<bool(int32_t)>& on_token);
};

struct GenerateOptions {
  int n_predict = 128;             // tokens to generate at most (0: only run the prompt)
  bool render_special = true;      // print special tokens' text (EOG tokens end generation unprinted)
  std::string dump_logits_path;    // if set: little-endian f32 [n_prompt x n_vocab] of every prompt position
};

struct GenerateResult {
  std::vector<int32_t> generated;  // sampled ids, in order (an ending EOG id included)
  size_t n_prompt = 0;
  double prompt_seconds = 0;       // the prompt's forward pass (and the dump, if any)
  double generate_seconds = 0;     // sampling + forward of the generated tokens
  bool hit_eog = false;            // stopped at an end-of-generation token
  bool context_full = false;       // stopped because the context has no room left
};

// Runs `prompt` through `model` (from its current position), then samples up to n_predict tokens,
// passing each newly completed piece of text to `on_text` as it is generated (needs `tokenizer`
// when n_predict > 0). The sampler also accepts the prompt tokens (for its penalties).
// Throws Error(Usage) for an empty prompt or one that does not fit in the context,
// Error(Runtime) if the logits file cannot be written.
GenerateResult generate(LanguageModel& model, std::span<const int32_t> prompt, const text::Tokenizer* tokenizer,
                        text::Sampler& sampler, const GenerateOptions& options,
                        const std::function<void(std::string_view)>& on_text);

// Parses "12,7,99" (spaces allowed around ids) into token ids; Error(Usage) naming the bad item.
std::vector<int32_t> parse_token_list(std::string_view text);

}  // namespace tessera
