// Malformed GGUF corpus: every defect must be refused with Error(BadInput) and a message naming it.
// Built from a valid file description (gguf_fixture.h); run under -DTESSERA_SANITIZE=ON to check
// that no input makes the reader read outside its buffer.
#include <gtest/gtest.h>

#include "gguf_fixture.h"

namespace tessera::test {
namespace {

void expect_rejected(const RawGguf& g, const std::string& phrase) {
  std::vector<uint8_t> keep;
  expect_bad_input([&] { parse_copy(encode(g), keep); }, phrase);
}

TEST(GgufMalformed, ValidBaseFileParses) {
  std::vector<uint8_t> keep;
  RawLayout layout;
  const Bytes bytes = encode(valid_raw(), &layout);
  const GgufFile f = parse_copy(bytes, keep);
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.data_offset(), layout.data_start);
  EXPECT_EQ(f.tensors()[1].nbytes, 36u);
  EXPECT_EQ(f.tensors()[2].nbytes, 64u);
  EXPECT_EQ(f.data_offset() + 192, bytes.size());
}

TEST(GgufMalformed, TruncatedAtEveryByte) {
  RawLayout layout;
  const Bytes full = encode(valid_raw(), &layout);
  // Every proper prefix is invalid: the last tensor ends exactly at the end of the file.
  for (size_t n = 0; n < full.size(); ++n) {
    std::vector<uint8_t> keep(full.begin(), full.begin() + long(n));
    try {
      GgufFile::from_memory(std::span<const uint8_t>(keep.data(), keep.size()), "cut.gguf");
      ADD_FAILURE() << "prefix of " << n << " bytes was accepted";
    } catch (const Error& e) {
      ASSERT_EQ(e.kind(), ErrorKind::BadInput) << e.what();
      ASSERT_NE(std::string(e.what()).find("cut.gguf"), std::string::npos) << e.what();
    }
  }
}

TEST(GgufMalformed, TruncatedAtSectionBoundariesSaysTruncated) {
  RawLayout layout;
  const Bytes full = encode(valid_raw(), &layout);
  for (uint64_t cut : layout.boundaries) {
    if (cut >= full.size()) continue;
    std::vector<uint8_t> keep(full.begin(), full.begin() + long(cut));
    expect_bad_input([&] { GgufFile::from_memory(keep, "cut.gguf"); }, "truncated");
  }
  // Inside the data section: the tensor that no longer fits is named.
  std::vector<uint8_t> keep(full.begin(), full.end() - 1);
  expect_bad_input([&] { GgufFile::from_memory(keep, "cut.gguf"); }, "tensor 'c'");
}

TEST(GgufMalformed, BadMagic) {
  RawGguf g = valid_raw();
  g.magic = "GGML";
  expect_rejected(g, "not a GGUF file: magic is \"GGML\"");
  g.magic = std::string("\x7f" "ELF", 4);
  expect_rejected(g, "\\x7fELF");
}

TEST(GgufMalformed, BadVersion) {
  RawGguf g = valid_raw();
  g.version = 1;
  expect_rejected(g, "unsupported GGUF version 1 (expected 2 or 3)");
  g.version = 4;
  expect_rejected(g, "unsupported GGUF version 4");
  g.version = 0x03000000;
  expect_rejected(g, "big-endian");
  g.version = 2;  // same layout as v3: accepted
  std::vector<uint8_t> keep;
  EXPECT_EQ(parse_copy(encode(g), keep).version(), 2u);
}

TEST(GgufMalformed, AbsurdCounts) {
  RawGguf g = valid_raw();
  g.tensor_count = int64_t(1) << 40;
  expect_rejected(g, "tensor_count 1099511627776 cannot fit");
  g = valid_raw();
  g.kv_count = int64_t(1) << 50;
  expect_rejected(g, "kv_count");
  g = valid_raw();
  g.tensor_count = -2;  // 0xffff...fe
  expect_rejected(g, "tensor_count 18446744073709551614 cannot fit");
  g = valid_raw();
  g.kv_count = 4;  // one more than present: the 4th key reads tensor info bytes, then runs out
  expect_rejected(g, "");
}

TEST(GgufMalformed, AbsurdStringLength) {
  RawGguf g = valid_raw();
  Bytes key;
  put<uint64_t>(key, uint64_t(1) << 50);  // key length
  key.insert(key.end(), {'a', 'b'});
  g.kvs.insert(g.kvs.begin(), key);
  expect_rejected(g, "string length 1125899906842624");

  g = valid_raw();
  Bytes p;
  put<uint64_t>(p, ~uint64_t(0));  // string value length
  g.kvs.push_back(kv_raw("test.s", 8, p));
  expect_rejected(g, "string length");

  // A tensor name of absurd length: header + KVs of the valid file, then a hand-made info.
  g = valid_raw();
  g.tensors.clear();
  g.data_bytes = 0;
  RawLayout layout;
  Bytes b = encode(g, &layout);
  b.resize(layout.boundaries[g.kvs.size()]);  // end of the last KV
  b[8] = 1;                                   // tensor_count = 1
  put<uint64_t>(b, uint64_t(1) << 60);
  b.resize(b.size() + 40, 0);
  std::vector<uint8_t> keep;
  expect_bad_input([&] { parse_copy(b, keep); }, "string length");
}

TEST(GgufMalformed, AbsurdArrayLength) {
  RawGguf g = valid_raw();
  Bytes p;
  put<uint32_t>(p, 4);  // u32 elements
  put<uint64_t>(p, uint64_t(1) << 62);
  g.kvs.push_back(kv_raw("test.arr", 9, p));
  expect_rejected(g, "array length 4611686018427387904");

  g = valid_raw();
  p.clear();
  put<uint32_t>(p, 8);  // strings
  put<uint64_t>(p, uint64_t(1) << 40);
  g.kvs.push_back(kv_raw("test.strs", 9, p));
  expect_rejected(g, "array length");
}

TEST(GgufMalformed, NestedArray) {
  RawGguf g = valid_raw();
  Bytes p;
  put<uint32_t>(p, 9);
  put<uint64_t>(p, 1);
  put<uint32_t>(p, 4);
  put<uint64_t>(p, 1);
  put<uint32_t>(p, 5);
  g.kvs.push_back(kv_raw("test.nested", 9, p));
  expect_rejected(g, "nested array");
}

TEST(GgufMalformed, UnknownValueType) {
  RawGguf g = valid_raw();
  g.kvs.push_back(kv_raw("test.x", 13, Bytes{0, 0, 0, 0}));
  expect_rejected(g, "unknown value type 13");
  g = valid_raw();
  Bytes p;
  put<uint32_t>(p, 77);
  put<uint64_t>(p, 1);
  g.kvs.push_back(kv_raw("test.y", 9, p));
  expect_rejected(g, "unknown value type 77");
}

TEST(GgufMalformed, BadBool) {
  RawGguf g = valid_raw();
  g.kvs.push_back(kv_raw("test.flag", 7, Bytes{2}));
  expect_rejected(g, "invalid bool value 2");
  g = valid_raw();
  Bytes p;
  put<uint32_t>(p, 7);
  put<uint64_t>(p, 3);
  p.insert(p.end(), {1, 0, 9});
  g.kvs.push_back(kv_raw("test.flags", 9, p));
  expect_rejected(g, "invalid bool value 9 at array element 2");
}

TEST(GgufMalformed, DuplicateKey) {
  RawGguf g = valid_raw();
  g.kvs.push_back(kv_u32("test.count", 8));
  expect_rejected(g, "duplicate key 'test.count'");
}

TEST(GgufMalformed, DuplicateTensorName) {
  RawGguf g = valid_raw();
  g.tensors[2].name = "a";
  expect_rejected(g, "duplicate tensor name 'a'");
}

TEST(GgufMalformed, TensorNameTooLong) {
  RawGguf g = valid_raw();
  g.tensors[0].name = std::string(64, 'x');
  expect_rejected(g, "at most 63");
}

TEST(GgufMalformed, BadAlignment) {
  RawGguf g = valid_raw();
  g.kvs[2] = kv_u32("general.alignment", 48);
  expect_rejected(g, "'general.alignment' = 48 is not a power of two");
  g.kvs[2] = kv_u32("general.alignment", 0);
  expect_rejected(g, "'general.alignment' = 0 is not a power of two");
  Bytes p;
  put<uint64_t>(p, 32);
  g.kvs[2] = kv_raw("general.alignment", 10, p);
  expect_rejected(g, "'general.alignment' must have type u32, found u64");
}

TEST(GgufMalformed, NDimsOutOfRange) {
  RawGguf g = valid_raw();
  g.tensors[0].n_dims = 0;
  g.tensors[0].ne = {};
  expect_rejected(g, "tensor 'a': n_dims 0 is out of range");
  g = valid_raw();
  g.tensors[0].n_dims = 5;
  g.tensors[0].ne = {8, 2, 1, 1, 1};
  expect_rejected(g, "tensor 'a': n_dims 5 is out of range");
}

TEST(GgufMalformed, DimsOverflow) {
  RawGguf g = valid_raw();
  g.tensors[0].ne = {uint64_t(1) << 40, uint64_t(1) << 40};
  expect_rejected(g, "overflows the element or byte count");
  g = valid_raw();
  g.tensors[0].ne = {uint64_t(1) << 62, 1};  // fits in elements, not in bytes (x4)
  expect_rejected(g, "overflows");
  g = valid_raw();
  g.tensors[0].ne = {uint64_t(1) << 63, 1};
  expect_rejected(g, "ne[0] = 9223372036854775808 overflows int64");
}

TEST(GgufMalformed, UnknownTypeId) {
  RawGguf g = valid_raw();
  g.tensors[1].type = 4;  // retired Q4_2
  expect_rejected(g, "tensor 'b': unknown ggml type id 4");
  g.tensors[1].type = 1000;
  expect_rejected(g, "unknown ggml type id 1000");
}

TEST(GgufMalformed, RowNotMultipleOfBlock) {
  RawGguf g = valid_raw();
  g.tensors[1].ne = {48};
  expect_rejected(g, "tensor 'b': ne[0] = 48 is not a multiple of the block size 32 of type q4_0");
}

TEST(GgufMalformed, UnalignedOffset) {
  RawGguf g = valid_raw();
  g.tensors[2].offset = 112;
  expect_rejected(g, "tensor 'c': offset 112 is not a multiple of the alignment 32");
}

TEST(GgufMalformed, OffsetPastEnd) {
  RawGguf g = valid_raw();
  g.tensors[2].offset = 4096;
  expect_rejected(g, "past the end of the file");
  g.tensors[2].offset = ~uint64_t(31);  // aligned, huge: offset + bytes would wrap
  expect_rejected(g, "past the end of the file");
}

TEST(GgufMalformed, OverlappingTensors) {
  RawGguf g = valid_raw();
  g.tensors[1].offset = 32;  // b [32, 68) overlaps a [0, 64)
  expect_rejected(g, "tensor 'b' [32, 68) overlaps tensor 'a' [0, 64)");
  g = valid_raw();
  g.tensors[2].offset = 0;  // c starts where a starts
  expect_rejected(g, "overlaps");
}

TEST(GgufMalformed, ShapeDisagreesWithBytes) {
  // a's shape grows to 128 bytes while b still starts at 64: the data ranges collide.
  RawGguf g = valid_raw();
  g.tensors[0].ne = {8, 4};
  expect_rejected(g, "tensor 'b' [64, 100) overlaps tensor 'a' [0, 128)");
  // c (the last tensor) grows beyond the bytes the file holds.
  g = valid_raw();
  g.tensors[2].ne = {4, 2, 2, 4};
  expect_rejected(g, "tensor 'c' (f16 {4, 2, 2, 4}, 128 bytes at data offset 128) runs past the end of the file");
}

TEST(GgufMalformed, MetadataParseRejectsTrailingBytes) {
  Metadata m;
  m.set_u32("k", 1);
  std::vector<uint8_t> bytes = m.serialize();
  EXPECT_EQ(Metadata::parse(bytes, 1, "meta").get_uint("k"), 1u);
  bytes.push_back(0);
  expect_bad_input([&] { Metadata::parse(bytes, 1, "meta"); }, "1 unexpected bytes");
  bytes.pop_back();
  expect_bad_input([&] { Metadata::parse(bytes, 2, "meta"); }, "kv_count 2 cannot fit");
}

// Deterministic single-byte corruption of every position of the valid file: each result must
// either parse or throw BadInput (never crash, never another exception kind).
TEST(GgufMalformed, EveryByteFlipIsHandled) {
  const Bytes full = encode(valid_raw());
  const uint8_t patterns[] = {0x00, 0xff, 0x80, 0x01, 0x7f};
  size_t rejected = 0;
  for (size_t pos = 0; pos < full.size(); ++pos)
    for (uint8_t v : patterns) {
      std::vector<uint8_t> keep = full;
      if (keep[pos] == v) continue;
      keep[pos] = v;
      try {
        const GgufFile f = GgufFile::from_memory(keep, "flip.gguf");
        for (const GgufTensorInfo& t : f.tensors())
          ASSERT_LE(f.data_offset() + t.offset + t.nbytes, keep.size());
      } catch (const Error& e) {
        ASSERT_EQ(e.kind(), ErrorKind::BadInput) << e.what();
        ++rejected;
      }
    }
  EXPECT_GT(rejected, 100u);
}

}  // namespace
}  // namespace tessera::test
