// The `tessera` executable: git-style subcommands, one file each (app/cmd_<name>.cpp).
// A command file registers itself with a static CommandRegistrar; main.cpp builds the CLI11 app
// from the registry. Only commands that fully work are registered.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tessera::app {

struct Globals {
  int verbose = 0;       // -v / --verbose (repeatable)
  unsigned threads = 0;  // --threads N (0 = all hardware threads)
  unsigned thread_count() const;  // threads, or hardware_concurrency when 0
};

// Runs after parsing; returns the process exit code (0 ok). Throw tessera::Error for failures.
using Action = std::function<int()>;
// Adds the subcommand's options to `sub` and returns its action. Options should be bound to
// storage the action owns (e.g. a shared_ptr<Options> captured by the lambda).
using Setup = Action (*)(CLI::App& sub, const Globals& globals);

struct CommandInfo {
  const char* name;
  const char* description;
  Setup setup;
  int order;  // position in --help
};

std::vector<CommandInfo>& command_registry();

struct CommandRegistrar {
  CommandRegistrar(const char* name, const char* description, Setup setup, int order) {
    command_registry().push_back({name, description, setup, order});
  }
};

// True when stderr is a terminal (progress bars draw only then).
bool stderr_is_tty();

}  // namespace tessera::app
