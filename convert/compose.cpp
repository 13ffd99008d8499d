// Composed MLA weights with Eigen in float64 (see compose.h).
#include "convert/compose.h"

#include <Eigen/Dense>

#include <algorithm>
#include <cctype>

#include "format/error.h"
#include "format/quant.h"

namespace tessera::convert {

namespace {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapD = Eigen::Map<MatD>;
using CMapD = Eigen::Map<const MatD>;

bool is_float(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

}  // namespace

std::string resolve_compose(std::string_view option, const ModelConfig& c) {
  if (option != "auto") return std::string(option);
  return c.q_lora_rank ? "all" : "none";
}

ComposeSet parse_compose(std::string_view o) {
  if (o == "all") return {true, true};
  if (o == "qk") return {true, false};
  if (o == "vo") return {false, true};
  if (o == "none") return {false, false};
  usage_error("--compose '", o, "': expected all, qk, vo or none");
}

const std::vector<std::string>& composed_type_options() {
  static const std::vector<std::string> words = {"f32", "f16", "bf16", "q8_0", "q6_K", "q4_K", "q4_0", "source"};
  return words;
}

void check_composed_type_option(std::string_view o) {
  const std::vector<std::string>& words = composed_type_options();
  std::string list, hint;
  for (size_t i = 0; i < words.size(); ++i) {
    if (o == words[i]) return;
    list += cat(i == 0 ? "" : i + 1 == words.size() ? " or " : ", ", words[i]);
    if (o.size() == words[i].size() &&
        std::equal(o.begin(), o.end(), words[i].begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
        }))
      hint = cat(" (types are spelled as GGUF names them: '", words[i], "')");
  }
  usage_error("--composed-type '", o, "': expected ", list, hint);
}

GgmlType composed_storage_type(std::string_view option, GgmlType source_type, uint64_t row_len) {
  check_composed_type_option(option);
  GgmlType t = option == "source" ? source_type : *type_from_name(option);
  while (!is_float(t) && row_len % type_info(t).block_elems != 0) {
    switch (t) {
      case GgmlType::Q4_K: t = GgmlType::Q5_0; break;
      case GgmlType::Q5_K: t = GgmlType::Q5_1; break;
      case GgmlType::Q6_K: t = GgmlType::Q8_0; break;
      default: t = GgmlType::F16; break;
    }
  }
  return t;
}

std::string qk_name(uint32_t layer) { return blk(layer, "attn_qk.weight"); }
std::string vo_name(uint32_t layer) { return blk(layer, "attn_vo.weight"); }

const GgufTensorInfo& query_tensor(const GgufFile& f, const ModelConfig& c, uint32_t layer) {
  return f.require_tensor(blk(layer, c.q_lora_rank ? "attn_q_b.weight" : "attn_q.weight"));
}

uint64_t qk_rows(const ModelConfig& c) { return uint64_t(c.n_head) * (c.kv_lora_rank + c.n_rot); }
uint64_t qk_row_len(const ModelConfig& c) { return c.q_lora_rank ? c.q_lora_rank : c.n_embd; }
uint64_t vo_row_len(const ModelConfig& c) { return uint64_t(c.n_head) * c.kv_lora_rank; }

void dequant_rows_f64(const GgufFile& f, const GgufTensorInfo& t, uint64_t row0, uint64_t n, double* out) {
  if (row0 > t.n_rows() || n > t.n_rows() - row0)
    bad_input(f.path(), ": tensor '", t.name, "': rows [", row0, ", ", row0 + n, ") exceed its ", t.n_rows(), " rows");
  const uint64_t len = t.row_elems(), rb = row_bytes(t.type, len);
  std::vector<float> row(len);
  for (uint64_t r = 0; r < n; ++r) {
    dequantize_row(t.type, f.tensor_data(t) + (row0 + r) * rb, row.data(), int64_t(len));
    for (uint64_t k = 0; k < len; ++k) out[r * len + k] = row[k];
  }
}

void quantize_rows_f64(GgmlType type, const double* rows, uint64_t n_rows, uint64_t row_len, uint8_t* out) {
  const uint64_t rb = row_bytes(type, row_len);
  std::vector<float> row(row_len);
  for (uint64_t r = 0; r < n_rows; ++r) {
    for (uint64_t k = 0; k < row_len; ++k) row[k] = float(rows[r * row_len + k]);
    quantize_row(type, row.data(), out + r * rb, int64_t(row_len));
  }
}

void compose_qk_head(const GgufFile& f, const ModelConfig& c, uint32_t layer, uint32_t head, std::vector<double>& out) {
  const uint64_t R = c.kv_lora_rank, Dn = c.n_nope, q_in = qk_row_len(c);
  // Kb_h: slab h of attn_k_b = kv_lora x nope rows of `nope` elements.
  const GgufTensorInfo& kb = f.require_tensor(blk(layer, "attn_k_b.weight"));
  std::vector<double> kb_h(R * Dn), qn_h(Dn * q_in);
  dequant_rows_f64(f, kb, uint64_t(head) * R, R, kb_h.data());
  // Qb_nope_h: rows h*(nope+rope) + 0..nope-1 of the query projection.
  dequant_rows_f64(f, query_tensor(f, c, layer), uint64_t(head) * c.n_qk(), Dn, qn_h.data());
  out.assign(R * q_in, 0.0);
  MapD(out.data(), R, q_in).noalias() = CMapD(kb_h.data(), R, Dn) * CMapD(qn_h.data(), Dn, q_in);
}

std::vector<double> load_v_b(const GgufFile& f, const ModelConfig& c, uint32_t layer) {
  const GgufTensorInfo& vb = f.require_tensor(blk(layer, "attn_v_b.weight"));
  std::vector<double> v(vb.n_elements());
  dequant_rows_f64(f, vb, 0, vb.n_rows(), v.data());
  return v;
}

void compose_vo_rows(const GgufFile& f, const ModelConfig& c, uint32_t layer, const std::vector<double>& v_b,
                     uint64_t row0, uint64_t n, std::vector<double>& out) {
  const uint64_t H = c.n_head, Dv = c.n_v, R = c.kv_lora_rank;
  const GgufTensorInfo& wo = f.require_tensor(blk(layer, "attn_output.weight"));  // n_embd rows of H*Dv
  std::vector<double> wo_rows(n * H * Dv);
  dequant_rows_f64(f, wo, row0, n, wo_rows.data());
  out.assign(n * H * R, 0.0);
  const CMapD wo_m(wo_rows.data(), n, H * Dv);
  MapD out_m(out.data(), n, H * R);
  for (uint64_t h = 0; h < H; ++h)
    out_m.middleCols(h * R, R).noalias() = wo_m.middleCols(h * Dv, Dv) * CMapD(v_b.data() + h * Dv * R, Dv, R);
}

}  // namespace tessera::convert
