// `tessera inspect` end to end (runs the built binary) and the JSON emitter it uses.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "format/gguf.h"
#include "format/json.h"
#include "gguf_fixture.h"

namespace tessera::test {
namespace {

// ---- a minimal strict JSON parser (test-only) to check the output is well-formed ------------

struct Json {
  std::variant<std::nullptr_t, bool, double, std::string, std::vector<Json>, std::map<std::string, Json>> v;
  const Json& operator[](const std::string& k) const { return std::get<std::map<std::string, Json>>(v).at(k); }
  const Json& operator[](size_t i) const { return std::get<std::vector<Json>>(v).at(i); }
  double num() const { return std::get<double>(v); }
  const std::string& str() const { return std::get<std::string>(v); }
  size_t size() const {
    if (auto* a = std::get_if<std::vector<Json>>(&v)) return a->size();
    return std::get<std::map<std::string, Json>>(v).size();
  }
  bool has(const std::string& k) const { return std::get<std::map<std::string, Json>>(v).count(k) != 0; }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}
  Json parse_document() {
    Json j = value();
    ws();
    if (p_ != s_.size()) fail("trailing characters");
    return j;
  }

 private:
  [[noreturn]] void fail(const std::string& why) {
    throw std::runtime_error("JSON error at " + std::to_string(p_) + ": " + why);
  }
  void ws() {
    while (p_ < s_.size() && (s_[p_] == ' ' || s_[p_] == '\n' || s_[p_] == '\t' || s_[p_] == '\r')) ++p_;
  }
  bool eat(char c) {
    ws();
    if (p_ < s_.size() && s_[p_] == c) return ++p_, true;
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  Json value() {
    ws();
    if (p_ >= s_.size()) fail("unexpected end");
    const char c = s_[p_];
    if (c == '{') {
      ++p_;
      std::map<std::string, Json> m;
      if (!eat('}')) {
        do {
          ws();
          std::string k = string();
          expect(':');
          if (!m.emplace(k, value()).second) fail("duplicate key " + k);
        } while (eat(','));
        expect('}');
      }
      return Json{std::move(m)};
    }
    if (c == '[') {
      ++p_;
      std::vector<Json> a;
      if (!eat(']')) {
        do a.push_back(value());
        while (eat(','));
        expect(']');
      }
      return Json{std::move(a)};
    }
    if (c == '"') return Json{string()};
    for (const char* lit : {"true", "false", "null"})
      if (s_.compare(p_, std::strlen(lit), lit) == 0) {
        p_ += std::strlen(lit);
        if (lit[0] == 'n') return Json{nullptr};
        return Json{lit[0] == 't'};
      }
    size_t used = 0;
    if (c != '-' && (c < '0' || c > '9')) fail("bad value");
    const double d = std::stod(s_.substr(p_, 40), &used);
    p_ += used;
    return Json{d};
  }
  std::string string() {
    if (p_ >= s_.size() || s_[p_] != '"') fail("expected string");
    ++p_;
    std::string out;
    while (true) {
      if (p_ >= s_.size()) fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[p_++]);
      if (c == '"') return out;
      if (c < 0x20) fail("raw control character in string");
      if (c != '\\') {
        out += char(c);
        continue;
      }
      const char e = s_[p_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': out += "\\u" + s_.substr(p_, 4), p_ += 4; break;
        default: fail("bad escape");
      }
    }
  }
  const std::string& s_;
  size_t p_ = 0;
};

Json parse_json(const std::string& s) { return JsonParser(s).parse_document(); }

// Runs the tessera binary; returns the exit code and captures stdout (stderr to `err_file`).
int run_tessera(const std::string& args, std::string& out, const std::string& err_file) {
  const std::string cmd = std::string(TESSERA_BINARY) + " " + args + " 2>" + err_file;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return -1;
  out.clear();
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_sample(const std::string& path) {
  GgufWriter w;
  w.metadata().set_string("general.architecture", "deepseek2");
  w.metadata().set_u32("deepseek2.block_count", 2);
  w.metadata().set_f32("deepseek2.rope.freq_base", 10000.f);
  w.metadata().set_string_array("tokenizer.ggml.tokens", {"<s>", "a\"b", "\xe4\xbd\xa0", "x", "y", "z", "w", "v", "u", "t"});
  w.metadata().set_i32_array("t.ints", {-1, 2});
  w.metadata().set_bool("t.flag", true);
  w.add_tensor("token_embd.weight", GgmlType::Q4_0, {64, 3});
  w.add_tensor("output_norm.weight", GgmlType::F32, {64});
  w.add_tensor("blk.0.ffn_down_exps.weight", GgmlType::Q4_K, {256, 2, 4});
  w.begin(path);
  for (size_t k = 0; k < w.tensors().size(); ++k) {
    const std::vector<uint8_t> zeros(w.tensors()[k].nbytes, 0);
    w.write_tensor(k, zeros.data(), zeros.size());
  }
  w.finish();
}

TEST(Inspect, JsonOutputParsesWithExpectedFields) {
  TempDir dir;
  const std::string path = dir.file("m.gguf");
  write_sample(path);
  std::string out;
  ASSERT_EQ(run_tessera("inspect --json " + path, out, dir.file("err")), 0) << read_text(dir.file("err"));
  const Json j = parse_json(out);
  EXPECT_EQ(j["kind"].str(), "gguf");
  EXPECT_EQ(j["version"].num(), 3);
  EXPECT_EQ(j["alignment"].num(), 32);
  EXPECT_EQ(j["tensor_count"].num(), 3);
  EXPECT_EQ(j["kv_count"].num(), 6);
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(j["file_size"].num(), double(f.file_size()));
  EXPECT_EQ(j["data_offset"].num(), double(f.data_offset()));

  const Json& meta = j["metadata"];
  EXPECT_EQ(meta["general.architecture"]["type"].str(), "string");
  EXPECT_EQ(meta["general.architecture"]["value"].str(), "deepseek2");
  EXPECT_EQ(meta["deepseek2.block_count"]["value"].num(), 2);
  EXPECT_EQ(meta["deepseek2.rope.freq_base"]["value"].num(), 10000);
  EXPECT_EQ(std::get<bool>(meta["t.flag"]["value"].v), true);
  const Json& tokens = meta["tokenizer.ggml.tokens"];
  EXPECT_EQ(tokens["type"].str(), "array");
  EXPECT_EQ(tokens["element_type"].str(), "string");
  EXPECT_EQ(tokens["length"].num(), 10);
  EXPECT_EQ(tokens["items"].size(), 8u);  // default --max-items
  EXPECT_EQ(tokens["items"][1].str(), "a\"b");
  EXPECT_EQ(tokens["items"][2].str(), "\xe4\xbd\xa0");
  EXPECT_EQ(std::get<bool>(tokens["truncated"].v), true);
  EXPECT_EQ(meta["t.ints"]["items"][0].num(), -1);

  const Json& ts = j["tensors"];
  ASSERT_EQ(ts.size(), 3u);
  EXPECT_EQ(ts[2]["name"].str(), "blk.0.ffn_down_exps.weight");
  EXPECT_EQ(ts[2]["type"].str(), "q4_K");
  ASSERT_EQ(ts[2]["shape"].size(), 3u);
  EXPECT_EQ(ts[2]["shape"][0].num(), 256);
  EXPECT_EQ(ts[2]["shape"][2].num(), 4);
  EXPECT_EQ(ts[2]["bytes"].num(), 8 * 144);
  EXPECT_EQ(ts[2]["elements"].num(), 2048);
  EXPECT_EQ(ts[1]["offset"].num(), 128);  // 108 bytes of q4_0 padded to 32
  EXPECT_EQ(ts[1]["file_offset"].num(), double(f.data_offset() + 128));
  EXPECT_EQ(j["totals"]["parameters"].num(), 192 + 64 + 2048);
  EXPECT_EQ(j["totals"]["tensor_bytes"].num(), 108 + 256 + 1152);
  EXPECT_EQ(j["totals"]["by_type"].size(), 3u);

  ASSERT_EQ(run_tessera("inspect --json --max-items 0 " + path, out, dir.file("err")), 0);
  EXPECT_EQ(parse_json(out)["metadata"]["tokenizer.ggml.tokens"]["items"].size(), 10u);
}

TEST(Inspect, TextOutputListsEverything) {
  TempDir dir;
  const std::string path = dir.file("m.gguf");
  write_sample(path);
  std::string out;
  ASSERT_EQ(run_tessera("inspect " + path, out, dir.file("err")), 0) << read_text(dir.file("err"));
  for (const char* s : {"GGUF file:", "version        3", "general.architecture", "\"deepseek2\"",
                        "array<string>[10]", "... 2 more", "token_embd.weight", "{256, 2, 4}", "q4_K",
                        "Totals: 3 tensors, 2304 parameters"})
    EXPECT_NE(out.find(s), std::string::npos) << "missing \"" << s << "\" in:\n" << out;
}

TEST(Inspect, MalformedAndForeignFilesExitWithCode2) {
  TempDir dir;
  const std::string path = dir.file("m.gguf");
  write_sample(path);
  std::string bytes = read_text(path);
  std::ofstream(dir.file("cut.gguf"), std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  std::ofstream(dir.file("elf.bin"), std::ios::binary) << std::string("\x7f" "ELF-and-more", 12);
  std::ofstream(dir.file("tiny.bin"), std::ios::binary) << "GG";
  std::string out;
  EXPECT_EQ(run_tessera("inspect " + dir.file("cut.gguf"), out, dir.file("err")), 2);
  EXPECT_NE(read_text(dir.file("err")).find("truncated"), std::string::npos) << read_text(dir.file("err"));
  EXPECT_EQ(run_tessera("inspect --json " + dir.file("elf.bin"), out, dir.file("err")), 2);
  EXPECT_NE(read_text(dir.file("err")).find("unknown file kind: magic \"\\x7fELF\""), std::string::npos)
      << read_text(dir.file("err"));
  EXPECT_EQ(run_tessera("inspect " + dir.file("tiny.bin"), out, dir.file("err")), 2);
  EXPECT_NE(run_tessera("inspect " + dir.file("missing.gguf"), out, dir.file("err")), 0);
  EXPECT_EQ(run_tessera("inspect", out, dir.file("err")), 1);  // usage: FILE is required
}

TEST(JsonWriter, EscapesAndNests) {
  std::string out;
  JsonWriter j(out);
  j.begin_object()
      .field("s", "q\"\\\n\t\x01")
      .field("bad_utf8", "a\xff" "b")
      .field("i", -5)
      .field("u", uint64_t(18446744073709551615ull))
      .field("d", 0.1)
      .field("b", false);
  j.key("nan").value(std::nan(""));
  j.key("f").value_f32(0.1f);
  j.key("arr").begin_array().value(1).begin_object().end_object().begin_array().end_array().end_array();
  j.end_object();
  EXPECT_EQ(out,
            "{\"s\":\"q\\\"\\\\\\n\\t\\u0001\",\"bad_utf8\":\"a\\ufffdb\",\"i\":-5,\"u\":18446744073709551615,"
            "\"d\":0.1,\"b\":false,\"nan\":null,\"f\":0.1,\"arr\":[1,{},[]]}");
  EXPECT_NO_THROW(parse_json(out));
  std::string pretty;
  JsonWriter p(pretty, 2);
  p.begin_object().field("a", 1).key("b").begin_array().value(2).end_array().end_object();
  EXPECT_EQ(pretty, "{\n  \"a\": 1,\n  \"b\": [\n    2\n  ]\n}");
}

}  // namespace
}  // namespace tessera::test
