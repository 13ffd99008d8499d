// tessera: entry point. Exit codes: 0 ok, 1 usage error, 2 bad input file / model, 3 runtime failure.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "format/version.h"
#include "app/cli.h"
#include "format/error.h"

namespace tessera::app {

std::vector<CommandInfo>& command_registry() {
  static std::vector<CommandInfo> r;
  return r;
}

unsigned Globals::thread_count() const {
  if (threads) return threads;
  unsigned n = std::thread::hardware_concurrency();
  return n ? n : 1;
}

bool stderr_is_tty() { return isatty(STDERR_FILENO) != 0; }

}  // namespace tessera::app

int main(int argc, char** argv) {
  using namespace tessera::app;
  CLI::App app{"tessera: MLA + MoE language models (GLM-4.7-Flash, DeepSeek-V2-Lite) on any Vulkan GPU"};
  app.set_version_flag("--version", std::string("tessera ") + tessera::tessera_version() + " (" + tessera::tessera_git_commit() + ")");
  Globals globals;
  app.add_flag("-v,--verbose", globals.verbose, "More output (repeat for more)");
  app.add_option("--threads", globals.threads, "CPU threads (default: all)")->check(CLI::NonNegativeNumber);
  app.require_subcommand(1);

  auto& reg = command_registry();
  std::sort(reg.begin(), reg.end(), [](const CommandInfo& a, const CommandInfo& b) { return a.order < b.order; });
  std::vector<std::pair<CLI::App*, Action>> actions;
  for (const CommandInfo& c : reg) {
    CLI::App* sub = app.add_subcommand(c.name, c.description);
    actions.emplace_back(sub, c.setup(*sub, globals));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 1;
  }
  try {
    for (auto& [sub, action] : actions)
      if (sub->parsed()) return action();
  } catch (const tessera::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "tessera: error: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "tessera: error: %s\n", e.what());
    return 3;
  }
  return 1;
}
