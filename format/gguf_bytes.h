// Internal to the format library: bounds-checked little-endian cursor over a byte span and the
// GGUF key/value section codec shared by the GGUF reader/writer and the .tsr metadata section.
// Every read checks the remaining length first; nothing here can read outside the span.
#pragma once
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "format/error.h"
#include "format/gguf.h"

namespace tessera {

// Grants the codec append access to Metadata's entries (declared a friend in gguf.h).
struct MetadataAccess {
  static std::vector<GgufKV>& entries(Metadata& m) { return m.kv_; }
};

namespace gguf_detail {

// Payload size in bytes of a fixed-size value type; 0 for STRING and ARRAY.
size_t fixed_size(GgufType t);
// True for the 13 value type ids of gguf.md §3.1.
inline bool is_value_type(uint32_t id) { return id <= 12; }
inline bool is_integer_type(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::U16: case GgufType::I16:
    case GgufType::U32: case GgufType::I32: case GgufType::U64: case GgufType::I64: return true;
    default: return false;
  }
}
inline bool is_unsigned_type(GgufType t) {
  return t == GgufType::U8 || t == GgufType::U16 || t == GgufType::U32 || t == GgufType::U64;
}
inline bool is_float_type(GgufType t) { return t == GgufType::F32 || t == GgufType::F64; }

class ByteReader {
 public:
  // `origin` names the file in errors; `base` is the absolute offset of bytes[0] (for messages).
  ByteReader(std::span<const uint8_t> bytes, const std::string& origin, uint64_t base = 0)
      : bytes_(bytes), origin_(origin), base_(base) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }
  const std::string& origin() const { return origin_; }

  // Returns a pointer to the next n bytes and advances; throws BadInput ("truncated") naming
  // `what()` (a callable returning the field's description, built only on failure).
  template <class What>
  const uint8_t* take(uint64_t n, What&& what) {
    if (n > remaining())
      bad_input(origin_, ": truncated: ", what(), " at byte ", base_ + pos_, " needs ", n,
                " bytes but only ", remaining(), " remain");
    const uint8_t* p = bytes_.data() + pos_;
    pos_ += n;
    return p;
  }
  template <class T, class What>
  T read(What&& what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what), sizeof(T));
    return v;
  }
  // gguf_string: u64 length + bytes. The length is checked against the remaining bytes before
  // anything is allocated.
  template <class What>
  std::string read_string(What&& what) {
    const uint64_t len = read<uint64_t>(what);
    if (len > remaining())
      bad_input(origin_, ": ", what(), ": string length ", len, " at byte ", base_ + pos_ - 8,
                " exceeds the ", remaining(), " bytes that remain");
    const uint8_t* p = take(len, what);
    return std::string(reinterpret_cast<const char*>(p), len);
  }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& origin_;
  uint64_t base_;
  uint64_t pos_ = 0;
};

// Parses kv_count key/value pairs at the reader's position into `out` (appended), validating
// per gguf.md §3 and §11: known value types, string/array lengths vs remaining bytes, no nested
// arrays, bools 0/1, no duplicate keys (also against keys already in `out`).
void parse_kvs(ByteReader& r, uint64_t kv_count, Metadata& out);
// Appends the GGUF encoding of every entry of `m` to `out`.
void serialize_kvs(const Metadata& m, std::vector<uint8_t>& out);

template <class T>
void put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}
inline void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

}  // namespace gguf_detail
}  // namespace tessera
