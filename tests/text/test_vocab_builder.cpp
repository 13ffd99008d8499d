// Synthetic vocab: sizes, special ids, merge validity, determinism, metadata keys.
#include <gtest/gtest.h>

#include <chrono>
#include <unordered_set>

#include "format/error.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"
#include "runtime/text/vocab_builder.h"

using namespace tessera;
using namespace tessera::text;

namespace {

void expect_merges_valid(const VocabArrays& v) {
  const std::unordered_set<std::string> tokens(v.tokens.begin(), v.tokens.end());
  for (size_t i = 0; i < v.merges.size(); ++i) {
    const std::string& m = v.merges[i];
    const size_t sep = m.find(' ', 1);
    ASSERT_NE(sep, std::string::npos) << "merge " << i;
    const std::string left = m.substr(0, sep), right = m.substr(sep + 1);
    EXPECT_TRUE(tokens.count(left)) << "merge " << i << " left " << left;
    EXPECT_TRUE(tokens.count(right)) << "merge " << i << " right " << right;
    EXPECT_TRUE(tokens.count(left + right)) << "merge " << i << " result";
  }
}

}  // namespace

TEST(VocabBuilder, Glm4AtRealSizeHasRealSpecialIds) {
  const VocabArrays v = build_synthetic_vocab("glm4", 154880);
  ASSERT_EQ(v.tokens.size(), 154880u);
  ASSERT_EQ(v.token_types.size(), 154880u);
  const std::pair<int32_t, const char*> expected[] = {
      {154820, "<|endoftext|>"}, {154821, "[MASK]"},      {154822, "[gMASK]"},        {154823, "[sMASK]"},
      {154824, "<sop>"},         {154825, "<eop>"},       {154826, "<|system|>"},     {154827, "<|user|>"},
      {154828, "<|assistant|>"}, {154829, "<|observation|>"}, {154830, "<think>"},    {154831, "</think>"},
      {154832, "<tool_call>"},   {154839, "</tool_response>"},
  };
  for (const auto& [id, text] : expected) EXPECT_EQ(v.tokens[id], text) << id;
  EXPECT_EQ(v.token_types[154822], kTokenControl);
  EXPECT_EQ(v.token_types[154830], kTokenUserDefined);
  EXPECT_EQ(v.token_types[154840], kTokenUnused);
  EXPECT_EQ(v.tokens[154840], "[PAD154840]");
  EXPECT_EQ(v.tokens[154879], "[PAD154879]");
  EXPECT_EQ(v.bos, 154822);
  EXPECT_EQ(v.eos, 154820);
  EXPECT_EQ(v.eot, 154827);
  EXPECT_EQ(v.eom, 154829);
  EXPECT_EQ(v.unk, 154820);
  EXPECT_EQ(v.pad, 154820);
  EXPECT_FALSE(v.add_bos);
  EXPECT_EQ(v.pre, "glm4");
  EXPECT_EQ(v.model, "gpt2");
  EXPECT_EQ(detect_chat_format(v.chat_template), ChatFormat::Glm4);
  EXPECT_GT(v.merges.size(), 200u);
  expect_merges_valid(v);
  // Byte tokens first, then learned tokens, then padding.
  EXPECT_EQ(v.tokens[32], "\u0120");
  EXPECT_EQ(v.token_types[256], kTokenNormal);
  EXPECT_EQ(v.tokens[256 + v.merges.size() + 1000], "[PAD" + std::to_string(256 + v.merges.size() + 1000) + "]");
}

TEST(VocabBuilder, DeepseekLayouts) {
  const VocabArrays real = build_synthetic_vocab("deepseek-llm", 102400);
  ASSERT_EQ(real.tokens.size(), 102400u);
  EXPECT_EQ(real.tokens[100000], "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(real.tokens[100001], "<｜end▁of▁sentence｜>");
  EXPECT_EQ(real.bos, 100000);
  EXPECT_EQ(real.eos, 100001);
  EXPECT_TRUE(real.add_bos);
  EXPECT_EQ(detect_chat_format(real.chat_template), ChatFormat::DeepSeekV2);
  expect_merges_valid(real);

  const VocabArrays small = build_synthetic_vocab("deepseek-llm", 1000);
  ASSERT_EQ(small.tokens.size(), 1000u);
  EXPECT_EQ(small.bos, 984);
  EXPECT_EQ(small.tokens[984], "<｜begin▁of▁sentence｜>");
}

TEST(VocabBuilder, SmallVocabCapsMerges) {
  const VocabArrays v = build_synthetic_vocab("glm4", 400);  // room for 84 learned tokens
  ASSERT_EQ(v.tokens.size(), 400u);
  EXPECT_EQ(v.tokens[340], "<|endoftext|>");
  EXPECT_EQ(v.bos, 342);
  for (uint32_t i = 256; i < 340; ++i) EXPECT_EQ(v.token_types[i], kTokenNormal) << i;
  expect_merges_valid(v);
  // Prefix property: the small vocab's merges are the first merges of the big one.
  const VocabArrays big = build_synthetic_vocab("glm4", 154880);
  ASSERT_LE(v.merges.size(), big.merges.size());
  EXPECT_TRUE(std::equal(v.merges.begin(), v.merges.end(), big.merges.begin()));
}

TEST(VocabBuilder, DeterministicAndFast) {
  build_synthetic_vocab("glm4", 154880);  // training happens once per process
  const auto t0 = std::chrono::steady_clock::now();
  const VocabArrays a = build_synthetic_vocab("glm4", 154880);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const VocabArrays b = build_synthetic_vocab("glm4", 154880);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.merges, b.merges);
  EXPECT_EQ(a.token_types, b.token_types);
  EXPECT_LT(seconds, 2.0);
}

TEST(VocabBuilder, RejectsBadArguments) {
  EXPECT_THROW(build_synthetic_vocab("llama", 1000), Error);
  EXPECT_THROW(build_synthetic_vocab("glm4", 300), Error);
  EXPECT_THROW(build_synthetic_vocab("deepseek-llm", 271), Error);
  EXPECT_NO_THROW(build_synthetic_vocab("deepseek-llm", 272));
}

TEST(VocabBuilder, WriteVocabSetsEveryKey) {
  Metadata md("synthetic.gguf");
  write_vocab(build_synthetic_vocab("glm4", 154880), md);
  EXPECT_EQ(md.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(md.get_string("tokenizer.ggml.pre"), "glm4");
  EXPECT_EQ(md.get_string_array("tokenizer.ggml.tokens").size(), 154880u);
  EXPECT_EQ(md.get_int_array("tokenizer.ggml.token_type").size(), 154880u);
  EXPECT_FALSE(md.get_string_array("tokenizer.ggml.merges").empty());
  EXPECT_EQ(md.get_uint("tokenizer.ggml.bos_token_id"), 154822u);
  EXPECT_EQ(md.get_uint("tokenizer.ggml.eos_token_id"), 154820u);
  EXPECT_EQ(md.get_uint("tokenizer.ggml.eot_token_id"), 154827u);
  EXPECT_EQ(md.get_uint("tokenizer.ggml.eom_token_id"), 154829u);
  EXPECT_EQ(md.get_uint("tokenizer.ggml.unknown_token_id"), 154820u);
  EXPECT_EQ(md.get_uint("tokenizer.ggml.padding_token_id"), 154820u);
  EXPECT_EQ(md.get_bool("tokenizer.ggml.add_bos_token"), false);
  EXPECT_EQ(md.get_bool("tokenizer.ggml.add_eos_token"), false);
  EXPECT_TRUE(md.has("tokenizer.chat_template"));

  Metadata ds("synthetic-ds.gguf");
  write_vocab(build_synthetic_vocab("deepseek-llm", 1000), ds);
  EXPECT_FALSE(ds.has("tokenizer.ggml.eot_token_id"));  // -1 ids are not written
  EXPECT_EQ(ds.get_bool("tokenizer.ggml.add_bos_token"), true);
  // The metadata survives GGUF KV serialization.
  const std::vector<uint8_t> bytes = ds.serialize();
  const Metadata back = Metadata::parse(bytes, ds.entries().size(), "round-trip");
  const Tokenizer t = Tokenizer::from_metadata(back);
  EXPECT_EQ(t.n_vocab(), 1000);
  EXPECT_EQ(t.bos(), 984);
}
