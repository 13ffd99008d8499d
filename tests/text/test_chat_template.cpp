// Chat formats: exact renders, detection, names, and token ids of a rendered GLM prompt.
#include <gtest/gtest.h>

#include "format/error.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"
#include "runtime/text/vocab_builder.h"

using namespace tessera;
using namespace tessera::text;

TEST(ChatTemplate, Glm4SingleTurn) {
  const std::vector<ChatMessage> msgs = {{"system", "You are helpful."}, {"user", "Hello"}};
  EXPECT_EQ(render_chat(ChatFormat::Glm4, msgs, true, true),
            "[gMASK]<sop><|system|>You are helpful.<|user|>Hello<|assistant|><think>");
  EXPECT_EQ(render_chat(ChatFormat::Glm4, msgs, true, false),
            "[gMASK]<sop><|system|>You are helpful.<|user|>Hello<|assistant|></think>");
  EXPECT_EQ(render_chat(ChatFormat::Glm4, msgs, false, true), "[gMASK]<sop><|system|>You are helpful.<|user|>Hello");
}

TEST(ChatTemplate, Glm4MultiTurnWithTools) {
  const std::vector<ChatMessage> msgs = {
      {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Weather?"}, {"tool", "sunny"}, {"observation", "warm"},
      {"assistant", "It is sunny."}, {"tool", "late"},
  };
  EXPECT_EQ(render_chat(ChatFormat::Glm4, msgs, true, false),
            "[gMASK]<sop><|user|>Hi<|assistant|></think>Hello!<|user|>Weather?"
            "<|observation|><tool_response>sunny</tool_response><tool_response>warm</tool_response>"
            "<|assistant|></think>It is sunny.<|observation|><tool_response>late</tool_response>"
            "<|assistant|></think>");
}

TEST(ChatTemplate, DeepSeekV2) {
  const std::vector<ChatMessage> msgs = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}};
  EXPECT_EQ(render_chat(ChatFormat::DeepSeekV2, msgs, true, true),
            "<｜begin▁of▁sentence｜>Be brief.\n\nUser: Hi\n\nAssistant: Hello<｜end▁of▁sentence｜>"
            "User: Bye\n\nAssistant:");
  EXPECT_EQ(render_chat(ChatFormat::DeepSeekV2, {{"user", "x"}}, false, false),
            "<｜begin▁of▁sentence｜>User: x\n\n");
}

TEST(ChatTemplate, UnknownRoleIsAnError) {
  EXPECT_THROW(render_chat(ChatFormat::Glm4, {{"narrator", "x"}}, true, true), Error);
  EXPECT_THROW(render_chat(ChatFormat::DeepSeekV2, {{"tool", "x"}}, true, true), Error);
}

TEST(ChatTemplate, DetectionAndNames) {
  EXPECT_EQ(detect_chat_format(builtin_chat_template(ChatFormat::Glm4)), ChatFormat::Glm4);
  EXPECT_EQ(detect_chat_format(builtin_chat_template(ChatFormat::DeepSeekV2)), ChatFormat::DeepSeekV2);
  EXPECT_EQ(detect_chat_format("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}"), std::nullopt);
  EXPECT_EQ(chat_format_from_name("glm4"), ChatFormat::Glm4);
  EXPECT_EQ(chat_format_from_name("deepseek2"), ChatFormat::DeepSeekV2);
  EXPECT_STREQ(chat_format_name(ChatFormat::DeepSeekV2), "deepseek2");
  try {
    chat_format_from_name("chatml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput);
    EXPECT_NE(std::string(e.what()).find("glm4"), std::string::npos);
  }
  try {
    resolve_chat_format("{{ messages }}", "");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--chat-template NAME"), std::string::npos) << e.what();
  }
  EXPECT_EQ(resolve_chat_format("{{ messages }}", "deepseek2"), ChatFormat::DeepSeekV2);
  EXPECT_EQ(resolve_chat_format(builtin_chat_template(ChatFormat::Glm4), ""), ChatFormat::Glm4);
}

TEST(ChatTemplate, RenderedGlmPromptTokenizesToSpecialIds) {
  Metadata md("glm.gguf");
  write_vocab(build_synthetic_vocab("glm4", 154880), md);
  const Tokenizer t = Tokenizer::from_metadata(md);
  const std::string prompt =
      render_chat(ChatFormat::Glm4, {{"system", "You are helpful."}, {"user", "Hello"}}, true, true);
  const std::vector<int32_t> ids = t.encode(prompt, true, false);
  ASSERT_GE(ids.size(), 7u);
  EXPECT_EQ(ids[0], 154822);
  EXPECT_EQ(ids[1], 154824);
  EXPECT_EQ(ids[2], 154826);
  EXPECT_EQ(ids[ids.size() - 2], 154828);
  EXPECT_EQ(ids.back(), 154830);  // <think>
  EXPECT_NE(std::find(ids.begin(), ids.end(), 154827), ids.end());
  EXPECT_EQ(t.decode(ids, true), prompt);
}
