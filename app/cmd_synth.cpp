// tessera synth --preset NAME --type TYPE [--seed N] [--layers N] -o FILE.gguf
// Writes a synthetic deepseek2 GGUF (real shapes, metadata and llama-quantize type mix; random
// weights) and prints a summary. Logic: convert/synth.h.
#include <cstdio>
#include <memory>

#include "app/cli.h"
#include "convert/synth.h"
#include "format/model_config.h"

namespace tessera::app {
namespace {

Action setup(CLI::App& sub, const Globals& globals) {
  auto opt = std::make_shared<synth::SynthOptions>();
  std::string presets, types;
  for (const auto& p : ModelConfig::preset_names()) presets += (presets.empty() ? "" : ", ") + p;
  for (const auto& t : synth::type_names()) types += (types.empty() ? "" : ", ") + t;
  sub.add_option("--preset", opt->preset, "Model shape: " + presets)->required();
  sub.add_option("--type", opt->type, "Weight type mix (as llama-quantize makes it): " + types)->required();
  sub.add_option("--seed", opt->seed, "Random seed (same seed, same bytes)")->capture_default_str();
  sub.add_option("--layers", opt->layers, "Number of decoder blocks (-1: the preset's)")->capture_default_str();
  sub.add_option("-o,--output", opt->out_path, "Output .gguf file")->required();
  return [opt, &globals]() -> int {
    opt->threads = globals.thread_count();
    opt->progress = stderr_is_tty();
    const synth::SynthResult r = synth::synthesize(*opt);
    std::string mix;
    for (auto [type, n] : r.type_counts) mix += std::string(mix.empty() ? "" : ", ") + type_name(type) + " " + std::to_string(n);
    const bool gib = r.bytes >= (1ull << 30);
    std::printf("wrote %s: %s %s, %zu tensors (%s), %llu bytes (%.2f %s) in %.2f s (%.1f MB/s)\n", opt->out_path.c_str(),
                opt->preset.c_str(), opt->type.c_str(), r.n_tensors, mix.c_str(), static_cast<unsigned long long>(r.bytes),
                double(r.bytes) / double(gib ? 1ull << 30 : 1ull << 20), gib ? "GiB" : "MiB", r.seconds,
                r.seconds > 0 ? double(r.bytes) / 1e6 / r.seconds : 0.0);
    return 0;
  };
}

CommandRegistrar reg("synth", "Write a synthetic GLM-4.7-Flash / DeepSeek-V2-Lite shaped GGUF with random weights", &setup, 20);

}  // namespace
}  // namespace tessera::app
