// open_weights: choose the WeightSource for a model file by its magic bytes.
// (Packed .tsr files get their own branch here, next to the GGUF one.)
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "format/error.h"
#include "runtime/cpu/tsr_weights.h"
#include "runtime/cpu/weight_source.h"

namespace tessera {

std::unique_ptr<WeightSource> open_weights(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    bad_input(path, ": not a regular file (expected a model file)");
  std::ifstream in(path, std::ios::binary);
  if (!in) runtime_error(path, ": cannot open model file: ", std::strerror(errno));
  char magic[4] = {0, 0, 0, 0};
  in.read(magic, 4);
  const std::string found(magic, size_t(in.gcount()));
  if (found == "GGUF") return std::make_unique<GgufWeights>(path);
  if (found == "TSR1") return std::make_unique<TsrWeights>(path);  // packed .tsr (docs/FORMAT.md)
  std::string shown;
  for (unsigned char c : found) {
    char buf[8];
    std::snprintf(buf, sizeof buf, (c >= 0x20 && c < 0x7f) ? "%c" : "\\x%02x", c);
    shown += buf;
  }
  bad_input(path, ": unknown model file format: magic \"", shown, "\", expected \"GGUF\" (a .gguf file) or \"TSR1\" (a packed .tsr)");
}

}  // namespace tessera
