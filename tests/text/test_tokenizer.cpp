// Byte-level BPE: merge order, special tokens, round trips, streaming decode, metadata errors.
#include <gtest/gtest.h>

#include <random>

#include "format/error.h"
#include "runtime/text/tokenizer.h"
#include "runtime/text/unicode.h"
#include "runtime/text/vocab_builder.h"

using namespace tessera;
using namespace tessera::text;

namespace {

// 256 byte tokens + a few merged ones; merges in the given rank order.
Metadata hand_made_vocab(const std::vector<std::string>& merges, const std::vector<std::string>& extra_tokens,
                         const std::vector<int32_t>& extra_types = {}) {
  std::vector<std::string> tokens(byte_symbols().begin(), byte_symbols().end());
  std::vector<int32_t> types(256, kTokenNormal);
  for (size_t i = 0; i < extra_tokens.size(); ++i) {
    tokens.push_back(extra_tokens[i]);
    types.push_back(i < extra_types.size() ? extra_types[i] : kTokenNormal);
  }
  Metadata md("hand-made.gguf");
  md.set_string("tokenizer.ggml.model", "gpt2");
  md.set_string("tokenizer.ggml.pre", "default");
  md.set_string_array("tokenizer.ggml.tokens", tokens);
  md.set_i32_array("tokenizer.ggml.token_type", types);
  md.set_string_array("tokenizer.ggml.merges", merges);
  return md;
}

const Tokenizer& synthetic(const std::string& flavor) {
  static const Tokenizer glm = [] {
    Metadata md("glm.gguf");
    write_vocab(build_synthetic_vocab("glm4", 154880), md);
    return Tokenizer::from_metadata(md);
  }();
  static const Tokenizer ds = [] {
    Metadata md("ds.gguf");
    write_vocab(build_synthetic_vocab("deepseek-llm", 102400), md);
    return Tokenizer::from_metadata(md);
  }();
  return flavor == "glm4" ? glm : ds;
}

std::vector<std::string> texts_of(const Tokenizer& t, const std::vector<int32_t>& ids) {
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(t.token_text(id));
  return out;
}

// Random valid UTF-8 from pools that stress the pre-tokenizers.
std::string random_text(std::mt19937& rng, size_t n_chars) {
  static const std::vector<std::vector<char32_t>> pools = {
      {U'a', U'b', U'e', U'z', U'A', U'Q', U'\'', U's'},               // ASCII letters, contractions
      {U'0', U'1', U'5', U'9', U'٣', U'²'},                            // digits incl. Arabic-Indic, superscript
      {U' ', U' ', U'\t', U'\n', U'\r', 0x3000, 0xA0},                 // whitespace runs
      {U'(', U')', U'{', U';', U'=', U'"', U'<', U'>', U'|', U'!'},     // code punctuation
      {0x4E16, 0x754C, 0x4F60, 0x597D, 0x3002, 0xFF0C, 0x30C6, 0xAC00},  // CJK, kana, Hangul
      {0x1F642, 0x1F44D, 0x1F3FD, 0x200D, 0x2764, 0xFE0F},             // emoji, ZWJ, modifiers
      {0x0301, 0x0308, 0x0327},                                        // combining marks
      {0x0414, 0x03A9, 0x05D0, 0x0627, 0x0E01, 0xFF21, 0x10400},       // other scripts
  };
  std::string s;
  for (size_t i = 0; i < n_chars; ++i) {
    const auto& pool = pools[rng() % pools.size()];
    utf8_append(s, pool[rng() % pool.size()]);
  }
  return s;
}

}  // namespace

TEST(Bpe, LowestRankMergesFirstThenLeftmost) {
  const Metadata md = hand_made_vocab({"b c", "a b", "a bc", "c d", "abc d", "x x"},
                                      {"bc", "ab", "abc", "cd", "abcd", "xx"});
  const Tokenizer t = Tokenizer::from_metadata(md);
  const auto enc = [&](std::string_view s) { return texts_of(t, t.encode(s, false, false)); };
  EXPECT_EQ(enc("abcd"), (std::vector<std::string>{"abcd"}));     // b c, a bc, abc d
  EXPECT_EQ(enc("bcd"), (std::vector<std::string>{"bc", "d"}));   // b c (rank 0) beats c d (rank 3)
  EXPECT_EQ(enc("abd"), (std::vector<std::string>{"ab", "d"}));
  EXPECT_EQ(enc("cdab"), (std::vector<std::string>{"cd", "ab"}));
  EXPECT_EQ(enc("xxx"), (std::vector<std::string>{"xx", "x"}));   // equal ranks: leftmost first
  EXPECT_EQ(enc("a b"), (std::vector<std::string>{"a", "\u0120", "b"}));  // " b" has no merge
  EXPECT_EQ(t.n_merges(), 6u);
}

TEST(Bpe, MergeWithoutTokenFallsBackToBytes) {
  // "q r" merges but "qr" is not a token: the symbol is emitted as its bytes.
  const Tokenizer t = Tokenizer::from_metadata(hand_made_vocab({"q r"}, {}));
  EXPECT_EQ(texts_of(t, t.encode("qr", false, false)), (std::vector<std::string>{"q", "r"}));
}

TEST(Tokenizer, SpecialTokensParsedOnlyWhenAsked) {
  const Tokenizer& t = synthetic("glm4");
  const int32_t gmask = 154822, sop = 154824, user = 154827, assistant = 154828, think = *t.find_token("<think>");
  const std::vector<int32_t> ids = t.encode("[gMASK]<sop><|user|>Hi<|assistant|><think>", true, false);
  ASSERT_GE(ids.size(), 6u);
  EXPECT_EQ(ids[0], gmask);
  EXPECT_EQ(ids[1], sop);
  EXPECT_EQ(ids[2], user);
  EXPECT_EQ(ids[ids.size() - 2], assistant);
  EXPECT_EQ(ids.back(), think);
  EXPECT_EQ(t.decode(ids, true), "[gMASK]<sop><|user|>Hi<|assistant|><think>");
  EXPECT_EQ(t.decode(ids, false), "Hi<think>");  // control tokens hidden, user-defined shown

  // Without parse_special, control literals are plain text; user-defined ones still match.
  const std::vector<int32_t> plain = t.encode("<|user|>x<think>", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), user), 0);
  EXPECT_EQ(plain.back(), think);
  EXPECT_EQ(t.decode(plain, false), "<|user|>x<think>");
}

TEST(Tokenizer, LongestSpecialWins) {
  // "<a>" and "<a><b>" both special: the longer literal is cut out first.
  const Metadata md = hand_made_vocab({}, {"<a>", "<a><b>"}, {kTokenControl, kTokenControl});
  const Tokenizer t = Tokenizer::from_metadata(md);
  EXPECT_EQ(t.encode("<a><b><a>", true, false), (std::vector<int32_t>{257, 256}));
}

TEST(Tokenizer, BosAddedOnlyWhenFlagged) {
  const Tokenizer& ds = synthetic("deepseek-llm");
  EXPECT_TRUE(ds.add_bos());
  EXPECT_EQ(ds.encode("hi", false, true).front(), 100000);
  EXPECT_NE(ds.encode("hi", false, false).front(), 100000);
  const Tokenizer& glm = synthetic("glm4");
  EXPECT_FALSE(glm.add_bos());
  EXPECT_EQ(glm.encode("hi", false, true), glm.encode("hi", false, false));
}

TEST(Tokenizer, RoundTripsRandomUtf8) {
  std::mt19937 rng(1234);
  for (const char* flavor : {"glm4", "deepseek-llm"}) {
    const Tokenizer& t = synthetic(flavor);
    for (int iter = 0; iter < 300; ++iter) {
      const std::string s = random_text(rng, 1 + rng() % 60);
      const std::vector<int32_t> ids = t.encode(s, false, false);
      ASSERT_EQ(t.decode(ids, false), s) << flavor << " iteration " << iter;
      ASSERT_EQ(t.decode(t.encode(s, true, false), true), s) << flavor << " iteration " << iter;
    }
  }
}

TEST(Tokenizer, RoundTripsCodeAndInvalidBytes) {
  const Tokenizer& t = synthetic("glm4");
  const std::string code = "int main() {\n    return count_words(\"the cat\") == 2 ? 0 : 1;\n}\n\n\n";
  EXPECT_EQ(t.decode(t.encode(code, false, false), false), code);
  EXPECT_LT(t.encode(code, false, false).size(), code.size());  // merges learned from the sample apply
  const std::string raw("\xFF\xFE\x00z\xC3", 5);
  EXPECT_EQ(t.decode(t.encode(raw, false, false), false), raw);
}

TEST(TokenDecoder, HoldsPartialUtf8) {
  const Tokenizer& t = synthetic("glm4");
  const std::string text = "界🙂é";
  const std::vector<int32_t> ids = t.encode(text, false, false);
  TokenDecoder dec(t);
  std::string out;
  int empty_pushes = 0;
  for (int32_t id : ids) {
    const std::string chunk = dec.push(id, false);
    size_t pos = 0;
    while (pos < chunk.size()) ASSERT_TRUE(utf8_decode(chunk, pos)) << "chunk is not valid UTF-8";
    empty_pushes += chunk.empty();
    out += chunk;
  }
  out += dec.flush();
  EXPECT_EQ(out, text);
  EXPECT_GT(empty_pushes, 0);  // the emoji is split over byte tokens

  // A sequence cut short comes out as U+FFFD on flush.
  TokenDecoder cut(t);
  EXPECT_EQ(cut.push(*t.find_token(byte_symbols()[0xF0]), false), "");
  EXPECT_EQ(cut.flush(), "\uFFFD");
}

TEST(Tokenizer, EndOfGeneration) {
  const Tokenizer& t = synthetic("glm4");
  EXPECT_TRUE(t.is_eog(154820));
  EXPECT_TRUE(t.is_eog(154827));
  EXPECT_TRUE(t.is_eog(154829));
  EXPECT_FALSE(t.is_eog(154828));
  EXPECT_EQ(t.eog_ids().size(), 3u);
  EXPECT_EQ(t.pre(), "glm4");
  EXPECT_THROW(t.token_text(154880), Error);
  EXPECT_THROW(t.token_text(-1), Error);
}

TEST(Tokenizer, MetadataErrorsNameTheProblem) {
  const auto message = [](const Metadata& md) -> std::string {
    try {
      Tokenizer::from_metadata(md);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::BadInput);
      return e.what();
    }
    return "no error";
  };
  Metadata md = hand_made_vocab({}, {});
  md.set_string("tokenizer.ggml.model", "llama");
  EXPECT_NE(message(md).find("\"llama\""), std::string::npos) << message(md);

  md = hand_made_vocab({}, {});
  md.set_string("tokenizer.ggml.pre", "falcon");
  EXPECT_NE(message(md).find("falcon"), std::string::npos);

  md = hand_made_vocab({}, {});
  md.set_i32_array("tokenizer.ggml.token_type", {1, 1, 1});
  EXPECT_NE(message(md).find("token_type"), std::string::npos);

  md = hand_made_vocab({"nospace"}, {});
  EXPECT_NE(message(md).find("merges[0]"), std::string::npos);

  md = hand_made_vocab({}, {});
  md.set_string_array("tokenizer.ggml.tokens", {"a", "b"});
  md.erase("tokenizer.ggml.token_type");
  EXPECT_NE(message(md).find("byte"), std::string::npos);

  md = hand_made_vocab({}, {});
  md.set_u32("tokenizer.ggml.eos_token_id", 999999);
  const Tokenizer t = Tokenizer::from_metadata(md);
  EXPECT_FALSE(t.eos().has_value());
  ASSERT_EQ(t.warnings().size(), 1u);
}
