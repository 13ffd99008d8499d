// tessera verify ORIGINAL.gguf PACKED.tsr [-v]
// Proves a packed file equals its source: bytes of every re-laid-out tensor, composed-weight
// errors per head, all checksums, metadata and tokenizer. Exit 0 only if every check passes,
// 2 otherwise. Logic: convert/verify.h.
#include <cstdio>
#include <memory>

#include "app/cli.h"
#include "convert/verify.h"

namespace tessera::app {
namespace {

Action setup(CLI::App& sub, const Globals& globals) {
  auto opt = std::make_shared<convert::VerifyOptions>();
  auto threads = std::make_shared<unsigned>(0);
  auto all = std::make_shared<bool>(false);
  sub.add_option("original", opt->original_path, "The source .gguf")->required();
  sub.add_option("packed", opt->packed_path, "The packed .tsr made from it")->required();
  sub.add_option("--threads", *threads, "Threads (default: the global --threads, else all)");
  sub.add_flag("--all", *all, "List every check, not only the failures");
  return [opt, threads, all, &globals]() -> int {
    opt->threads = *threads ? *threads : globals.thread_count();
    opt->progress = stderr_is_tty();
    const convert::VerifyReport r = convert::verify_packed(*opt);
    std::printf("verify %s against %s\n%s", opt->packed_path.c_str(), opt->original_path.c_str(),
                r.table(*all || globals.verbose > 0).c_str());
    return r.ok() ? 0 : 2;
  };
}

CommandRegistrar reg("verify", "Check a packed .tsr against its original GGUF (bytes, composed error, checksums, metadata)",
                     &setup, 40);

}  // namespace
}  // namespace tessera::app
