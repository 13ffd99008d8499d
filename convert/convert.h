// `tessera convert`: a deepseek2 GGUF -> a packed .tsr (docs/FORMAT.md).
//   plan (convert_plan.cpp): check the source against expected_tensors(), choose each tensor's
//        layout, compose or drop the MLA pairs, order by execution;
//   run  (convert.cpp): stream every tensor through the TsrWriter - copy, split rows, build expert
//        tiles slot by slot, compose head by head / row chunk by row chunk - on `threads` threads
//        with bounded memory; the writer renames the file into place only when complete.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "format/model_config.h"
#include "format/tsr.h"

namespace tessera::convert {

struct ConvertOptions {
  std::string in_path;                 // source .gguf
  std::string out_path;                // destination .tsr
  std::string compose = "auto";        // auto | all | qk | vo | none (auto: resolve_compose, compose.h)
  std::string composed_type = "q8_0";  // f32 | f16 | bf16 | q8_0 | q6_K | q4_K | q4_0 | source (compose.h)
  unsigned threads = 1;
  bool progress = false;               // draw a progress bar on stderr (the caller checks for a TTY)
  // Test hook: called after each tensor is completely written, with its directory index and
  // name. It may throw (an injected failure) or kill the process.
  std::function<void(size_t index, const std::string& name)> after_tensor;
};

// What each source tensor becomes.
enum class Job {
  Copy,       // PLAIN: the GGUF bytes as they are
  Split,      // SPLIT1 of the GGUF bytes
  Tile,       // MOE_TILE1 of one MoE block's expert tensors
  ComposeQk,  // composed attn_qk
  ComposeVo,  // composed attn_vo
};
const char* job_name(Job j);  // "plain", "split1", "moe_tile1", "composed qk", "composed vo"

struct PlannedTensor {
  TsrTensor entry;                        // directory entry (offset/xxh64 assigned by the writer)
  Job job = Job::Copy;
  const GgufTensorInfo* source = nullptr; // Copy / Split: the tensor copied
  uint32_t layer = 0;                     // Tile / ComposeQk / ComposeVo: the block
  uint64_t source_bytes = 0;              // GGUF bytes this entry stands for (its inputs)
};

struct ConvertPlan {
  ModelConfig config;
  std::vector<PlannedTensor> tensors;        // in file order
  std::vector<std::string> dropped;          // source tensors replaced by composed ones
  uint64_t dropped_bytes = 0;                // their GGUF bytes
  uint64_t composed_bytes = 0;               // bytes of the composed tensors
};

// Every tensor expected_tensors(c) lists is in `src` with its shape; throws Error(BadInput)
// naming the file, the tensor, and the expected and found shapes.
void check_source(const GgufFile& src, const ModelConfig& c);

// Checks the source (deepseek2 via ModelConfig::from_metadata, every expected tensor present with
// its shape, gate/up types equal for tiles) and decides every tensor. Throws Error(BadInput)
// naming the file and tensor, Error(Usage) for bad options.
ConvertPlan make_plan(const GgufFile& src, const ConvertOptions& opt);

// The .tsr metadata: all source keys + provenance and option keys (FORMAT.md §4).
Metadata packed_metadata(const GgufFile& src, const ConvertOptions& opt);
// xxh64 of the source's bytes [0, data_offset) (tessera.source.metadata_hash).
uint64_t source_metadata_hash(const GgufFile& src);

struct ConvertResult {
  std::string out_path;
  size_t n_tensors = 0;
  uint64_t source_file_bytes = 0, out_file_bytes = 0;
  uint64_t bytes_by_job[5] = {0, 0, 0, 0, 0};  // indexed by Job
  size_t tensors_by_job[5] = {0, 0, 0, 0, 0};
  uint64_t dropped_bytes = 0;    // source bytes replaced by composition
  uint64_t composed_bytes = 0;   // bytes of the composed tensors
  double seconds = 0;
  // A human-readable summary table (tensors and bytes by kind, size change, time, MB/s).
  std::string summary() const;
};

// Runs the whole conversion. Refuses (before writing anything): output path == input path,
// non-deepseek2 files, missing tensors / shape mismatches, bad options, too little disk space.
ConvertResult convert_model(const ConvertOptions& opt);

}  // namespace tessera::convert
