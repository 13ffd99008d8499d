// tessera chat MODEL [--backend auto|cpu|vulkan] [--ctx N] [--system TEXT] [--think] [sampling...]
// Interactive multi-turn chat with the model's template. The KV cache is reused across turns: a
// turn processes only the tokens after the longest prefix already in the cache. Commands:
// /reset (forget the conversation), /system TEXT (set the system prompt, starts over), /quit.
// Ctrl-C stops the current answer, not the program (a second Ctrl-C at the prompt exits).
#include <csignal>
#include <cstdio>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "app/cli.h"
#include "app/open_model.h"
#include "format/error.h"
#include "runtime/cpu/generate.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/sampler.h"
#include "runtime/text/tokenizer.h"

namespace tessera::app {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;
void on_sigint(int) { g_interrupted = 1; }

struct Stopped {};  // thrown from the text callback to end an answer early

struct ChatArgs {
  std::string model, backend = "auto", system, chat_template;
  int device = -1, ctx = 4096, n_predict = 1024;
  bool think = false, f32_activations = false;
  uint32_t prefill_chunk = model::kPrefillChunkAuto;
  text::SamplerParams sampling;
  std::optional<uint64_t> seed;
};

// Tokens shared at the start of both lists.
size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

int chat(const ChatArgs& a, const Globals& g) {
  text::SamplerParams sp = a.sampling;
  sp.seed = a.seed ? *a.seed : std::random_device{}();
  OpenModel om = open_model({.path = a.model, .backend = a.backend, .device = a.device, .n_ctx = a.ctx,
                             .threads = g.thread_count(), .sampling = sp, .verbose = g.verbose,
                             .f32_activations = a.f32_activations, .prefill_chunk = a.prefill_chunk});
  LanguageModel& model = *om.model;
  const Metadata& md = om.weights->metadata();
  const text::Tokenizer tok = text::Tokenizer::from_metadata(md);
  const text::ChatFormat format =
      text::resolve_chat_format(md.get_string("tokenizer.chat_template").value_or(""), a.chat_template);
  text::Sampler sampler(sp);
  std::signal(SIGINT, on_sigint);

  std::vector<text::ChatMessage> history;
  if (!a.system.empty()) history.push_back({"system", a.system});
  std::vector<int32_t> cached;  // exactly the tokens in the model's cache, in order
  std::fprintf(stderr, "tessera chat: %s (%s backend, %s template, context %d). /reset, /system TEXT, /quit; Ctrl-C stops an answer.\n",
               a.model.c_str(), om.backend.c_str(), text::chat_format_name(format), model.n_ctx());
  std::string line;
  while (true) {
    std::fputs("> ", stdout);
    std::fflush(stdout);
    g_interrupted = 0;
    if (!std::getline(std::cin, line)) break;
    if (line == "/quit" || line == "/exit") break;
    if (line == "/reset" || line.rfind("/system", 0) == 0) {
      history.clear();
      if (line.rfind("/system", 0) == 0) {
        const std::string text = line.size() > 8 ? line.substr(8) : "";
        if (!text.empty()) history.push_back({"system", text});
      } else if (!a.system.empty()) {
        history.push_back({"system", a.system});
      }
      model.reset();
      cached.clear();
      std::fputs("(conversation reset)\n", stdout);
      continue;
    }
    if (line.empty()) continue;
    history.push_back({"user", line});
    const std::vector<int32_t> full =
        tok.encode(text::render_chat(format, history, true, a.think), /*parse_special=*/true, /*add_bos=*/false);
    size_t keep = common_prefix(cached, full);
    if (keep < cached.size() || keep == full.size()) {  // the cache diverged: start over
      model.reset();
      cached.clear();
      keep = 0;
    }
    if (full.size() + 1 > size_t(model.n_ctx())) {
      history.pop_back();
      std::printf("(the context of %d tokens is full: /reset to start a new conversation)\n", model.n_ctx());
      continue;
    }
    const std::vector<int32_t> fresh(full.begin() + long(keep), full.end());
    GenerateOptions go;
    go.n_predict = std::min(a.n_predict, model.n_ctx() - int(full.size()));
    std::string answer;
    GenerateResult r;
    bool stopped = false;
    try {
      r = generate(model, fresh, &tok, sampler, go, [&](std::string_view s) {
        std::fwrite(s.data(), 1, s.size(), stdout);
        std::fflush(stdout);
        answer += s;
        if (g_interrupted) throw Stopped{};
      });
    } catch (const Stopped&) {
      stopped = true;
    }
    std::fputc('\n', stdout);
    history.push_back({"assistant", answer});
    if (stopped) {
      // The cache holds part of an answer whose tokens we did not keep: recompute next turn.
      model.reset();
      cached.clear();
      std::fputs("(stopped)\n", stdout);
      continue;
    }
    cached = full;
    // The cache holds every generated token except the last one (sampled, never fed back).
    if (!r.generated.empty()) cached.insert(cached.end(), r.generated.begin(), r.generated.end() - 1);
    if (r.context_full) std::printf("(the context of %d tokens is full: /reset to start a new conversation)\n", model.n_ctx());
  }
  return 0;
}

Action setup(CLI::App& sub, const Globals& globals) {
  auto a = std::make_shared<ChatArgs>();
  a->sampling = text::SamplerParams{};
  sub.add_option("MODEL", a->model, "Model file (.tsr, or .gguf for the CPU backend)")->required();
  sub.add_option("--backend", a->backend, "Compute backend (auto: vulkan for .tsr, cpu for .gguf)")
      ->check(CLI::IsMember({"auto", "cpu", "vulkan"}))->capture_default_str();
  sub.add_option("--device", a->device, "Vulkan device number (tessera devices)");
  sub.add_flag("--f32-activations", a->f32_activations, "Vulkan: f32 inputs to every matvec (no int8 activations)");
  sub.add_option("--prefill-chunk", a->prefill_chunk,
                 "Vulkan: prompt tokens per batched prefill chunk (0: token by token; default 512 where tensor cores "
                 "run the prefill's matrices, else 64; a prompt's last tokens run in chunks of 64)");
  sub.add_option("--ctx", a->ctx, "Context size in tokens")->check(CLI::PositiveNumber)->capture_default_str();
  sub.add_option("--system", a->system, "System prompt");
  sub.add_option("--chat-template", a->chat_template, "Chat format when the model's template is not recognized");
  sub.add_flag("--think", a->think, "Open assistant turns in thinking mode (GLM)");
  sub.add_option("-n,--n-predict", a->n_predict, "Most tokens per answer")->check(CLI::PositiveNumber)->capture_default_str();
  sub.add_option("--temp", a->sampling.temperature, "Temperature (0: greedy)")->check(CLI::NonNegativeNumber)->capture_default_str();
  sub.add_option("--top-k", a->sampling.top_k, "Keep the K most likely tokens (0: all)")->capture_default_str();
  sub.add_option("--top-p", a->sampling.top_p, "Nucleus sampling threshold (1: off)")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  sub.add_option("--min-p", a->sampling.min_p, "Drop tokens below P x the best one's probability")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  sub.add_option("--seed", a->seed, "Sampling seed (default: random)");
  return [a, &globals]() { return chat(*a, globals); };
}

CommandRegistrar reg("chat", "Interactive multi-turn chat (KV cache reused across turns)", &setup, 60);

}  // namespace
}  // namespace tessera::app
