// GGUF reader: validates a whole file (gguf.md §2-§5, §11) before anything can touch it.
#include <algorithm>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "format/gguf.h"
#include "format/gguf_bytes.h"
#include "format/mapped_file.h"

namespace tessera {

using gguf_detail::ByteReader;

namespace {

constexpr uint64_t kMaxNameBytes = 63;  // GGML_MAX_NAME - 1
constexpr uint64_t kInt64Max = uint64_t(std::numeric_limits<int64_t>::max());

// The 4 magic bytes as text: printable ASCII as is, anything else as \xNN.
std::string show_magic(const uint8_t* p, size_t n) {
  std::string s = "\"";
  static const char* hex = "0123456789abcdef";
  for (size_t k = 0; k < n; ++k) {
    if (p[k] >= 0x20 && p[k] < 0x7f && p[k] != '"' && p[k] != '\\') {
      s += char(p[k]);
    } else {
      s += "\\x";
      s += hex[p[k] >> 4];
      s += hex[p[k] & 15];
    }
  }
  return s + "\"";
}

// Alignment from general.alignment (u32, non-zero power of two), else 32.
uint32_t read_alignment(const Metadata& meta, const std::string& origin) {
  const GgufValue* v = meta.find("general.alignment");
  if (!v) return 32;
  if (v->type != GgufType::U32)
    bad_input(origin, ": metadata key 'general.alignment' must have type u32, found ",
              v->is_array() ? "array" : gguf_type_name(v->type));
  if (v->u == 0 || (v->u & (v->u - 1)) != 0)
    bad_input(origin, ": metadata key 'general.alignment' = ", v->u, " is not a power of two");
  return uint32_t(v->u);
}

// Reads and validates one tensor-info record (gguf.md §5). Offsets are checked against the
// data section later, once its start is known.
GgufTensorInfo parse_tensor_info(ByteReader& r, uint64_t index, uint32_t alignment) {
  const std::string& origin = r.origin();
  GgufTensorInfo t;
  t.name = r.read_string([&] { return cat("name of tensor #", index); });
  if (t.name.size() > kMaxNameBytes)
    bad_input(origin, ": tensor #", index, " name '", t.name.substr(0, 80), "' is ", t.name.size(),
              " bytes long (ggml allows at most ", kMaxNameBytes, ")");
  auto what = [&] { return cat("info of tensor '", t.name, "'"); };
  t.n_dims = r.read<uint32_t>(what);
  if (t.n_dims < 1 || t.n_dims > 4)
    bad_input(origin, ": tensor '", t.name, "': n_dims ", t.n_dims, " is out of range (expected 1..4)");
  for (uint32_t d = 0; d < t.n_dims; ++d) {
    t.ne[d] = r.read<uint64_t>(what);
    if (t.ne[d] > kInt64Max)
      bad_input(origin, ": tensor '", t.name, "': dimension ne[", d, "] = ", t.ne[d], " overflows int64");
  }
  const uint32_t type_id = r.read<uint32_t>(what);
  const TypeInfo* ti = type_info(type_id);
  if (!ti) bad_input(origin, ": tensor '", t.name, "': unknown ggml type id ", type_id);
  t.type = ti->type;
  t.offset = r.read<uint64_t>(what);

  if (t.ne[0] % ti->block_elems != 0)
    bad_input(origin, ": tensor '", t.name, "': ne[0] = ", t.ne[0], " is not a multiple of the block size ",
              ti->block_elems, " of type ", ti->name);
  uint64_t elems = 1, nbytes = t.ne[0] / ti->block_elems * uint64_t(ti->block_bytes);
  bool overflow = t.ne[0] / ti->block_elems > kInt64Max / ti->block_bytes;
  for (int d = 0; d < 4; ++d) overflow |= __builtin_mul_overflow(elems, t.ne[d], &elems);
  for (int d = 1; d < 4; ++d) overflow |= __builtin_mul_overflow(nbytes, t.ne[d], &nbytes);
  if (overflow || elems > kInt64Max || nbytes > kInt64Max)
    bad_input(origin, ": tensor '", t.name, "': shape ", t.shape_string(), " of type ", ti->name,
              " overflows the element or byte count");
  t.nbytes = nbytes;
  if (t.offset % alignment != 0)
    bad_input(origin, ": tensor '", t.name, "': offset ", t.offset, " is not a multiple of the alignment ", alignment);
  return t;
}

}  // namespace

std::string GgufTensorInfo::shape_string() const {
  std::string s = "{";
  for (uint32_t d = 0; d < std::max<uint32_t>(n_dims, 1) && d < 4; ++d) s += cat(d ? ", " : "", ne[d]);
  return s + "}";
}

GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

GgufFile GgufFile::open(const std::string& path) {
  auto map = std::make_unique<MappedFile>(path);
  GgufFile f = from_memory(map->bytes(), path);
  f.map_ = std::move(map);  // the span stays valid: moving the owner does not move the mapping
  return f;
}

GgufFile GgufFile::from_memory(std::span<const uint8_t> bytes, std::string origin) {
  GgufFile f;
  f.path_ = origin;
  f.bytes_ = bytes;
  f.meta_ = Metadata(origin);
  ByteReader r(bytes, origin);

  // Header: magic, version, counts.
  const uint8_t* magic = r.take(4, [] { return std::string("magic"); });
  if (std::memcmp(magic, "GGUF", 4) != 0)
    bad_input(origin, ": not a GGUF file: magic is ", show_magic(magic, 4), " (expected \"GGUF\")");
  f.version_ = r.read<uint32_t>([] { return std::string("version"); });
  if (f.version_ == 0x02000000u || f.version_ == 0x03000000u)
    bad_input(origin, ": unsupported GGUF version ", f.version_, ": a big-endian file (expected 2 or 3, little-endian)");
  if (f.version_ != 2 && f.version_ != 3)
    bad_input(origin, ": unsupported GGUF version ", f.version_, " (expected 2 or 3)");
  const uint64_t tensor_count = r.read<uint64_t>([] { return std::string("tensor_count"); });
  const uint64_t kv_count = r.read<uint64_t>([] { return std::string("kv_count"); });
  // Each tensor info needs >= 28 bytes and each KV >= 12: reject counts that cannot fit before
  // allocating anything for them.
  const uint64_t rest = r.remaining();
  if (tensor_count > rest / 28)
    bad_input(origin, ": tensor_count ", tensor_count, " cannot fit: each tensor info needs at least 28 bytes and only ",
              rest, " bytes follow the header (truncated or corrupt file)");
  if (kv_count > rest / 12 || kv_count * 12 + tensor_count * 28 > rest)
    bad_input(origin, ": kv_count ", kv_count, " cannot fit: each key/value needs at least 12 bytes, the ",
              tensor_count, " tensor infos at least 28, and only ", rest,
              " bytes follow the header (truncated or corrupt file)");

  gguf_detail::parse_kvs(r, kv_count, f.meta_);
  f.alignment_ = read_alignment(f.meta_, origin);

  // Tensor infos.
  f.tensors_.reserve(tensor_count);
  std::unordered_map<std::string, uint64_t> index_of;
  index_of.reserve(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo t = parse_tensor_info(r, i, f.alignment_);
    auto [it, fresh] = index_of.emplace(t.name, i);
    if (!fresh)
      bad_input(origin, ": duplicate tensor name '", t.name, "' (tensor infos #", it->second, " and #", i, ")");
    f.tensors_.push_back(std::move(t));
  }

  // Data section: starts at the next alignment boundary; every tensor must lie inside the file.
  const uint64_t pos = r.pos();
  f.data_offset_ = pos + (f.alignment_ - pos % f.alignment_) % f.alignment_;
  if (tensor_count == 0) return f;
  if (f.data_offset_ > bytes.size())
    bad_input(origin, ": truncated: the data section starts at byte ", f.data_offset_, " but the file is only ",
              bytes.size(), " bytes");
  const uint64_t avail = bytes.size() - f.data_offset_;
  for (const GgufTensorInfo& t : f.tensors_)
    if (t.offset > avail || t.nbytes > avail - t.offset)
      bad_input(origin, ": tensor '", t.name, "' (", type_name(t.type), " ", t.shape_string(), ", ", t.nbytes,
                " bytes at data offset ", t.offset, ") runs past the end of the file: the data section holds ",
                avail, " bytes (truncated file or wrong shape)");

  // No two tensors may share bytes.
  std::vector<uint32_t> order(f.tensors_.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return f.tensors_[a].offset < f.tensors_[b].offset;
  });
  const GgufTensorInfo* prev = nullptr;  // the tensor whose range ends last so far
  for (uint32_t k : order) {
    const GgufTensorInfo& t = f.tensors_[k];
    if (t.nbytes == 0) continue;
    if (prev && t.offset < prev->offset + prev->nbytes)
      bad_input(origin, ": tensor '", t.name, "' [", t.offset, ", ", t.offset + t.nbytes, ") overlaps tensor '",
                prev->name, "' [", prev->offset, ", ", prev->offset + prev->nbytes, ") in the data section");
    if (!prev || t.offset + t.nbytes > prev->offset + prev->nbytes) prev = &t;
  }
  return f;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  for (const GgufTensorInfo& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const GgufTensorInfo& GgufFile::require_tensor(std::string_view name) const {
  if (const GgufTensorInfo* t = find_tensor(name)) return *t;
  bad_input(path_, ": tensor '", name, "' not found (the file has ", tensors_.size(), " tensors)");
}

}  // namespace tessera
