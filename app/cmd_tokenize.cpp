// `tessera tokenize MODEL -p TEXT [--ids] [--no-special]`: shows how a model's tokenizer splits
// text. Prints "id<TAB>piece" lines (piece = the token's bytes with control characters and
// invalid UTF-8 escaped), or just the ids separated by spaces with --ids.
#include <cstdio>
#include <memory>
#include <string>

#include "app/cli.h"
#include "format/gguf.h"
#include "runtime/text/tokenizer.h"
#include "runtime/text/unicode.h"

namespace tessera::app {
namespace {

struct TokenizeOptions {
  std::string model;
  std::string prompt;
  bool ids_only = false;
  bool no_special = false;
};

// Makes a token's bytes printable on one line: \n, \t, \r, other C0 bytes as \xNN, invalid UTF-8
// bytes as \xNN, backslash as "\\".
std::string escape_piece(std::string_view bytes) {
  std::string out;
  size_t pos = 0;
  char buf[8];
  while (pos < bytes.size()) {
    const size_t start = pos;
    const std::optional<char32_t> cp = text::utf8_decode(bytes, pos);
    if (!cp || *cp < 0x20 || *cp == 0x7F) {
      const auto b = static_cast<uint8_t>(bytes[start]);
      if (b == '\n') out += "\\n";
      else if (b == '\t') out += "\\t";
      else if (b == '\r') out += "\\r";
      else {
        std::snprintf(buf, sizeof buf, "\\x%02X", b);
        out += buf;
      }
      pos = start + 1;
    } else if (*cp == '\\') {
      out += "\\\\";
    } else {
      out.append(bytes.substr(start, pos - start));
    }
  }
  return out;
}

Action setup(CLI::App& sub, const Globals&) {
  auto opt = std::make_shared<TokenizeOptions>();
  sub.add_option("MODEL", opt->model, "Model file (.gguf)")->required()->check(CLI::ExistingFile);
  sub.add_option("-p,--prompt", opt->prompt, "Text to tokenize")->required();
  sub.add_flag("--ids", opt->ids_only, "Print only the token ids, separated by spaces");
  sub.add_flag("--no-special", opt->no_special,
               "Treat special-token text like <|user|> as plain text (user-defined tokens still match)");
  return [opt]() {
    const GgufFile file = GgufFile::open(opt->model);
    const text::Tokenizer tok = text::Tokenizer::from_metadata(file.metadata());
    for (const std::string& w : tok.warnings()) std::fprintf(stderr, "tessera: warning: %s\n", w.c_str());
    const std::vector<int32_t> ids = tok.encode(opt->prompt, !opt->no_special, tok.add_bos());
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (opt->ids_only) {
        out += (i ? " " : "") + std::to_string(ids[i]);
      } else {
        out += std::to_string(ids[i]) + "\t" + escape_piece(tok.token_piece(ids[i], true)) + "\n";
      }
    }
    if (opt->ids_only) out += "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  };
}

CommandRegistrar reg("tokenize", "Split text into a model's tokens", &setup, 70);

}  // namespace
}  // namespace tessera::app
