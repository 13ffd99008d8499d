// Human-readable and JSON descriptions of model files, for `tessera inspect`.
// One function pair per file kind; the command picks the kind by the file's magic.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera {

class GgufFile;
struct GgufValue;
class Metadata;
class JsonWriter;

struct InspectOptions {
  size_t max_items = 8;  // array elements shown per metadata array (0 = all)
};

// GGUF: header (version, alignment, counts, data offset, file size), every metadata key with its
// type and value (arrays: element type, length, first max_items items), the tensor table (name,
// type, shape in GGUF order, data offset, bytes) and totals (parameters, bytes per type).
std::string describe_gguf_text(const GgufFile& f, const InspectOptions& opt);
// The same as one JSON object:
// {"kind":"gguf","path","file_size","version","alignment","tensor_count","kv_count","data_offset",
//  "metadata":{key:{"type",("value")|("element_type","length","items","truncated")}},
//  "tensors":[{"name","type","shape","offset","file_offset","bytes","elements"}],
//  "totals":{"parameters","tensor_bytes","by_type":[{"type","tensors","parameters","bytes"}]}}
std::string describe_gguf_json(const GgufFile& f, const InspectOptions& opt);

// A metadata value as text: strings quoted, arrays as "[a, b, ...]" limited to max_items.
std::string gguf_value_text(const GgufValue& v, size_t max_items);
// Writes a metadata value's JSON member fields ("type", "value" or the array fields).
void gguf_value_json(JsonWriter& j, const GgufValue& v, size_t max_items);
// Every metadata key as {key: {type, value...}} inside the object being written (GGUF and .tsr).
void metadata_json(JsonWriter& j, const Metadata& md, size_t max_items);

// "1.50 GiB", "12.0 KiB", "17 B".
std::string human_bytes(uint64_t n);

}  // namespace tessera
