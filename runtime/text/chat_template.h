// Chat prompt formats (tokenizer.md §6, §1.2). tessera does not evaluate Jinja: it recognizes
// which known format a GGUF's `tokenizer.chat_template` implements and renders that format in
// C++. Rendered prompts contain special-token literals ([gMASK], <|user|>, BOS, ...): encode them
// with parse_special = true and add_bos = false (the render already holds any BOS).
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::text {

enum class ChatFormat {
  Glm4,        // GLM-4.5/4.7: [gMASK]<sop><|system|>..<|user|>..<|assistant|><think>
  DeepSeekV2,  // DeepSeek-V2(-Lite)-Chat: <BOS>User: ..\n\nAssistant: ..<EOS>
};

// Recognizes the format a Jinja chat template implements (by its role markers); nullopt when it
// is none of the known ones.
std::optional<ChatFormat> detect_chat_format(std::string_view jinja);

// "glm4" -> Glm4, "deepseek2" -> DeepSeekV2. Throws Error(BadInput) listing the names otherwise.
ChatFormat chat_format_from_name(std::string_view name);
const char* chat_format_name(ChatFormat format);
std::vector<std::string> chat_format_names();

// Picks the format for a model: the explicit `name` when not empty (--chat-template NAME), else
// detection on `jinja`. Throws Error(BadInput) when the template is missing or not recognized,
// suggesting --chat-template NAME with the known names.
ChatFormat resolve_chat_format(std::string_view jinja, std::string_view name);

// The Jinja text tessera writes into synthetic models for `format` (its own rendition of the
// format; detect_chat_format recognizes it).
std::string_view builtin_chat_template(ChatFormat format);

struct ChatMessage {
  std::string role;  // "system" | "user" | "assistant" | "tool" (GLM also accepts "observation")
  std::string content;
};

// Renders a conversation as prompt text.
//  Glm4: "[gMASK]<sop>", then per message <|system|>C, <|user|>C, <|assistant|></think>C (past
//    assistant turns keep no reasoning), tool results as <tool_response>C</tool_response> with
//    one <|observation|> before each run of them. Generation prompt: "<|assistant|><think>" when
//    enable_thinking, else "<|assistant|></think>".
//  DeepSeekV2: BOS, then system "C\n\n", user "User: C\n\n", assistant "Assistant: C" + EOS.
//    Generation prompt: "Assistant:". enable_thinking is ignored.
// Throws Error(Usage) naming the role for a role the format does not have.
std::string render_chat(ChatFormat format, const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                        bool enable_thinking);

}  // namespace tessera::text
