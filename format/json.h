// A small streaming JSON emitter (no parser): objects, arrays, escaped strings, numbers.
// Usage: JsonWriter j(out); j.begin_object().field("n", 3).key("xs").begin_array()...;
// Commas and colons are placed automatically; strings are escaped and invalid UTF-8 is replaced
// by U+FFFD so the output is always valid JSON. NaN and infinities are written as null.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace tessera {

// `s` as a quoted JSON string literal.
std::string json_quote(std::string_view s);

class JsonWriter {
 public:
  // Appends to `out`. With indent > 0 every member/element goes on its own line.
  explicit JsonWriter(std::string& out, int indent = 0) : out_(out), indent_(indent) {}

  JsonWriter& begin_object() { return open('{'); }
  JsonWriter& end_object() { return close('}'); }
  JsonWriter& begin_array() { return open('['); }
  JsonWriter& end_array() { return close(']'); }
  // The key of the next object member.
  JsonWriter& key(std::string_view k);

  JsonWriter& value(std::string_view s);
  JsonWriter& value(const char* s) { return value(std::string_view(s)); }
  JsonWriter& value(const std::string& s) { return value(std::string_view(s)); }
  JsonWriter& value(bool b);
  JsonWriter& value(double d);     // shortest form that round-trips the double; null for NaN/inf
  JsonWriter& value_f32(float f);  // shortest form that round-trips the float; null for NaN/inf
  JsonWriter& null();
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  JsonWriter& value(T v) {
    if constexpr (std::is_signed_v<T>) return raw(std::to_string(static_cast<long long>(v)));
    else return raw(std::to_string(static_cast<unsigned long long>(v)));
  }
  template <class T>
  JsonWriter& field(std::string_view k, const T& v) {
    key(k);
    return value(v);
  }

 private:
  JsonWriter& open(char c);
  JsonWriter& close(char c);
  JsonWriter& raw(std::string_view text);  // a complete scalar token
  void before_value();
  void newline();

  std::string& out_;
  int indent_;
  std::vector<bool> first_;  // per open container: no member written yet
  bool after_key_ = false;
};

}  // namespace tessera
