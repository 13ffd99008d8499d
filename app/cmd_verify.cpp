// tessera verify ORIGINAL.gguf PACKED.tsr [--logits N [--device N]] [--all] [-v]
// Proves a packed file equals its source: bytes of every re-laid-out tensor, composed-weight
// errors per head, all checksums, metadata and tokenizer. Exit 0 only if every check passes,
// 2 otherwise. Logic: convert/verify.h.
#include <cstdio>
#include <memory>

#include "app/cli.h"
#include "convert/verify.h"
#include "runtime/model/verify_logits.h"

namespace tessera::app {
namespace {

Action setup(CLI::App& sub, const Globals& globals) {
  auto opt = std::make_shared<convert::VerifyOptions>();
  auto threads = std::make_shared<unsigned>(0);
  auto all = std::make_shared<bool>(false);
  auto device = std::make_shared<int>(-1);
  sub.add_option("original", opt->original_path, "The source .gguf")->required();
  sub.add_option("packed", opt->packed_path, "The packed .tsr made from it")->required();
  sub.add_option("--threads", *threads, "Threads (default: the global --threads, else all)");
  sub.add_flag("--all", *all, "List every check, not only the failures");
  sub.add_option("--logits", opt->logits_tokens,
                 "Also run N tokens through the Vulkan runtime on PACKED and the CPU reference on ORIGINAL "
                 "and compare the logits (max |d|, KL, top-1)")->check(CLI::NonNegativeNumber);
  sub.add_option("--device", *device, "Vulkan device for --logits (tessera devices)");
  return [opt, threads, all, device, &globals]() -> int {
    opt->threads = *threads ? *threads : globals.thread_count();
    if (opt->logits_tokens > 0) {
      const int dev = *device;
      opt->logits_check = [dev](const convert::VerifyOptions& o) { return model::verify_logits(o, dev); };
    }
    opt->progress = stderr_is_tty();
    const convert::VerifyReport r = convert::verify_packed(*opt);
    std::printf("verify %s against %s\n%s", opt->packed_path.c_str(), opt->original_path.c_str(),
                r.table(*all || globals.verbose > 0).c_str());
    return r.ok() ? 0 : 2;
  };
}

CommandRegistrar reg("verify", "Check a packed .tsr against its original GGUF (bytes, composed error, checksums, metadata, logits)",
                     &setup, 40);

}  // namespace
}  // namespace tessera::app
