// Metadata: the ordered GGUF key/value store, its typed getters/setters and its byte codec
// (gguf.md §3). Shared by GGUF files and the .tsr metadata section.
#include <limits>
#include <unordered_set>

#include "format/gguf.h"
#include "format/gguf_bytes.h"

namespace tessera {

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::U8: return "u8";
    case GgufType::I8: return "i8";
    case GgufType::U16: return "u16";
    case GgufType::I16: return "i16";
    case GgufType::U32: return "u32";
    case GgufType::I32: return "i32";
    case GgufType::F32: return "f32";
    case GgufType::BOOL: return "bool";
    case GgufType::STRING: return "string";
    case GgufType::ARRAY: return "array";
    case GgufType::U64: return "u64";
    case GgufType::I64: return "i64";
    case GgufType::F64: return "f64";
  }
  return "unknown";
}

namespace gguf_detail {

size_t fixed_size(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::BOOL: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
    default: return 0;
  }
}

namespace {

// Reads one fixed-size or string scalar of type t into v.
template <class What>
void parse_scalar(ByteReader& r, GgufType t, GgufValue& v, const std::string& key, What&& what) {
  switch (t) {
    case GgufType::U8: v.u = r.read<uint8_t>(what); break;
    case GgufType::I8: v.i = r.read<int8_t>(what); break;
    case GgufType::U16: v.u = r.read<uint16_t>(what); break;
    case GgufType::I16: v.i = r.read<int16_t>(what); break;
    case GgufType::U32: v.u = r.read<uint32_t>(what); break;
    case GgufType::I32: v.i = r.read<int32_t>(what); break;
    case GgufType::U64: v.u = r.read<uint64_t>(what); break;
    case GgufType::I64: v.i = r.read<int64_t>(what); break;
    case GgufType::F32: v.f = r.read<float>(what); break;
    case GgufType::F64: v.f = r.read<double>(what); break;
    case GgufType::BOOL: {
      const uint8_t b = r.read<uint8_t>(what);
      if (b > 1)
        bad_input(r.origin(), ": metadata key '", key, "': invalid bool value ", int(b),
                  " at byte ", r.pos() - 1, " (expected 0 or 1)");
      v.b = b != 0;
      break;
    }
    case GgufType::STRING: v.str = r.read_string(what); break;
    case GgufType::ARRAY: break;  // handled by parse_array
  }
}

void parse_array(ByteReader& r, GgufValue& v, const std::string& key) {
  auto what = [&] { return cat("array header of metadata key '", key, "'"); };
  const uint32_t elem = r.read<uint32_t>(what);
  const uint64_t count = r.read<uint64_t>(what);
  if (elem == uint32_t(GgufType::ARRAY))
    bad_input(r.origin(), ": metadata key '", key, "': nested array (an array of arrays) is not supported");
  if (!is_value_type(elem))
    bad_input(r.origin(), ": metadata key '", key, "': unknown value type ", elem,
              " for array elements (expected 0..12)");
  v.elem_type = GgufType(elem);
  v.count = count;
  if (v.elem_type == GgufType::STRING) {
    if (count > r.remaining() / 8)
      bad_input(r.origin(), ": metadata key '", key, "': array length ", count,
                " of strings cannot fit: needs at least ", 8, " bytes each, only ", r.remaining(),
                " bytes remain");
    v.strings.reserve(count);
    for (uint64_t k = 0; k < count; ++k)
      v.strings.push_back(r.read_string([&] { return cat("string element ", k, " of metadata key '", key, "'"); }));
    return;
  }
  const size_t size = fixed_size(v.elem_type);
  if (count > r.remaining() / size)
    bad_input(r.origin(), ": metadata key '", key, "': array length ", count, " of ",
              gguf_type_name(v.elem_type), " needs ", count, " x ", size, " bytes, only ",
              r.remaining(), " bytes remain");
  const uint8_t* p = r.take(count * size, what);
  v.raw.assign(p, p + count * size);
  if (v.elem_type == GgufType::BOOL)
    for (uint64_t k = 0; k < count; ++k)
      if (v.raw[k] > 1)
        bad_input(r.origin(), ": metadata key '", key, "': invalid bool value ", int(v.raw[k]),
                  " at array element ", k, " (expected 0 or 1)");
}

// Writes one scalar; checks that the value fits the declared type.
void put_scalar(std::vector<uint8_t>& out, const GgufValue& v, const std::string& key) {
  auto range = [&](auto lo, auto hi, auto x) {
    if (x < lo || x > hi)
      runtime_error("metadata key '", key, "': value ", x, " does not fit its type ", gguf_type_name(v.type));
  };
  switch (v.type) {
    case GgufType::U8: range(uint64_t(0), uint64_t(UINT8_MAX), v.u); put<uint8_t>(out, uint8_t(v.u)); break;
    case GgufType::U16: range(uint64_t(0), uint64_t(UINT16_MAX), v.u); put<uint16_t>(out, uint16_t(v.u)); break;
    case GgufType::U32: range(uint64_t(0), uint64_t(UINT32_MAX), v.u); put<uint32_t>(out, uint32_t(v.u)); break;
    case GgufType::U64: put<uint64_t>(out, v.u); break;
    case GgufType::I8: range(int64_t(INT8_MIN), int64_t(INT8_MAX), v.i); put<int8_t>(out, int8_t(v.i)); break;
    case GgufType::I16: range(int64_t(INT16_MIN), int64_t(INT16_MAX), v.i); put<int16_t>(out, int16_t(v.i)); break;
    case GgufType::I32: range(int64_t(INT32_MIN), int64_t(INT32_MAX), v.i); put<int32_t>(out, int32_t(v.i)); break;
    case GgufType::I64: put<int64_t>(out, v.i); break;
    case GgufType::F32: put<float>(out, float(v.f)); break;
    case GgufType::F64: put<double>(out, v.f); break;
    case GgufType::BOOL: put<uint8_t>(out, v.b ? 1 : 0); break;
    case GgufType::STRING: put_string(out, v.str); break;
    case GgufType::ARRAY: break;
  }
}

}  // namespace

void parse_kvs(ByteReader& r, uint64_t kv_count, Metadata& out) {
  if (kv_count > r.remaining() / 12)
    bad_input(r.origin(), ": kv_count ", kv_count, " cannot fit: each key/value needs at least 12 bytes and only ",
              r.remaining(), " bytes remain (truncated or corrupt data)");
  std::vector<GgufKV>& kv = MetadataAccess::entries(out);
  std::unordered_set<std::string> seen;
  for (const GgufKV& e : kv) seen.insert(e.key);
  kv.reserve(kv.size() + kv_count);
  for (uint64_t n = 0; n < kv_count; ++n) {
    GgufKV e;
    e.key = r.read_string([&] { return cat("key of metadata entry #", n); });
    auto what = [&] { return cat("value of metadata key '", e.key, "'"); };
    const uint32_t type = r.read<uint32_t>(what);
    if (!is_value_type(type))
      bad_input(r.origin(), ": metadata key '", e.key, "': unknown value type ", type, " (expected 0..12)");
    if (!seen.insert(e.key).second)
      bad_input(r.origin(), ": duplicate key '", e.key, "' in metadata (entry #", n, ")");
    e.value.type = GgufType(type);
    if (e.value.type == GgufType::ARRAY)
      parse_array(r, e.value, e.key);
    else
      parse_scalar(r, e.value.type, e.value, e.key, what);
    kv.push_back(std::move(e));
  }
}

void serialize_kvs(const Metadata& m, std::vector<uint8_t>& out) {
  for (const GgufKV& e : m.entries()) {
    const GgufValue& v = e.value;
    put_string(out, e.key);
    put<uint32_t>(out, uint32_t(v.type));
    if (v.type != GgufType::ARRAY) {
      put_scalar(out, v, e.key);
      continue;
    }
    if (v.elem_type == GgufType::ARRAY || !is_value_type(uint32_t(v.elem_type)))
      runtime_error("metadata key '", e.key, "': arrays of ", gguf_type_name(v.elem_type), " cannot be written");
    put<uint32_t>(out, uint32_t(v.elem_type));
    put<uint64_t>(out, v.count);
    if (v.elem_type == GgufType::STRING) {
      if (v.strings.size() != v.count)
        runtime_error("metadata key '", e.key, "': array count ", v.count, " but ", v.strings.size(), " strings");
      for (const std::string& s : v.strings) put_string(out, s);
    } else {
      if (v.raw.size() != v.count * fixed_size(v.elem_type))
        runtime_error("metadata key '", e.key, "': array of ", v.count, " ", gguf_type_name(v.elem_type),
                      " needs ", v.count * fixed_size(v.elem_type), " bytes, raw holds ", v.raw.size());
      out.insert(out.end(), v.raw.begin(), v.raw.end());
    }
  }
}

}  // namespace gguf_detail

using gguf_detail::is_float_type;
using gguf_detail::is_integer_type;

namespace {

// "u32", "string", "array of f32[12]" for error messages.
std::string describe(const GgufValue& v) {
  if (!v.is_array()) return gguf_type_name(v.type);
  return cat("array of ", gguf_type_name(v.elem_type), "[", v.count, "]");
}

// Element k of a numeric array as int64 (range-checked for u64) or double.
int64_t array_int(const GgufValue& v, uint64_t k, const std::string& origin, std::string_view key) {
  const uint8_t* p = v.raw.data() + k * gguf_detail::fixed_size(v.elem_type);
  auto ld = [p](auto x) { std::memcpy(&x, p, sizeof(x)); return x; };
  switch (v.elem_type) {
    case GgufType::U8: return ld(uint8_t());
    case GgufType::I8: return ld(int8_t());
    case GgufType::U16: return ld(uint16_t());
    case GgufType::I16: return ld(int16_t());
    case GgufType::U32: return ld(uint32_t());
    case GgufType::I32: return ld(int32_t());
    case GgufType::I64: return ld(int64_t());
    case GgufType::U64: {
      const uint64_t u = ld(uint64_t());
      if (u > uint64_t(std::numeric_limits<int64_t>::max()))
        bad_input(origin, ": metadata key '", key, "': array element ", k, " = ", u, " is out of range for int64");
      return int64_t(u);
    }
    default: return 0;
  }
}

}  // namespace

const GgufValue* Metadata::find(std::string_view key) const {
  for (const GgufKV& e : kv_)
    if (e.key == key) return &e.value;
  return nullptr;
}

std::optional<uint64_t> Metadata::get_uint(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (!is_integer_type(v->type))
    bad_input(origin_, ": metadata key '", key, "': expected an integer, found ", describe(*v));
  if (gguf_detail::is_unsigned_type(v->type)) return v->u;
  if (v->i < 0)
    bad_input(origin_, ": metadata key '", key, "': expected a non-negative integer, found ", v->i);
  return uint64_t(v->i);
}

std::optional<int64_t> Metadata::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (!is_integer_type(v->type))
    bad_input(origin_, ": metadata key '", key, "': expected an integer, found ", describe(*v));
  if (gguf_detail::is_unsigned_type(v->type)) {
    if (v->u > uint64_t(std::numeric_limits<int64_t>::max()))
      bad_input(origin_, ": metadata key '", key, "': value ", v->u, " is out of range for int64");
    return int64_t(v->u);
  }
  return v->i;
}

std::optional<double> Metadata::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (!is_float_type(v->type))
    bad_input(origin_, ": metadata key '", key, "': expected a float (f32 or f64), found ", describe(*v));
  return v->f;
}

std::optional<bool> Metadata::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufType::BOOL)
    bad_input(origin_, ": metadata key '", key, "': expected a bool, found ", describe(*v));
  return v->b;
}

std::optional<std::string> Metadata::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufType::STRING)
    bad_input(origin_, ": metadata key '", key, "': expected a string, found ", describe(*v));
  return v->str;
}

uint64_t Metadata::require_uint(std::string_view key) const {
  if (auto v = get_uint(key)) return *v;
  bad_input(origin_, ": required metadata key '", key, "' is missing (expected an integer)");
}

double Metadata::require_float(std::string_view key) const {
  if (auto v = get_float(key)) return *v;
  bad_input(origin_, ": required metadata key '", key, "' is missing (expected a float)");
}

std::string Metadata::require_string(std::string_view key) const {
  if (auto v = get_string(key)) return *v;
  bad_input(origin_, ": required metadata key '", key, "' is missing (expected a string)");
}

const std::vector<std::string>& Metadata::get_string_array(std::string_view key) const {
  static const std::vector<std::string> kEmpty;
  const GgufValue* v = find(key);
  if (!v) return kEmpty;
  if (!v->is_array() || v->elem_type != GgufType::STRING)
    bad_input(origin_, ": metadata key '", key, "': expected an array of string, found ", describe(*v));
  return v->strings;
}

std::vector<int64_t> Metadata::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return {};
  if (!v->is_array() || !is_integer_type(v->elem_type))
    bad_input(origin_, ": metadata key '", key, "': expected an array of integers, found ", describe(*v));
  std::vector<int64_t> out(v->count);
  for (uint64_t k = 0; k < v->count; ++k) out[k] = array_int(*v, k, origin_, key);
  return out;
}

std::vector<double> Metadata::get_float_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return {};
  if (!v->is_array() || !is_float_type(v->elem_type))
    bad_input(origin_, ": metadata key '", key, "': expected an array of floats, found ", describe(*v));
  std::vector<double> out(v->count);
  for (uint64_t k = 0; k < v->count; ++k) {
    if (v->elem_type == GgufType::F32) {
      float f;
      std::memcpy(&f, v->raw.data() + 4 * k, 4);
      out[k] = f;
    } else {
      std::memcpy(&out[k], v->raw.data() + 8 * k, 8);
    }
  }
  return out;
}

void Metadata::set(std::string key, GgufValue v) {
  for (GgufKV& e : kv_)
    if (e.key == key) {
      e.value = std::move(v);
      return;
    }
  kv_.push_back({std::move(key), std::move(v)});
}

void Metadata::set_u32(std::string key, uint32_t x) {
  GgufValue v;
  v.type = GgufType::U32;
  v.u = x;
  set(std::move(key), std::move(v));
}
void Metadata::set_u64(std::string key, uint64_t x) {
  GgufValue v;
  v.type = GgufType::U64;
  v.u = x;
  set(std::move(key), std::move(v));
}
void Metadata::set_i32(std::string key, int32_t x) {
  GgufValue v;
  v.type = GgufType::I32;
  v.i = x;
  set(std::move(key), std::move(v));
}
void Metadata::set_f32(std::string key, float x) {
  GgufValue v;
  v.type = GgufType::F32;
  v.f = x;
  set(std::move(key), std::move(v));
}
void Metadata::set_bool(std::string key, bool x) {
  GgufValue v;
  v.type = GgufType::BOOL;
  v.b = x;
  set(std::move(key), std::move(v));
}
void Metadata::set_string(std::string key, std::string x) {
  GgufValue v;
  v.type = GgufType::STRING;
  v.str = std::move(x);
  set(std::move(key), std::move(v));
}
void Metadata::set_string_array(std::string key, std::vector<std::string> x) {
  GgufValue v;
  v.type = GgufType::ARRAY;
  v.elem_type = GgufType::STRING;
  v.count = x.size();
  v.strings = std::move(x);
  set(std::move(key), std::move(v));
}
void Metadata::set_i32_array(std::string key, const std::vector<int32_t>& x) {
  GgufValue v;
  v.type = GgufType::ARRAY;
  v.elem_type = GgufType::I32;
  v.count = x.size();
  v.raw.resize(x.size() * 4);
  if (!x.empty()) std::memcpy(v.raw.data(), x.data(), v.raw.size());
  set(std::move(key), std::move(v));
}
void Metadata::set_f32_array(std::string key, const std::vector<float>& x) {
  GgufValue v;
  v.type = GgufType::ARRAY;
  v.elem_type = GgufType::F32;
  v.count = x.size();
  v.raw.resize(x.size() * 4);
  if (!x.empty()) std::memcpy(v.raw.data(), x.data(), v.raw.size());
  set(std::move(key), std::move(v));
}

void Metadata::erase(std::string_view key) {
  for (auto it = kv_.begin(); it != kv_.end(); ++it)
    if (it->key == key) {
      kv_.erase(it);
      return;
    }
}

std::vector<uint8_t> Metadata::serialize() const {
  std::vector<uint8_t> out;
  gguf_detail::serialize_kvs(*this, out);
  return out;
}

Metadata Metadata::parse(std::span<const uint8_t> bytes, uint64_t kv_count, std::string origin) {
  Metadata m(origin);
  gguf_detail::ByteReader r(bytes, origin);
  gguf_detail::parse_kvs(r, kv_count, m);
  if (r.remaining() != 0)
    bad_input(origin, ": ", r.remaining(), " unexpected bytes after the last of ", kv_count, " metadata entries");
  return m;
}

}  // namespace tessera
