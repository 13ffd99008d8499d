// GGUF v3: metadata store, reader over mmap, streaming writer.  Spec: ../shared/spec/gguf.md.
//
// Contract: GgufFile::open / from_memory validate *everything* before returning (magic, version,
// counts against the file size, string and array lengths, element types, dims <= 4 without
// overflow, known type ids, alignment, each tensor's [offset, offset+bytes) inside the data
// section, no overlaps, shape x type size == bytes). After that, no accessor can read out of
// bounds. Errors are tessera::Error(BadInput) naming the file, the field and found/expected.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "format/quant.h"

namespace tessera {

enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* gguf_type_name(GgufType t);

// One metadata value. Scalars live in the scalar fields; arrays keep their element type, count
// and either `strings` (string arrays) or `raw` (little-endian numeric elements back to back).
struct GgufValue {
  GgufType type = GgufType::U32;
  // scalar payload (exactly one is meaningful, by `type`)
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string str;
  // array payload
  GgufType elem_type = GgufType::U8;
  uint64_t count = 0;
  std::vector<std::string> strings;
  std::vector<uint8_t> raw;

  bool is_array() const { return type == GgufType::ARRAY; }
};

struct GgufKV {
  std::string key;
  GgufValue value;
};

// An ordered key/value store; shared by GGUF files and the .tsr metadata section.
class Metadata {
 public:
  // `origin` names the file in error messages.
  explicit Metadata(std::string origin = "<memory>") : origin_(std::move(origin)) {}

  const std::vector<GgufKV>& entries() const { return kv_; }
  const GgufValue* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }
  const std::string& origin() const { return origin_; }

  // Typed access. get_* return nullopt when the key is absent and throw BadInput when it is
  // present with an incompatible type or out of range: any integer type for integers, any
  // float type for floats (gguf.md §3.1).
  std::optional<uint64_t> get_uint(std::string_view key) const;
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  // require_*: as get_*, but absence throws BadInput naming the key.
  uint64_t require_uint(std::string_view key) const;
  double require_float(std::string_view key) const;
  std::string require_string(std::string_view key) const;
  // Arrays (absent -> empty; wrong element type -> BadInput).
  const std::vector<std::string>& get_string_array(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;
  std::vector<double> get_float_array(std::string_view key) const;

  // Setters (replace an existing key of the same name, else append).
  void set(std::string key, GgufValue v);
  void set_u32(std::string key, uint32_t v);
  void set_u64(std::string key, uint64_t v);
  void set_i32(std::string key, int32_t v);
  void set_f32(std::string key, float v);
  void set_bool(std::string key, bool v);
  void set_string(std::string key, std::string v);
  void set_string_array(std::string key, std::vector<std::string> v);
  void set_i32_array(std::string key, const std::vector<int32_t>& v);
  void set_f32_array(std::string key, const std::vector<float>& v);
  void erase(std::string_view key);

  // GGUF KV encoding of all entries (without the header's kv_count), and its inverse; used by
  // the GGUF writer and by the .tsr metadata section. parse() validates like the GGUF reader.
  std::vector<uint8_t> serialize() const;
  static Metadata parse(std::span<const uint8_t> bytes, uint64_t kv_count, std::string origin);

 private:
  friend struct MetadataAccess;  // gguf.cpp / metadata.cpp: append parsed entries without lookups
  std::string origin_;
  std::vector<GgufKV> kv_;
};

struct GgufTensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  std::array<uint64_t, 4> ne{1, 1, 1, 1};  // ne[0] is the contiguous dimension
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;  // relative to the data section
  uint64_t nbytes = 0;

  uint64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  uint64_t row_elems() const { return ne[0]; }
  uint64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  std::string shape_string() const;  // "{2048, 768}"
};

class MappedFile;  // format/mapped_file.h

class GgufFile {
 public:
  // mmap + validate. Throws Error(BadInput) (or Runtime for I/O failures).
  static GgufFile open(const std::string& path);
  // Validate a buffer in memory (fuzz entry point; the caller keeps `bytes` alive).
  static GgufFile from_memory(std::span<const uint8_t> bytes, std::string origin = "<memory>");

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute offset of the data section
  uint64_t file_size() const { return bytes_.size(); }
  std::span<const uint8_t> bytes() const { return bytes_; }

  const Metadata& metadata() const { return meta_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  // find_tensor or throw BadInput naming the tensor and the file.
  const GgufTensorInfo& require_tensor(std::string_view name) const;
  // Pointer to the tensor's bytes inside the mapping (valid while this object lives).
  const uint8_t* tensor_data(const GgufTensorInfo& t) const { return bytes_.data() + data_offset_ + t.offset; }

 private:
  GgufFile() = default;
  std::string path_;
  std::unique_ptr<MappedFile> map_;
  std::span<const uint8_t> bytes_;
  uint32_t version_ = 3, alignment_ = 32;
  uint64_t data_offset_ = 0;
  Metadata meta_;
  std::vector<GgufTensorInfo> tensors_;
};

// Streaming GGUF writer. Usage: set metadata, add every tensor's info (offsets are assigned
// densely in order, each padded to the alignment, exactly as ggml requires), begin(path), then
// write each tensor's bytes (any order, from any thread: write_tensor uses pwrite), then
// finish(). Data goes to "<path>.tmp-<pid>" in the destination folder and is renamed into place
// only by finish() after fsync; destroying an unfinished writer deletes the temporary file.
class GgufWriter {
 public:
  GgufWriter();
  ~GgufWriter();
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  Metadata& metadata() { return meta_; }
  // ne in GGUF order (ne[0] contiguous). Returns the tensor's index.
  size_t add_tensor(std::string name, GgmlType type, std::vector<uint64_t> ne);
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  uint64_t total_size() const;  // file size once written (valid after the last add_tensor)

  void begin(const std::string& path);
  // Write `n` bytes at byte `offset` inside tensor `index` (offset + n <= nbytes). Thread-safe.
  void write_tensor(size_t index, const void* data, uint64_t n, uint64_t offset = 0);
  void finish();

 private:
  Metadata meta_{"<writer>"};
  std::vector<GgufTensorInfo> tensors_;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::string path_, tmp_path_;
  int fd_ = -1;
  std::unique_ptr<std::atomic<uint64_t>[]> written_;  // bytes written per tensor, checked by finish()
};

}  // namespace tessera
