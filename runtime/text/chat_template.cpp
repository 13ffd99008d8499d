#include "runtime/text/chat_template.h"

#include "format/error.h"

namespace tessera::text {

namespace {

// tessera's rendition of the GLM-4.7 chat format (tokenizer.md §6). Role tokens are followed
// directly by content; assistant turns after the last user message keep their reasoning.
constexpr std::string_view kGlm4Jinja = R"JINJA([gMASK]<sop>
{%- if tools -%}
<|system|>
# Available tools

The functions below may be called to help answer the user. Their signatures are listed inside
<tools></tools>, one JSON object per line:
<tools>
{%- for tool in tools %}
{{ tool | tojson(ensure_ascii=False) }}
{%- endfor %}
</tools>

To call a function, write its name and each argument as:
<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value></tool_call>
{%- endif -%}
{%- set ns = namespace(last_user = -1) -%}
{%- for m in messages -%}
  {%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- for m in messages -%}
  {%- if m.role == 'system' -%}
<|system|>{{ m.content }}
  {%- elif m.role == 'user' -%}
<|user|>{{ m.content }}
  {%- elif m.role == 'assistant' -%}
<|assistant|>
    {%- if loop.index0 > ns.last_user and m.reasoning_content -%}
<think>{{ m.reasoning_content }}</think>
    {%- else -%}
</think>
    {%- endif -%}
{{ m.content }}
    {%- for call in m.tool_calls or [] -%}
<tool_call>{{ call.function.name }}
      {%- for key, value in call.function.arguments.items() -%}
<arg_key>{{ key }}</arg_key><arg_value>{{ value if value is string else value | tojson(ensure_ascii=False) }}</arg_value>
      {%- endfor -%}
</tool_call>
    {%- endfor -%}
  {%- elif m.role == 'tool' or m.role == 'observation' -%}
    {%- if loop.first or (messages[loop.index0 - 1].role != 'tool' and messages[loop.index0 - 1].role != 'observation') -%}
<|observation|>
    {%- endif -%}
<tool_response>{{ m.content }}</tool_response>
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|assistant|>{{ '</think>' if enable_thinking is defined and not enable_thinking else '<think>' }}
{%- endif -%})JINJA";

// tessera's rendition of the DeepSeek-V2-Chat format.
constexpr std::string_view kDeepSeekV2Jinja = R"JINJA({{ bos_token }}
{%- for m in messages -%}
  {%- if m['role'] == 'system' -%}{{ m['content'] + '\n\n' }}
  {%- elif m['role'] == 'user' -%}{{ 'User: ' + m['content'] + '\n\n' }}
  {%- elif m['role'] == 'assistant' -%}{{ 'Assistant: ' + m['content'] + eos_token }}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ 'Assistant:' }}{%- endif -%})JINJA";

constexpr std::string_view kDeepSeekBos = "<｜begin▁of▁sentence｜>";
constexpr std::string_view kDeepSeekEos = "<｜end▁of▁sentence｜>";

bool contains(std::string_view hay, std::string_view needle) { return hay.find(needle) != std::string_view::npos; }

std::string known_names() {
  std::string s;
  for (const std::string& n : chat_format_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

std::string render_glm4(const std::vector<ChatMessage>& messages, bool add_generation_prompt, bool enable_thinking) {
  std::string out = "[gMASK]<sop>";
  bool previous_was_tool = false;
  for (const ChatMessage& m : messages) {
    const bool is_tool = m.role == "tool" || m.role == "observation";
    if (m.role == "system") {
      out += "<|system|>" + m.content;
    } else if (m.role == "user") {
      out += "<|user|>" + m.content;
    } else if (m.role == "assistant") {
      out += "<|assistant|></think>" + m.content;
    } else if (is_tool) {
      if (!previous_was_tool) out += "<|observation|>";
      out += "<tool_response>" + m.content + "</tool_response>";
    } else {
      usage_error("chat message role \"", m.role, "\" is not supported by the glm4 chat format ",
                  "(roles: system, user, assistant, tool, observation)");
    }
    previous_was_tool = is_tool;
  }
  if (add_generation_prompt) out += enable_thinking ? "<|assistant|><think>" : "<|assistant|></think>";
  return out;
}

std::string render_deepseek_v2(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out(kDeepSeekBos);
  for (const ChatMessage& m : messages) {
    if (m.role == "system") {
      out += m.content + "\n\n";
    } else if (m.role == "user") {
      out += "User: " + m.content + "\n\n";
    } else if (m.role == "assistant") {
      out += "Assistant: " + m.content;
      out += kDeepSeekEos;
    } else {
      usage_error("chat message role \"", m.role, "\" is not supported by the deepseek2 chat format ",
                  "(roles: system, user, assistant)");
    }
  }
  if (add_generation_prompt) out += "Assistant:";
  return out;
}

}  // namespace

std::optional<ChatFormat> detect_chat_format(std::string_view jinja) {
  if (contains(jinja, "[gMASK]") && contains(jinja, "<|assistant|>")) return ChatFormat::Glm4;
  if (contains(jinja, "User: ") && contains(jinja, "Assistant:")) return ChatFormat::DeepSeekV2;
  return std::nullopt;
}

std::vector<std::string> chat_format_names() { return {"glm4", "deepseek2"}; }

const char* chat_format_name(ChatFormat format) { return format == ChatFormat::Glm4 ? "glm4" : "deepseek2"; }

ChatFormat chat_format_from_name(std::string_view name) {
  if (name == "glm4") return ChatFormat::Glm4;
  if (name == "deepseek2") return ChatFormat::DeepSeekV2;
  bad_input("unknown chat template name \"", name, "\" (known: ", known_names(), ")");
}

ChatFormat resolve_chat_format(std::string_view jinja, std::string_view name) {
  if (!name.empty()) return chat_format_from_name(name);
  if (jinja.empty())
    bad_input("the model has no tokenizer.chat_template; choose a format with --chat-template NAME (",
              known_names(), ")");
  if (const std::optional<ChatFormat> f = detect_chat_format(jinja)) return *f;
  bad_input("tokenizer.chat_template is not a chat format tessera knows; choose one with --chat-template NAME (",
            known_names(), ")");
}

std::string_view builtin_chat_template(ChatFormat format) {
  return format == ChatFormat::Glm4 ? kGlm4Jinja : kDeepSeekV2Jinja;
}

std::string render_chat(ChatFormat format, const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                        bool enable_thinking) {
  if (format == ChatFormat::Glm4) return render_glm4(messages, add_generation_prompt, enable_thinking);
  return render_deepseek_v2(messages, add_generation_prompt);
}

}  // namespace tessera::text
