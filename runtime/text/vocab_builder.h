// Synthetic byte-level BPE vocabularies for `tessera synth` (spec: ../shared/spec/tokenizer.md).
//
// A synthetic vocab is shaped like the real one of its flavor: 256 byte tokens in the byte-level
// alphabet (tokenizer.md §2), then merged tokens learned by a small BPE trainer over an embedded
// English + Chinese + code sample (runtime/text/sample_text.cpp), then the flavor's special
// tokens at the real ids (for the real vocab size) and "[PADn]" UNUSED slots filling the rest.
// Everything is deterministic: the same (flavor, vocab_size) always yields the same arrays.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "format/gguf.h"

namespace tessera::text {

// tokenizer.ggml.token_type values (tokenizer.md §1).
enum TokenType : int32_t {
  kTokenUndefined = 0,
  kTokenNormal = 1,
  kTokenUnknown = 2,
  kTokenControl = 3,
  kTokenUserDefined = 4,
  kTokenUnused = 5,
  kTokenByte = 6,
};

// The tokenizer part of a GGUF's metadata, as plain arrays.
struct VocabArrays {
  std::vector<std::string> tokens;   // [n_vocab] token text (byte-level alphabet for normal ones)
  std::vector<int32_t> token_types;  // [n_vocab] TokenType per token
  std::vector<std::string> merges;   // [n_merges] "left right", rank = index
  std::string model = "gpt2", pre;   // tokenizer.ggml.model / tokenizer.ggml.pre
  std::string chat_template;         // Jinja text for tokenizer.chat_template
  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, pad = -1;  // -1 = key not written
  bool add_bos = false;
};

// Flavors accepted by build_synthetic_vocab.
std::vector<std::string> synthetic_vocab_flavors();  // {"glm4", "deepseek-llm"}

// Builds the synthetic vocab of `flavor` ("glm4" | "deepseek-llm") with exactly `vocab_size`
// tokens. glm4: the 60-slot special block starts at vocab_size-60 (154820 for 154880, the real
// GLM-4.7-Flash ids); deepseek-llm: 100000 for 102400, else vocab_size-16. The merges learned
// from the sample are computed once per process and cached, so a large vocab builds fast.
// Throws Error(Usage) for an unknown flavor or a vocab_size too small to hold the 256 byte
// tokens plus the special block.
VocabArrays build_synthetic_vocab(std::string_view flavor, uint32_t vocab_size);

// Writes every tokenizer.ggml.* key (model, pre, tokens, token_type, merges, the special ids that
// are >= 0, add_bos_token, add_eos_token = false) and tokenizer.chat_template into `md`.
void write_vocab(const VocabArrays& vocab, Metadata& md);

}  // namespace tessera::text
