// libFuzzer entry point for the GGUF reader: any byte string must either parse (and then every
// tensor lies inside the buffer and every metadata getter is safe) or throw tessera::Error.
// Not built by default. Build and run from the repository root with clang:
//
//   clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -I. \
//       tests/fuzz/fuzz_gguf.cpp format/gguf.cpp format/gguf_writer.cpp format/metadata.cpp \
//       format/mapped_file.cpp format/quant.cpp format/quant_kquants.cpp format/file_io.cpp -o fuzz_gguf
//   mkdir -p fuzz-corpus && ./fuzz_gguf fuzz-corpus -max_len=4096
//
// Seed the corpus with small valid files (e.g. written by tests/format) for faster coverage.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "format/error.h"
#include "format/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const tessera::GgufFile f = tessera::GgufFile::from_memory(std::span<const uint8_t>(data, size), "fuzz");
    uint64_t checksum = 0;
    for (const tessera::GgufTensorInfo& t : f.tensors()) {
      if (f.data_offset() + t.offset + t.nbytes > size) std::abort();  // the reader's contract
      if (t.nbytes) checksum += f.tensor_data(t)[t.nbytes - 1];
    }
    for (const tessera::GgufKV& kv : f.metadata().entries()) {
      try {
        (void)f.metadata().get_int_array(kv.key);
      } catch (const tessera::Error&) {
      }
    }
    return int(checksum & 0);
  } catch (const tessera::Error& e) {
    if (e.kind() != tessera::ErrorKind::BadInput) std::abort();
    return 0;
  }
}
