// `tessera verify ORIGINAL.gguf PACKED.tsr`: proves a packed file equals its source.
//   (a) bytes:     every re-laid-out tensor (plain, split1, each part of each expert tile) maps back
//                  to the original GGUF bytes exactly; every source tensor is present or was
//                  replaced by a composed tensor;
//   (b) composed:  per head, W_qk / W_vo recomputed in float64 from the originals by an independent
//                  plain-loop implementation; two relative Frobenius errors:
//                    composition error  = |deq(stored) - deq(quantize(recomputed))| / |recomputed|
//                                         (mistakes made before quantization: algebra, layout;
//                                         must be <= kCompositionTolerance for every type)
//                    quantization error = |deq(stored) - recomputed| / |recomputed|
//                                         (after quantization; threshold per stored type)
//   (c) checksums: header+directory and metadata (at open), every tensor's xxh64;
//   (d) metadata:  every source key/value identical and in order (tessera.* keys ignored), and
//                  the provenance keys match the given original.
//   (e) logits:    N tokens through the GPU runtime on the packed file vs the CPU reference on the
//                  original - supplied by the caller (the runtime lives above this library).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "format/quant.h"

namespace tessera::convert {

inline constexpr double kCompositionTolerance = 1e-4;
// Largest accepted quantization error (relative Frobenius, per head) of a composed tensor
// stored in type t; calibrated on synthetic models (docs/FORMAT.md §10).
double quantization_tolerance(GgmlType t);

struct VerifyRow {
  std::string check;    // "bytes", "composed", "checksum", "metadata", "logits"
  std::string subject;  // tensor name, key, or a summary subject
  bool pass = true;
  std::string detail;   // what was compared / found
};

struct VerifyReport {
  std::vector<VerifyRow> rows;
  bool ok() const;
  // Table: one summary line per check (counts), then every failing row; with `all` every row.
  std::string table(bool all) const;
};

struct VerifyOptions {
  std::string original_path;  // the source .gguf
  std::string packed_path;    // the .tsr
  unsigned threads = 1;
  bool progress = false;      // progress bar on stderr (the caller checks for a TTY)
  // Level (e), run when logits_tokens > 0 and a check is supplied (the GPU runtime registers it).
  int logits_tokens = 0;
  std::function<std::vector<VerifyRow>(const VerifyOptions&)> logits_check;
};

// Runs checks (a)-(d) (and (e) when configured). A file that fails to open (bad header,
// directory or metadata checksum, wrong version, truncation) throws Error(BadInput); every other
// finding is a row of the report.
VerifyReport verify_packed(const VerifyOptions& opt);

}  // namespace tessera::convert
