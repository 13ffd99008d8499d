// UTF-8 helpers, the byte-level alphabet and the pre-tokenizer regex splits.
#include <gtest/gtest.h>

#include "format/error.h"
#include "runtime/text/pretokenizer.h"
#include "runtime/text/unicode.h"

using namespace tessera::text;

namespace {

std::vector<std::string> split(std::string_view pre, std::string_view text) {
  std::vector<std::string> out;
  for (std::string_view p : PreTokenizer::for_name(pre).split(text)) out.emplace_back(p);
  return out;
}

using Pieces = std::vector<std::string>;

}  // namespace

TEST(ByteAlphabet, MatchesSpecExamples) {
  const auto& sym = byte_symbols();
  EXPECT_EQ(sym[0x00], "\u0100");
  EXPECT_EQ(sym[0x0A], "\u010A");  // Ċ
  EXPECT_EQ(sym[0x20], "\u0120");  // Ġ
  EXPECT_EQ(sym[0x7F], "\u0121");
  EXPECT_EQ(sym[0x80], "\u0122");
  EXPECT_EQ(sym[0xA0], "\u0142");
  EXPECT_EQ(sym[0xAD], "\u0143");
  EXPECT_EQ(sym['a'], "a");
  EXPECT_EQ(sym[0xE9], "\u00E9");  // printable Latin-1 maps to itself
  for (int b = 0; b < 256; ++b) {
    size_t pos = 0;
    const auto cp = utf8_decode(sym[b], pos);
    ASSERT_TRUE(cp.has_value());
    EXPECT_EQ(symbol_to_byte(*cp), b) << "byte " << b;
  }
  EXPECT_FALSE(symbol_to_byte(0x144).has_value());
  EXPECT_FALSE(symbol_to_byte(0x20).has_value());
  EXPECT_EQ(bytes_to_symbols("a b\n"), "a\u0120b\u010A");
  EXPECT_EQ(symbols_to_bytes("a\u0120b\u010A"), "a b\n");
}

TEST(Utf8, DecodeRejectsMalformed) {
  for (std::string_view bad : {"\x80", "\xC0\xAF", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xF8",
                               "\xE4\xB8"}) {
    size_t pos = 0;
    EXPECT_FALSE(utf8_decode(bad, pos).has_value()) << testing::PrintToString(bad);
    EXPECT_EQ(pos, 0u);
  }
  size_t pos = 0;
  EXPECT_EQ(utf8_decode("\xF0\x9F\x99\x82", pos), char32_t{0x1F642});
  EXPECT_EQ(pos, 4u);
}

TEST(Utf8, IncompleteTail) {
  EXPECT_EQ(utf8_incomplete_tail("ab"), 0u);
  EXPECT_EQ(utf8_incomplete_tail("a\xE4"), 1u);
  EXPECT_EQ(utf8_incomplete_tail("a\xE4\xB8"), 2u);
  EXPECT_EQ(utf8_incomplete_tail("a\xE4\xB8\x96"), 0u);
  EXPECT_EQ(utf8_incomplete_tail("\xF0\x9F\x99"), 3u);
  EXPECT_EQ(utf8_incomplete_tail("\xED\xA0"), 0u);  // would be a surrogate: never completes
  EXPECT_EQ(utf8_incomplete_tail("\x80\x80"), 0u);
  EXPECT_EQ(utf8_sanitize("a\xFF" "b\xE4"), "a\uFFFDb\uFFFD");
}

TEST(PreTokenizer, Glm4SplitsLikeLlama3Pattern) {
  EXPECT_EQ(split("glm4", "Hello  world's 12345\n\n x"),
            (Pieces{"Hello", " ", " world", "'s", " ", "123", "45", "\n\n", " x"}));
  EXPECT_EQ(split("glm4", "I'LL don't"), (Pieces{"I", "'LL", " don", "'t"}));
  EXPECT_EQ(split("glm4", "x = foo(a, b);\n\treturn"),
            (Pieces{"x", " =", " foo", "(a", ",", " b", ");\n", "\treturn"}));
  EXPECT_EQ(split("glm4", "end   "), (Pieces{"end", "   "}));
  EXPECT_EQ(split("glm4", "你好，世界"), (Pieces{"你好", "，世界"}));
  EXPECT_EQ(split("chatglm-bpe", "a  b"), split("glm4", "a  b"));
}

TEST(PreTokenizer, Gpt2Default) {
  EXPECT_EQ(split("default", "Hello world's 123  x"), (Pieces{"Hello", " world", "'s", " 123", " ", " x"}));
  EXPECT_EQ(split("gpt2", "a!!b"), (Pieces{"a", "!!", "b"}));
}

TEST(PreTokenizer, DeepseekLlmCjkAndNumbers) {
  EXPECT_EQ(split("deepseek-llm", "Hello 世界123 数字4567!\n"),
            (Pieces{"Hello", " ", "世界", "123", " ", "数字", "4567", "!", "\n"}));
  // Cased-letter ranges: Greek and Cyrillic join words, a fullwidth "！" is punctuation.
  EXPECT_EQ(split("deepseek-llm", "αβγ Привет！"), (Pieces{"αβγ", " Привет", "！"}));
  // Trailing whitespace is its own piece; Hangul groups with CJK.
  EXPECT_EQ(split("deepseek-llm", "한국어 ok  "), (Pieces{"한국어", " ok", "  "}));
  EXPECT_EQ(split("deepseek-llm", "a\r\nb"), (Pieces{"a", "\r", "\n", "b"}));
}

TEST(PreTokenizer, DeepseekV3) {
  EXPECT_EQ(split("deepseek-v3", "abc 1234567 日本語テスト"),
            (Pieces{"abc", " ", "123", "456", "7", " ", "日本語テスト"}));
  EXPECT_EQ(split("deepseek-v3", "x.foo"), (Pieces{"x", ".foo"}));
}

TEST(PreTokenizer, PiecesAlwaysCoverInput) {
  const std::string text = "Mixed: naïve café — 東京 2024年\t\t\n\n  🙂👍🏽 e\u0301 ...\xFF\xFEraw";
  for (const std::string& pre : PreTokenizer::supported_names()) {
    std::string joined;
    for (const std::string& p : split(pre, text)) {
      EXPECT_FALSE(p.empty()) << pre;
      joined += p;
    }
    EXPECT_EQ(joined, text) << pre;
  }
  // Invalid bytes are pieces of their own.
  EXPECT_EQ(split("glm4", "a\xFF" "b"), (Pieces{"a", "\xFF", "b"}));
}

TEST(PreTokenizer, UnknownNameListsSupported) {
  try {
    PreTokenizer::for_name("qwen2");
    FAIL() << "expected an error";
  } catch (const tessera::Error& e) {
    EXPECT_EQ(e.kind(), tessera::ErrorKind::BadInput);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("qwen2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("glm4"), std::string::npos) << msg;
    EXPECT_NE(msg.find("deepseek-llm"), std::string::npos) << msg;
  }
}
