// `tessera inspect` renderers for .tsr files (see tsr_inspect.h).
#include "format/tsr_inspect.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "format/error.h"
#include "format/json.h"
#include "format/tsr.h"

namespace tessera {

namespace {

std::string pad(std::string s, size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}
std::string pad_left(const std::string& s, size_t width) {
  return s.size() < width ? std::string(width - s.size(), ' ') + s : s;
}
std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)v);
  return buf;
}

std::string flags_text(uint32_t flags) {
  std::string s;
  if (flags & kTsrFlagComposedQk) s += "composed qk";
  if (flags & kTsrFlagComposedVo) s += std::string(s.empty() ? "" : ", ") + "composed vo";
  return s.empty() ? "none" : s;
}

// One layout parameter of an entry: a number, or a type name.
struct Param {
  const char* name;
  uint64_t number;
  const char* text;  // non-null for type names
};

std::vector<Param> params_of(const TsrTensor& t) {
  if (t.layout == TsrLayout::Split1) {
    const Split1Geometry g = t.split1();
    return {{"rows", g.rows, nullptr},       {"cols", g.cols, nullptr},       {"blocks_per_row", g.blocks_per_row, nullptr},
            {"q_bytes", g.q_bytes, nullptr}, {"m_bytes", g.m_bytes, nullptr}, {"m_offset", g.m_offset, nullptr}};
  }
  if (t.layout == TsrLayout::MoeTile1) {
    const MoeTileGeometry g = t.moe_tile();
    return {{"n_expert", g.n_expert, nullptr},
            {"w_routed", g.w_routed, nullptr},
            {"w_shared", g.w_shared, nullptr},
            {"n_embd", g.n_embd, nullptr},
            {"gateup_type", 0, type_name(g.gateup_type)},
            {"down_type", 0, type_name(g.down_type)},
            {"shared_gateup_type", 0, type_name(g.shared_gateup_type)},
            {"shared_down_type", 0, type_name(g.shared_down_type)},
            {"slot_stride", g.slot_stride, nullptr},
            {"down_offset", g.down_offset, nullptr},
            {"shared_gateup_offset", g.shared_gateup_offset, nullptr},
            {"shared_down_offset", g.shared_down_offset, nullptr}};
  }
  return {};
}

struct LayoutTotals {
  uint64_t tensors = 0, bytes = 0;
};
std::map<uint32_t, LayoutTotals> totals_by_layout(const TsrFile& f, uint64_t& bytes) {
  std::map<uint32_t, LayoutTotals> by;
  bytes = 0;
  for (const TsrTensor& t : f.tensors()) {
    by[uint32_t(t.layout)].tensors += 1;
    by[uint32_t(t.layout)].bytes += t.nbytes;
    bytes += t.nbytes;
  }
  return by;
}

}  // namespace

std::string describe_tsr_text(const TsrFile& f, const InspectOptions& opt) {
  const TsrHeader& h = f.header();
  const Metadata& m = f.metadata();
  std::string out;
  out += cat(".tsr file: ", f.path(), "\n");
  out += cat("  version        ", h.version, "\n");
  out += cat("  file size      ", h.file_size, " (", human_bytes(h.file_size), ")\n");
  out += cat("  flags          ", flags_text(h.flags), "\n");
  out += cat("  tensors        ", h.tensor_count, "\n");
  out += cat("  metadata keys  ", h.metadata_kv_count, " (", h.metadata_raw_size, " bytes, ", h.metadata_size,
             " zstd-compressed)\n");
  out += cat("  data offset    ", h.data_offset, "\n");
  out += cat("  checksum       ", hex(h.header_xxh64), " (header + directory)\n");
  out += cat("  source         ", m.get_string("tessera.source.name").value_or("?"), ", ",
             m.get_uint("tessera.source.size").value_or(0), " bytes, metadata xxh64 ",
             hex(m.get_uint("tessera.source.metadata_hash").value_or(0)), "\n");
  out += cat("  converter      ", m.get_string("tessera.converter").value_or("?"), "\n");
  out += cat("  compose        ", m.get_string("tessera.compose").value_or("?"), " (composed type ",
             m.get_string("tessera.composed_type").value_or("?"), ")\n");

  const auto& kv = m.entries();
  out += cat("\nMetadata (", kv.size(), " keys):\n");
  size_t key_w = 0;
  for (const GgufKV& e : kv) key_w = std::max(key_w, std::min<size_t>(e.key.size(), 48));
  for (const GgufKV& e : kv) out += cat("  ", pad(e.key, key_w), "  ", gguf_value_text(e.value, opt.max_items), "\n");

  const auto& ts = f.tensors();
  out += cat("\nTensors (", ts.size(), ", in data order):\n");
  size_t shape_w = 5;
  for (const TsrTensor& t : ts) shape_w = std::max(shape_w, t.shape_string().size());
  out += cat("  ", pad_left("#", 4), "  ", pad_left("block", 5), "  ", pad("layout", 9), "  ", pad("type", 5), "  ",
             pad("shape", shape_w), "  ", pad_left("offset", 12), "  ", pad_left("bytes", 12), "  name\n");
  for (size_t k = 0; k < ts.size(); ++k) {
    const TsrTensor& t = ts[k];
    out += cat("  ", pad_left(std::to_string(k), 4), "  ", pad_left(t.layer < 0 ? "-" : std::to_string(t.layer), 5), "  ",
               pad(layout_name(t.layout), 9), "  ", pad(type_name(t.type), 5), "  ", pad(t.shape_string(), shape_w), "  ",
               pad_left(std::to_string(t.offset), 12), "  ", pad_left(std::to_string(t.nbytes), 12), "  ", t.name,
               t.composed() ? "  (composed)" : "", "\n");
    const auto params = params_of(t);
    if (!params.empty()) {
      std::string line = "        ";
      for (const Param& p : params) line += p.text ? cat(p.name, "=", p.text, " ") : cat(p.name, "=", p.number, " ");
      out += line + "\n";
    }
  }

  out += cat("\nBlocks (", f.n_layer_groups(), "):\n");
  for (int L = 0; L < f.n_layer_groups(); ++L) {
    const TsrSpan s = f.layer_span(L);
    out += cat("  ", pad_left(std::to_string(L), 5), "  offset ", pad_left(std::to_string(s.offset), 12), "  ",
               pad_left(std::to_string(s.size), 12), " bytes (", human_bytes(s.size), ")\n");
  }

  uint64_t bytes = 0;
  const auto by = totals_by_layout(f, bytes);
  out += cat("\nTotals: ", ts.size(), " tensors, ", bytes, " bytes (", human_bytes(bytes), ")\n");
  for (const auto& [id, a] : by)
    out += cat("  ", pad(layout_name(TsrLayout(id)), 10), pad_left(std::to_string(a.tensors), 6), " tensors  ",
               pad_left(std::to_string(a.bytes), 14), " bytes (", human_bytes(a.bytes), ")\n");
  return out;
}

std::string describe_tsr_json(const TsrFile& f, const InspectOptions& opt) {
  const TsrHeader& h = f.header();
  std::string out;
  JsonWriter j(out, 2);
  j.begin_object();
  j.field("kind", "tsr").field("path", f.path()).field("file_size", h.file_size).field("version", h.version);
  j.field("flags", h.flags).field("tensor_count", h.tensor_count).field("kv_count", h.metadata_kv_count);
  j.field("data_offset", h.data_offset);
  j.key("metadata").begin_object();
  metadata_json(j, f.metadata(), opt.max_items);
  j.end_object();
  j.key("tensors").begin_array();
  for (const TsrTensor& t : f.tensors()) {
    j.begin_object().field("name", t.name).field("layer", t.layer).field("layout", layout_name(t.layout));
    j.field("type", type_name(t.type));
    j.key("shape").begin_array();
    for (uint32_t d = 0; d < t.n_dims; ++d) j.value(t.ne[d]);
    j.end_array();
    j.field("offset", t.offset).field("bytes", t.nbytes).field("xxh64", hex(t.xxh64)).field("composed", t.composed());
    j.key("params").begin_object();
    for (const Param& p : params_of(t)) {
      if (p.text) j.field(p.name, p.text);
      else j.field(p.name, p.number);
    }
    j.end_object().end_object();
  }
  j.end_array();
  j.key("blocks").begin_array();
  for (int L = 0; L < f.n_layer_groups(); ++L) {
    const TsrSpan s = f.layer_span(L);
    j.begin_object().field("layer", L).field("offset", s.offset).field("bytes", s.size).end_object();
  }
  j.end_array();
  uint64_t bytes = 0;
  const auto by = totals_by_layout(f, bytes);
  j.key("totals").begin_object().field("tensor_bytes", bytes).key("by_layout").begin_array();
  for (const auto& [id, a] : by)
    j.begin_object().field("layout", layout_name(TsrLayout(id))).field("tensors", a.tensors).field("bytes", a.bytes).end_object();
  j.end_array().end_object();
  j.end_object();
  out += '\n';
  return out;
}

std::string inspect_tsr(const std::string& path, bool json, const InspectOptions& opt) {
  const TsrFile f = TsrFile::open(path);
  return json ? describe_tsr_json(f, opt) : describe_tsr_text(f, opt);
}

}  // namespace tessera
