// `tessera synth`: synthetic deepseek2 GGUF files with the real tensor shapes, metadata and
// llama-quantize type mix (../shared/spec/gguf.md §10), filled with random but numerically sane
// weights. They stand in for the real GLM-4.7-Flash / DeepSeek-V2-Lite files (which we do not
// have) in every test and benchmark.
//
// Usage:
//   tessera::synth::synthesize({"tiny", "q4_k_m", /*seed*/ 7, /*layers*/ -1, "/tmp/tiny.gguf"});
//
// Determinism: the bytes of a file depend only on (preset, type, layers, seed, generation mode):
// every chunk of rows draws from its own counter-based random stream seeded by
// (seed, tensor name, chunk index), so the thread count never changes the output, and a tensor's
// values do not depend on how many layers the file has.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "format/model_config.h"
#include "format/quant.h"

namespace tessera::synth {

// How weight values are produced for quantized tensors.
enum class Generation {
  // Floats everywhere for small models; direct quantized blocks (see Blocks) for quantized
  // tensors of models with more than kDirectBlocksMinParams parameters (the full-size presets),
  // where quantizing ~30 G floats with the K-quant reference search would take many minutes.
  Auto,
  // Draw random floats, then quantize_row() them: realistic quantization error (small presets).
  Floats,
  // Draw quantized blocks directly: per block a random fp16 scale in a sane range and random
  // integer levels from a discretized normal distribution; same element RMS as Floats.
  // Types without a direct drawer (Q4_1, Q5_1, Q5_K) still go through Floats.
  Blocks,
};
constexpr uint64_t kDirectBlocksMinParams = 1'000'000'000;

// Field order is part of the API (callers use positional aggregate initialization).
struct SynthOptions {
  std::string preset;     // ModelConfig::preset name: glm47flash, ds2lite, tiny, tiny-lite
  std::string type;       // f32 f16 bf16 q8_0 q4_0 q4_k_m (see type_names())
  uint64_t seed = 1;
  int layers = -1;        // -1: the preset's n_layer; else n_layer (>= leading dense + 1 when the
                          // preset has MoE layers); vocabulary and widths stay the preset's
  std::string out_path;   // destination .gguf (written atomically by GgufWriter)
  unsigned threads = 0;   // 0: all hardware threads
  bool progress = false;  // draw a progress bar on stderr (callers pass "stderr is a TTY")
  Generation generation = Generation::Auto;
};

struct SynthResult {
  uint64_t bytes = 0;      // file size
  size_t n_tensors = 0;
  double seconds = 0;      // wall time of the whole synthesis (vocab, weights, fsync)
  std::vector<std::pair<GgmlType, size_t>> type_counts;  // tensors per type, ascending type id
};

// Accepted --type names, in the order listed in the help text.
const std::vector<std::string>& type_names();
// general.file_type (llama_ftype) of a --type: f32 0, f16 1, q4_0 2, q8_0 7, q4_k_m 15, bf16 32.
// Throws Error(Usage) for an unknown type name.
uint32_t file_type(std::string_view type);

// The type mix rule (gguf.md §10, llama.cpp llama-quant.cpp without imatrix or overrides): the
// ggml type tensor `spec` of model `config` gets in a file of --type `type`.
// - 1-D tensors, norms, ffn_gate_inp, exp_probs_b (anything not "*weight"): F32 always.
// - f32 / f16 / bf16 / q8_0: every other tensor at that type.
// - q4_0: Q4_0, except output.weight Q6_K.
// - q4_k_m: Q4_K, except output Q6_K; ffn_down* Q6_K where use_more_bits(layer, n_layer);
//   attn_kv_b (legacy files only) Q6_K where use_more_bits, Q8_0 when n_expert == 8;
//   attn_output Q5_K when n_expert == 8 (the tiny presets). layer / n_layer = block index / count.
// - Shape fallbacks when ne0 is not a multiple of the block: output -> Q8_0 when ne0 is not a
//   multiple of the base type's block; Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0; then F16 when
//   even 32 does not divide ne0 (also for q4_0 / q8_0 bases, where llama.cpp would refuse).
// Throws Error(Usage) for an unknown type name.
GgmlType tensor_type(const ModelConfig& config, const TensorSpec& spec, std::string_view type);

// One tensor of a synthetic file: what expected_tensors() says plus the chosen type and size.
struct PlannedTensor {
  TensorSpec spec;
  GgmlType type = GgmlType::F32;
  uint64_t nbytes = 0;  // row_bytes(type, ne0) * rows
};

// Everything about a synthetic file except the bytes: config (with --layers applied), tensors in
// file order with their types, and the tensor-data size.
struct Plan {
  std::string preset;
  std::string type;
  ModelConfig config;
  std::vector<PlannedTensor> tensors;
  uint64_t data_bytes = 0;  // sum of nbytes, each padded to 32 (the GGUF data section)
  uint64_t n_params = 0;    // total elements over all tensors
  bool direct_blocks = false;  // Generation resolved for this plan (see Generation)
};

// Validates the options (preset, type, layers, threads not needed) and computes the plan.
// Writes nothing, builds no vocabulary: cheap even for glm47flash.
// Throws Error(Usage) naming the bad option and listing the accepted values.
Plan make_plan(const SynthOptions& options);

// Writes the synthetic GGUF to options.out_path: metadata (ModelConfig::to_metadata,
// general.file_type, general.quantization_version = 2, the synthetic tokenizer of the preset's
// flavor), then every tensor, streamed in row chunks by `threads` workers with bounded memory.
// Throws Error(Usage) for bad options, Error(Runtime) for I/O failures (no partial file is left).
SynthResult synthesize(const SynthOptions& options);

// ---- Value generation (used by synthesize; public so tests can check it directly) ----

// The distribution a tensor's elements are drawn from: mean + stddev * z, z ~ N(0, 1) (an
// Irwin-Hall approximation, |z| < 3.47) for floats; the direct block drawers reproduce mean 0
// and the same RMS. Norm weights ~ 1; matrices ~ N(0, 1/in) so a layer keeps activations O(1);
// output ~ N(0, 4/in) for logits of std ~2; router rows N(0, 1/in); exp_probs_b small.
struct ValueDist {
  float mean = 0;
  float stddev = 0;
};
ValueDist value_dist(const TensorSpec& spec);

// Rows per generation chunk of a tensor (depends only on the shape: part of the determinism
// contract, never on the thread count).
uint64_t rows_per_chunk(const PlannedTensor& t);

// Produces the bytes of chunk `chunk` of tensor `t` (rows [chunk*rows_per_chunk, ...), clipped
// to the tensor) into `dst`, which must hold that many rows of row_bytes(t.type, ne0).
// `scratch` is reused between calls (float rows for the Floats path). Returns the byte count.
uint64_t generate_chunk(const Plan& plan, const PlannedTensor& t, uint64_t chunk, uint64_t seed,
                        void* dst, std::vector<float>& scratch);

}  // namespace tessera::synth
