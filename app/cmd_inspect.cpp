// tessera inspect FILE [--json] [--max-items N]: header, metadata, tensors and totals of a model
// file. The file kind is chosen by its 4-byte magic; each kind is one row of kKinds.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "app/cli.h"
#include "format/error.h"
#include "format/gguf.h"
#include "format/inspect.h"
#include "format/mapped_file.h"
#include "format/tsr_inspect.h"

namespace tessera::app {
namespace {

struct InspectArgs {
  std::string path;
  bool json = false;
  size_t max_items = 8;
};

std::string inspect_gguf(const std::string& path, bool json, const InspectOptions& opt) {
  const GgufFile f = GgufFile::open(path);
  return json ? describe_gguf_json(f, opt) : describe_gguf_text(f, opt);
}

struct FileKind {
  const char* magic;  // first 4 bytes of the file
  const char* name;
  std::string (*describe)(const std::string& path, bool json, const InspectOptions& opt);
};

constexpr FileKind kKinds[] = {
    {"GGUF", "GGUF", &inspect_gguf},
    {"TSR1", "packed .tsr", &inspect_tsr},  // format/tsr_inspect.h
};

// The magic as printable text (non-printable bytes as \xNN).
std::string show_magic(const uint8_t* p, size_t n) {
  std::string s;
  for (size_t k = 0; k < n; ++k) {
    if (p[k] >= 0x20 && p[k] < 0x7f) {
      s += char(p[k]);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", p[k]);
      s += buf;
    }
  }
  return s;
}

int run_inspect(const InspectArgs& a) {
  std::string expected;
  for (const FileKind& k : kKinds) expected += cat(expected.empty() ? "" : " or ", "\"", k.magic, "\" (", k.name, ")");
  const MappedFile probe(a.path);
  const auto bytes = probe.bytes();
  if (bytes.size() < 4)
    bad_input(a.path, ": file is ", bytes.size(), " bytes, too short for a 4-byte magic (expected ", expected, ")");
  for (const FileKind& k : kKinds)
    if (std::memcmp(bytes.data(), k.magic, 4) == 0) {
      const std::string text = k.describe(a.path, a.json, InspectOptions{a.max_items});
      std::fwrite(text.data(), 1, text.size(), stdout);
      return 0;
    }
  bad_input(a.path, ": unknown file kind: magic \"", show_magic(bytes.data(), 4), "\" (expected ", expected, ")");
}

Action setup(CLI::App& sub, const Globals&) {
  auto args = std::make_shared<InspectArgs>();
  sub.add_option("file", args->path, "Model file (GGUF or packed .tsr)")->required();
  sub.add_flag("--json", args->json, "Print one JSON object instead of text");
  sub.add_option("--max-items", args->max_items, "Array elements shown per metadata array (0 = all)")
      ->capture_default_str();
  return [args] { return run_inspect(*args); };
}

CommandRegistrar reg("inspect", "Show a model file's header, metadata, tensors and totals", &setup, 10);

}  // namespace
}  // namespace tessera::app
