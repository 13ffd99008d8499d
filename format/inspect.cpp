// `tessera inspect` renderers for GGUF files (see inspect.h).
#include "format/inspect.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <map>

#include "format/error.h"
#include "format/gguf.h"
#include "format/gguf_bytes.h"
#include "format/json.h"

namespace tessera {

namespace {

constexpr size_t kTextStringLimit = 160;  // bytes of a string value shown in text mode

// One scalar metadata value or array element, decoded.
struct Scalar {
  enum Kind { Unsigned, Signed, Float32, Float64, Bool } kind = Unsigned;
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  bool b = false;
};

Scalar scalar_of(const GgufValue& v) {
  Scalar s;
  s.u = v.u, s.i = v.i, s.f = v.f, s.b = v.b;
  if (gguf_detail::is_unsigned_type(v.type)) s.kind = Scalar::Unsigned;
  else if (gguf_detail::is_integer_type(v.type)) s.kind = Scalar::Signed;
  else if (v.type == GgufType::F32) s.kind = Scalar::Float32;
  else if (v.type == GgufType::F64) s.kind = Scalar::Float64;
  else s.kind = Scalar::Bool;
  return s;
}

// Element k of a numeric or bool array (raw little-endian storage).
Scalar array_element(const GgufValue& v, uint64_t k) {
  const uint8_t* p = v.raw.data() + k * gguf_detail::fixed_size(v.elem_type);
  auto ld = [p](auto x) { std::memcpy(&x, p, sizeof x); return x; };
  Scalar s;
  switch (v.elem_type) {
    case GgufType::U8: s.u = ld(uint8_t()); break;
    case GgufType::U16: s.u = ld(uint16_t()); break;
    case GgufType::U32: s.u = ld(uint32_t()); break;
    case GgufType::U64: s.u = ld(uint64_t()); break;
    case GgufType::I8: s.kind = Scalar::Signed, s.i = ld(int8_t()); break;
    case GgufType::I16: s.kind = Scalar::Signed, s.i = ld(int16_t()); break;
    case GgufType::I32: s.kind = Scalar::Signed, s.i = ld(int32_t()); break;
    case GgufType::I64: s.kind = Scalar::Signed, s.i = ld(int64_t()); break;
    case GgufType::F32: s.kind = Scalar::Float32, s.f = ld(float()); break;
    case GgufType::F64: s.kind = Scalar::Float64, s.f = ld(double()); break;
    case GgufType::BOOL: s.kind = Scalar::Bool, s.b = ld(uint8_t()) != 0; break;
    default: break;
  }
  return s;
}

std::string float_text(double f, bool single) {
  char buf[64];
  const auto r = single ? std::to_chars(buf, buf + sizeof buf, float(f)) : std::to_chars(buf, buf + sizeof buf, f);
  return std::string(buf, size_t(r.ptr - buf));
}

std::string scalar_text(const Scalar& s) {
  switch (s.kind) {
    case Scalar::Unsigned: return std::to_string(s.u);
    case Scalar::Signed: return std::to_string(s.i);
    case Scalar::Float32: return float_text(s.f, true);
    case Scalar::Float64: return float_text(s.f, false);
    case Scalar::Bool: return s.b ? "true" : "false";
  }
  return "";
}

void scalar_json(JsonWriter& j, const Scalar& s) {
  switch (s.kind) {
    case Scalar::Unsigned: j.value(s.u); break;
    case Scalar::Signed: j.value(s.i); break;
    case Scalar::Float32: j.value_f32(float(s.f)); break;
    case Scalar::Float64: j.value(s.f); break;
    case Scalar::Bool: j.value(s.b); break;
  }
}

std::string string_text(const std::string& s, size_t max_items) {
  if (max_items == 0 || s.size() <= kTextStringLimit) return json_quote(s);
  return json_quote(s.substr(0, kTextStringLimit)) + cat("... (", s.size(), " bytes)");
}

std::string type_text(const GgufValue& v) {
  if (!v.is_array()) return gguf_type_name(v.type);
  return cat("array<", gguf_type_name(v.elem_type), ">[", v.count, "]");
}

std::string pad(std::string s, size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}
std::string pad_left(const std::string& s, size_t width) {
  return s.size() < width ? std::string(width - s.size(), ' ') + s : s;
}

struct TypeTotals {
  uint64_t tensors = 0, params = 0, bytes = 0;
};

std::map<uint32_t, TypeTotals> totals_by_type(const GgufFile& f, uint64_t& params, uint64_t& bytes) {
  std::map<uint32_t, TypeTotals> by;
  params = bytes = 0;
  for (const GgufTensorInfo& t : f.tensors()) {
    TypeTotals& a = by[uint32_t(t.type)];
    a.tensors += 1;
    a.params += t.n_elements();
    a.bytes += t.nbytes;
    params += t.n_elements();
    bytes += t.nbytes;
  }
  return by;
}

}  // namespace

std::string human_bytes(uint64_t n) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (n < 1024) return cat(n, " B");
  double v = double(n);
  int u = 0;
  while (v >= 1024 && u < 5) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

std::string gguf_value_text(const GgufValue& v, size_t max_items) {
  if (v.type == GgufType::STRING) return string_text(v.str, max_items);
  if (!v.is_array()) return scalar_text(scalar_of(v));
  const uint64_t shown = max_items == 0 ? v.count : std::min<uint64_t>(v.count, max_items);
  std::string s = "[";
  for (uint64_t k = 0; k < shown; ++k) {
    if (k) s += ", ";
    s += v.elem_type == GgufType::STRING ? string_text(v.strings[k], max_items) : scalar_text(array_element(v, k));
  }
  if (shown < v.count) s += cat(shown ? ", " : "", "... ", v.count - shown, " more");
  return s + "]";
}

void gguf_value_json(JsonWriter& j, const GgufValue& v, size_t max_items) {
  j.field("type", gguf_type_name(v.type));
  if (!v.is_array()) {
    j.key("value");
    if (v.type == GgufType::STRING) j.value(v.str);
    else scalar_json(j, scalar_of(v));
    return;
  }
  const uint64_t shown = max_items == 0 ? v.count : std::min<uint64_t>(v.count, max_items);
  j.field("element_type", gguf_type_name(v.elem_type)).field("length", v.count);
  j.key("items").begin_array();
  for (uint64_t k = 0; k < shown; ++k) {
    if (v.elem_type == GgufType::STRING) j.value(v.strings[k]);
    else scalar_json(j, array_element(v, k));
  }
  j.end_array().field("truncated", shown < v.count);
}

void metadata_json(JsonWriter& j, const Metadata& md, size_t max_items) {
  for (const GgufKV& e : md.entries()) {
    j.key(e.key).begin_object();
    gguf_value_json(j, e.value, max_items);
    j.end_object();
  }
}

std::string describe_gguf_text(const GgufFile& f, const InspectOptions& opt) {
  std::string out;
  out += cat("GGUF file: ", f.path(), "\n");
  out += cat("  version        ", f.version(), "\n");
  out += cat("  file size      ", f.file_size(), " (", human_bytes(f.file_size()), ")\n");
  out += cat("  alignment      ", f.alignment(), "\n");
  out += cat("  tensors        ", f.tensors().size(), "\n");
  out += cat("  metadata keys  ", f.metadata().entries().size(), "\n");
  out += cat("  data offset    ", f.data_offset(), "\n");

  const auto& kv = f.metadata().entries();
  out += cat("\nMetadata (", kv.size(), " keys):\n");
  size_t key_w = 0, type_w = 0;
  for (const GgufKV& e : kv) {
    key_w = std::max(key_w, std::min<size_t>(e.key.size(), 48));
    type_w = std::max(type_w, type_text(e.value).size());
  }
  for (const GgufKV& e : kv)
    out += cat("  ", pad(e.key, key_w), "  ", pad(type_text(e.value), type_w), "  ",
               gguf_value_text(e.value, opt.max_items), "\n");

  const auto& ts = f.tensors();
  out += cat("\nTensors (", ts.size(), "):\n");
  size_t shape_w = 5, type_w2 = 4, idx_w = std::to_string(ts.size()).size();
  for (const GgufTensorInfo& t : ts) {
    shape_w = std::max(shape_w, t.shape_string().size());
    type_w2 = std::max(type_w2, std::strlen(type_name(t.type)));
  }
  out += cat("  ", pad_left("#", idx_w), "  ", pad("type", type_w2), "  ", pad("shape", shape_w), "  ",
             pad_left("offset", 14), "  ", pad_left("bytes", 14), "  name\n");
  for (size_t k = 0; k < ts.size(); ++k) {
    const GgufTensorInfo& t = ts[k];
    out += cat("  ", pad_left(std::to_string(k), idx_w), "  ", pad(type_name(t.type), type_w2), "  ",
               pad(t.shape_string(), shape_w), "  ", pad_left(std::to_string(t.offset), 14), "  ",
               pad_left(std::to_string(t.nbytes), 14), "  ", t.name, "\n");
  }

  uint64_t params = 0, bytes = 0;
  const auto by = totals_by_type(f, params, bytes);
  out += cat("\nTotals: ", ts.size(), " tensors, ", params, " parameters, ", bytes, " bytes (", human_bytes(bytes), ")\n");
  for (const auto& [id, a] : by)
    out += cat("  ", pad(type_info(id)->name, 8), pad_left(std::to_string(a.tensors), 6), " tensors  ",
               pad_left(std::to_string(a.params), 14), " parameters  ", pad_left(std::to_string(a.bytes), 14),
               " bytes (", human_bytes(a.bytes), ")\n");
  return out;
}

std::string describe_gguf_json(const GgufFile& f, const InspectOptions& opt) {
  std::string out;
  JsonWriter j(out, 2);
  j.begin_object();
  j.field("kind", "gguf").field("path", f.path()).field("file_size", f.file_size());
  j.field("version", f.version()).field("alignment", f.alignment());
  j.field("tensor_count", f.tensors().size()).field("kv_count", f.metadata().entries().size());
  j.field("data_offset", f.data_offset());

  j.key("metadata").begin_object();
  metadata_json(j, f.metadata(), opt.max_items);
  j.end_object();

  j.key("tensors").begin_array();
  for (const GgufTensorInfo& t : f.tensors()) {
    j.begin_object().field("name", t.name).field("type", type_name(t.type));
    j.key("shape").begin_array();
    for (uint32_t d = 0; d < t.n_dims; ++d) j.value(t.ne[d]);
    j.end_array();
    j.field("offset", t.offset).field("file_offset", f.data_offset() + t.offset);
    j.field("bytes", t.nbytes).field("elements", t.n_elements()).end_object();
  }
  j.end_array();

  uint64_t params = 0, bytes = 0;
  const auto by = totals_by_type(f, params, bytes);
  j.key("totals").begin_object().field("parameters", params).field("tensor_bytes", bytes);
  j.key("by_type").begin_array();
  for (const auto& [id, a] : by)
    j.begin_object()
        .field("type", type_info(id)->name)
        .field("tensors", a.tensors)
        .field("parameters", a.params)
        .field("bytes", a.bytes)
        .end_object();
  j.end_array().end_object();
  j.end_object();
  out += '\n';
  return out;
}

}  // namespace tessera
