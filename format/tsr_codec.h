// Internal to the format library: byte encoding of the .tsr header and directory entries
// (docs/FORMAT.md §2, §3), shared by the reader (tsr.cpp) and the writer (tsr_writer.cpp).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

#include "format/error.h"
#include "format/tsr.h"

namespace tessera::tsr_codec {

inline constexpr char kMagic[4] = {'T', 'S', 'R', '1'};
inline constexpr uint64_t kHeaderHashedBytes = 248;  // header bytes covered by header_xxh64
inline constexpr uint64_t kMaxMetadataRaw = uint64_t(1) << 30;
// ... and at most this many times its compressed size plus kMetadataRatioSlack: a few bytes of a
// corrupt or crafted frame cannot make the reader allocate up to kMaxMetadataRaw before zstd
// fails (the writer's metadata compresses ~4-40 x: a synthetic GLM-4.7-Flash's 3.5 MB -> 93 KB).
inline constexpr uint64_t kMaxMetadataRatio = 256;
inline constexpr uint64_t kMetadataRatioSlack = uint64_t(64) << 20;
// The most raw bytes a metadata frame of `compressed` bytes may declare by the ratio bound.
inline uint64_t metadata_ratio_bound(uint64_t compressed) { return kMaxMetadataRatio * compressed + kMetadataRatioSlack; }

// Header field offsets (FORMAT.md §2).
enum HeaderOffset : uint32_t {
  kOffMagic = 0, kOffVersion = 4, kOffHeaderSize = 8, kOffFlags = 12, kOffFileSize = 16,
  kOffDirOffset = 24, kOffDirSize = 32, kOffTensorCount = 40, kOffMetaOffset = 48, kOffMetaSize = 56,
  kOffMetaRawSize = 64, kOffMetaKvCount = 72, kOffMetaHash = 80, kOffDataOffset = 88, kOffDataSize = 96,
  kOffGroupAlign = 104, kOffTensorAlign = 108, kOffReserved = 112, kOffHeaderHash = 248,
};
// Directory entry field offsets (FORMAT.md §3).
enum EntryOffset : uint32_t {
  kEntName = 0, kEntLayout = 64, kEntType = 68, kEntNDims = 72, kEntLayer = 76, kEntNe = 80,
  kEntOffset = 112, kEntNBytes = 120, kEntHash = 128, kEntFlags = 136, kEntReserved = 140, kEntParams = 144,
};

template <class T>
inline T get(const uint8_t* p, uint32_t off) {
  T v;
  std::memcpy(&v, p + off, sizeof(T));
  return v;
}
template <class T>
inline void set(uint8_t* p, uint32_t off, T v) {
  std::memcpy(p + off, &v, sizeof(T));
}

// 256 header bytes <-> TsrHeader (magic written by encode, not checked by decode).
TsrHeader decode_header(const uint8_t* p);
void encode_header(const TsrHeader& h, uint8_t* p);  // p: 256 zeroed bytes; header_xxh64 included
// Structural checks of a decoded header against the file size (everything but the checksums).
void check_header_fields(const uint8_t* p, const TsrHeader& h, uint64_t file_size, const std::string& origin);

// 256 entry bytes <-> TsrTensor. decode checks the name field (NUL padding, length) and the
// reserved word; `index` names the entry in errors.
TsrTensor decode_entry(const uint8_t* p, const std::string& origin, uint64_t index);
void encode_entry(const TsrTensor& t, uint8_t* p);  // p: 256 zeroed bytes

// Checks an entry's layout params and nbytes against its layout, type and shape; with
// fill = true computes and stores them instead. Throws BadInput naming origin and tensor.
void validate_entry(TsrTensor& t, const std::string& origin, bool fill);

}  // namespace tessera::tsr_codec
