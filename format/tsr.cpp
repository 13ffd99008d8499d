// .tsr reader and directory entries (docs/FORMAT.md). The writer is in tsr_writer.cpp.
#include "format/tsr.h"

#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <unordered_set>

#include "format/error.h"
#include "format/mapped_file.h"
#include "format/tsr_codec.h"

namespace tessera {

bool is_tsr_magic(std::span<const uint8_t> b) {
  return b.size() >= 4 && std::memcmp(b.data(), tsr_codec::kMagic, 4) == 0;
}

std::string TsrTensor::shape_string() const {
  std::string s = "{";
  for (uint32_t d = 0; d < n_dims; ++d) s += cat(d ? ", " : "", ne[d]);
  return s + "}";
}

Split1Geometry TsrTensor::split1() const {
  if (layout != TsrLayout::Split1) usage_error("tensor '", name, "' is ", layout_name(layout), ", not split1");
  return split1_geometry(type, n_rows(), ne[0]);
}

std::vector<TsrSpan> TsrTensor::padding() const {
  std::vector<TsrSpan> out;
  auto gap = [&](uint64_t from, uint64_t to) {
    if (to > from) out.push_back({from, to - from});
  };
  auto matrix = [&](const Split1Geometry& g, uint64_t at) { gap(at + g.q_row_offset(g.rows), at + g.m_offset); };
  if (layout == TsrLayout::Split1) matrix(split1(), 0);
  if (layout == TsrLayout::MoeTile1) {
    const MoeTileGeometry g = moe_tile();
    for (uint32_t s = 0; s < g.n_slots(); ++s) {
      const Split1Geometry gu = g.gateup(s), dn = g.down(s);
      matrix(gu, g.gateup_at(s));
      gap(g.gateup_at(s) + gu.total_bytes, g.down_at(s));
      matrix(dn, g.down_at(s));
      gap(g.down_at(s) + dn.total_bytes, std::min(g.slot_end(s), nbytes));
    }
  }
  return out;
}

MoeTileGeometry TsrTensor::moe_tile() const {
  if (layout != TsrLayout::MoeTile1) usage_error("tensor '", name, "' is ", layout_name(layout), ", not moe_tile1");
  return MoeTileGeometry::from_params(params, "<tsr>", name.c_str());
}

namespace {

void fill_shape(TsrTensor& t, std::span<const uint64_t> ne) {
  if (ne.empty() || ne.size() > 4) bad_input("tensor '", t.name, "': ", ne.size(), " dimensions (expected 1..4)");
  t.n_dims = uint32_t(ne.size());
  t.ne = {1, 1, 1, 1};
  for (size_t d = 0; d < ne.size(); ++d) t.ne[d] = ne[d];
}

}  // namespace

TsrTensor TsrTensor::plain(std::string name, GgmlType type, std::span<const uint64_t> ne, int32_t layer) {
  TsrTensor t;
  t.name = std::move(name);
  t.layout = TsrLayout::Plain;
  t.type = type;
  t.layer = layer;
  fill_shape(t, ne);
  tsr_codec::validate_entry(t, "<tsr writer>", /*fill=*/true);
  return t;
}

TsrTensor TsrTensor::split1(std::string name, GgmlType type, std::span<const uint64_t> ne, int32_t layer) {
  TsrTensor t;
  t.name = std::move(name);
  t.layout = TsrLayout::Split1;
  t.type = type;
  t.layer = layer;
  fill_shape(t, ne);
  tsr_codec::validate_entry(t, "<tsr writer>", /*fill=*/true);
  return t;
}

TsrTensor TsrTensor::moe_tile(std::string name, const MoeTileGeometry& g, int32_t layer) {
  TsrTensor t;
  t.name = std::move(name);
  t.layout = TsrLayout::MoeTile1;
  t.type = g.gateup_type;
  t.layer = layer;
  const uint64_t ne[3] = {g.n_embd, g.w_routed, g.n_expert};
  fill_shape(t, ne);
  t.params = g.params();
  tsr_codec::validate_entry(t, "<tsr writer>", /*fill=*/true);
  return t;
}

void tsr_codec::validate_entry(TsrTensor& t, const std::string& origin, bool fill) {
  auto fail = [&](auto&&... a) { bad_input(origin, ": tensor '", t.name, "': ", a...); };
  if (t.name.empty() || t.name.size() > 63) fail("name of ", t.name.size(), " bytes (expected 1..63)");
  if (t.n_dims < 1 || t.n_dims > 4) fail("n_dims = ", t.n_dims, " (expected 1..4)");
  uint64_t elems = 1;
  for (uint32_t d = 0; d < 4; ++d) {
    if (d >= t.n_dims && t.ne[d] != 1) fail("ne[", d, "] = ", t.ne[d], " beyond n_dims ", t.n_dims, " (expected 1)");
    if (t.ne[d] == 0 || t.ne[d] > (uint64_t(1) << 40)) fail("ne[", d, "] = ", t.ne[d], " (expected 1..2^40)");
    if (__builtin_mul_overflow(elems, t.ne[d], &elems) || elems > (uint64_t(1) << 48))
      fail("shape ", t.shape_string(), " has too many elements");
  }
  const TypeInfo* ti = type_info(uint32_t(t.type));
  if (!ti || !ti->readable) fail("type id ", uint32_t(t.type), " is not a type tessera reads");
  if (t.flags & ~kTsrTensorComposed) fail("unknown flag bits 0x", std::hex, t.flags);
  std::array<uint64_t, 14> params{};
  uint64_t nbytes = 0;
  switch (t.layout) {
    case TsrLayout::Plain:
      if (t.ne[0] % ti->block_elems != 0) fail("ne[0] = ", t.ne[0], " is not a multiple of the ", ti->name, " block");
      nbytes = row_bytes(t.type, t.ne[0]) * t.n_rows();
      break;
    case TsrLayout::Split1: {
      if (!split1_block(t.type)) fail("type ", ti->name, " has no split1 layout");
      if (t.ne[0] % ti->block_elems != 0) fail("ne[0] = ", t.ne[0], " is not a multiple of the ", ti->name, " block");
      const Split1Geometry g = split1_geometry(t.type, t.n_rows(), t.ne[0]);
      params = {g.rows, g.cols, g.blocks_per_row, g.q_bytes, g.m_bytes, g.m_offset, 0, 0, 0, 0, 0, 0, 0, 0};
      nbytes = g.total_bytes;
      break;
    }
    case TsrLayout::MoeTile1: {
      const MoeTileGeometry g = MoeTileGeometry::from_params(t.params, origin.c_str(), t.name.c_str());
      if (t.n_dims != 3 || t.ne[0] != g.n_embd || t.ne[1] != g.w_routed || t.ne[2] != g.n_expert)
        fail("moe_tile1 shape ", t.shape_string(), " does not match its params {", g.n_embd, ", ", g.w_routed, ", ",
             g.n_expert, "}");
      if (t.type != g.gateup_type) fail("type ", ti->name, " differs from its params' gate/up type ", type_name(g.gateup_type));
      params = t.params;
      nbytes = g.total_bytes;
      break;
    }
    default:
      fail("unknown layout id ", uint32_t(t.layout), " (this tessera knows 0 plain, 1 split1, 2 moe_tile1)");
  }
  if (fill) {
    t.params = params;
    t.nbytes = nbytes;
    return;
  }
  for (int k = 0; k < 14; ++k)
    if (t.params[k] != params[k])
      fail(layout_name(t.layout), " params[", k, "] is ", t.params[k], ", the layout gives ", params[k]);
  if (t.nbytes != nbytes) fail("nbytes is ", t.nbytes, ", ", layout_name(t.layout), " ", ti->name, " ", t.shape_string(),
                               " needs ", nbytes);
}

// ---------------------------------------------------------------------------------------------
// TsrFile

TsrFile::TsrFile(TsrFile&&) noexcept = default;
TsrFile& TsrFile::operator=(TsrFile&&) noexcept = default;
TsrFile::~TsrFile() = default;

TsrFile TsrFile::open(const std::string& path, const OpenOptions& opt) {
  TsrFile f;
  f.path_ = path;
  f.map_ = std::make_unique<MappedFile>(path);
  f.bytes_ = f.map_->bytes();
  f.parse();
  if (opt.check_tensors) f.check_all_tensors(opt.threads);
  return f;
}

TsrFile TsrFile::from_memory(std::span<const uint8_t> bytes, std::string origin) {
  TsrFile f;
  f.path_ = std::move(origin);
  f.bytes_ = bytes;
  f.parse();
  return f;
}

void TsrFile::parse() {
  const std::string& P = path_;
  const uint64_t size = bytes_.size();
  if (size < 4 || !is_tsr_magic(bytes_)) {
    if (size >= 4 && std::memcmp(bytes_.data(), "GGUF", 4) == 0)
      bad_input(P, ": this is a GGUF file, not a packed .tsr (make one with `tessera convert`)");
    std::string shown;
    for (size_t i = 0; i < std::min<uint64_t>(size, 4); ++i) {
      const unsigned char c = bytes_[i];
      shown += (c >= 32 && c < 127) ? std::string(1, char(c)) : cat("\\x", std::hex, int(c));
    }
    bad_input(P, ": bad magic \"", shown, "\", expected \"TSR1\" (not a .tsr file)");
  }
  if (size < kTsrHeaderBytes)
    bad_input(P, ": truncated: the file has ", size, " bytes, the .tsr header alone needs ", kTsrHeaderBytes);
  TsrHeader& h = header_;
  h = tsr_codec::decode_header(bytes_.data());
  if (h.version != kTsrVersion)
    bad_input(P, ": .tsr format version ", h.version, ", this tessera reads version ", kTsrVersion,
              "; re-run `tessera convert` on the original GGUF");
  tsr_codec::check_header_fields(bytes_.data(), h, size, P);

  // Header + directory checksum.
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  XXH64_update(st, bytes_.data(), tsr_codec::kHeaderHashedBytes);
  XXH64_update(st, bytes_.data() + h.directory_offset, h.directory_size);
  const uint64_t hh = XXH64_digest(st);
  XXH64_freeState(st);
  if (hh != h.header_xxh64)
    bad_input(P, ": header/directory checksum mismatch: stored xxh64 ", std::hex, h.header_xxh64, ", computed ", hh,
              " (the file is corrupt)");

  // Metadata.
  const uint8_t* mz = bytes_.data() + h.metadata_offset;
  const uint64_t mh = XXH64(mz, h.metadata_size, 0);
  if (mh != h.metadata_xxh64)
    bad_input(P, ": metadata checksum mismatch: stored xxh64 ", std::hex, h.metadata_xxh64, ", computed ", mh,
              " (the file is corrupt)");
  const unsigned long long content = ZSTD_getFrameContentSize(mz, h.metadata_size);
  if (content != h.metadata_raw_size)
    bad_input(P, ": metadata: the zstd frame declares ", (long long)content, " bytes, the header says ", h.metadata_raw_size);
  std::vector<uint8_t> raw(h.metadata_raw_size);
  const size_t got = ZSTD_decompress(raw.data(), raw.size(), mz, h.metadata_size);
  if (ZSTD_isError(got) || got != raw.size())
    bad_input(P, ": metadata: zstd decompression failed: ",
              ZSTD_isError(got) ? ZSTD_getErrorName(got) : cat(got, " bytes instead of ", raw.size()).c_str());
  meta_ = Metadata::parse(raw, h.metadata_kv_count, P);

  // Directory.
  tensors_.clear();
  tensors_.reserve(h.tensor_count);
  std::unordered_set<std::string> names;
  uint64_t end_prev = h.data_offset;
  uint32_t flags_seen = 0;
  int32_t layer_prev = INT32_MIN;
  layer_first_.clear();
  layer_last_.clear();
  for (uint64_t i = 0; i < h.tensor_count; ++i) {
    TsrTensor t = tsr_codec::decode_entry(bytes_.data() + h.directory_offset + i * kTsrEntryBytes, P, i);
    tsr_codec::validate_entry(t, P, /*fill=*/false);
    if (!names.insert(t.name).second) bad_input(P, ": duplicate tensor name '", t.name, "' in the directory");
    const bool new_group = t.layer != layer_prev;
    const uint64_t need_align = new_group ? kTsrGroupAlign : kTsrTensorAlign;
    if (t.offset % need_align != 0)
      bad_input(P, ": tensor '", t.name, "': offset ", t.offset, " is not a multiple of ", need_align,
                new_group ? " (first tensor of a group)" : "");
    if (t.offset < end_prev)
      bad_input(P, ": tensor '", t.name, "': offset ", t.offset, " overlaps the previous tensor or the sections before "
                "the data (expected >= ", end_prev, ")");
    if (t.offset > size || t.nbytes > size - t.offset)
      bad_input(P, ": tensor '", t.name, "': bytes [", t.offset, ", ", t.offset + t.nbytes, ") exceed the file size ", size);
    end_prev = t.offset + t.nbytes;
    if (t.layer < -1) bad_input(P, ": tensor '", t.name, "': layer ", t.layer, " (expected -1 or a block index)");
    if (t.layer >= 0) {
      const size_t L = size_t(t.layer);
      if (L >= layer_first_.size()) {
        if (L > h.tensor_count) bad_input(P, ": tensor '", t.name, "': layer ", t.layer, " exceeds the tensor count");
        layer_first_.resize(L + 1, SIZE_MAX);
        layer_last_.resize(L + 1, SIZE_MAX);
      }
      if (layer_first_[L] == SIZE_MAX) {
        layer_first_[L] = i;
      } else if (layer_last_[L] != i - 1) {
        bad_input(P, ": tensor '", t.name, "': block ", L, " is split into several runs of the directory");
      }
      layer_last_[L] = i;
    }
    if (t.composed() && t.name.ends_with("attn_qk.weight")) flags_seen |= kTsrFlagComposedQk;
    if (t.composed() && t.name.ends_with("attn_vo.weight")) flags_seen |= kTsrFlagComposedVo;
    layer_prev = t.layer;
    tensors_.push_back(std::move(t));
  }
  for (size_t L = 0; L < layer_first_.size(); ++L)
    if (layer_first_[L] == SIZE_MAX) bad_input(P, ": block ", L, " has no tensors but block ", layer_first_.size() - 1, " has");
  if (flags_seen != h.flags)
    bad_input(P, ": header flags 0x", std::hex, h.flags, " do not match the composed tensors found (0x", flags_seen, ")");
}

const TsrTensor* TsrFile::find_tensor(std::string_view name) const {
  for (const TsrTensor& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const TsrTensor& TsrFile::require_tensor(std::string_view name) const {
  const TsrTensor* t = find_tensor(name);
  if (!t) bad_input(path_, ": tensor '", name, "' not found");
  return *t;
}

TsrSpan TsrFile::layer_span(int layer) const {
  if (layer < 0 || size_t(layer) >= layer_first_.size())
    usage_error(path_, ": no block ", layer, " (the file has blocks 0..", int(layer_first_.size()) - 1, ")");
  const TsrTensor& a = tensors_[layer_first_[size_t(layer)]];
  const TsrTensor& b = tensors_[layer_last_[size_t(layer)]];
  return {a.offset, b.offset + b.nbytes - a.offset};
}

bool TsrFile::tensor_checksum_ok(const TsrTensor& t) const {
  const auto b = tensor_bytes(t);
  return XXH64(b.data(), b.size(), 0) == t.xxh64;
}

void TsrFile::check_tensor(const TsrTensor& t) const {
  const auto b = tensor_bytes(t);
  const uint64_t got = XXH64(b.data(), b.size(), 0);
  if (got != t.xxh64)
    bad_input(path_, ": tensor '", t.name, "': checksum mismatch: directory xxh64 ", std::hex, t.xxh64, ", bytes hash to ",
              got, " (the file is corrupt)");
}

void TsrFile::check_all_tensors(unsigned threads) const {
  const size_t n = tensors_.size();
  std::vector<char> bad(n, 0);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) bad[i] = !tensor_checksum_ok(tensors_[i]);
  };
  std::vector<std::thread> pool;
  for (unsigned k = 1; k < std::max(1u, threads); ++k) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  for (size_t i = 0; i < n; ++i)
    if (bad[i]) check_tensor(tensors_[i]);
}

}  // namespace tessera
