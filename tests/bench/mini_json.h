// A small strict JSON reader for the bench tests: enough to check that `tessera bench -o json`
// is well-formed and has the fields its schema promises. Throws std::runtime_error on bad JSON.
#pragma once
#include <cctype>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::testjson {

struct Value {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<Value> arr;
  std::map<std::string, Value> obj;

  bool has(const std::string& k) const { return kind == Object && obj.count(k) > 0; }
  // The member `k` of an object; throws when absent.
  const Value& operator[](const std::string& k) const {
    if (!has(k)) throw std::runtime_error("JSON: no member '" + k + "'");
    return obj.at(k);
  }
};

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}
  Value parse_document() {
    Value v = value();
    ws();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("JSON: " + what + " at offset " + std::to_string(i_));
  }
  void ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool eat(char c) {
    ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  bool word(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }
  std::string string_lit() {
    expect('"');
    std::string o;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c == '\\') {
        if (i_ >= s_.size()) fail("unfinished escape");
        const char e = s_[i_++];
        if (e == 'u') {
          if (i_ + 4 > s_.size()) fail("short \\u escape");
          const unsigned long cp = std::strtoul(std::string(s_.substr(i_, 4)).c_str(), nullptr, 16);
          i_ += 4;
          o += cp < 0x80 ? char(cp) : '?';
          continue;
        }
        const std::string_view from = "\"\\/bfnrt", to = "\"\\/\b\f\n\r\t";
        const size_t k = from.find(e);
        if (k == std::string_view::npos) fail("bad escape");
        c = to[k];
      }
      o += c;
    }
    expect('"');
    return o;
  }
  Value value() {
    ws();
    if (i_ >= s_.size()) fail("unexpected end");
    Value v;
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      v.kind = Value::Object;
      if (eat('}')) return v;
      do {
        ws();
        std::string k = string_lit();
        expect(':');
        if (v.obj.count(k)) fail("duplicate key '" + k + "'");
        v.obj[k] = value();
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      ++i_;
      v.kind = Value::Array;
      if (eat(']')) return v;
      do v.arr.push_back(value());
      while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Value::String;
      v.str = string_lit();
    } else if (word("true") || word("false")) {
      v.kind = Value::Bool;
      v.b = s_[i_ - 1] == 'e' && s_.substr(i_ - 4, 4) == "true";
    } else if (word("null")) {
      v.kind = Value::Null;
    } else {
      const std::string rest(s_.substr(i_, 64));
      char* end = nullptr;
      v.num = std::strtod(rest.c_str(), &end);
      if (end == rest.c_str()) fail("expected a value");
      v.kind = Value::Number;
      i_ += size_t(end - rest.c_str());
    }
    return v;
  }

  std::string_view s_;
  size_t i_ = 0;
};

inline Value parse(std::string_view s) { return Parser(s).parse_document(); }

}  // namespace tessera::testjson
