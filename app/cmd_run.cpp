// tessera run MODEL [--backend auto|cpu|vulkan] [--device N] (-p TEXT | -f FILE | --tokens ID,ID,...) [-n N] [--temp T]
//   [--top-k K] [--top-p P] [--min-p P] [--seed S] [--chat] [--chat-template NAME] [--think]
//   [--no-special] [--ctx N] [--attention absorbed|expanded] [--dump-logits FILE] [--print-ids]
// Generates text from a prompt, streaming it to stdout; speeds go to stderr at the end.
// Logic: runtime/cpu/generate.h (loop), runtime/cpu/forward.h (model), runtime/text (tokenizer,
// sampler, chat templates).
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>

#include "app/cli.h"
#include "app/open_model.h"
#include "format/error.h"
#include "runtime/cpu/forward.h"
#include "runtime/cpu/generate.h"
#include "runtime/cpu/weight_source.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/sampler.h"
#include "runtime/text/tokenizer.h"

namespace tessera::app {
namespace {

struct RunArgs {
  std::string model;
  std::string backend = "auto";
  int device = -1;
  bool f32_activations = false;
  uint32_t prefill_chunk = model::kPrefillChunkAuto;
  std::string prompt, prompt_file, tokens;
  int n_predict = 128;
  text::SamplerParams sampling;
  std::optional<uint64_t> seed;
  bool chat = false, think = false, no_special = false, print_ids = false;
  std::string chat_template;
  int ctx = 4096;
  std::string attention = "absorbed";
  std::string dump_logits;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) usage_error("-f ", path, ": cannot read the prompt file");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The prompt as token ids, from whichever of -p / -f / --tokens was given.
std::vector<int32_t> prompt_tokens(const RunArgs& a, const Metadata& md, const text::Tokenizer* tok) {
  if (!a.tokens.empty()) {
    if (a.chat) usage_error("--chat needs a text prompt (-p or -f), not --tokens");
    return parse_token_list(a.tokens);
  }
  const std::string text = a.prompt_file.empty() ? a.prompt : read_file(a.prompt_file);
  const bool parse_special = !a.no_special;
  if (!a.chat) return tok->encode(text, parse_special, tok->add_bos());
  const std::string jinja = md.get_string("tokenizer.chat_template").value_or("");
  const text::ChatFormat format = text::resolve_chat_format(jinja, a.chat_template);
  const std::string rendered = text::render_chat(format, {{"user", text}}, true, a.think);
  // the rendered prompt holds its own BOS and role markers
  return tok->encode(rendered, true, false);
}

Action setup(CLI::App& sub, const Globals& globals) {
  auto a = std::make_shared<RunArgs>();
  a->sampling = text::SamplerParams{};
  sub.add_option("MODEL", a->model, "Model file (.tsr, or .gguf for the CPU backend)")->required();
  sub.add_option("--backend", a->backend, "Compute backend (auto: vulkan for .tsr, cpu for .gguf)")
      ->check(CLI::IsMember({"auto", "cpu", "vulkan"}))->capture_default_str();
  sub.add_option("--device", a->device, "Vulkan device number (tessera devices; default: the best one)");
  sub.add_flag("--f32-activations", a->f32_activations,
               "Vulkan: f32 inputs to every matvec (default: int8 activations with integer dot products for Q4_0/Q8_0/Q4_K/Q6_K weights)");
  sub.add_option("--prefill-chunk", a->prefill_chunk,
                 "Vulkan: prompt tokens per batched prefill chunk (0: token by token; default 512 where tensor cores "
                 "run the prefill's matrices, else 64; a prompt's last tokens run in chunks of 64)");
  auto* p = sub.add_option("-p,--prompt", a->prompt, "Prompt text");
  auto* f = sub.add_option("-f,--file", a->prompt_file, "Read the prompt text from a file");
  auto* t = sub.add_option("--tokens", a->tokens, "Prompt as token ids: ID,ID,...");
  p->excludes(f)->excludes(t);
  f->excludes(t);
  sub.add_option("-n,--n-predict", a->n_predict, "Tokens to generate (0: run the prompt only)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  sub.add_option("--temp", a->sampling.temperature, "Temperature (0: greedy)")->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub.add_option("--top-k", a->sampling.top_k, "Keep the K most likely tokens (0: all)")->capture_default_str();
  sub.add_option("--top-p", a->sampling.top_p, "Nucleus sampling threshold (1: off)")->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  sub.add_option("--min-p", a->sampling.min_p, "Drop tokens below P x the best one's probability (0: off)")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  sub.add_option("--seed", a->seed, "Sampling seed (default: random)");
  sub.add_flag("--chat", a->chat, "Wrap the prompt as one user turn of the model's chat template");
  sub.add_option("--chat-template", a->chat_template, "Chat format when the model's template is not recognized: " +
                                                          [] {
                                                            std::string s;
                                                            for (const auto& n : text::chat_format_names())
                                                              s += (s.empty() ? "" : ", ") + n;
                                                            return s;
                                                          }());
  sub.add_flag("--think", a->think, "With --chat: open the assistant turn in thinking mode (GLM)");
  sub.add_flag("--no-special", a->no_special,
               "Treat special-token text in the prompt as plain text and do not print special tokens");
  sub.add_option("--ctx", a->ctx, "Context size in tokens")->check(CLI::PositiveNumber)->capture_default_str();
  sub.add_option("--attention", a->attention, "CPU attention path (the two must agree)")
      ->check(CLI::IsMember({"absorbed", "expanded"}))->capture_default_str();
  sub.add_option("--dump-logits", a->dump_logits, "Write little-endian f32 logits [n_prompt x n_vocab] of the prompt");
  sub.add_flag("--print-ids", a->print_ids, "Print the generated token ids as the last line of stdout");

  return [a, &globals]() -> int {
    if (a->prompt.empty() && a->prompt_file.empty() && a->tokens.empty())
      usage_error("run: give a prompt with -p TEXT, -f FILE or --tokens ID,ID,...");
    text::SamplerParams sp = a->sampling;
    sp.seed = a->seed ? *a->seed : std::random_device{}();
    const AttentionPath path = a->attention == "expanded" ? AttentionPath::Expanded : AttentionPath::Absorbed;
    OpenModel om = open_model({.path = a->model, .backend = a->backend, .device = a->device, .n_ctx = a->ctx,
                               .threads = globals.thread_count(), .attention = path, .sampling = sp,
                               .verbose = globals.verbose, .f32_activations = a->f32_activations,
                               .prefill_chunk = a->prefill_chunk});
    LanguageModel* model = om.model.get();
    const std::string& backend = om.backend;
    const Metadata& md = om.weights->metadata();
    const bool need_tokenizer = a->tokens.empty() || a->n_predict > 0;
    std::optional<text::Tokenizer> tok;
    if (need_tokenizer) tok.emplace(text::Tokenizer::from_metadata(md));
    const std::vector<int32_t> prompt = prompt_tokens(*a, md, tok ? &*tok : nullptr);
    if (tok && uint32_t(tok->n_vocab()) > model->n_vocab())
      bad_input(a->model, ": the tokenizer has ", tok->n_vocab(), " tokens but the model's vocabulary is ",
                model->n_vocab());

    text::Sampler sampler(sp);
    GenerateOptions go;
    go.n_predict = a->n_predict;
    go.render_special = !a->no_special;
    go.dump_logits_path = a->dump_logits;
    if (globals.verbose)
      std::fprintf(stderr, "tessera run: %s, %zu prompt tokens, backend %s (%s attention, %u threads), seed %llu\n",
                   a->model.c_str(), prompt.size(), backend.c_str(), attention_path_name(path), globals.thread_count(),
                   static_cast<unsigned long long>(sp.seed));

    bool printed = false;
    const GenerateResult r = generate(*model, prompt, tok ? &*tok : nullptr, sampler, go, [&](std::string_view s) {
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
      printed = true;
    });
    if (printed) std::fputc('\n', stdout);
    if (a->print_ids) {
      std::string line;
      for (int32_t id : r.generated) line += (line.empty() ? "" : " ") + std::to_string(id);
      std::printf("%s\n", line.c_str());
    }
    std::fflush(stdout);
    if (r.context_full) std::fprintf(stderr, "tessera run: stopped, the context of %d tokens is full\n", model->n_ctx());
    std::fprintf(stderr, "prompt: %zu tokens in %.3f s (%.2f tok/s)\n", r.n_prompt, r.prompt_seconds,
                 r.prompt_seconds > 0 ? double(r.n_prompt) / r.prompt_seconds : 0.0);
    if (a->n_predict > 0)
      std::fprintf(stderr, "generation: %zu tokens in %.3f s (%.2f tok/s)\n", r.generated.size(), r.generate_seconds,
                   r.generate_seconds > 0 ? double(r.generated.size()) / r.generate_seconds : 0.0);
    return 0;
  };
}

CommandRegistrar reg("run", "Generate text from a prompt (Vulkan for .tsr, CPU reference for .gguf)", &setup, 50);

}  // namespace
}  // namespace tessera::app
