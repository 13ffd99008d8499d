// The packed model file (.tsr): reader and streaming writer. Byte layout: docs/FORMAT.md.
//
// Reading (what a loader does):
//   TsrFile f = TsrFile::open(path);            // mmap + validate header, directory, metadata
//   ModelConfig c = ModelConfig::from_metadata(f.metadata());
//   for (const TsrTensor& t : f.tensors()) {    // directory entries, in data (= execution) order
//     std::span<const uint8_t> bytes = f.tensor_bytes(t);   // t.nbytes bytes, 256-byte aligned
//     switch (t.layout) {                       // how to read them
//       case TsrLayout::Plain:    ...  // GGUF bytes: t.type, t.ne
//       case TsrLayout::Split1:   ...  // t.split1(): rows, cols, m_offset, bytes per block
//       case TsrLayout::MoeTile1: ...  // t.moe_tile(): slot_stride, down_offset, shared offsets, types
//     }
//   }
//   TsrSpan block = f.layer_span(3);            // one page-aligned span per decoder block
//
// Contract: open()/from_memory() validate everything before returning (magic, version, sizes and
// offsets of every section against the file size, header+directory checksum, metadata checksum
// and decompression, each entry's layout params, bounds, alignment, order, unique names).
// After that no accessor can read out of bounds. Tensor checksums are checked only on request
// (check_tensor / check_all_tensors, or OpenOptions::check_tensors). Errors: Error(BadInput)
// naming the file, the field or tensor, what was expected and what was found.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "format/gguf.h"
#include "format/quant.h"
#include "format/tsr_layout.h"

namespace tessera {

inline constexpr uint32_t kTsrVersion = 1;        // the only version this build reads and writes
inline constexpr uint64_t kTsrHeaderBytes = 256;
inline constexpr uint64_t kTsrEntryBytes = 256;
inline constexpr uint32_t kTsrFlagComposedQk = 1u << 0;  // header flags
inline constexpr uint32_t kTsrFlagComposedVo = 1u << 1;
inline constexpr uint32_t kTsrTensorComposed = 1u << 0;  // directory entry flags

// True if the first bytes of a file are the .tsr magic "TSR1".
bool is_tsr_magic(std::span<const uint8_t> first_bytes);

// The fixed header (FORMAT.md §2), decoded.
struct TsrHeader {
  uint32_t version = kTsrVersion;
  uint32_t flags = 0;
  uint64_t file_size = 0;
  uint64_t directory_offset = 0, directory_size = 0, tensor_count = 0;
  uint64_t metadata_offset = 0, metadata_size = 0, metadata_raw_size = 0, metadata_kv_count = 0;
  uint64_t metadata_xxh64 = 0;
  uint64_t data_offset = 0, data_size = 0;
  uint32_t group_alignment = uint32_t(kTsrGroupAlign), tensor_alignment = uint32_t(kTsrTensorAlign);
  uint64_t header_xxh64 = 0;
};

// A contiguous byte range (of the file, or of a tensor where stated).
struct TsrSpan {
  uint64_t offset = 0;
  uint64_t size = 0;
};

// One directory entry (FORMAT.md §3).
struct TsrTensor {
  std::string name;
  TsrLayout layout = TsrLayout::Plain;
  GgmlType type = GgmlType::F32;  // MOE_TILE1: the routed gate/up type (see moe_tile() for all four)
  uint32_t n_dims = 1;
  int32_t layer = -1;             // decoder block, -1 outside the blocks
  std::array<uint64_t, 4> ne{1, 1, 1, 1};  // GGUF order; MOE_TILE1: {n_embd, w_routed, E, 1}
  uint64_t offset = 0;            // absolute file offset (assigned by the writer)
  uint64_t nbytes = 0;            // exact size of the layout's bytes
  uint64_t xxh64 = 0;             // of the nbytes bytes (filled by the writer)
  uint32_t flags = 0;             // kTsrTensorComposed
  std::array<uint64_t, 14> params{};  // layout parameters (FORMAT.md §6)

  bool composed() const { return (flags & kTsrTensorComposed) != 0; }
  uint64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  std::string shape_string() const;  // "{2048, 768}"
  // Byte ranges (relative to the tensor start) that the layout leaves as zero padding: between
  // a SPLIT1 matrix's regions Q and M, and between / inside the parts of a tile's slots.
  std::vector<TsrSpan> padding() const;
  // SPLIT1 geometry (layout Split1 only; Error(Usage) otherwise).
  Split1Geometry split1() const;
  // Tile geometry (layout MoeTile1 only; Error(Usage) otherwise).
  MoeTileGeometry moe_tile() const;

  // Entry builders: fill layout, type, shape and layout params, and nbytes. Throw BadInput when
  // the type has no such layout or the shape does not fit the type's block.
  static TsrTensor plain(std::string name, GgmlType type, std::span<const uint64_t> ne, int32_t layer);
  static TsrTensor split1(std::string name, GgmlType type, std::span<const uint64_t> ne, int32_t layer);
  static TsrTensor moe_tile(std::string name, const MoeTileGeometry& g, int32_t layer);
};

class MappedFile;

class TsrFile {
 public:
  struct OpenOptions {
    bool check_tensors = false;  // also hash every tensor's bytes (reads the whole file)
    unsigned threads = 1;        // for check_tensors
  };
  // mmap + validate. Throws Error(BadInput) (Runtime for I/O failures).
  static TsrFile open(const std::string& path, const OpenOptions& opt);
  static TsrFile open(const std::string& path) { return open(path, OpenOptions{}); }
  // Validate a buffer in memory (the caller keeps `bytes` alive).
  static TsrFile from_memory(std::span<const uint8_t> bytes, std::string origin = "<memory>");

  TsrFile(TsrFile&&) noexcept;
  TsrFile& operator=(TsrFile&&) noexcept;
  ~TsrFile();

  const std::string& path() const { return path_; }
  const TsrHeader& header() const { return header_; }
  std::span<const uint8_t> bytes() const { return bytes_; }
  const Metadata& metadata() const { return meta_; }

  // Directory entries in data order.
  const std::vector<TsrTensor>& tensors() const { return tensors_; }
  const TsrTensor* find_tensor(std::string_view name) const;
  // find_tensor or throw BadInput naming the tensor and the file.
  const TsrTensor& require_tensor(std::string_view name) const;
  // The tensor's nbytes bytes inside the mapping (valid while this object lives).
  std::span<const uint8_t> tensor_bytes(const TsrTensor& t) const { return bytes_.subspan(t.offset, t.nbytes); }

  // Number of decoder blocks that have tensors (blocks 0..n-1), and the byte span of one block:
  // from its first tensor (a multiple of 4096) to the end of its last. Throws Usage if absent.
  int n_layer_groups() const { return int(layer_first_.size()); }
  TsrSpan layer_span(int layer) const;

  // Hash a tensor's bytes and compare with its directory xxh64; throws BadInput naming the
  // tensor, the expected and the found hash.
  void check_tensor(const TsrTensor& t) const;
  bool tensor_checksum_ok(const TsrTensor& t) const;
  // check_tensor for every tensor on `threads` threads; throws for the first mismatch found.
  void check_all_tensors(unsigned threads = 1) const;

 private:
  TsrFile() = default;
  void parse();  // validates bytes_ and fills the members (throws)

  std::string path_;
  std::unique_ptr<MappedFile> map_;
  std::span<const uint8_t> bytes_;
  TsrHeader header_;
  Metadata meta_;
  std::vector<TsrTensor> tensors_;
  std::vector<size_t> layer_first_, layer_last_;  // directory index range of each block
};

// Streaming .tsr writer. Usage: fill metadata(), add every tensor's entry in data order
// (TsrTensor::plain/split1/moe_tile), begin(path) (assigns offsets, checks free disk space,
// writes the metadata), write each tensor's bytes with write() (any order, any thread: pwrite),
// then finish(): hashes every tensor from the file, writes the directory and the header last,
// fsyncs and renames "<path>.tmp-<pid>" to `path`. Destroying an unfinished writer deletes
// the temporary file; until finish() writes the header the file has no valid magic.
class TsrWriter {
 public:
  TsrWriter();
  ~TsrWriter();
  TsrWriter(const TsrWriter&) = delete;
  TsrWriter& operator=(const TsrWriter&) = delete;

  Metadata& metadata() { return meta_; }
  // Adds an entry (offset/xxh64 are assigned later); validates name, layout params and nbytes.
  // The entry's layer sets the grouping: a change of layer starts a 4096-aligned group.
  size_t add_tensor(TsrTensor t);
  const std::vector<TsrTensor>& tensors() const { return tensors_; }
  // File size for the given compressed metadata size (the data part is exact).
  uint64_t planned_size(uint64_t metadata_bytes) const;
  // Sum of the tensors' nbytes.
  uint64_t tensor_bytes() const;

  void begin(const std::string& path);
  // Write n bytes at `offset` inside tensor `index` (offset + n <= nbytes). Thread-safe.
  void write(size_t index, const void* data, uint64_t n, uint64_t offset = 0);
  void finish(unsigned threads = 1);
  const std::string& temp_path() const { return tmp_path_; }  // valid after begin()

 private:
  Metadata meta_{"<tsr writer>"};
  std::vector<TsrTensor> tensors_;
  TsrHeader header_;
  std::string path_, tmp_path_;
  int fd_ = -1;
  std::unique_ptr<std::atomic<uint64_t>[]> written_;
};

}  // namespace tessera
