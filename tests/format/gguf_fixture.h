// Test helpers: a byte-exact GGUF assembler with full control over every field (so tests can
// build malformed files), a default valid file description, and temp-dir utilities.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "format/error.h"
#include "format/gguf.h"

namespace tessera::test {

using Bytes = std::vector<uint8_t>;

template <class T>
void put(Bytes& b, T v) {
  const size_t at = b.size();
  b.resize(at + sizeof(T));
  std::memcpy(b.data() + at, &v, sizeof(T));
}
inline void put_str(Bytes& b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}

// One encoded key/value: key string, u32 type, then `payload` verbatim.
inline Bytes kv_raw(const std::string& key, uint32_t type, const Bytes& payload) {
  Bytes b;
  put_str(b, key);
  put<uint32_t>(b, type);
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}
inline Bytes kv_u32(const std::string& key, uint32_t v) {
  Bytes p;
  put<uint32_t>(p, v);
  return kv_raw(key, 4, p);
}
inline Bytes kv_str(const std::string& key, const std::string& v) {
  Bytes p;
  put_str(p, v);
  return kv_raw(key, 8, p);
}

struct RawTensor {
  std::string name;
  uint32_t n_dims;
  std::vector<uint64_t> ne;  // n_dims values (the test may make them disagree)
  uint32_t type;
  uint64_t offset;
};

struct RawGguf {
  std::string magic = "GGUF";
  uint32_t version = 3;
  int64_t tensor_count = -1;  // -1: tensors.size()
  int64_t kv_count = -1;      // -1: kvs.size()
  std::vector<Bytes> kvs;
  std::vector<RawTensor> tensors;
  uint32_t alignment = 32;  // used for the padding before the data section
  uint64_t data_bytes = 0;  // bytes of data section appended (pattern-filled)
};

// Section boundaries of an encoded file (absolute offsets).
struct RawLayout {
  std::vector<uint64_t> boundaries;  // after header, after each KV, after each tensor info, data start
  uint64_t data_start = 0;
};

inline Bytes encode(const RawGguf& g, RawLayout* layout = nullptr) {
  Bytes b(g.magic.begin(), g.magic.end());
  put<uint32_t>(b, g.version);
  put<uint64_t>(b, g.tensor_count == -1 ? g.tensors.size() : uint64_t(g.tensor_count));
  put<uint64_t>(b, g.kv_count == -1 ? g.kvs.size() : uint64_t(g.kv_count));
  RawLayout l;
  l.boundaries.push_back(b.size());
  for (const Bytes& kv : g.kvs) {
    b.insert(b.end(), kv.begin(), kv.end());
    l.boundaries.push_back(b.size());
  }
  for (const RawTensor& t : g.tensors) {
    put_str(b, t.name);
    put<uint32_t>(b, t.n_dims);
    for (uint64_t v : t.ne) put<uint64_t>(b, v);
    put<uint32_t>(b, t.type);
    put<uint64_t>(b, t.offset);
    l.boundaries.push_back(b.size());
  }
  while (b.size() % g.alignment) b.push_back(0);
  l.data_start = b.size();
  l.boundaries.push_back(b.size());
  for (uint64_t k = 0; k < g.data_bytes; ++k) b.push_back(uint8_t(k * 7 + 1));
  if (layout) *layout = l;
  return b;
}

// A valid file: 3 KVs and 3 tensors; the data section ends exactly at the last tensor's end.
//   a: f32 {8, 2}   64 bytes at 0
//   b: q4_0 {64}    36 bytes at 64 (padded to 128)
//   c: f16 {4,2,2,2} 64 bytes at 128
inline RawGguf valid_raw() {
  RawGguf g;
  g.kvs.push_back(kv_str("general.architecture", "test"));
  g.kvs.push_back(kv_u32("test.count", 7));
  g.kvs.push_back(kv_u32("general.alignment", 32));
  g.tensors.push_back({"a", 2, {8, 2}, 0, 0});
  g.tensors.push_back({"b", 1, {64}, 2, 64});
  g.tensors.push_back({"c", 4, {4, 2, 2, 2}, 1, 128});
  g.data_bytes = 192;
  return g;
}

// Runs `f` expecting tessera::Error(BadInput) whose message contains `phrase`.
template <class F>
void expect_bad_input(F&& f, const std::string& phrase) {
  try {
    f();
    ADD_FAILURE() << "expected BadInput containing \"" << phrase << "\", nothing was thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput) << e.what();
    EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos)
        << "message \"" << e.what() << "\" lacks \"" << phrase << "\"";
  }
}

// Parses `bytes` from an exactly-sized heap copy (so a sanitizer catches any over-read).
inline GgufFile parse_copy(const Bytes& bytes, std::vector<uint8_t>& keep) {
  keep = bytes;
  return GgufFile::from_memory(std::span<const uint8_t>(keep.data(), keep.size()), "test.gguf");
}

// A fresh empty folder under the system temp dir, removed by the destructor.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = std::filesystem::temp_directory_path() /
           ("tessera-format-" + std::to_string(::getpid()) + "-" + (info ? info->name() : "x"));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
  size_t entries() const {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(path)) ++n;
    return n;
  }
};

}  // namespace tessera::test
