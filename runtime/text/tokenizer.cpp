#include "runtime/text/tokenizer.h"

#include <algorithm>
#include <queue>

#include "format/error.h"
#include "runtime/text/unicode.h"
#include "runtime/text/vocab_builder.h"

namespace tessera::text {

namespace {

bool is_special_type(int32_t type) {
  return type == kTokenControl || type == kTokenUserDefined || type == kTokenUnknown;
}
// Types whose text is only shown when special tokens are rendered.
bool is_hidden_type(int32_t type) {
  return type == kTokenControl || type == kTokenUnknown || type == kTokenUnused;
}
// Types whose stored text is in the byte-level alphabet.
bool is_byte_level_type(int32_t type) {
  return type == kTokenNormal || type == kTokenUndefined || type == kTokenByte;
}

const std::string kEmpty;

}  // namespace

Tokenizer Tokenizer::from_metadata(const Metadata& md) {
  const std::string& origin = md.origin();
  const std::optional<std::string> model = md.get_string("tokenizer.ggml.model");
  if (!model) bad_input(origin, ": tokenizer.ggml.model is missing (expected \"gpt2\", byte-level BPE)");
  if (*model != "gpt2")
    bad_input(origin, ": tokenizer.ggml.model is \"", *model,
              "\"; tessera supports only \"gpt2\" (byte-level BPE) tokenizers");

  Tokenizer t;
  t.pretokenizer_ = PreTokenizer::for_name(md.get_string("tokenizer.ggml.pre").value_or("default"));
  t.tokens_ = md.get_string_array("tokenizer.ggml.tokens");
  if (t.tokens_.empty()) bad_input(origin, ": tokenizer.ggml.tokens is missing or empty");
  if (t.tokens_.size() > static_cast<size_t>(INT32_MAX))
    bad_input(origin, ": tokenizer.ggml.tokens has ", t.tokens_.size(), " entries (at most 2^31-1 supported)");
  const size_t n = t.tokens_.size();

  const std::vector<int64_t> types = md.get_int_array("tokenizer.ggml.token_type");
  if (types.empty()) {
    t.types_.assign(n, kTokenNormal);
  } else if (types.size() != n) {
    bad_input(origin, ": tokenizer.ggml.token_type has ", types.size(), " entries, expected ", n,
              " (one per token)");
  } else {
    t.types_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      if (types[i] < 0 || types[i] > kTokenByte)
        bad_input(origin, ": tokenizer.ggml.token_type[", i, "] is ", types[i], ", expected 0..6");
      t.types_[i] = static_cast<int32_t>(types[i]);
    }
  }

  t.pieces_.resize(n);
  t.id_of_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& text = t.tokens_[i];
    t.pieces_[i] = is_byte_level_type(t.types_[i]) ? symbols_to_bytes(text) : text;
    if (!text.empty()) t.id_of_.emplace(text, static_cast<int32_t>(i));
    if (!text.empty() && is_special_type(t.types_[i])) t.specials_.push_back(static_cast<int32_t>(i));
  }
  std::stable_sort(t.specials_.begin(), t.specials_.end(),
                   [&](int32_t a, int32_t b) { return t.tokens_[a].size() > t.tokens_[b].size(); });
  const auto& symbols = byte_symbols();
  for (int b = 0; b < 256; ++b)
    if (!t.id_of_.count(symbols[b]))
      bad_input(origin, ": tokenizer.ggml.tokens has no token for byte 0x", "0123456789ABCDEF"[b >> 4],
                "0123456789ABCDEF"[b & 15], " (byte-level symbol \"", symbols[b],
                "\"); a byte-level BPE vocab needs all 256");

  const std::vector<std::string>& merges = md.get_string_array("tokenizer.ggml.merges");
  t.merge_rank_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& m = merges[i];
    const size_t sep = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    if (sep == std::string::npos || sep + 1 >= m.size())
      bad_input(origin, ": tokenizer.ggml.merges[", i, "] is \"", m, "\", expected \"left right\"");
    t.merge_rank_.emplace(m, static_cast<int32_t>(i));  // a repeated merge keeps its first rank
  }

  const auto special_id = [&](const char* key, std::optional<int32_t>& slot) {
    const std::optional<uint64_t> id = md.get_uint(key);
    if (!id) return;
    if (*id >= n) {
      t.warnings_.push_back(cat(origin, ": ", key, " = ", *id, " is not below the vocab size ", n, "; ignored"));
      return;
    }
    slot = static_cast<int32_t>(*id);
  };
  special_id("tokenizer.ggml.bos_token_id", t.bos_);
  special_id("tokenizer.ggml.eos_token_id", t.eos_);
  special_id("tokenizer.ggml.eot_token_id", t.eot_);
  special_id("tokenizer.ggml.eom_token_id", t.eom_);
  special_id("tokenizer.ggml.unknown_token_id", t.unk_);
  special_id("tokenizer.ggml.padding_token_id", t.pad_);
  t.add_bos_ = md.get_bool("tokenizer.ggml.add_bos_token").value_or(false);
  for (const std::optional<int32_t>& id : {t.eos_, t.eot_, t.eom_})
    if (id && std::find(t.eog_.begin(), t.eog_.end(), *id) == t.eog_.end()) t.eog_.push_back(*id);
  return t;
}

void Tokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= n_vocab()) bad_input("token id ", id, " is outside the vocab [0, ", n_vocab(), ")");
}

const std::string& Tokenizer::token_text(int32_t id) const {
  check_id(id);
  return tokens_[id];
}

int32_t Tokenizer::token_type(int32_t id) const {
  check_id(id);
  return types_[id];
}

const std::string& Tokenizer::token_piece(int32_t id, bool render_special) const {
  check_id(id);
  if (!render_special && is_hidden_type(types_[id])) return kEmpty;
  return pieces_[id];
}

bool Tokenizer::is_eog(int32_t id) const { return std::find(eog_.begin(), eog_.end(), id) != eog_.end(); }

std::optional<int32_t> Tokenizer::find_token(std::string_view literal) const {
  const auto it = id_of_.find(std::string(literal));
  if (it == id_of_.end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
  std::string out;
  for (int32_t id : ids) out += token_piece(id, render_special);
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special, bool add_bos) const {
  // Special-token partition: each special literal (longest first) is cut out of the raw
  // fragments that remain; what is left is plain text for pre-tokenization + BPE.
  struct Fragment {
    int32_t token;  // -1 = raw text
    size_t begin, size;
  };
  std::vector<Fragment> fragments{{-1, 0, text.size()}}, next;
  for (int32_t id : specials_) {
    if (!parse_special && types_[id] != kTokenUserDefined) continue;
    const std::string& literal = tokens_[id];
    next.clear();
    for (const Fragment& f : fragments) {
      if (f.token >= 0 || f.size < literal.size()) {
        next.push_back(f);
        continue;
      }
      const std::string_view raw = text.substr(f.begin, f.size);
      size_t pos = 0;
      for (size_t hit; (hit = raw.find(literal, pos)) != std::string_view::npos; pos = hit + literal.size()) {
        if (hit > pos) next.push_back({-1, f.begin + pos, hit - pos});
        next.push_back({id, f.begin + hit, literal.size()});
      }
      if (pos < raw.size()) next.push_back({-1, f.begin + pos, raw.size() - pos});
    }
    fragments.swap(next);
  }

  std::vector<int32_t> out;
  if (add_bos && add_bos_ && bos_) out.push_back(*bos_);
  for (const Fragment& f : fragments) {
    if (f.token >= 0)
      out.push_back(f.token);
    else if (f.size > 0)
      encode_plain(text.substr(f.begin, f.size), out);
  }
  return out;
}

void Tokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  for (std::string_view piece : pretokenizer_.split(text)) encode_piece(piece, out);
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  const std::string sym = bytes_to_symbols(piece);
  // Symbols: one per byte-level character, linked so merges can splice them.
  struct Symbol {
    int prev, next;
    size_t begin, size;  // bytes of `sym`; size 0 = merged away
  };
  std::vector<Symbol> symbols;
  for (size_t pos = 0; pos < sym.size();) {
    const size_t len = static_cast<size_t>(utf8_sequence_length(static_cast<uint8_t>(sym[pos])));
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({index - 1, index + 1, pos, len});
    pos += len;
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  // Candidate merges, lowest rank first, then leftmost. Entries can go stale when a neighbour
  // merges; they are checked when popped.
  struct Bigram {
    int32_t rank;
    int left, right;
    size_t size;
  };
  const auto later = [](const Bigram& a, const Bigram& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(later)> queue(later);
  std::string key;
  const auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[right];
    key.assign(sym, l.begin, l.size);
    key += ' ';
    key.append(sym, r.begin, r.size);
    const auto it = merge_rank_.find(key);
    if (it != merge_rank_.end()) queue.push({it->second, left, right, l.size + r.size});
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) try_add(static_cast<int>(i), static_cast<int>(i + 1));

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = symbols[b.left];
    Symbol& r = symbols[b.right];
    if (l.size == 0 || r.size == 0 || l.next != b.right || l.size + r.size != b.size) continue;  // stale
    l.size += r.size;
    l.next = r.next;
    if (r.next >= 0) symbols[r.next].prev = b.left;
    r.size = 0;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }

  for (int i = 0; i >= 0; i = symbols[i].next) {
    const std::string_view text = std::string_view(sym).substr(symbols[i].begin, symbols[i].size);
    if (const auto it = id_of_.find(std::string(text)); it != id_of_.end()) {
      out.push_back(it->second);
      continue;
    }
    // A merge produced a symbol the vocab lacks: fall back to its single byte symbols (all 256
    // are checked to exist at load).
    for (size_t pos = 0; pos < text.size();) {
      const size_t len = static_cast<size_t>(utf8_sequence_length(static_cast<uint8_t>(text[pos])));
      out.push_back(id_of_.at(std::string(text.substr(pos, len))));
      pos += len;
    }
  }
}

std::string TokenDecoder::push(int32_t id, bool render_special) {
  pending_ += tokenizer_->token_piece(id, render_special);
  const size_t tail = utf8_incomplete_tail(pending_);
  std::string out = utf8_sanitize(std::string_view(pending_).substr(0, pending_.size() - tail));
  pending_.erase(0, pending_.size() - tail);
  return out;
}

std::string TokenDecoder::flush() {
  std::string out = utf8_sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace tessera::text
