// JSON emitter (see json.h).
#include "format/json.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace tessera {

namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 if it is not valid (overlong forms,
// surrogates and code points above U+10FFFF are invalid).
size_t utf8_sequence(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t len;
  uint32_t cp;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1F;
  else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0F;
  else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07;
  else return 0;
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
    return 0;
  return len;
}

}  // namespace

std::string json_quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t len = utf8_sequence(s, i);
      if (len == 0) {
        out += "\\ufffd";
        ++i;
      } else {
        out.append(s.substr(i, len));
        i += len;
      }
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);
        }
    }
    ++i;
  }
  out += '"';
  return out;
}

void JsonWriter::newline() {
  if (indent_ <= 0) return;
  out_ += '\n';
  out_.append(first_.size() * size_t(indent_), ' ');
}

void JsonWriter::before_value() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) out_ += ',';
    first_.back() = false;
    newline();
  }
}

JsonWriter& JsonWriter::key(std::string_view k) {
  before_value();
  out_ += json_quote(k);
  out_ += indent_ > 0 ? ": " : ":";
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::open(char c) {
  before_value();
  out_ += c;
  first_.push_back(true);
  return *this;
}

JsonWriter& JsonWriter::close(char c) {
  const bool empty = first_.empty() || first_.back();
  if (!first_.empty()) first_.pop_back();
  if (!empty) newline();
  out_ += c;
  return *this;
}

JsonWriter& JsonWriter::raw(std::string_view text) {
  before_value();
  out_.append(text);
  return *this;
}

JsonWriter& JsonWriter::value(std::string_view s) { return raw(json_quote(s)); }
JsonWriter& JsonWriter::value(bool b) { return raw(b ? "true" : "false"); }
JsonWriter& JsonWriter::null() { return raw("null"); }

JsonWriter& JsonWriter::value(double d) {
  if (!std::isfinite(d)) return null();
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d);
  return raw(std::string_view(buf, size_t(r.ptr - buf)));
}

JsonWriter& JsonWriter::value_f32(float f) {
  if (!std::isfinite(f)) return null();
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, f);
  return raw(std::string_view(buf, size_t(r.ptr - buf)));
}

}  // namespace tessera
