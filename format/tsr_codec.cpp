// Byte encoding of the .tsr header and directory entries (see tsr_codec.h, docs/FORMAT.md §2-3).
#include "format/tsr_codec.h"

namespace tessera::tsr_codec {

TsrHeader decode_header(const uint8_t* p) {
  TsrHeader h;
  h.version = get<uint32_t>(p, kOffVersion);
  h.flags = get<uint32_t>(p, kOffFlags);
  h.file_size = get<uint64_t>(p, kOffFileSize);
  h.directory_offset = get<uint64_t>(p, kOffDirOffset);
  h.directory_size = get<uint64_t>(p, kOffDirSize);
  h.tensor_count = get<uint64_t>(p, kOffTensorCount);
  h.metadata_offset = get<uint64_t>(p, kOffMetaOffset);
  h.metadata_size = get<uint64_t>(p, kOffMetaSize);
  h.metadata_raw_size = get<uint64_t>(p, kOffMetaRawSize);
  h.metadata_kv_count = get<uint64_t>(p, kOffMetaKvCount);
  h.metadata_xxh64 = get<uint64_t>(p, kOffMetaHash);
  h.data_offset = get<uint64_t>(p, kOffDataOffset);
  h.data_size = get<uint64_t>(p, kOffDataSize);
  h.group_alignment = get<uint32_t>(p, kOffGroupAlign);
  h.tensor_alignment = get<uint32_t>(p, kOffTensorAlign);
  h.header_xxh64 = get<uint64_t>(p, kOffHeaderHash);
  return h;
}

void encode_header(const TsrHeader& h, uint8_t* p) {
  std::memcpy(p + kOffMagic, kMagic, 4);
  set<uint32_t>(p, kOffVersion, h.version);
  set<uint32_t>(p, kOffHeaderSize, uint32_t(kTsrHeaderBytes));
  set<uint32_t>(p, kOffFlags, h.flags);
  set<uint64_t>(p, kOffFileSize, h.file_size);
  set<uint64_t>(p, kOffDirOffset, h.directory_offset);
  set<uint64_t>(p, kOffDirSize, h.directory_size);
  set<uint64_t>(p, kOffTensorCount, h.tensor_count);
  set<uint64_t>(p, kOffMetaOffset, h.metadata_offset);
  set<uint64_t>(p, kOffMetaSize, h.metadata_size);
  set<uint64_t>(p, kOffMetaRawSize, h.metadata_raw_size);
  set<uint64_t>(p, kOffMetaKvCount, h.metadata_kv_count);
  set<uint64_t>(p, kOffMetaHash, h.metadata_xxh64);
  set<uint64_t>(p, kOffDataOffset, h.data_offset);
  set<uint64_t>(p, kOffDataSize, h.data_size);
  set<uint32_t>(p, kOffGroupAlign, h.group_alignment);
  set<uint32_t>(p, kOffTensorAlign, h.tensor_alignment);
  set<uint64_t>(p, kOffHeaderHash, h.header_xxh64);
}

void check_header_fields(const uint8_t* p, const TsrHeader& h, uint64_t size, const std::string& P) {
  const uint32_t header_size = get<uint32_t>(p, kOffHeaderSize);
  if (header_size != kTsrHeaderBytes) bad_input(P, ": header_size is ", header_size, ", expected ", kTsrHeaderBytes);
  if (h.file_size != size) {
    if (size < h.file_size)
      bad_input(P, ": truncated: the header says the file has ", h.file_size, " bytes, it has ", size);
    bad_input(P, ": the header says the file has ", h.file_size, " bytes, it has ", size, " (trailing bytes)");
  }
  if (h.flags & ~(kTsrFlagComposedQk | kTsrFlagComposedVo))
    bad_input(P, ": unknown header flag bits 0x", std::hex, h.flags, " (written by a newer tessera?)");
  for (uint32_t i = kOffReserved; i < kOffHeaderHash; ++i)
    if (p[i] != 0) bad_input(P, ": reserved header byte ", i, " is ", int(p[i]), ", expected 0");
  if (h.group_alignment != kTsrGroupAlign || h.tensor_alignment != kTsrTensorAlign)
    bad_input(P, ": alignments ", h.group_alignment, "/", h.tensor_alignment, ", expected ", kTsrGroupAlign, "/",
              kTsrTensorAlign);
  if (h.directory_offset != kTsrHeaderBytes)
    bad_input(P, ": directory_offset is ", h.directory_offset, ", expected ", kTsrHeaderBytes);
  if (h.tensor_count == 0 || h.tensor_count > (size - kTsrHeaderBytes) / kTsrEntryBytes)
    bad_input(P, ": tensor_count ", h.tensor_count, " does not fit a file of ", size, " bytes (each entry takes ",
              kTsrEntryBytes, ")");
  if (h.directory_size != h.tensor_count * kTsrEntryBytes)
    bad_input(P, ": directory_size is ", h.directory_size, ", expected ", h.tensor_count, " x ", kTsrEntryBytes);
  if (h.metadata_offset != h.directory_offset + h.directory_size)
    bad_input(P, ": metadata_offset is ", h.metadata_offset, ", expected ", h.directory_offset + h.directory_size);
  if (h.metadata_size > size - h.metadata_offset)
    bad_input(P, ": metadata section [", h.metadata_offset, ", +", h.metadata_size, ") exceeds the file size ", size);
  if (h.metadata_raw_size > kMaxMetadataRaw)
    bad_input(P, ": metadata_raw_size ", h.metadata_raw_size, " exceeds the limit of ", kMaxMetadataRaw, " bytes");
  if (h.metadata_raw_size > metadata_ratio_bound(h.metadata_size))
    bad_input(P, ": metadata_raw_size ", h.metadata_raw_size, " is more than ", kMaxMetadataRatio, " x its ",
              h.metadata_size, " compressed bytes + ", kMetadataRatioSlack, ": not a metadata section tessera writes");
  const uint64_t data = align_up(h.metadata_offset + h.metadata_size, kTsrGroupAlign);
  if (h.data_offset != data) bad_input(P, ": data_offset is ", h.data_offset, ", expected ", data);
  if (h.data_offset > size || h.data_size != size - h.data_offset)
    bad_input(P, ": data section [", h.data_offset, ", +", h.data_size, ") does not end at the file size ", size);
  if (h.data_size % kTsrGroupAlign != 0) bad_input(P, ": data_size ", h.data_size, " is not a multiple of ", kTsrGroupAlign);
}

TsrTensor decode_entry(const uint8_t* p, const std::string& P, uint64_t index) {
  TsrTensor t;
  const char* name = reinterpret_cast<const char*>(p + kEntName);
  const size_t len = strnlen(name, 64);
  if (len == 0 || len == 64)
    bad_input(P, ": directory entry ", index, ": name is ", len == 0 ? "empty" : "not NUL-terminated within 64 bytes");
  for (size_t i = len; i < 64; ++i)
    if (name[i] != 0) bad_input(P, ": directory entry ", index, ": bytes after the name's NUL are not zero");
  t.name.assign(name, len);
  t.layout = TsrLayout(get<uint32_t>(p, kEntLayout));
  t.type = GgmlType(get<uint32_t>(p, kEntType));
  t.n_dims = get<uint32_t>(p, kEntNDims);
  t.layer = get<int32_t>(p, kEntLayer);
  for (uint32_t d = 0; d < 4; ++d) t.ne[d] = get<uint64_t>(p, kEntNe + 8 * d);
  t.offset = get<uint64_t>(p, kEntOffset);
  t.nbytes = get<uint64_t>(p, kEntNBytes);
  t.xxh64 = get<uint64_t>(p, kEntHash);
  t.flags = get<uint32_t>(p, kEntFlags);
  if (get<uint32_t>(p, kEntReserved) != 0) bad_input(P, ": tensor '", t.name, "': reserved entry word is not 0");
  for (uint32_t k = 0; k < 14; ++k) t.params[k] = get<uint64_t>(p, kEntParams + 8 * k);
  return t;
}

void encode_entry(const TsrTensor& t, uint8_t* p) {
  std::memcpy(p + kEntName, t.name.data(), std::min<size_t>(t.name.size(), 63));
  set<uint32_t>(p, kEntLayout, uint32_t(t.layout));
  set<uint32_t>(p, kEntType, uint32_t(t.type));
  set<uint32_t>(p, kEntNDims, t.n_dims);
  set<int32_t>(p, kEntLayer, t.layer);
  for (uint32_t d = 0; d < 4; ++d) set<uint64_t>(p, kEntNe + 8 * d, t.ne[d]);
  set<uint64_t>(p, kEntOffset, t.offset);
  set<uint64_t>(p, kEntNBytes, t.nbytes);
  set<uint64_t>(p, kEntHash, t.xxh64);
  set<uint32_t>(p, kEntFlags, t.flags);
  for (uint32_t k = 0; k < 14; ++k) set<uint64_t>(p, kEntParams + 8 * k, t.params[k]);
}

}  // namespace tessera::tsr_codec
