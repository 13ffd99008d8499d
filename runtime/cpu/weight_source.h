// Where the CPU reference gets its weights: a read-only, row-addressed view of a model file.
//
// The CPU forward never holds a whole matrix in float: it asks for a block of rows, dequantized
// to f32, computes with it and drops it. Any container can feed it by implementing WeightSource:
// GgufWeights (below) reads a GGUF directly; the packed .tsr reader (runtime/cpu/tsr_weights.h)
// un-tiles its layouts on the fly. open_weights(path) picks the right one for a file.
//
// Rows: a tensor with ne = {ne0, ne1, ne2, ne3} (GGUF order, ne0 contiguous) has
// ne1*ne2*ne3 rows of ne0 elements; rows of a 3-D tensor are numbered slab-major:
// row = slab*ne1 + r (slab = expert or head). A 1-D tensor is one row.
//
// Composed tensors (present only in packed files, written by `tessera convert`, forward.md §8):
//   blk.L.attn_qk.weight  ne {q_in, H*(kv_lora+rope)}: per head h, rows h*(kv_lora+rope) + 0..kv_lora-1
//                         are W_qk_h = Kb_h·Qb_nope_h, the next `rope` rows are Qb_pe_h
//                         (q_in = q_lora_rank, or n_embd without q LoRA). Replaces attn_q_b/attn_q
//                         and attn_k_b for the query.
//   blk.L.attn_vo.weight  ne {H*kv_lora, n_embd}: W_vo = [Wo_0·Vb_0 | Wo_1·Vb_1 | ...].
//                         Replaces attn_v_b and attn_output.
// Both are optional and independent; CpuModel uses them when has() says they are there.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "format/gguf.h"
#include "format/quant.h"

namespace tessera {

struct TensorDesc {
  std::string name;
  GgmlType type = GgmlType::F32;          // storage type of the original data
  std::array<uint64_t, 4> ne{1, 1, 1, 1};  // GGUF order; unused trailing dims are 1

  uint64_t row_elems() const { return ne[0]; }
  uint64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  uint64_t n_elements() const { return ne[0] * n_rows(); }
  std::string shape_string() const;  // "{2048, 768}" (trailing 1-dims after the first omitted)
};

class WeightSource {
 public:
  virtual ~WeightSource();

  // The file's metadata (hyperparameters, tokenizer, chat template). Lives as long as the source.
  virtual const Metadata& metadata() const = 0;
  // True if the file holds a tensor of that name.
  virtual bool has(std::string_view name) const = 0;
  // Type and shape of a tensor. Throws Error(BadInput) naming the tensor and the file if absent.
  virtual TensorDesc desc(std::string_view name) const = 0;
  // Dequantize `n_rows` rows starting at row `row0` into dst (n_rows * ne[0] floats, row-major).
  // Throws Error(BadInput) if the tensor is absent or [row0, row0+n_rows) exceeds its rows.
  // Must be safe to call concurrently from several threads (the forward pass does).
  virtual void read_rows(std::string_view name, uint64_t row0, uint64_t n_rows, float* dst) const = 0;

  // Convenience: the whole tensor as floats (for small tensors: norms, biases, routers).
  std::vector<float> read_all(std::string_view name) const;
  // desc(name), checked against an expected shape (trailing dims of `expected` omitted = 1);
  // throws Error(BadInput) naming the tensor, the file, the expected and the found shape.
  TensorDesc require(std::string_view name, std::vector<uint64_t> expected) const;
};

// A GGUF file read in place: dequantize_row on the mmapped bytes.
class GgufWeights : public WeightSource {
 public:
  // Opens and validates the file (GgufFile::open). Throws Error(BadInput/Runtime).
  explicit GgufWeights(const std::string& path);
  explicit GgufWeights(GgufFile file);

  const Metadata& metadata() const override { return file_.metadata(); }
  bool has(std::string_view name) const override { return file_.find_tensor(name) != nullptr; }
  TensorDesc desc(std::string_view name) const override;
  void read_rows(std::string_view name, uint64_t row0, uint64_t n_rows, float* dst) const override;

  const GgufFile& file() const { return file_; }

 private:
  GgufFile file_;
};

// Opens a model file with the WeightSource that fits its contents (chosen by the file's magic
// bytes: "GGUF" -> GgufWeights). Throws Error(BadInput) naming the path and the magic found for
// an unknown format, Error(Runtime) if the file cannot be read.
std::unique_ptr<WeightSource> open_weights(const std::string& path);

}  // namespace tessera
