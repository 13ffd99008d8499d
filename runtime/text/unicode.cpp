#include "runtime/text/unicode.h"

namespace tessera::text {

int utf8_sequence_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xC2) return 0;  // continuation byte, or an overlong 2-byte lead (0xC0, 0xC1)
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF5) return 4;
  return 0;
}

std::optional<char32_t> utf8_decode(std::string_view text, size_t& pos) {
  if (pos >= text.size()) return std::nullopt;
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t lead = byte(pos);
  const int len = utf8_sequence_length(lead);
  if (len == 0 || pos + len > text.size()) return std::nullopt;
  if (len == 1) {
    ++pos;
    return lead;
  }
  char32_t cp = lead & (0x7F >> len);
  for (int k = 1; k < len; ++k) {
    const uint8_t c = byte(pos + k);
    if ((c & 0xC0) != 0x80) return std::nullopt;
    cp = (cp << 6) | (c & 0x3F);
  }
  static constexpr char32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMinForLength[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return std::nullopt;
  pos += len;
  return cp;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

namespace {

// Allowed range of the second byte of a sequence with this lead (RFC 3629 table).
bool valid_second_byte(uint8_t lead, uint8_t c) {
  switch (lead) {
    case 0xE0: return c >= 0xA0 && c <= 0xBF;  // no overlongs
    case 0xED: return c >= 0x80 && c <= 0x9F;  // no surrogates
    case 0xF0: return c >= 0x90 && c <= 0xBF;  // no overlongs
    case 0xF4: return c >= 0x80 && c <= 0x8F;  // <= U+10FFFF
    default: return c >= 0x80 && c <= 0xBF;
  }
}

}  // namespace

size_t utf8_incomplete_tail(std::string_view text) {
  // The lead byte of an unfinished sequence is at most 3 bytes from the end.
  const size_t n = text.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const uint8_t lead = static_cast<uint8_t>(text[n - back]);
    if ((lead & 0xC0) == 0x80) continue;  // continuation: keep looking for the lead
    const int len = utf8_sequence_length(lead);
    if (len <= static_cast<int>(back)) return 0;  // complete, or not a lead at all
    if (back >= 2 && !valid_second_byte(lead, static_cast<uint8_t>(text[n - back + 1]))) return 0;
    return back;  // later bytes were checked to be continuations by the loop above
  }
  return 0;
}

std::string utf8_sanitize(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    if (utf8_decode(text, pos)) {
      out.append(text.substr(start, pos - start));
    } else {
      utf8_append(out, 0xFFFD);
      ++pos;
    }
  }
  return out;
}

namespace {

// U(b) per tokenizer.md §2: printable Latin-1 bytes map to themselves, the other 68 bytes (in
// increasing order) to U+0100, U+0101, ...
struct ByteAlphabet {
  std::array<char32_t, 256> to_cp{};
  std::array<std::string, 256> to_text;
  ByteAlphabet() {
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cp[b] = printable ? static_cast<char32_t>(b) : next++;
      utf8_append(to_text[b], to_cp[b]);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

}  // namespace

const std::array<std::string, 256>& byte_symbols() { return alphabet().to_text; }

std::optional<uint8_t> symbol_to_byte(char32_t cp) {
  if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
    return static_cast<uint8_t>(cp);
  if (cp < 0x100 || cp > 0x143) return std::nullopt;
  // U+0100.. enumerate the non-printable bytes in increasing order.
  static const std::array<uint8_t, 68> kShifted = [] {
    std::array<uint8_t, 68> t{};
    const auto& a = alphabet();
    for (int b = 0; b < 256; ++b)
      if (a.to_cp[b] >= 0x100) t[a.to_cp[b] - 0x100] = static_cast<uint8_t>(b);
    return t;
  }();
  return kShifted[cp - 0x100];
}

std::string bytes_to_symbols(std::string_view bytes) {
  const auto& sym = byte_symbols();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += sym[static_cast<uint8_t>(c)];
  return out;
}

std::string symbols_to_bytes(std::string_view symbols) {
  std::string out;
  out.reserve(symbols.size());
  size_t pos = 0;
  while (pos < symbols.size()) {
    const size_t start = pos;
    const std::optional<char32_t> cp = utf8_decode(symbols, pos);
    if (!cp) {
      out += symbols[pos++];
      continue;
    }
    if (const std::optional<uint8_t> b = symbol_to_byte(*cp))
      out += static_cast<char>(*b);
    else
      out.append(symbols.substr(start, pos - start));
  }
  return out;
}

}  // namespace tessera::text
