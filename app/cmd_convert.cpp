// tessera convert IN.gguf -o OUT.tsr [--compose auto|all|qk|vo|none] [--composed-type TYPE] [--threads N]
// Packs a deepseek2 GGUF into the GPU-ready .tsr format (docs/FORMAT.md) and prints a summary.
// Logic: convert/convert.h.
#include <cstdio>
#include <memory>

#include "app/cli.h"
#include "convert/compose.h"
#include "convert/convert.h"
#include "format/error.h"

namespace tessera::app {
namespace {

Action setup(CLI::App& sub, const Globals& globals) {
  auto opt = std::make_shared<convert::ConvertOptions>();
  auto threads = std::make_shared<unsigned>(0);
  sub.add_option("input", opt->in_path, "Source .gguf (GGUF arch deepseek2)")->required();
  sub.add_option("-o,--output", opt->out_path, "Destination .tsr")->required();
  sub.add_option("--compose", opt->compose,
                 "Compose MLA weights: all, qk (W_qk), vo (W_vo), none, or auto (all with a q LoRA, else none: "
                 "what measured faster overall; qk reads fewer bytes per token and decodes Q4_0 files ~3 % faster "
                 "at short contexts on an H100, prefill ~9 % slower)")
      ->check(CLI::IsMember({"auto", "all", "qk", "vo", "none"}))
      ->capture_default_str();
  sub.add_option("--composed-type", opt->composed_type,
                 "Type of the composed weights: f32, f16, bf16, q8_0, q6_K, q4_K, q4_0 or source (the originals' "
                 "type); spelled exactly so. A row length that is not a multiple of 256 stores q6_K as q8_0 and "
                 "q4_K as q5_0")
      ->check(CLI::Validator(
          [](std::string& word) -> std::string {
            try {  // the library's message: the accepted words, and the GGUF spelling of a near miss
              convert::check_composed_type_option(word);
              return {};
            } catch (const Error& e) {
              return e.what();
            }
          },
          "TYPE"))
      ->capture_default_str();
  sub.add_option("--threads", *threads, "Threads (default: the global --threads, else all)");
  return [opt, threads, &globals]() -> int {
    opt->threads = *threads ? *threads : globals.thread_count();
    opt->progress = stderr_is_tty();
    const convert::ConvertResult r = convert::convert_model(*opt);
    std::printf("wrote %s: %zu tensors\n%s", r.out_path.c_str(), r.n_tensors, r.summary().c_str());
    return 0;
  };
}

CommandRegistrar reg("convert", "Pack a deepseek2 GGUF into a GPU-ready .tsr file (expert tiles, split blocks, composed MLA)",
                     &setup, 30);

}  // namespace
}  // namespace tessera::app
