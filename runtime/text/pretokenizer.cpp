#include "runtime/text/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdio>
#include <map>
#include <mutex>

#include "format/error.h"
#include "runtime/text/unicode.h"

namespace tessera::text {

struct PreTokenizer::Regex {
  std::string pattern;
  pcre2_code* code = nullptr;

  explicit Regex(std::string pat) : pattern(std::move(pat)) {
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                         &err, &err_offset, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      runtime_error("pre-tokenizer regex failed to compile at offset ", err_offset, ": ",
                    reinterpret_cast<const char*>(msg), " (pattern: ", pattern, ")");
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional: pcre2_match falls back to the interpreter
  }
  ~Regex() { pcre2_code_free(code); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
};

namespace {

// Letters of the cased scripts that DeepSeek-LLM's second regex groups into words (Latin, Greek,
// Cyrillic, Armenian, Georgian, Cherokee, Glagolitic, Coptic, fullwidth Latin, Deseret, Osage,
// Old Hungarian, Warang Citi, Adlam, ...), as inclusive code point ranges. Same set as llama.cpp's
// DEEPSEEK_LLM pre-tokenizer.
struct CodeRange {
  char32_t first, last;
};
constexpr CodeRange kDeepseekCasedLetters[] = {
    {0x41, 0x5A},       {0x61, 0x7A},       {0xB5, 0xB5},       {0xC0, 0xD6},       {0xD8, 0xF6},
    {0xF8, 0x1BA},      {0x1BC, 0x1BF},     {0x1C4, 0x293},     {0x295, 0x2AF},     {0x370, 0x373},
    {0x376, 0x377},     {0x37B, 0x37D},     {0x37F, 0x37F},     {0x386, 0x386},     {0x388, 0x38A},
    {0x38C, 0x38C},     {0x38E, 0x3A1},     {0x3A3, 0x3F5},     {0x3F7, 0x481},     {0x48A, 0x52F},
    {0x531, 0x556},     {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},   {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},   {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},
    {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},   {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},
    {0x1F5B, 0x1F5B},   {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},   {0x1FD6, 0x1FDB},
    {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},   {0x2102, 0x2102},   {0x2107, 0x2107},
    {0x210A, 0x2113},   {0x2115, 0x2115},   {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},
    {0x2128, 0x2128},   {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},   {0x2C7E, 0x2CE4},
    {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},   {0xA680, 0xA69B},   {0xA722, 0xA76F},
    {0xA771, 0xA787},   {0xA78B, 0xA78E},   {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},
    {0xFF21, 0xFF3A},   {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};

std::string char_class(std::initializer_list<CodeRange> ranges) {
  std::string s = "[";
  char buf[40];
  for (const CodeRange& r : ranges) {
    if (r.first == r.last)
      std::snprintf(buf, sizeof buf, "\\x{%X}", static_cast<unsigned>(r.first));
    else
      std::snprintf(buf, sizeof buf, "\\x{%X}-\\x{%X}", static_cast<unsigned>(r.first), static_cast<unsigned>(r.last));
    s += buf;
  }
  return s + "]";
}

std::string deepseek_letters_class() {
  std::string s = "[";
  char buf[40];
  for (const CodeRange& r : kDeepseekCasedLetters) {
    std::snprintf(buf, sizeof buf, "\\x{%X}-\\x{%X}", static_cast<unsigned>(r.first), static_cast<unsigned>(r.last));
    s += buf;
  }
  return s + "]";
}

// LLaMA-3 style split used by GLM-4 (tokenizer.md §3.1).
const char* const kGlm4Pattern =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// GPT-2's original split ("default" / "gpt2").
const char* const kGpt2Pattern = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

std::vector<std::string> patterns_for(std::string_view pre) {
  if (pre == "glm4" || pre == "chatglm-bpe") return {kGlm4Pattern};
  if (pre == "default" || pre == "gpt2") return {kGpt2Pattern};
  if (pre == "deepseek-v3")
    return {
        "\\p{N}{1,3}",
        char_class({{0x4E00, 0x9FA5}, {0x3040, 0x309F}, {0x30A0, 0x30FF}}) + "+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        "| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    };
  if (pre == "deepseek-llm")
    return {
        "[\\r\\n]",
        "\\s?" + deepseek_letters_class() + "+",
        // ASCII punctuation/symbols, their fullwidth forms, U+2018..U+201F quotes, U+3000..U+3002
        "\\s?" + char_class({{0x21, 0x2F}, {0x3A, 0x7E}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E}, {0x2018, 0x201F},
                             {0x3000, 0x3002}}) + "+",
        "\\s+\\z",
        // CJK unified ideographs, U+0800..U+4E00, Hangul syllables and the rest of that block
        char_class({{0x4E00, 0x9FA5}, {0x0800, 0x4E00}, {0xAC00, 0xD7FF}}) + "+",
        "\\p{N}+",
    };
  return {};
}

struct Span {
  size_t begin, size;
  bool splittable;  // false for single invalid-UTF-8 bytes
};

// Splits one valid-UTF-8 piece by `re`, appending matches and gaps to `out`.
void split_piece(const PreTokenizer::Regex& re, pcre2_match_data* md, std::string_view text, Span piece,
                 std::vector<Span>& out) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + piece.begin);
  size_t pos = 0, gap_start = 0;
  while (pos < piece.size) {
    int rc = pcre2_match(re.code, subject, piece.size, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(re.code, subject, piece.size, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      runtime_error("pre-tokenizer regex failed on a ", piece.size, "-byte piece: ",
                    reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t m_begin = ov[0], m_end = ov[1];
    if (m_end == m_begin) {  // empty match: not a piece; step over one code point
      pos = m_begin + 1;
      while (pos < piece.size && (static_cast<uint8_t>(subject[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (m_begin > gap_start) out.push_back({piece.begin + gap_start, m_begin - gap_start, true});
    out.push_back({piece.begin + m_begin, m_end - m_begin, true});
    pos = gap_start = m_end;
  }
  if (gap_start < piece.size) out.push_back({piece.begin + gap_start, piece.size - gap_start, true});
}

}  // namespace

std::vector<std::string> PreTokenizer::supported_names() {
  return {"glm4", "chatglm-bpe", "deepseek-v3", "deepseek-llm", "default", "gpt2"};
}

PreTokenizer PreTokenizer::for_name(std::string_view pre) {
  // Compiled regexes are shared by every tokenizer of the process.
  static std::mutex mutex;
  static std::map<std::string, std::vector<std::shared_ptr<const Regex>>, std::less<>> cache;

  const std::vector<std::string> patterns = patterns_for(pre);
  if (patterns.empty()) {
    std::string names;
    for (const std::string& n : supported_names()) names += (names.empty() ? "" : ", ") + n;
    bad_input("tokenizer.ggml.pre: unsupported pre-tokenizer \"", pre, "\" (supported: ", names, ")");
  }
  PreTokenizer p;
  p.name_ = std::string(pre);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(pre);
  if (it == cache.end()) {
    std::vector<std::shared_ptr<const Regex>> compiled;
    for (const std::string& pat : patterns) compiled.push_back(std::make_shared<const Regex>(pat));
    it = cache.emplace(std::string(pre), std::move(compiled)).first;
  }
  p.regexes_ = it->second;
  return p;
}

std::vector<std::string_view> PreTokenizer::split(std::string_view text) const {
  // Valid UTF-8 runs are splittable; every invalid byte is a piece of its own.
  std::vector<Span> spans;
  size_t pos = 0, run_start = 0;
  while (pos < text.size()) {
    const size_t before = pos;
    if (utf8_decode(text, pos)) continue;
    if (before > run_start) spans.push_back({run_start, before - run_start, true});
    spans.push_back({before, 1, false});
    pos = run_start = before + 1;
  }
  if (pos > run_start) spans.push_back({run_start, pos - run_start, true});

  std::vector<Span> next;
  for (const auto& re : regexes_) {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(re->code, nullptr);
    if (!md) runtime_error("pre-tokenizer: out of memory allocating PCRE2 match data");
    next.clear();
    try {
      for (const Span& s : spans) {
        if (s.splittable)
          split_piece(*re, md, text, s, next);
        else
          next.push_back(s);
      }
    } catch (...) {
      pcre2_match_data_free(md);
      throw;
    }
    pcre2_match_data_free(md);
    spans.swap(next);
  }

  std::vector<std::string_view> pieces;
  pieces.reserve(spans.size());
  for (const Span& s : spans) pieces.push_back(text.substr(s.begin, s.size));
  return pieces;
}

}  // namespace tessera::text
