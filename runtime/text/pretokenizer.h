// Pre-tokenization: splitting text into pieces before BPE (tokenizer.md §3), with PCRE2
// (UTF + UCP, JIT when available).
//
// A pre-tokenizer is a sequence of regexes. The first splits the whole text; each next one
// re-splits every current piece. Inside a piece, every match becomes a piece and every gap
// between matches is kept as a piece too, so the pieces always concatenate back to the input.
// Regexes see one piece at a time (lookarounds and `\z` stop at the piece's ends).
// Bytes that are not valid UTF-8 become one-byte pieces of their own and are never re-split.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::text {

class PreTokenizer {
 public:
  // The pre-tokenizer for a `tokenizer.ggml.pre` value: "glm4", "chatglm-bpe", "deepseek-v3",
  // "deepseek-llm", "default", "gpt2". Throws Error(BadInput) naming `pre` and listing the
  // supported names otherwise.
  static PreTokenizer for_name(std::string_view pre);
  static std::vector<std::string> supported_names();

  // Splits `text` into non-empty pieces (views into `text`) that concatenate to `text`.
  // Thread-safe (each call uses its own match data).
  std::vector<std::string_view> split(std::string_view text) const;

  const std::string& name() const { return name_; }

  struct Regex;  // a compiled PCRE2 pattern (pretokenizer.cpp)

 private:
  std::string name_;
  std::vector<std::shared_ptr<const Regex>> regexes_;
};

}  // namespace tessera::text
