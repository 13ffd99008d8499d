// GGUF writer -> reader round trips, Metadata typed access, writer failure behaviour.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "format/gguf.h"
#include "format/mapped_file.h"
#include "gguf_fixture.h"

namespace tessera::test {
namespace {

GgufValue array_of(GgufType elem, const Bytes& raw, uint64_t count) {
  GgufValue v;
  v.type = GgufType::ARRAY;
  v.elem_type = elem;
  v.count = count;
  v.raw = raw;
  return v;
}

// Metadata holding every value type once as a scalar and once as an array.
Metadata all_types_metadata() {
  Metadata m;
  auto scalar = [&](const char* key, GgufType t, auto setter) {
    GgufValue v;
    v.type = t;
    setter(v);
    m.set(key, v);
  };
  scalar("t.u8", GgufType::U8, [](GgufValue& v) { v.u = 200; });
  scalar("t.i8", GgufType::I8, [](GgufValue& v) { v.i = -100; });
  scalar("t.u16", GgufType::U16, [](GgufValue& v) { v.u = 60000; });
  scalar("t.i16", GgufType::I16, [](GgufValue& v) { v.i = -30000; });
  m.set_u32("t.u32", 4000000000u);
  m.set_i32("t.i32", -2000000000);
  m.set_f32("t.f32", 0.1f);
  m.set_bool("t.bool", true);
  m.set_string("t.string", "h\xc3\xa9llo \"world\"\n");
  m.set_u64("t.u64", 18000000000000000000ull);
  scalar("t.i64", GgufType::I64, [](GgufValue& v) { v.i = -9000000000000000000ll; });
  scalar("t.f64", GgufType::F64, [](GgufValue& v) { v.f = 1e-300; });
  m.set_string_array("t.strings", {"a", "", "long string \xe2\x82\xac"});
  m.set_i32_array("t.i32s", {1, -2, 3});
  m.set_f32_array("t.f32s", {0.5f, -1.25f});
  m.set("t.u8s", array_of(GgufType::U8, {1, 2, 255}, 3));
  m.set("t.bools", array_of(GgufType::BOOL, {1, 0}, 2));
  Bytes u64s;
  put<uint64_t>(u64s, 5);
  put<uint64_t>(u64s, ~uint64_t(0));
  m.set("t.u64s", array_of(GgufType::U64, u64s, 2));
  Bytes f64s;
  put<double>(f64s, 2.5);
  m.set("t.f64s", array_of(GgufType::F64, f64s, 1));
  m.set("t.empty", array_of(GgufType::I16, {}, 0));
  return m;
}

struct TensorSpec {
  const char* name;
  GgmlType type;
  std::vector<uint64_t> ne;
};

const std::vector<TensorSpec> kTensors = {
    {"t.f32", GgmlType::F32, {5}},
    {"t.f16", GgmlType::F16, {3, 4}},
    {"t.q4_0", GgmlType::Q4_0, {64, 2, 3}},
    {"t.q8_0", GgmlType::Q8_0, {32, 1, 2, 2}},
    {"t.q4_k", GgmlType::Q4_K, {256, 2}},
    {"t.q6_k", GgmlType::Q6_K, {256}},
    {"t.bf16", GgmlType::BF16, {7, 3, 1, 2}},
    {"t.empty", GgmlType::F32, {0}},
};

Bytes pattern(uint64_t n, uint8_t seed) {
  Bytes b(n);
  for (uint64_t k = 0; k < n; ++k) b[k] = uint8_t(k * 31 + seed);
  return b;
}

TEST(GgufRoundTrip, AllValueTypesAndTensorShapes) {
  TempDir dir;
  const std::string path = dir.file("rt.gguf");
  std::vector<Bytes> payloads;
  uint64_t expected_size = 0;
  {
    GgufWriter w;
    w.metadata() = all_types_metadata();
    w.metadata().set_u32("general.alignment", 64);
    for (size_t k = 0; k < kTensors.size(); ++k) {
      EXPECT_EQ(w.add_tensor(kTensors[k].name, kTensors[k].type, kTensors[k].ne), k);
      payloads.push_back(pattern(w.tensors()[k].nbytes, uint8_t(k)));
    }
    expected_size = w.total_size();
    w.begin(path);
    // Reverse order, two halves each, from two threads: any order and thread must work.
    std::thread t([&] {
      for (size_t k = kTensors.size(); k-- > 0;) {
        const uint64_t half = payloads[k].size() / 2;
        w.write_tensor(k, payloads[k].data() + half, payloads[k].size() - half, half);
      }
    });
    for (size_t k = kTensors.size(); k-- > 0;) w.write_tensor(k, payloads[k].data(), payloads[k].size() / 2, 0);
    t.join();
    w.finish();
  }
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.file_size(), expected_size);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);

  // Metadata: same keys in the same order with the same values.
  const Metadata expect = all_types_metadata();
  const Metadata& got = f.metadata();
  ASSERT_EQ(got.entries().size(), expect.entries().size() + 1);
  for (size_t k = 0; k < expect.entries().size(); ++k) {
    const GgufKV& a = expect.entries()[k];
    const GgufKV& b = got.entries()[k];
    EXPECT_EQ(a.key, b.key);
    EXPECT_EQ(a.value.type, b.value.type) << a.key;
    EXPECT_EQ(a.value.u, b.value.u) << a.key;
    EXPECT_EQ(a.value.i, b.value.i) << a.key;
    EXPECT_EQ(a.value.b, b.value.b) << a.key;
    EXPECT_EQ(a.value.str, b.value.str) << a.key;
    EXPECT_EQ(a.value.elem_type, b.value.elem_type) << a.key;
    EXPECT_EQ(a.value.count, b.value.count) << a.key;
    EXPECT_EQ(a.value.strings, b.value.strings) << a.key;
    EXPECT_EQ(a.value.raw, b.value.raw) << a.key;
  }
  EXPECT_FLOAT_EQ(float(*got.get_float("t.f32")), 0.1f);
  EXPECT_EQ(*got.get_float("t.f64"), 1e-300);
  EXPECT_EQ(*got.get_int("t.i64"), -9000000000000000000ll);
  EXPECT_EQ(*got.get_uint("t.u64"), 18000000000000000000ull);
  EXPECT_EQ(got.get_int_array("t.i32s"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(got.get_int_array("t.u8s"), (std::vector<int64_t>{1, 2, 255}));
  EXPECT_EQ(got.get_float_array("t.f32s"), (std::vector<double>{0.5, -1.25}));
  EXPECT_EQ(got.get_string_array("t.strings")[2], "long string \xe2\x82\xac");

  // Tensors: names, shapes, types, dense aligned offsets, bytes, zero padding.
  ASSERT_EQ(f.tensors().size(), kTensors.size());
  uint64_t next = 0;
  for (size_t k = 0; k < kTensors.size(); ++k) {
    const GgufTensorInfo& t = f.tensors()[k];
    EXPECT_EQ(t.name, kTensors[k].name);
    EXPECT_EQ(t.type, kTensors[k].type);
    EXPECT_EQ(t.n_dims, kTensors[k].ne.size());
    for (size_t d = 0; d < 4; ++d) EXPECT_EQ(t.ne[d], d < kTensors[k].ne.size() ? kTensors[k].ne[d] : 1u);
    EXPECT_EQ(t.offset, next) << t.name;
    ASSERT_EQ(t.nbytes, payloads[k].size());
    if (t.nbytes) EXPECT_EQ(0, std::memcmp(f.tensor_data(t), payloads[k].data(), t.nbytes)) << t.name;
    const uint64_t padded = (t.nbytes + 63) / 64 * 64;
    for (uint64_t p = t.nbytes; p < padded; ++p) ASSERT_EQ(f.tensor_data(t)[p], 0) << t.name;
    next += padded;
  }
  EXPECT_EQ(f.data_offset() + next, f.file_size());
  EXPECT_EQ(f.require_tensor("t.q4_k").nbytes, 2u * 144u);
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
  expect_bad_input([&] { f.require_tensor("nope"); }, "tensor 'nope' not found");
  EXPECT_EQ(f.tensors()[3].shape_string(), "{32, 1, 2, 2}");
  EXPECT_EQ(f.tensors()[0].shape_string(), "{5}");
  EXPECT_EQ(dir.entries(), 1u);  // no temporary file left behind
}

TEST(GgufRoundTrip, DefaultAlignmentAndNoTensors) {
  TempDir dir;
  {
    GgufWriter w;
    w.metadata().set_string("general.architecture", "x");
    w.begin(dir.file("empty.gguf"));
    w.finish();
  }
  const GgufFile f = GgufFile::open(dir.file("empty.gguf"));
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(f.metadata().require_string("general.architecture"), "x");
}

TEST(GgufWriter, UnfinishedWriterLeavesNothing) {
  TempDir dir;
  {
    GgufWriter w;
    w.add_tensor("a", GgmlType::F32, {16});
    w.begin(dir.file("out.gguf"));
    EXPECT_EQ(dir.entries(), 1u);  // the temporary file
    const float zeros[16] = {};
    w.write_tensor(0, zeros, sizeof zeros);
  }
  EXPECT_EQ(dir.entries(), 0u);
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.gguf")));
}

TEST(GgufWriter, FinishRefusesMissingTensorBytesAndCleansUp) {
  TempDir dir;
  {
    GgufWriter w;
    w.add_tensor("a", GgmlType::F32, {16});
    w.add_tensor("b", GgmlType::F32, {16});
    w.begin(dir.file("out.gguf"));
    const float data[16] = {};
    w.write_tensor(0, data, sizeof data);
    w.write_tensor(1, data, 32);
    try {
      w.finish();
      ADD_FAILURE() << "finish() accepted a partly written tensor";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("tensor 'b': 32 bytes were written, expected 64"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(dir.entries(), 0u);
}

TEST(GgufWriter, RejectsBadUse) {
  TempDir dir;
  GgufWriter w;
  expect_bad_input([&] { w.add_tensor("q", GgmlType::Q4_0, {48}); }, "not a multiple of the block size 32");
  expect_bad_input([&] { w.add_tensor("z", GgmlType::F32, {}); }, "0 dimensions");
  expect_bad_input([&] { w.add_tensor("z", GgmlType::F32, {1, 1, 1, 1, 1}); }, "5 dimensions");
  expect_bad_input([&] { w.add_tensor(std::string(64, 'n'), GgmlType::F32, {1}); }, "at most 63");
  expect_bad_input([&] { w.add_tensor("o", GgmlType::F32, {uint64_t(1) << 62, 4}); }, "overflows");
  w.add_tensor("a", GgmlType::F32, {4});
  expect_bad_input([&] { w.add_tensor("a", GgmlType::F16, {4}); }, "duplicate tensor name 'a'");
  EXPECT_THROW(w.write_tensor(0, "", 0), Error);  // before begin()
  w.begin(dir.file("x.gguf"));
  const float four[4] = {1, 2, 3, 4};
  EXPECT_THROW(w.write_tensor(0, four, 16, 4), Error);  // past the tensor's end
  EXPECT_THROW(w.write_tensor(1, four, 4), Error);      // no such tensor
  w.write_tensor(0, four, 16);
  w.finish();
  const GgufFile f = GgufFile::open(dir.file("x.gguf"));
  EXPECT_EQ(0, std::memcmp(f.tensor_data(f.tensors()[0]), four, 16));
}

TEST(GgufWriter, NotEnoughDiskSpace) {
  TempDir dir;
  GgufWriter w;
  w.add_tensor("huge", GgmlType::F32, {uint64_t(1) << 40, 1024});  // 4 PiB
  try {
    w.begin(dir.file("big.gguf"));
    ADD_FAILURE() << "begin() accepted a 4 PiB file";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Runtime);
    EXPECT_NE(std::string(e.what()).find("not enough disk space"), std::string::npos) << e.what();
  }
  EXPECT_EQ(dir.entries(), 0u);
}

TEST(GgufWriter, MissingFolderIsRuntimeError) {
  GgufWriter w;
  try {
    w.begin("/nonexistent-tessera-dir/sub/x.gguf");
    ADD_FAILURE() << "begin() into a missing folder succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Runtime);
    EXPECT_NE(std::string(e.what()).find("/nonexistent-tessera-dir/sub"), std::string::npos) << e.what();
  }
}

TEST(Metadata, IntegerGettersConvertWithRangeChecks) {
  Metadata m("m.gguf");
  GgufValue v;
  v.type = GgufType::I16;
  v.i = 7;
  m.set("small", v);
  v.i = -3;
  m.set("negative", v);
  m.set_u64("huge", ~uint64_t(0));
  m.set_string("text", "7");
  m.set_f32("real", 1.5f);
  EXPECT_EQ(*m.get_uint("small"), 7u);
  EXPECT_EQ(*m.get_int("small"), 7);
  EXPECT_EQ(*m.get_int("negative"), -3);
  EXPECT_EQ(*m.get_uint("huge"), ~uint64_t(0));
  EXPECT_FALSE(m.get_uint("absent").has_value());
  expect_bad_input([&] { m.get_uint("negative"); }, "m.gguf: metadata key 'negative': expected a non-negative integer, found -3");
  expect_bad_input([&] { m.get_int("huge"); }, "'huge': value 18446744073709551615 is out of range for int64");
  expect_bad_input([&] { m.get_uint("text"); }, "'text': expected an integer, found string");
  expect_bad_input([&] { m.get_uint("real"); }, "expected an integer, found f32");
  expect_bad_input([&] { m.require_uint("absent"); }, "required metadata key 'absent' is missing");
}

TEST(Metadata, OtherGetters) {
  Metadata m("m.gguf");
  m.set_f32("f", 0.25f);
  GgufValue d;
  d.type = GgufType::F64;
  d.f = 1e100;
  m.set("d", d);
  m.set_bool("b", false);
  m.set_string("s", "str");
  m.set_u32("u", 3);
  m.set_string_array("strs", {"x", "y"});
  m.set_i32_array("ints", {4, 5});
  EXPECT_EQ(*m.get_float("f"), 0.25);
  EXPECT_EQ(m.require_float("d"), 1e100);
  EXPECT_EQ(*m.get_bool("b"), false);
  EXPECT_EQ(m.require_string("s"), "str");
  EXPECT_TRUE(m.get_string_array("absent").empty());
  EXPECT_TRUE(m.get_int_array("absent").empty());
  expect_bad_input([&] { m.get_float("u"); }, "'u': expected a float (f32 or f64), found u32");
  expect_bad_input([&] { m.get_bool("u"); }, "'u': expected a bool, found u32");
  expect_bad_input([&] { m.get_string("u"); }, "'u': expected a string, found u32");
  expect_bad_input([&] { m.get_string_array("ints"); }, "'ints': expected an array of string, found array of i32[2]");
  expect_bad_input([&] { m.get_int_array("strs"); }, "expected an array of integers, found array of string[2]");
  expect_bad_input([&] { m.get_float_array("ints"); }, "expected an array of floats");
  expect_bad_input([&] { m.require_string("none"); }, "'none' is missing (expected a string)");
}

TEST(Metadata, SetReplacesInPlaceAndEraseRemoves) {
  Metadata m;
  m.set_u32("a", 1);
  m.set_u32("b", 2);
  m.set_u32("c", 3);
  m.set_string("b", "two");
  ASSERT_EQ(m.entries().size(), 3u);
  EXPECT_EQ(m.entries()[1].key, "b");
  EXPECT_EQ(*m.get_string("b"), "two");
  m.erase("a");
  m.erase("zzz");
  ASSERT_EQ(m.entries().size(), 2u);
  EXPECT_EQ(m.entries()[0].key, "b");
  EXPECT_FALSE(m.has("a"));
}

TEST(Metadata, SerializeRejectsValuesThatDoNotFit) {
  Metadata m;
  GgufValue v;
  v.type = GgufType::U8;
  v.u = 300;
  m.set("k", v);
  EXPECT_THROW(m.serialize(), Error);
  Metadata m2;
  m2.set("arr", array_of(GgufType::U32, {1, 2, 3}, 1));  // 3 bytes for one u32
  EXPECT_THROW(m2.serialize(), Error);
}

TEST(MappedFile, MapsWholeFileAndReportsMissing) {
  TempDir dir;
  {
    std::ofstream(dir.file("f.bin"), std::ios::binary) << "hello";
    std::ofstream(dir.file("empty.bin"), std::ios::binary);
  }
  const MappedFile f(dir.file("f.bin"));
  ASSERT_EQ(f.bytes().size(), 5u);
  EXPECT_EQ(0, std::memcmp(f.bytes().data(), "hello", 5));
  EXPECT_EQ(MappedFile(dir.file("empty.bin")).bytes().size(), 0u);
  try {
    MappedFile missing(dir.file("missing.bin"));
    ADD_FAILURE() << "opened a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Runtime);
    EXPECT_NE(std::string(e.what()).find("missing.bin"), std::string::npos);
  }
  EXPECT_THROW(MappedFile m(dir.path.string()), Error);  // a folder
}

}  // namespace
}  // namespace tessera::test
