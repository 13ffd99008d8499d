// UTF-8 helpers and the byte-level BPE alphabet (tokenizer.md §2).
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tessera::text {

// Length in bytes of the UTF-8 sequence whose first byte is `lead` (1..4), or 0 when `lead` cannot
// start a sequence (a continuation byte or 0xF8..0xFF).
int utf8_sequence_length(uint8_t lead);

// Decodes one strict UTF-8 sequence at text[pos] (no overlongs, no surrogates, <= U+10FFFF).
// On success returns the code point and advances `pos`; on failure returns nullopt and leaves
// `pos` unchanged. Never reads past text.size().
std::optional<char32_t> utf8_decode(std::string_view text, size_t& pos);

// Appends the UTF-8 encoding of `cp` (must be a valid scalar value) to `out`.
void utf8_append(std::string& out, char32_t cp);

// Number of bytes at the end of `text` that form the start of a valid UTF-8 sequence still
// missing bytes (0..3): a streaming decoder holds these back until the sequence completes.
size_t utf8_incomplete_tail(std::string_view text);

// Returns `text` with every byte that is not part of a valid UTF-8 sequence replaced by U+FFFD.
std::string utf8_sanitize(std::string_view text);

// The byte-level alphabet: U(b) for each byte b, as UTF-8 text (e.g. 0x20 -> "Ġ").
const std::array<std::string, 256>& byte_symbols();

// Inverse of U: the byte a code point stands for, or nullopt if it is not in the alphabet.
std::optional<uint8_t> symbol_to_byte(char32_t cp);

// Maps raw bytes to byte-level alphabet text ("a b" -> "aĠb").
std::string bytes_to_symbols(std::string_view bytes);

// Maps byte-level alphabet text back to raw bytes. Code points outside the alphabet are copied
// through as their own UTF-8; invalid UTF-8 bytes are copied through unchanged.
std::string symbols_to_bytes(std::string_view symbols);

}  // namespace tessera::text
