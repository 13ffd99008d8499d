#include "runtime/cpu/generate.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <charconv>
#include <cstdio>
#include <cstring>

#include "format/error.h"

namespace tessera {

LanguageModel::~LanguageModel() = default;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void write_logits(const std::string& path, const std::vector<float>& logits) {
  static_assert(std::endian::native == std::endian::little, "logit dumps are written as little-endian f32");
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) runtime_error(path, ": cannot write the logits dump: ", std::strerror(errno));
  const size_t n = std::fwrite(logits.data(), sizeof(float), logits.size(), f);
  const bool ok = n == logits.size() && std::fflush(f) == 0;
  const int err = errno;
  std::fclose(f);
  if (!ok) runtime_error(path, ": writing the logits dump failed: ", std::strerror(err));
}

}  // namespace

int32_t LanguageModel::device_token() const { runtime_error("this model does not sample on its device"); }
int32_t LanguageModel::device_step() { runtime_error("this model does not sample on its device"); }

int LanguageModel::device_steps(int n, const std::function<bool(int32_t)>& on_token) {
  for (int i = 0; i < n; ++i)
    if (!on_token(device_step())) return i + 1;
  return std::max(n, 0);
}

GenerateResult generate(LanguageModel& model, std::span<const int32_t> prompt, const text::Tokenizer* tokenizer,
                        text::Sampler& sampler, const GenerateOptions& options,
                        const std::function<void(std::string_view)>& on_text) {
  if (prompt.empty()) usage_error("the prompt is empty (no tokens to run)");
  if (model.n_past() + prompt.size() > size_t(model.n_ctx()))
    usage_error("the prompt has ", prompt.size(), " tokens but the context holds ", model.n_ctx() - model.n_past(),
                " more (raise --ctx)");
  if (options.n_predict > 0 && !tokenizer) usage_error("generating text needs the model's tokenizer");
  GenerateResult r;
  r.n_prompt = prompt.size();
  const uint32_t V = model.n_vocab();

  auto t0 = std::chrono::steady_clock::now();
  const bool dump = !options.dump_logits_path.empty();
  std::vector<float> logits = model.forward(prompt, !dump);
  if (dump) {
    write_logits(options.dump_logits_path, logits);
    logits.erase(logits.begin(), logits.end() - V);  // keep the last position's row
  }
  r.prompt_seconds = seconds_since(t0);
  for (int32_t id : prompt) sampler.accept(id);
  if (options.n_predict <= 0) return r;

  t0 = std::chrono::steady_clock::now();
  text::TokenDecoder decoder(*tokenizer);
  // One generated token: false when generation ends with it.
  auto take = [&](int32_t id) {
    sampler.accept(id);
    r.generated.push_back(id);
    if (tokenizer->is_eog(id)) {
      r.hit_eog = true;
      return false;
    }
    const std::string piece = decoder.push(id, options.render_special);
    if (!piece.empty()) on_text(piece);
    if (r.generated.size() == size_t(options.n_predict)) return false;
    if (model.n_past() >= model.n_ctx()) {
      r.context_full = true;
      return false;
    }
    return true;
  };
  if (model.samples_on_device()) {
    // The first token was chosen with the prompt's logits; the device may queue the steps after it.
    if (take(model.device_token()))
      model.device_steps(std::min(options.n_predict - 1, model.n_ctx() - model.n_past()), take);
  } else {
    for (;;) {
      const int32_t id = sampler.sample(logits);
      if (!take(id)) break;
      logits = model.forward(std::span<const int32_t>(&id, 1), true);
    }
  }
  const std::string rest = decoder.flush();
  if (!rest.empty()) on_text(rest);
  r.generate_seconds = seconds_since(t0);
  return r;
}

std::vector<int32_t> parse_token_list(std::string_view text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    std::string_view item = text.substr(pos, comma - pos);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    int32_t v = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < 0)
      usage_error("--tokens: '", item, "' is not a token id (expected comma-separated non-negative integers)");
    ids.push_back(v);
    pos = comma + 1;
  }
  return ids;
}

}  // namespace tessera
