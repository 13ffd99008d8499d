// Byte-level BPE tokenizer from GGUF `tokenizer.ggml.*` metadata (tokenizer.md §1-§5), and a
// streaming decoder for generated tokens.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "format/gguf.h"
#include "runtime/text/pretokenizer.h"

namespace tessera::text {

class Tokenizer {
 public:
  // Builds the tokenizer from metadata. Requires tokenizer.ggml.model == "gpt2", a known
  // tokenizer.ggml.pre (missing -> "default"), a non-empty tokens array holding all 256
  // byte-level symbols, token_type (if present) of the same length, and merges of the form
  // "left right". Special ids >= n_vocab are ignored and noted in warnings(). Throws
  // Error(BadInput) naming the metadata origin and the key otherwise.
  static Tokenizer from_metadata(const Metadata& md);

  // Text -> token ids. parse_special: CONTROL/UNKNOWN token literals in `text` become their ids
  // (USER_DEFINED literals always do). add_bos: prepend BOS when the vocab has one and its
  // add_bos_token flag is set. Accepts any bytes (invalid UTF-8 is encoded byte by byte).
  std::vector<int32_t> encode(std::string_view text, bool parse_special, bool add_bos) const;

  // Token ids -> bytes. Normal tokens decode through the byte alphabet; USER_DEFINED tokens give
  // their text; CONTROL/UNKNOWN/UNUSED tokens give their text only when render_special.
  // Ids outside [0, n_vocab) throw Error(BadInput).
  std::string decode(std::span<const int32_t> ids, bool render_special) const;
  // The bytes one token decodes to (see decode).
  const std::string& token_piece(int32_t id, bool render_special) const;
  // The token's text as stored in the vocab (byte-level alphabet for normal tokens).
  const std::string& token_text(int32_t id) const;
  int32_t token_type(int32_t id) const;  // TokenType (vocab_builder.h)

  int32_t n_vocab() const { return static_cast<int32_t>(tokens_.size()); }
  size_t n_merges() const { return merge_rank_.size(); }
  std::optional<int32_t> bos() const { return bos_; }
  std::optional<int32_t> eos() const { return eos_; }
  std::optional<int32_t> eot() const { return eot_; }
  std::optional<int32_t> eom() const { return eom_; }
  std::optional<int32_t> unk() const { return unk_; }
  std::optional<int32_t> pad() const { return pad_; }
  bool add_bos() const { return add_bos_; }
  // End of generation: eos, eot or eom.
  bool is_eog(int32_t id) const;
  const std::vector<int32_t>& eog_ids() const { return eog_; }
  // The id of the token whose stored text is exactly `literal` (e.g. "<|user|>").
  std::optional<int32_t> find_token(std::string_view literal) const;
  const std::string& pre() const { return pretokenizer_.name(); }
  const std::vector<std::string>& warnings() const { return warnings_; }

  // BPE of one pre-tokenized piece (raw bytes) appended to `out`; exposed for tests.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

 private:
  Tokenizer() = default;
  void check_id(int32_t id) const;
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;

  PreTokenizer pretokenizer_;
  std::vector<std::string> tokens_;  // [n_vocab] stored text
  std::vector<int32_t> types_;       // [n_vocab]
  std::vector<std::string> pieces_;  // [n_vocab] decoded bytes (normal) or literal text
  std::unordered_map<std::string, int32_t> id_of_;       // stored text -> first id with it
  std::unordered_map<std::string, int32_t> merge_rank_;  // "left right" -> rank
  std::vector<int32_t> specials_;  // CONTROL/USER_DEFINED/UNKNOWN ids, longest text first
  std::optional<int32_t> bos_, eos_, eot_, eom_, unk_, pad_;
  bool add_bos_ = false;
  std::vector<int32_t> eog_;
  std::vector<std::string> warnings_;
};

// Streams decoded text token by token: bytes of a UTF-8 sequence split across tokens are held
// until the sequence completes, so every returned chunk is valid UTF-8. Bytes that can never
// form valid UTF-8 come out as U+FFFD.
class TokenDecoder {
 public:
  explicit TokenDecoder(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}
  // Text that became complete with token `id` (possibly empty).
  std::string push(int32_t id, bool render_special);
  // Everything still held (an unfinished sequence becomes U+FFFD); resets the decoder.
  std::string flush();

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;
};

}  // namespace tessera::text
