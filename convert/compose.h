// Composed MLA weights (docs/FORMAT.md §7, forward.md §8): W_qk = Kb_h · Qb_nope_h stacked with
// the rope rows Qb_pe_h, and W_vo = [Wo_0·Vb_0 | Wo_1·Vb_1 | ...], computed with Eigen in
// float64 from the dequantized originals, then quantized once to the stored type.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "format/gguf.h"
#include "format/model_config.h"

namespace tessera::convert {

// --compose all|qk|vo|none.
struct ComposeSet {
  bool qk = true;
  bool vo = true;
};
// Throws Error(Usage) for another word.
ComposeSet parse_compose(std::string_view option);
// --compose auto (the default) picks what measured faster on an H200 (docs/PERFORMANCE.md, the
// grid of 2026-11-22): "all" for models with a q LoRA (GLM-4.7-Flash: W_qk reads the 768-wide cq;
// decode +4 %, prefill +23 %), "none" without one (DeepSeek-V2-Lite: W_qk would read the 2048-wide
// x, ~5x the bytes of attn_q; factored decode +4 %). Other words are returned unchanged.
std::string resolve_compose(std::string_view option, const ModelConfig& c);
// The words --composed-type accepts, exactly as spelled (the k-quants as GGUF names them):
// f32 f16 bf16 q8_0 q6_K q4_K q4_0 source.
const std::vector<std::string>& composed_type_options();
// Throws Error(Usage) naming the accepted words for another one (a case-only misspelling such as
// "q6_k" gets the right spelling in the message).
void check_composed_type_option(std::string_view option);
// The type a composed tensor is stored in: the option's type ("source": `source_type`), then
// llama.cpp's fallback if `row_len` does not fit its block: Q4_K -> Q5_0, Q5_K -> Q5_1,
// Q6_K -> Q8_0, and any 32-block type that does not fit -> F16.
GgmlType composed_storage_type(std::string_view option, GgmlType source_type, uint64_t row_len);

std::string qk_name(uint32_t layer);  // "blk.L.attn_qk.weight"
std::string vo_name(uint32_t layer);  // "blk.L.attn_vo.weight"
// The query projection the rope rows and Qb_nope come from: attn_q_b (q LoRA) or attn_q.
const GgufTensorInfo& query_tensor(const GgufFile& f, const ModelConfig& c, uint32_t layer);
// Rows of W_qk (kv_lora + rope per head) and the row length q_in; W_vo: n_embd rows of H*kv_lora.
uint64_t qk_rows(const ModelConfig& c);
uint64_t qk_row_len(const ModelConfig& c);
uint64_t vo_row_len(const ModelConfig& c);

// Dequantize rows [row0, row0+n) of a GGUF tensor into out (n x ne[0] doubles, row-major).
void dequant_rows_f64(const GgufFile& f, const GgufTensorInfo& t, uint64_t row0, uint64_t n, double* out);
// Round float64 rows to f32 and quantize each to `type` (n_rows x row_bytes(type, row_len) bytes).
void quantize_rows_f64(GgmlType type, const double* rows, uint64_t n_rows, uint64_t row_len, uint8_t* out);

// W_qk_h = Kb_h · Qb_nope_h for head h of block `layer`: out = kv_lora x q_in doubles, row-major.
void compose_qk_head(const GgufFile& f, const ModelConfig& c, uint32_t layer, uint32_t head, std::vector<double>& out);
// attn_v_b of block `layer` dequantized: H slabs of Dv x kv_lora doubles, slab-major.
std::vector<double> load_v_b(const GgufFile& f, const ModelConfig& c, uint32_t layer);
// Rows [row0, row0+n) of W_vo (n x H*kv_lora doubles, row-major) from attn_output and v_b.
void compose_vo_rows(const GgufFile& f, const ModelConfig& c, uint32_t layer, const std::vector<double>& v_b,
                     uint64_t row0, uint64_t n, std::vector<double>& out);

}  // namespace tessera::convert
