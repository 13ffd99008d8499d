// `tessera verify` (see verify.h). The composed-weight recomputation here is deliberately a
// separate, plain-loop implementation (no Eigen), so it checks the converter rather than repeating it.
#include "convert/verify.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include "convert/compose.h"
#include "convert/convert.h"
#include "convert/convert_parallel.h"
#include "convert/convert_progress.h"
#include "format/error.h"
#include "format/gguf.h"
#include "format/model_config.h"
#include "format/tsr.h"

namespace tessera::convert {

double quantization_tolerance(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return 1e-6;
    case GgmlType::F16: return 1e-3;
    case GgmlType::BF16: return 8e-3;
    case GgmlType::Q8_0: return 1e-2;
    case GgmlType::Q6_K: return 3e-2;
    case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q5_K: return 6e-2;
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q4_K: return 0.15;
    default: return 0.0;
  }
}

bool VerifyReport::ok() const {
  for (const VerifyRow& r : rows)
    if (!r.pass) return false;
  return true;
}

std::string VerifyReport::table(bool all) const {
  std::map<std::string, std::pair<size_t, size_t>> counts;  // check -> (passed, failed)
  std::vector<std::string> order;
  for (const VerifyRow& r : rows) {
    if (!counts.count(r.check)) order.push_back(r.check);
    (r.pass ? counts[r.check].first : counts[r.check].second)++;
  }
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line, "  %-10s %8s %8s  %s\n", "check", "passed", "failed", "result");
  s += line;
  for (const std::string& c : order) {
    const auto [p, f] = counts[c];
    std::snprintf(line, sizeof line, "  %-10s %8zu %8zu  %s\n", c.c_str(), p, f, f ? "FAIL" : "ok");
    s += line;
  }
  bool header = false;
  for (const VerifyRow& r : rows) {
    if (r.pass && !all) continue;
    if (!header) {
      s += all ? "\n  details:\n" : "\n  failures:\n";
      header = true;
    }
    s += cat("  ", r.pass ? "ok   " : "FAIL ", r.check, "  ", r.subject, ": ", r.detail, "\n");
  }
  s += ok() ? "\n  result: PASS\n" : "\n  result: FAIL\n";
  return s;
}

namespace {

struct Ctx {
  const GgufFile& src;
  const TsrFile& tsr;
  const ModelConfig& cfg;
  unsigned threads;
  ProgressBar& bar;
  std::mutex mu;
  VerifyReport report;

  void add(std::string check, std::string subject, bool pass, std::string detail) {
    std::lock_guard<std::mutex> lock(mu);
    report.rows.push_back({std::move(check), std::move(subject), pass, std::move(detail)});
  }
};

// First differing byte of two equal-length ranges, or -1.
int64_t first_difference(const uint8_t* a, const uint8_t* b, uint64_t n) {
  if (std::memcmp(a, b, n) == 0) return -1;
  for (uint64_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return int64_t(i);
  return -1;
}

// (a) The zero padding a layout leaves inside a tensor (so every byte of it is accounted for).
bool padding_is_zero(Ctx& cx, const TsrTensor& t) {
  const uint8_t* b = cx.tsr.tensor_bytes(t).data();
  for (const TsrSpan& s : t.padding())
    for (uint64_t i = 0; i < s.size; ++i)
      if (b[s.offset + i] != 0) {
        cx.add("bytes", t.name, false, cat("padding byte ", s.offset + i, " is ", int(b[s.offset + i]), ", expected 0"));
        return false;
      }
  return true;
}

// (a) A plain or split1 tensor against its same-named source tensor.
void check_copied(Ctx& cx, const TsrTensor& t) {
  const GgufTensorInfo* s = cx.src.find_tensor(t.name);
  if (!s) return cx.add("bytes", t.name, false, "no tensor of this name in the original");
  if (s->type != t.type || s->ne != t.ne)
    return cx.add("bytes", t.name, false,
                  cat("type/shape ", type_name(t.type), " ", t.shape_string(), " but the original has ",
                      type_name(s->type), " ", s->shape_string()));
  const uint8_t* orig = cx.src.tensor_data(*s);
  const uint8_t* packed = cx.tsr.tensor_bytes(t).data();
  if (t.layout == TsrLayout::Plain) {
    const int64_t d = first_difference(orig, packed, s->nbytes);
    cx.bar.add(s->nbytes);
    return cx.add("bytes", t.name, d < 0, d < 0 ? cat("plain, ", s->nbytes, " bytes identical") : cat("byte ", d, " differs"));
  }
  const Split1Geometry g = t.split1();
  const uint64_t rb = g.gguf_row_bytes();
  std::vector<uint8_t> rows(rb);
  for (uint64_t r = 0; r < g.rows; ++r) {
    split1_get_rows(g, packed, r, 1, rows.data());
    const int64_t d = first_difference(orig + r * rb, rows.data(), rb);
    if (d >= 0) return cx.add("bytes", t.name, false, cat("split1 row ", r, " byte ", d, " differs after un-splitting"));
  }
  cx.bar.add(s->nbytes);
  cx.add("bytes", t.name, true, cat("split1, ", g.rows, " rows identical after un-splitting"));
}

// (a) Every part of every slot of an expert tile against the six source tensors.
void check_tile(Ctx& cx, const TsrTensor& t) {
  const MoeTileGeometry g = t.moe_tile();
  const int32_t L = t.layer;
  const uint8_t* tile = cx.tsr.tensor_bytes(t).data();
  struct Part { MoePart part; const char* routed; const char* shared; };
  const Part parts[3] = {{MoePart::Gate, "ffn_gate_exps.weight", "ffn_gate_shexp.weight"},
                         {MoePart::Up, "ffn_up_exps.weight", "ffn_up_shexp.weight"},
                         {MoePart::Down, "ffn_down_exps.weight", "ffn_down_shexp.weight"}};
  for (bool shared : {false, true}) {
    if (shared && !g.has_shared()) continue;
    for (const Part& p : parts) {
      const std::string name = blk(uint32_t(L), shared ? p.shared : p.routed);
      const GgufTensorInfo* s = cx.src.find_tensor(name);
      const GgmlType want_type = p.part == MoePart::Down ? (shared ? g.shared_down_type : g.down_type)
                                                         : (shared ? g.shared_gateup_type : g.gateup_type);
      if (!s || s->type != want_type) {
        cx.add("bytes", name, false, cat("tile ", t.name, " holds ", type_name(want_type), " but the original has ",
                                         s ? type_name(s->type) : "no such tensor"));
        continue;
      }
      const uint64_t w = g.width(shared ? g.n_expert : 0);
      const std::array<uint64_t, 4> want_ne = p.part == MoePart::Down ? std::array<uint64_t, 4>{w, g.n_embd, shared ? 1 : g.n_expert, 1}
                                                                       : std::array<uint64_t, 4>{g.n_embd, w, shared ? 1 : g.n_expert, 1};
      if (s->ne != want_ne) {
        cx.add("bytes", name, false, cat("shape ", s->shape_string(), " does not match the tile ", t.name));
        continue;
      }
      const uint64_t rb = row_bytes(s->type, s->ne[0]);
      const uint64_t rows_per_slot = p.part == MoePart::Down ? g.n_embd : w;
      std::vector<uint8_t> rows(rows_per_slot * rb);
      std::string failure;
      const uint32_t first = shared ? g.n_expert : 0, last = shared ? g.n_expert + 1 : g.n_expert;
      for (uint32_t slot = first; slot < last && failure.empty(); ++slot) {
        moe_tile_get_rows(g, tile, slot, p.part, 0, rows_per_slot, rows.data());
        const uint64_t at = shared ? 0 : uint64_t(slot) * rows_per_slot * rb;
        const int64_t d = first_difference(cx.src.tensor_data(*s) + at, rows.data(), rows.size());
        if (d >= 0)
          failure = cat(shared ? "shared expert" : cat("expert ", slot), " row ", uint64_t(d) / rb, " byte ",
                        uint64_t(d) % rb, " differs after un-tiling ", t.name);
      }
      cx.bar.add(s->nbytes);
      cx.add("bytes", name, failure.empty(), failure.empty() ? cat("un-tiled from ", t.name, ", identical") : failure);
    }
  }
}

// Plain-loop float64 product: out (m x n) = a (m x k) * b (k x n), all row-major, a's row
// stride lda, out's ldo. Four output rows at a time so each row of b is read once per four rows;
// contiguous inner loops for the compiler to vectorize.
void matmul(const double* a, uint64_t lda, const double* b, uint64_t m, uint64_t k, uint64_t n, double* out,
            uint64_t ldo) {
  for (uint64_t i = 0; i < m; i += 4) {
    const uint64_t rows = std::min<uint64_t>(4, m - i);
    double* __restrict o[4];
    for (uint64_t r = 0; r < 4; ++r) o[r] = out + (i + std::min(r, rows - 1)) * ldo;
    for (uint64_t r = 0; r < rows; ++r) std::fill(o[r], o[r] + n, 0.0);
    for (uint64_t p = 0; p < k; ++p) {
      const double* __restrict br = b + p * n;
      if (rows == 4) {
        const double a0 = a[i * lda + p], a1 = a[(i + 1) * lda + p], a2 = a[(i + 2) * lda + p], a3 = a[(i + 3) * lda + p];
        double* __restrict o0 = o[0];
        double* __restrict o1 = o[1];
        double* __restrict o2 = o[2];
        double* __restrict o3 = o[3];
        for (uint64_t j = 0; j < n; ++j) {
          const double bv = br[j];
          o0[j] += a0 * bv;
          o1[j] += a1 * bv;
          o2[j] += a2 * bv;
          o3[j] += a3 * bv;
        }
      } else {
        for (uint64_t r = 0; r < rows; ++r) {
          const double av = a[(i + r) * lda + p];
          double* __restrict orow = o[r];
          for (uint64_t j = 0; j < n; ++j) orow[j] += av * br[j];
        }
      }
    }
  }
}

// Dequantize GGUF-layout rows of type t into doubles.
std::vector<double> dequant_bytes(GgmlType t, const uint8_t* rows, uint64_t n_rows, uint64_t len) {
  std::vector<double> out(n_rows * len);
  std::vector<float> f(len);
  const uint64_t rb = row_bytes(t, len);
  for (uint64_t r = 0; r < n_rows; ++r) {
    dequantize_row(t, rows + r * rb, f.data(), int64_t(len));
    for (uint64_t k = 0; k < len; ++k) out[r * len + k] = f[k];
  }
  return out;
}

// GGUF-layout bytes of rows [row0, row0+n) of a plain or split1 packed tensor.
std::vector<uint8_t> packed_rows(const TsrFile& f, const TsrTensor& t, uint64_t row0, uint64_t n) {
  const uint64_t rb = row_bytes(t.type, t.ne[0]);
  std::vector<uint8_t> out(n * rb);
  const uint8_t* b = f.tensor_bytes(t).data();
  if (t.layout == TsrLayout::Plain) std::memcpy(out.data(), b + row0 * rb, out.size());
  else split1_get_rows(t.split1(), b, row0, n, out.data());
  return out;
}

struct HeadErrors {
  double composition = 0, quantization = 0;
};

// The two errors of one head block: `ref` = float64 recomputation (n values), `ideal` = the bytes
// the spec says to store for it, `stored` = the bytes stored (both GGUF-layout rows of type t).
HeadErrors head_errors(const std::vector<double>& ref, GgmlType t, const uint8_t* ideal, const uint8_t* stored,
                       uint64_t n_rows, uint64_t len) {
  const std::vector<double> di = dequant_bytes(t, ideal, n_rows, len), ds = dequant_bytes(t, stored, n_rows, len);
  double norm = 0, ec = 0, eq = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    norm += ref[i] * ref[i];
    ec += (ds[i] - di[i]) * (ds[i] - di[i]);
    eq += (ds[i] - ref[i]) * (ds[i] - ref[i]);
  }
  norm = std::sqrt(std::max(norm, 1e-300));
  return {std::sqrt(ec) / norm, std::sqrt(eq) / norm};
}

void report_composed(Ctx& cx, const TsrTensor& t, const std::vector<HeadErrors>& heads) {
  const double tol = quantization_tolerance(t.type);
  double max_c = 0, max_q = 0;
  size_t worst = 0;
  for (size_t h = 0; h < heads.size(); ++h) {
    max_c = std::max(max_c, heads[h].composition);
    if (heads[h].quantization > max_q) max_q = heads[h].quantization, worst = h;
  }
  const bool pass = max_c <= kCompositionTolerance && max_q <= tol;
  char d[256];
  std::snprintf(d, sizeof d, "%s, %zu heads: composition err max %.2e (<= %.0e), quantization err max %.3e (<= %.1e, head %zu)",
                type_name(t.type), heads.size(), max_c, kCompositionTolerance, max_q, tol, worst);
  cx.add("composed", t.name, pass, d);
}

// (b) The stored type is the one the recorded --composed-type gives (FORMAT.md §7).
void check_composed_type(Ctx& cx, const TsrTensor& t, GgmlType source_type, uint64_t row_len) {
  const std::string option = cx.tsr.metadata().get_string("tessera.composed_type").value_or("?");
  std::string why;
  try {
    const GgmlType want = composed_storage_type(option, source_type, row_len);
    if (want != t.type) why = cat("stored as ", type_name(t.type), " but --composed-type ", option, " gives ", type_name(want));
  } catch (const Error& e) {
    why = cat("tessera.composed_type: ", e.what());
  }
  if (!why.empty()) cx.add("composed", t.name, false, why);
}

// (b) W_qk: per head [Kb_h · Qb_nope_h ; Qb_pe_h], kv_lora + rope rows of q_in.
void check_qk(Ctx& cx, const TsrTensor& t) {
  const ModelConfig& c = cx.cfg;
  const uint32_t L = uint32_t(t.layer);
  const GgufTensorInfo& q = query_tensor(cx.src, c, L);
  const GgufTensorInfo& kb = cx.src.require_tensor(blk(L, "attn_k_b.weight"));
  const uint64_t R = c.kv_lora_rank, Dr = c.n_rot, Dn = c.n_nope, q_in = qk_row_len(c), rows = R + Dr;
  if (t.ne[0] != q_in || t.n_rows() != c.n_head * rows || q.ne[0] != q_in || kb.ne[0] != Dn)
    return cx.add("composed", t.name, false, cat("shape ", t.shape_string(), ", expected {", q_in, ", ", c.n_head * rows, "}"));
  const uint64_t rb = row_bytes(t.type, q_in), src_rb = row_bytes(q.type, q_in);
  check_composed_type(cx, t, q.type, q_in);
  std::vector<HeadErrors> heads(c.n_head);
  parallel_for(c.n_head, cx.threads, [&](size_t h) {
    std::vector<double> kb_h(R * Dn), qn(Dn * q_in), ref(rows * q_in);
    dequant_rows_f64(cx.src, kb, h * R, R, kb_h.data());
    dequant_rows_f64(cx.src, q, h * c.n_qk(), Dn, qn.data());
    matmul(kb_h.data(), Dn, qn.data(), R, Dn, q_in, ref.data(), q_in);
    const uint64_t pe_row = h * c.n_qk() + Dn;
    dequant_rows_f64(cx.src, q, pe_row, Dr, ref.data() + R * q_in);
    std::vector<uint8_t> ideal(rows * rb);
    quantize_rows_f64(t.type, ref.data(), R, q_in, ideal.data());
    if (t.type == q.type) std::memcpy(ideal.data() + R * rb, cx.src.tensor_data(q) + pe_row * src_rb, Dr * rb);
    else quantize_rows_f64(t.type, ref.data() + R * q_in, Dr, q_in, ideal.data() + R * rb);
    const std::vector<uint8_t> stored = packed_rows(cx.tsr, t, h * rows, rows);
    heads[h] = head_errors(ref, t.type, ideal.data(), stored.data(), rows, q_in);
    cx.bar.add(stored.size());
  });
  report_composed(cx, t, heads);
}

// (b) W_vo: head h = columns h*kv_lora .. of every row, Wo_h · Vb_h.
void check_vo(Ctx& cx, const TsrTensor& t) {
  const ModelConfig& c = cx.cfg;
  const uint32_t L = uint32_t(t.layer);
  const uint64_t H = c.n_head, Dv = c.n_v, R = c.kv_lora_rank, d = c.n_embd, len = H * R;
  const GgufTensorInfo& wo = cx.src.require_tensor(blk(L, "attn_output.weight"));
  const GgufTensorInfo& vb = cx.src.require_tensor(blk(L, "attn_v_b.weight"));
  if (t.ne[0] != len || t.n_rows() != d)
    return cx.add("composed", t.name, false, cat("shape ", t.shape_string(), ", expected {", len, ", ", d, "}"));
  check_composed_type(cx, t, wo.type, len);
  std::vector<double> wo_all(d * H * Dv), vb_all(H * Dv * R), ref(d * len);
  dequant_rows_f64(cx.src, wo, 0, d, wo_all.data());
  dequant_rows_f64(cx.src, vb, 0, H * Dv, vb_all.data());
  parallel_for(H, cx.threads, [&](size_t h) {
    matmul(wo_all.data() + h * Dv, H * Dv, vb_all.data() + h * Dv * R, d, Dv, R, ref.data() + h * R, len);
  });
  const uint64_t rb = row_bytes(t.type, len);
  std::vector<uint8_t> ideal(d * rb);
  parallel_for(size_t(d), cx.threads, [&](size_t r) { quantize_rows_f64(t.type, ref.data() + r * len, 1, len, ideal.data() + r * rb); });
  const std::vector<uint8_t> stored = packed_rows(cx.tsr, t, 0, d);
  const std::vector<double> di = dequant_bytes(t.type, ideal.data(), d, len), ds = dequant_bytes(t.type, stored.data(), d, len);
  std::vector<HeadErrors> heads(H);
  for (uint64_t h = 0; h < H; ++h) {
    double norm = 0, ec = 0, eq = 0;
    for (uint64_t r = 0; r < d; ++r)
      for (uint64_t k = h * R; k < (h + 1) * R; ++k) {
        const size_t i = r * len + k;
        norm += ref[i] * ref[i];
        ec += (ds[i] - di[i]) * (ds[i] - di[i]);
        eq += (ds[i] - ref[i]) * (ds[i] - ref[i]);
      }
    norm = std::sqrt(std::max(norm, 1e-300));
    heads[h] = {std::sqrt(ec) / norm, std::sqrt(eq) / norm};
  }
  cx.bar.add(stored.size());
  report_composed(cx, t, heads);
}

// (a) Every source tensor is in the packed file, or in a tile, or replaced by a composed tensor.
void check_coverage(Ctx& cx) {
  for (const GgufTensorInfo& s : cx.src.tensors()) {
    if (cx.tsr.find_tensor(s.name)) continue;
    std::string by;
    const size_t dot = s.name.find('.', 4);
    if (s.name.rfind("blk.", 0) == 0 && dot != std::string::npos) {
      const std::string L = s.name.substr(4, dot - 4), suffix = s.name.substr(dot + 1);
      const std::string prefix = "blk." + L + ".";
      if (suffix.find("_exps.") != std::string::npos || suffix.find("_shexp.") != std::string::npos) by = prefix + "ffn_moe_tile";
      if (suffix == "attn_q_b.weight" || suffix == "attn_q.weight" || suffix == "attn_k_b.weight") by = prefix + "attn_qk.weight";
      if (suffix == "attn_v_b.weight" || suffix == "attn_output.weight") by = prefix + "attn_vo.weight";
    }
    const TsrTensor* r = by.empty() ? nullptr : cx.tsr.find_tensor(by);
    const bool ok = r && (r->layout == TsrLayout::MoeTile1 || r->composed());
    if (!ok) cx.add("bytes", s.name, false, "missing from the packed file (and not replaced by a tile or composed tensor)");
  }
}

bool same_value(const GgufValue& a, const GgufValue& b) {
  if (a.type != b.type) return false;
  switch (a.type) {
    case GgufType::STRING: return a.str == b.str;
    case GgufType::BOOL: return a.b == b.b;
    case GgufType::F32: case GgufType::F64: return a.f == b.f || (std::isnan(a.f) && std::isnan(b.f));
    case GgufType::I8: case GgufType::I16: case GgufType::I32: case GgufType::I64: return a.i == b.i;
    case GgufType::ARRAY: return a.elem_type == b.elem_type && a.count == b.count && a.strings == b.strings && a.raw == b.raw;
    default: return a.u == b.u;
  }
}

// (d) Metadata KV by KV (ignoring tessera.*), then provenance.
void check_metadata(Ctx& cx, const VerifyOptions& opt) {
  std::vector<const GgufKV*> packed;
  for (const GgufKV& kv : cx.tsr.metadata().entries())
    if (kv.key.rfind("tessera.", 0) != 0) packed.push_back(&kv);
  const auto& orig = cx.src.metadata().entries();
  size_t same = 0;
  for (size_t i = 0; i < std::max(orig.size(), packed.size()); ++i) {
    if (i >= orig.size()) { cx.add("metadata", packed[i]->key, false, "key not in the original"); continue; }
    if (i >= packed.size()) { cx.add("metadata", orig[i].key, false, "key missing from the packed file"); continue; }
    if (orig[i].key != packed[i]->key) {
      cx.add("metadata", orig[i].key, false, cat("key order differs: position ", i, " holds '", packed[i]->key, "'"));
      continue;
    }
    if (!same_value(orig[i].value, packed[i]->value)) {
      cx.add("metadata", orig[i].key, false, cat("value differs (", gguf_type_name(orig[i].value.type), ")"));
      continue;
    }
    ++same;
  }
  cx.add("metadata", "all keys", same == orig.size() && orig.size() == packed.size(),
         cat(same, " of ", orig.size(), " source keys identical (incl. tokenizer and chat template)"));
  const Metadata& m = cx.tsr.metadata();
  const auto hash = m.get_uint("tessera.source.metadata_hash");
  const auto size = m.get_uint("tessera.source.size");
  const bool prov = hash && size && *hash == source_metadata_hash(cx.src) && *size == cx.src.file_size();
  cx.add("metadata", "provenance", prov,
         prov ? cat("made from this file (", m.get_string("tessera.source.name").value_or("?"), ", ", *size, " bytes)")
              : "tessera.source.size / metadata_hash do not match this original: the packed file was made from another file");
  (void)opt;
}

}  // namespace

VerifyReport verify_packed(const VerifyOptions& opt) {
  const GgufFile src = GgufFile::open(opt.original_path);
  const TsrFile tsr = TsrFile::open(opt.packed_path);  // (c) header, directory, metadata checksums
  const ModelConfig cfg = ModelConfig::from_metadata(tsr.metadata());
  check_source(src, ModelConfig::from_metadata(src.metadata()));  // the original is a whole model
  check_source(src, cfg);  // ... of the shapes the packed file was made for
  uint64_t total = 0;
  for (const TsrTensor& t : tsr.tensors()) total += 2 * t.nbytes;
  ProgressBar bar("verify", total, opt.progress);
  Ctx cx{src, tsr, cfg, std::max(1u, opt.threads), bar, {}, {}};
  cx.add("checksum", "header+directory", true, "xxh64 matches");
  cx.add("checksum", "metadata", true, "xxh64 matches, zstd frame decodes");

  // (c) tensor checksums.
  std::vector<char> bad(tsr.tensors().size(), 0);
  parallel_for(tsr.tensors().size(), cx.threads, [&](size_t i) {
    bad[i] = !tsr.tensor_checksum_ok(tsr.tensors()[i]);
    bar.add(tsr.tensors()[i].nbytes);
  });
  size_t n_ok = 0;
  for (size_t i = 0; i < bad.size(); ++i) {
    if (bad[i]) cx.add("checksum", tsr.tensors()[i].name, false, "xxh64 of the bytes differs from the directory");
    else ++n_ok;
  }
  cx.add("checksum", "tensors", n_ok == bad.size(), cat(n_ok, " of ", bad.size(), " tensor hashes match"));

  check_metadata(cx, opt);  // (d)
  // (a) and (b), tensor by tensor (each parallel inside).
  for (const TsrTensor& t : tsr.tensors()) {
    if (!padding_is_zero(cx, t)) continue;
    if (t.layout == TsrLayout::MoeTile1) check_tile(cx, t);
    else if (t.composed() && t.name.ends_with("attn_qk.weight")) check_qk(cx, t);
    else if (t.composed() && t.name.ends_with("attn_vo.weight")) check_vo(cx, t);
    else if (t.composed()) cx.add("composed", t.name, false, "unknown composed tensor");
    else check_copied(cx, t);
  }
  check_coverage(cx);
  bar.finish();
  if (opt.logits_tokens > 0) {
    if (!opt.logits_check) usage_error("--logits needs the GPU runtime, which this build does not have");
    for (VerifyRow& r : opt.logits_check(opt)) cx.report.rows.push_back(std::move(r));
  }
  return std::move(cx.report);
}

}  // namespace tessera::convert
