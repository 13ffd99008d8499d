// The .tsr container on a small hand-built file: writer -> reader round trip, alignment and
// order rules, and every way a file can be damaged: each single byte of header, directory and
// metadata flipped, tensor bytes flipped, truncation, wrong version, garbage, trailing bytes,
// writers that never finish, and valid files the CPU loader must refuse (cases found by
// tests/fuzz/fuzz_tsr.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <random>

#include "format/error.h"
#include "format/model_config.h"
#include "format/tsr.h"
#include "runtime/cpu/model_weights.h"
#include "runtime/cpu/tsr_weights.h"
#include "tests/convert/convert_test_util.h"

namespace tessera {
namespace {

using convert::testing::Bytes;
using convert::testing::error_of;
using convert::testing::read_file;
using convert::testing::temp_file;
using convert::testing::write_file;

Bytes pattern(uint64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes b(n);
  for (auto& x : b) x = uint8_t(rng());
  return b;
}

// A small file: a global plain tensor, block 0 (split1 + plain), block 1 (a tile), a global
// plain tensor after the blocks. Returns the path; `contents` gets each tensor's bytes.
std::string write_small(const std::string& name, std::vector<Bytes>* contents = nullptr) {
  TsrWriter w;
  w.metadata().set_string("general.architecture", "deepseek2");
  w.metadata().set_u32("test.answer", 42);
  w.metadata().set_string_array("test.tokens", {"a", "b", "<|x|>"});
  const uint64_t embd[2] = {32, 10}, q[2] = {64, 3}, norm[1] = {32};
  w.add_tensor(TsrTensor::plain("token_embd.weight", GgmlType::F16, embd, -1));
  w.add_tensor(TsrTensor::split1("blk.0.attn_q_a.weight", GgmlType::Q8_0, q, 0));
  w.add_tensor(TsrTensor::plain("blk.0.attn_norm.weight", GgmlType::F32, norm, 0));
  const MoeTileGeometry g = moe_tile_geometry(2, 32, 32, 64, GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::Q4_0);
  w.add_tensor(TsrTensor::moe_tile("blk.1.ffn_moe_tile", g, 1));
  w.add_tensor(TsrTensor::plain("output_norm.weight", GgmlType::F32, norm, -1));
  const std::string path = temp_file(name);
  w.begin(path);
  std::vector<Bytes> data;
  for (size_t i = 0; i < w.tensors().size(); ++i) {
    data.push_back(pattern(w.tensors()[i].nbytes, uint32_t(i + 1)));
    const uint64_t half = data[i].size() / 2;  // two writes, second half first
    w.write(i, data[i].data() + half, data[i].size() - half, half);
    w.write(i, data[i].data(), half, 0);
  }
  w.finish(2);
  if (contents) *contents = data;
  return path;
}

TEST(TsrFile, RoundTrip) {
  std::vector<Bytes> data;
  const std::string path = write_small("round.tsr", &data);
  const TsrFile f = TsrFile::open(path, {true, 2});
  ASSERT_EQ(f.tensors().size(), 5u);
  EXPECT_EQ(f.header().version, kTsrVersion);
  EXPECT_EQ(f.header().file_size, std::filesystem::file_size(path));
  EXPECT_EQ(f.header().file_size % 4096, 0u);
  EXPECT_EQ(f.header().data_offset % 4096, 0u);
  EXPECT_EQ(f.metadata().get_uint("test.answer"), 42u);
  EXPECT_EQ(f.metadata().get_string_array("test.tokens").size(), 3u);
  for (size_t i = 0; i < 5; ++i) {
    const TsrTensor& t = f.tensors()[i];
    EXPECT_EQ(t.offset % 256, 0u) << t.name;
    const auto b = f.tensor_bytes(t);
    EXPECT_TRUE(std::equal(b.begin(), b.end(), data[i].begin(), data[i].end())) << t.name;
  }
  // Groups start on pages: token_embd (the data start), block 0, block 1, output_norm.
  for (const char* n : {"token_embd.weight", "blk.0.attn_q_a.weight", "blk.1.ffn_moe_tile", "output_norm.weight"})
    EXPECT_EQ(f.require_tensor(n).offset % 4096, 0u) << n;
  EXPECT_NE(f.require_tensor("blk.0.attn_norm.weight").offset % 4096, 0u);  // 256-aligned inside its block
  ASSERT_EQ(f.n_layer_groups(), 2);
  const TsrSpan s0 = f.layer_span(0);
  EXPECT_EQ(s0.offset, f.require_tensor("blk.0.attn_q_a.weight").offset);
  const TsrTensor& n0 = f.require_tensor("blk.0.attn_norm.weight");
  EXPECT_EQ(s0.offset + s0.size, n0.offset + n0.nbytes);
  EXPECT_THROW(f.layer_span(2), Error);
  const TsrTensor& tile = f.require_tensor("blk.1.ffn_moe_tile");
  EXPECT_EQ(tile.moe_tile().slot_stride, tile.params[8]);
  EXPECT_EQ(f.require_tensor("blk.0.attn_q_a.weight").split1().rows, 3u);
  EXPECT_EQ(f.header().flags, 0u);
  EXPECT_TRUE(error_of([&] { f.require_tensor("nope"); }).find("'nope' not found") != std::string::npos);
}

TEST(TsrFile, EveryHeaderDirectoryAndMetadataByteIsProtected) {
  const std::string path = write_small("flip.tsr");
  const Bytes good = read_file(path);
  const TsrFile f = TsrFile::open(path);
  const uint64_t end = f.header().metadata_offset + f.header().metadata_size;
  size_t caught = 0;
  for (uint64_t i = 0; i < end; ++i) {
    Bytes b = good;
    b[i] ^= 0x01;
    const std::string msg = error_of([&] { TsrFile::from_memory(b, "flipped"); });
    EXPECT_FALSE(msg.empty()) << "byte " << i << " flipped was not caught";
    caught += !msg.empty();
  }
  EXPECT_EQ(caught, end);
}

TEST(TsrFile, TensorByteFlipsAreCaughtByTheirChecksum) {
  const std::string path = write_small("tflip.tsr");
  Bytes b = read_file(path);
  const TsrFile f0 = TsrFile::from_memory(b, "x");
  const std::vector<TsrTensor> tensors = f0.tensors();
  for (const TsrTensor& t : tensors) {
    Bytes c = b;
    c[t.offset + t.nbytes / 2] ^= 0x80;
    const TsrFile f = TsrFile::from_memory(c, "flipped");  // opening does not read tensor bytes
    EXPECT_FALSE(f.tensor_checksum_ok(f.require_tensor(t.name))) << t.name;
    const std::string msg = error_of([&] { f.check_all_tensors(2); });
    EXPECT_NE(msg.find("'" + t.name + "': checksum mismatch"), std::string::npos) << msg;
  }
}

TEST(TsrFile, SpecificErrors) {
  const std::string path = write_small("errors.tsr");
  const Bytes good = read_file(path);
  auto open_msg = [](const Bytes& b) { return error_of([&] { TsrFile::from_memory(b, "f.tsr"); }); };
  // Truncation anywhere (header, directory, metadata, data).
  for (uint64_t n : {uint64_t(0), uint64_t(3), uint64_t(100), uint64_t(256), uint64_t(1000), uint64_t(good.size() - 1)}) {
    const std::string m = open_msg(Bytes(good.begin(), good.begin() + int64_t(n)));
    EXPECT_NE(m.find(n < 4 ? "bad magic" : "truncated"), std::string::npos) << n << ": " << m;
  }
  Bytes longer = good;
  longer.push_back(0);
  EXPECT_NE(open_msg(longer).find("trailing bytes"), std::string::npos);
  // Another version (header re-sealed so only the version differs).
  Bytes v2 = good;
  tsr_codec::set<uint32_t>(v2.data(), tsr_codec::kOffVersion, 2);
  convert::testing::reseal(v2);
  EXPECT_NE(open_msg(v2).find("format version 2, this tessera reads version 1"), std::string::npos) << open_msg(v2);
  // Garbage and a GGUF.
  EXPECT_NE(open_msg(pattern(5000, 9)).find("bad magic"), std::string::npos);
  Bytes gguf = good;
  std::memcpy(gguf.data(), "GGUF", 4);
  EXPECT_NE(open_msg(gguf).find("GGUF file, not a packed .tsr"), std::string::npos);
  // A directory edit that is re-sealed is still caught by the layout rules.
  Bytes moved = good;
  uint8_t* e1 = moved.data() + kTsrHeaderBytes + 1 * kTsrEntryBytes;
  tsr_codec::set<uint64_t>(e1, tsr_codec::kEntOffset, tsr_codec::get<uint64_t>(e1, tsr_codec::kEntOffset) + 256);
  convert::testing::reseal(moved);
  EXPECT_NE(open_msg(moved).find("is not a multiple of 4096"), std::string::npos) << open_msg(moved);
  Bytes layout = good;
  tsr_codec::set<uint32_t>(layout.data() + kTsrHeaderBytes + kTsrEntryBytes, tsr_codec::kEntLayout, 7);
  convert::testing::reseal(layout);
  EXPECT_NE(open_msg(layout).find("unknown layout id 7"), std::string::npos) << open_msg(layout);
  Bytes params = good;
  uint8_t* e3 = params.data() + kTsrHeaderBytes + 3 * kTsrEntryBytes;  // the tile
  tsr_codec::set<uint64_t>(e3, tsr_codec::kEntParams + 8 * 8, 12345);
  convert::testing::reseal(params);
  EXPECT_NE(open_msg(params).find("slot_stride"), std::string::npos) << open_msg(params);
  // A metadata frame that claims far more bytes than it could hold (checked before any allocation).
  Bytes huge = good;
  tsr_codec::set<uint64_t>(huge.data(), tsr_codec::kOffMetaRawSize, uint64_t(900) << 20);
  convert::testing::reseal(huge);
  EXPECT_NE(open_msg(huge).find("is more than 256 x its"), std::string::npos) << open_msg(huge);
  Bytes over = good;
  tsr_codec::set<uint64_t>(over.data(), tsr_codec::kOffMetaRawSize, (uint64_t(1) << 30) + 1);
  convert::testing::reseal(over);
  EXPECT_NE(open_msg(over).find("exceeds the limit of 1073741824 bytes"), std::string::npos) << open_msg(over);
  // Opening a missing path is a runtime (I/O) error.
  try {
    TsrFile::open(temp_file("does-not-exist.tsr"));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Runtime);
  }
}

// Found by fuzz_tsr: metadata claiming billions of decoder blocks made ModelWeights::load allocate
// an entry per block before looking for any of their tensors (std::bad_alloc, not an Error).
TEST(TsrFile, LoaderRefusesMoreBlocksThanTheFileHolds) {
  ModelConfig c = *ModelConfig::preset("tiny");
  c.n_embd = 32;
  c.n_vocab = 8;
  c.n_layer = 4'000'000'000u;
  TsrWriter w;
  c.to_metadata(w.metadata());
  const uint64_t embd[2] = {c.n_embd, c.n_vocab}, norm[1] = {c.n_embd};
  w.add_tensor(TsrTensor::plain("token_embd.weight", GgmlType::F32, embd, -1));
  w.add_tensor(TsrTensor::plain("output_norm.weight", GgmlType::F32, norm, -1));
  const std::string path = temp_file("many-blocks.tsr");
  w.begin(path);
  for (size_t i = 0; i < w.tensors().size(); ++i) {
    const Bytes bytes = pattern(w.tensors()[i].nbytes, 0);
    w.write(i, bytes.data(), bytes.size());
  }
  w.finish();
  const TsrWeights weights(path);
  const ModelConfig read = ModelConfig::from_metadata(weights.metadata());
  ASSERT_EQ(read.n_layer, c.n_layer);
  const std::string msg = error_of([&] { cpu::ModelWeights::load(weights, read, AttentionPath::Absorbed); });
  EXPECT_NE(msg.find("the metadata says 4000000000 decoder blocks, the file has no tensors of block 0 "
                     "('blk.0.attn_norm.weight' not found)"),
            std::string::npos)
      << msg;
}

// A vocabulary size past 32 bits is refused, not truncated (found reading fuzz_tsr's targets).
TEST(TsrFile, VocabularySizePast32BitsIsRefused) {
  ModelConfig c = *ModelConfig::preset("tiny");
  Metadata md;
  c.to_metadata(md);
  md.set_u64("deepseek2.vocab_size", (1ull << 32) + 8);
  const std::string msg = error_of([&] { ModelConfig::from_metadata(md); });
  EXPECT_NE(msg.find("deepseek2.vocab_size = 4294967304 is out of range"), std::string::npos) << msg;
}

// The float hyper-parameters: NaN, infinities, a non-positive RMS epsilon or a rope base <= 1
// are refused with the key and the value (found reading fuzz_tsr's targets).
TEST(TsrFile, HyperParametersOutOfRangeAreRefused) {
  struct Bad {
    const char* key;
    float value;
    const char* expect;
  };
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  for (const Bad& b : {Bad{"deepseek2.attention.layer_norm_rms_epsilon", nan, "expected a finite number"},
                       Bad{"deepseek2.attention.layer_norm_rms_epsilon", 0.f, "expected 0 < eps < 1"},
                       Bad{"deepseek2.attention.layer_norm_rms_epsilon", -1e-6f, "expected 0 < eps < 1"},
                       Bad{"deepseek2.rope.freq_base", 0.5f, "expected > 1"},
                       Bad{"deepseek2.rope.freq_base", inf, "expected a finite number"},
                       Bad{"deepseek2.expert_weights_scale", nan, "expected a finite number"}}) {
    SCOPED_TRACE(b.key);
    ModelConfig c = *ModelConfig::preset("tiny");
    Metadata md;
    c.to_metadata(md);
    md.set_f32(b.key, b.value);
    const std::string msg = error_of([&] { ModelConfig::from_metadata(md); });
    EXPECT_NE(msg.find(b.key), std::string::npos) << msg;
    EXPECT_NE(msg.find(b.expect), std::string::npos) << msg;
  }
}

TEST(TsrWriter, UnfinishedWritersLeaveNothing) {
  const std::string path = temp_file("unfinished.tsr");
  std::string tmp;
  {
    TsrWriter w;
    const uint64_t ne[1] = {64};
    w.add_tensor(TsrTensor::plain("a", GgmlType::F32, ne, -1));
    w.begin(path);
    tmp = w.temp_path();
    EXPECT_TRUE(std::filesystem::exists(tmp));
    EXPECT_FALSE(std::filesystem::exists(path));
  }  // destroyed without finish()
  EXPECT_FALSE(std::filesystem::exists(tmp));
  EXPECT_FALSE(std::filesystem::exists(path));
  {
    TsrWriter w;
    const uint64_t ne[1] = {64};
    w.add_tensor(TsrTensor::plain("a", GgmlType::F32, ne, -1));
    w.begin(path);
    const Bytes half(128, 1);
    w.write(0, half.data(), half.size(), 0);
    EXPECT_NE(error_of([&] { w.finish(); }).find("128 bytes were written, expected 256"), std::string::npos);
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(TsrWriter, RefusesBadPlansBeforeWriting) {
  const std::string path = temp_file("huge.tsr");
  TsrWriter w;
  const uint64_t huge[2] = {uint64_t(1) << 30, uint64_t(1) << 14};  // 64 TiB of f32
  w.add_tensor(TsrTensor::plain("huge", GgmlType::F32, huge, -1));
  EXPECT_NE(error_of([&] { w.begin(path); }).find("not enough disk space"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(w.temp_path()));
  // Metadata the reader would refuse (80 MiB that compress past 256 x): refused before writing.
  TsrWriter m;
  const uint64_t one[1] = {64};
  m.add_tensor(TsrTensor::plain("a", GgmlType::F32, one, -1));
  m.metadata().set_string("test.padding", std::string(size_t(80) << 20, 'x'));
  EXPECT_NE(error_of([&] { m.begin(path); }).find("past what a .tsr reader accepts"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(m.temp_path()));
  // A block split into two runs, and a duplicate name.
  TsrWriter v;
  const uint64_t ne[1] = {64};
  v.add_tensor(TsrTensor::plain("a", GgmlType::F32, ne, 0));
  v.add_tensor(TsrTensor::plain("b", GgmlType::F32, ne, 1));
  EXPECT_NE(error_of([&] { v.add_tensor(TsrTensor::plain("c", GgmlType::F32, ne, 0)); }).find("does not follow"),
            std::string::npos);
  EXPECT_NE(error_of([&] { v.add_tensor(TsrTensor::plain("a", GgmlType::F32, ne, 1)); }).find("duplicate"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera
