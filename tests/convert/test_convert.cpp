// tessera convert + verify on synthetic tiny models: every synth type and every --compose mode
// converts and verifies; every --composed-type stores the type it names (or its fallback); the
// packed file has the documented layout; damage to any kind of tensor is found by verify; bad
// sources and options are refused before anything is written; a conversion that fails or is
// killed midway leaves no output file.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <utility>

#include "convert/compose.h"
#include "convert/convert.h"
#include "convert/verify.h"
#include "format/error.h"
#include "format/gguf.h"
#include "format/tsr.h"
#include "tests/convert/convert_test_util.h"

namespace tessera::convert {
namespace {

using testing::Bytes;
using testing::error_of;
using testing::packed_model;
using testing::read_file;
using testing::synth_model;
using testing::temp_file;
using testing::write_file;

VerifyReport verify(const std::string& gguf, const std::string& tsr) {
  VerifyOptions o;
  o.original_path = gguf;
  o.packed_path = tsr;
  o.threads = 2;
  return verify_packed(o);
}

// Failing rows of one check category.
std::vector<VerifyRow> failures(const VerifyReport& r, const std::string& check) {
  std::vector<VerifyRow> out;
  for (const VerifyRow& row : r.rows)
    if (!row.pass && row.check == check) out.push_back(row);
  return out;
}

struct Case {
  const char* preset;
  const char* type;
};
class ConvertVerify : public ::testing::TestWithParam<Case> {};

// --compose auto (the default) composes where it measured faster: with a q LoRA (tiny, GLM-like)
// everything, without one (tiny-lite, V2-Lite-like) nothing.
TEST(ConvertCompose, AutoFollowsTheQLora) {
  for (const char* preset : {"tiny", "tiny-lite"}) {
    SCOPED_TRACE(preset);
    const std::string& src = synth_model(preset, "q4_0");
    const ModelConfig cfg = ModelConfig::from_metadata(GgufFile::open(src).metadata());
    const std::string want = cfg.q_lora_rank ? "all" : "none";
    EXPECT_EQ(resolve_compose("auto", cfg), want);
    EXPECT_EQ(resolve_compose("vo", cfg), "vo");
    EXPECT_EQ(ConvertOptions{}.compose, "auto");
    const std::string out = temp_file(std::string(preset) + "-auto.tsr");
    ConvertOptions o = testing::convert_options(src, out, "auto");
    convert_model(o);
    const TsrFile f = TsrFile::open(out);
    EXPECT_EQ(f.metadata().get_string("tessera.compose"), want);
    EXPECT_EQ(f.find_tensor(qk_name(0)) != nullptr, want == "all");
    EXPECT_EQ(f.find_tensor(vo_name(0)) != nullptr, want == "all");
  }
}

TEST_P(ConvertVerify, EveryComposeModePasses) {
  const Case c = GetParam();
  const std::string& src = synth_model(c.preset, c.type);
  const GgufFile gguf = GgufFile::open(src);
  const ModelConfig cfg = ModelConfig::from_metadata(gguf.metadata());
  for (const char* compose : {"all", "qk", "vo", "none"}) {
    SCOPED_TRACE(compose);
    const std::string& out = packed_model(c.preset, c.type, compose);
    const VerifyReport r = verify(src, out);
    EXPECT_TRUE(r.ok()) << r.table(false);
    const TsrFile f = TsrFile::open(out, {true, 2});
    const ComposeSet set = parse_compose(compose);
    for (uint32_t L = 0; L < cfg.n_layer; ++L) {
      EXPECT_EQ(f.find_tensor(qk_name(L)) != nullptr, set.qk) << L;
      EXPECT_EQ(f.find_tensor(vo_name(L)) != nullptr, set.vo) << L;
      EXPECT_EQ(f.find_tensor(blk(L, "attn_k_b.weight")) == nullptr, set.qk) << L;
      EXPECT_EQ(f.find_tensor(blk(L, "attn_output.weight")) == nullptr, set.vo) << L;
      EXPECT_EQ(f.find_tensor(blk(L, "ffn_moe_tile")) != nullptr, cfg.is_moe(L)) << L;
      EXPECT_EQ(f.find_tensor(blk(L, "ffn_gate_exps.weight")), nullptr);
      EXPECT_EQ(f.layer_span(int(L)).offset % 4096, 0u);
    }
    EXPECT_EQ(f.metadata().get_string("tessera.compose"), compose);
    EXPECT_EQ(f.header().flags, (set.qk ? kTsrFlagComposedQk : 0u) | (set.vo ? kTsrFlagComposedVo : 0u));
    // Layout choice: float types plain, block types split1, types never changed.
    for (const TsrTensor& t : f.tensors()) {
      if (t.layout == TsrLayout::MoeTile1 || t.composed()) continue;
      const GgufTensorInfo& s = gguf.require_tensor(t.name);
      EXPECT_EQ(t.type, s.type) << t.name;
      const bool is_float = s.type == GgmlType::F32 || s.type == GgmlType::F16 || s.type == GgmlType::BF16;
      EXPECT_EQ(t.layout, is_float ? TsrLayout::Plain : TsrLayout::Split1) << t.name;
    }
  }
  // Composed in the source type as well ("source", with llama.cpp's fallback where needed).
  EXPECT_TRUE(verify(src, packed_model(c.preset, c.type, "all", "source")).ok());
}

INSTANTIATE_TEST_SUITE_P(Synth, ConvertVerify,
                         ::testing::Values(Case{"tiny", "f32"}, Case{"tiny", "f16"}, Case{"tiny", "bf16"}, Case{"tiny", "q8_0"},
                                           Case{"tiny", "q4_0"}, Case{"tiny", "q4_k_m"}, Case{"tiny-lite", "f32"},
                                           Case{"tiny-lite", "f16"}, Case{"tiny-lite", "bf16"}, Case{"tiny-lite", "q8_0"},
                                           Case{"tiny-lite", "q4_0"}, Case{"tiny-lite", "q4_k_m"}),
                         [](const auto& info) {
                           std::string n = std::string(info.param.preset) + "_" + info.param.type;
                           for (char& ch : n) ch = ch == '-' ? '_' : ch;
                           return n;
                         });

TEST(Convert, ComposedTypesAndFallbacks) {
  // tiny: q_in = 96 (fits 32-blocks, not 256), H*kv_lora = 512.
  EXPECT_EQ(composed_storage_type("q8_0", GgmlType::Q4_K, 96), GgmlType::Q8_0);
  EXPECT_EQ(composed_storage_type("source", GgmlType::Q4_K, 96), GgmlType::Q5_0);
  EXPECT_EQ(composed_storage_type("source", GgmlType::Q6_K, 96), GgmlType::Q8_0);
  EXPECT_EQ(composed_storage_type("source", GgmlType::Q5_K, 96), GgmlType::Q5_1);
  EXPECT_EQ(composed_storage_type("source", GgmlType::Q4_K, 512), GgmlType::Q4_K);
  EXPECT_EQ(composed_storage_type("q4_0", GgmlType::F32, 48), GgmlType::F16);
  EXPECT_EQ(composed_storage_type("source", GgmlType::BF16, 48), GgmlType::BF16);
  EXPECT_EQ(composed_storage_type("f16", GgmlType::Q4_0, 96), GgmlType::F16);
  EXPECT_EQ(composed_storage_type("q6_K", GgmlType::Q4_0, 512), GgmlType::Q6_K);
  EXPECT_EQ(composed_storage_type("q6_K", GgmlType::Q4_0, 96), GgmlType::Q8_0);
  EXPECT_EQ(composed_storage_type("q4_K", GgmlType::Q8_0, 256), GgmlType::Q4_K);
  EXPECT_EQ(composed_storage_type("q4_K", GgmlType::Q8_0, 96), GgmlType::Q5_0);
  EXPECT_EQ(composed_storage_type("q4_K", GgmlType::Q8_0, 48), GgmlType::F16);  // not even a 32-block
  EXPECT_THROW(composed_storage_type("q5_0", GgmlType::Q4_0, 96), Error);
  // An unknown word is a usage error naming every accepted one; a case-only misspelling is told
  // the right spelling (the option is matched exactly).
  const std::vector<std::string> accepted = {"f32", "f16", "bf16", "q8_0", "q6_K", "q4_K", "q4_0", "source"};
  EXPECT_EQ(composed_type_options(), accepted);
  for (const char* word : {"q5_K", "q6_k", "Q4_K", "q4_k_m", ""}) {
    SCOPED_TRACE(word);
    try {
      check_composed_type_option(word);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(e.kind(), ErrorKind::Usage) << m;
      EXPECT_NE(m.find(std::string("--composed-type '") + word + "'"), std::string::npos) << m;
      EXPECT_NE(m.find("expected f32, f16, bf16, q8_0, q6_K, q4_K, q4_0 or source"), std::string::npos) << m;
      const bool case_only = std::string(word) == "q6_k" || std::string(word) == "Q4_K";
      EXPECT_EQ(m.find("spelled as GGUF names them") != std::string::npos, case_only) << m;
    }
  }
  EXPECT_NE(error_of([] { check_composed_type_option("q6_k"); }).find("'q6_K'"), std::string::npos);
  for (const std::string& word : accepted) EXPECT_NO_THROW(check_composed_type_option(word)) << word;
  EXPECT_THROW(parse_compose("some"), Error);
  // In a file: q8_0 composed tensors are split1, f16 ones plain.
  const TsrFile q8 = TsrFile::open(packed_model("tiny", "q4_0", "all", "q8_0"));
  EXPECT_EQ(q8.require_tensor(qk_name(0)).layout, TsrLayout::Split1);
  EXPECT_EQ(q8.require_tensor(qk_name(0)).type, GgmlType::Q8_0);
  EXPECT_TRUE(q8.require_tensor(vo_name(1)).composed());
  const TsrFile f16 = TsrFile::open(packed_model("tiny", "q4_0", "all", "f16"));
  EXPECT_EQ(f16.require_tensor(vo_name(0)).layout, TsrLayout::Plain);
  EXPECT_EQ(f16.require_tensor(vo_name(0)).type, GgmlType::F16);
  EXPECT_TRUE(verify(synth_model("tiny", "q4_0"), packed_model("tiny", "q4_0", "all", "f16")).ok());
  // Shapes: attn_qk {q_in, H*(kv_lora+rope)}, attn_vo {H*kv_lora, n_embd}.
  const ModelConfig cfg = ModelConfig::from_metadata(q8.metadata());
  const TsrTensor& qk = q8.require_tensor(qk_name(2));
  EXPECT_EQ(qk.ne[0], cfg.q_lora_rank);
  EXPECT_EQ(qk.ne[1], uint64_t(cfg.n_head) * (cfg.kv_lora_rank + cfg.n_rot));
  const TsrTensor& vo = q8.require_tensor(vo_name(2));
  EXPECT_EQ(vo.ne[0], uint64_t(cfg.n_head) * cfg.kv_lora_rank);
  EXPECT_EQ(vo.ne[1], cfg.n_embd);
}

// The "quantization err max X" of a composed row (verify's per-tensor report), -1 if absent.
double quantization_error(const VerifyRow& row) {
  const std::string key = "quantization err max ";
  const size_t at = row.detail.find(key);
  return at == std::string::npos ? -1.0 : std::stod(row.detail.substr(at + key.size()));
}

// --composed-type q6_K / q4_K: K-quant composed tensors where the row length is a multiple of 256,
// llama.cpp's fallback (Q6_K -> Q8_0, Q4_K -> Q5_0) where not; verify re-derives the type, passes,
// and reports a quantization error that orders q8_0 < q6_K < q4_K on the same tensor.
TEST(ConvertCompose, KQuantComposedTypesAndTheirFallbacks) {
  // Rows: tiny q_in = 96 (a multiple of 32, not of 256), H*kv_lora = 512; tiny-lite 256 and 512.
  struct Want { const char* preset; const char* option; GgmlType qk, vo; };
  const Want wants[] = {{"tiny", "q8_0", GgmlType::Q8_0, GgmlType::Q8_0},
                        {"tiny", "q6_K", GgmlType::Q8_0, GgmlType::Q6_K},
                        {"tiny", "q4_K", GgmlType::Q5_0, GgmlType::Q4_K},
                        {"tiny-lite", "q8_0", GgmlType::Q8_0, GgmlType::Q8_0},
                        {"tiny-lite", "q6_K", GgmlType::Q6_K, GgmlType::Q6_K},
                        {"tiny-lite", "q4_K", GgmlType::Q4_K, GgmlType::Q4_K}};
  for (const char* source : {"q4_0", "q4_k_m"}) {
    std::map<std::string, double> q8_err;  // preset/tensor -> its q8_0 quantization error
    std::map<std::string, double> q6_err;
    for (const Want& w : wants) {
      SCOPED_TRACE(std::string(w.preset) + " " + source + " --composed-type " + w.option);
      const std::string& src = synth_model(w.preset, source);
      const std::string& out = packed_model(w.preset, source, "all", w.option);
      const TsrFile f = TsrFile::open(out);
      EXPECT_EQ(f.metadata().get_string("tessera.composed_type"), w.option);
      const ModelConfig cfg = ModelConfig::from_metadata(f.metadata());
      for (uint32_t L = 0; L < cfg.n_layer; ++L) {
        for (const auto& [name, type] : {std::pair{qk_name(L), w.qk}, std::pair{vo_name(L), w.vo}}) {
          const TsrTensor& t = f.require_tensor(name);
          EXPECT_EQ(t.type, type) << name << " stored as " << type_name(t.type);
          EXPECT_EQ(t.layout, TsrLayout::Split1) << name;
          EXPECT_TRUE(t.composed()) << name;
        }
      }
      const VerifyReport r = verify(src, out);
      EXPECT_TRUE(r.ok()) << r.table(false);
      size_t composed_rows = 0;
      for (const VerifyRow& row : r.rows) {
        if (row.check != "composed" || row.subject.find("attn_") == std::string::npos) continue;
        ++composed_rows;
        const GgmlType type = row.subject.ends_with("attn_qk.weight") ? w.qk : w.vo;
        EXPECT_EQ(row.detail.rfind(std::string(type_name(type)) + ", ", 0), 0u) << row.subject << ": " << row.detail;
        const double err = quantization_error(row);
        EXPECT_GT(err, 0.0) << row.subject << ": " << row.detail;
        EXPECT_LE(err, quantization_tolerance(type)) << row.subject << ": " << row.detail;
        const std::string key = std::string(w.preset) + "/" + row.subject;
        const std::string option = w.option;
        if (option == "q8_0") q8_err[key] = err;
        if (option == "q6_K") q6_err[key] = err;
        if (option == "q8_0" || !q8_err.count(key)) continue;
        if (type == GgmlType::Q8_0) {
          EXPECT_EQ(err, q8_err[key]) << row.subject << ": the fallback is plain q8_0";
        } else {
          EXPECT_GT(err, q8_err[key]) << row.subject << ": " << row.detail;
        }
        if (option == "q4_K" && q6_err.count(key)) EXPECT_GT(err, q6_err[key]) << row.subject << ": " << row.detail;
      }
      EXPECT_EQ(composed_rows, 2 * cfg.n_layer);
    }
  }
}

// A byte of a K-quant composed tensor changed (checksums re-sealed): verify's composed check
// finds it in the quants and in the super-block scales.
TEST(ConvertCompose, VerifyFindsAChangedByteInAKQuantComposedTensor) {
  const std::string& src = synth_model("tiny-lite", "q4_0");
  for (const char* option : {"q6_K", "q4_K"}) {
    SCOPED_TRACE(option);
    const Bytes good = read_file(packed_model("tiny-lite", "q4_0", "all", option));
    const TsrFile f = TsrFile::from_memory(good, "packed");
    const TsrTensor& qk = f.require_tensor(qk_name(1));
    const TsrTensor& vo = f.require_tensor(vo_name(2));
    for (const auto& [t, at] : {std::pair{&qk, qk.split1().q_row_offset(qk.split1().rows / 2) + 3},
                                std::pair{&vo, vo.split1().m_row_offset(7)}}) {
      Bytes b = good;
      b[t->offset + at] ^= 0x5A;
      testing::reseal(b);
      const std::string path = temp_file("changed-k.tsr");
      write_file(path, b);
      const std::vector<VerifyRow> bad = failures(verify(src, path), "composed");
      ASSERT_EQ(bad.size(), 1u) << t->name;
      EXPECT_EQ(bad[0].subject, t->name);
    }
  }
}

// A copy of the packed file `in` whose tessera.composed_type says `option` (tensors unchanged).
std::string relabel_composed_type(const std::string& in, const std::string& option) {
  const TsrFile f = TsrFile::open(in);
  TsrWriter w;
  w.metadata() = f.metadata();
  w.metadata().set_string("tessera.composed_type", option);
  for (const TsrTensor& t : f.tensors()) w.add_tensor(t);
  const std::string out = temp_file("relabeled-" + option + ".tsr");
  w.begin(out);
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const std::span<const uint8_t> b = f.tensor_bytes(f.tensors()[i]);
    w.write(i, b.data(), b.size());
  }
  w.finish();
  return out;
}

// verify re-derives each composed tensor's type from tessera.composed_type and its row length:
// a file stored otherwise fails on exactly the tensors that differ, naming both types.
TEST(ConvertCompose, VerifyChecksTheStoredTypeAgainstTheOption) {
  // tiny, composed q8_0, claimed q6_K: attn_qk (96-long rows) is q6_K's fallback Q8_0, attn_vo
  // (512) should have been Q6_K.
  const std::string tiny = relabel_composed_type(packed_model("tiny", "q4_0", "all", "q8_0"), "q6_K");
  VerifyReport r = verify(synth_model("tiny", "q4_0"), tiny);
  std::vector<VerifyRow> bad = failures(r, "composed");
  ASSERT_EQ(bad.size(), 3u) << r.table(false);
  for (const VerifyRow& row : bad) {
    EXPECT_TRUE(row.subject.ends_with("attn_vo.weight")) << row.subject;
    EXPECT_EQ(row.detail, "stored as q8_0 but --composed-type q6_K gives q6_K") << row.subject;
  }
  // tiny-lite, composed q6_K, claimed q4_K: every composed tensor differs.
  const std::string lite = relabel_composed_type(packed_model("tiny-lite", "q4_0", "all", "q6_K"), "q4_K");
  r = verify(synth_model("tiny-lite", "q4_0"), lite);
  bad = failures(r, "composed");
  ASSERT_EQ(bad.size(), 6u) << r.table(false);
  EXPECT_EQ(bad[0].detail, "stored as q6_K but --composed-type q4_K gives q4_K");
  // A word the converter does not accept (here a case-only misspelling) fails every composed tensor.
  const std::string word = relabel_composed_type(packed_model("tiny-lite", "q4_0", "all", "q6_K"), "q6_k");
  bad = failures(verify(synth_model("tiny-lite", "q4_0"), word), "composed");
  ASSERT_EQ(bad.size(), 6u);
  EXPECT_NE(bad[0].detail.find("tessera.composed_type: --composed-type 'q6_k': expected"), std::string::npos) << bad[0].detail;
}

TEST(Convert, MetadataCarriesTheSourceAndProvenance) {
  const std::string& src = synth_model("tiny-lite", "q4_0");
  const GgufFile g = GgufFile::open(src);
  const TsrFile f = TsrFile::open(packed_model("tiny-lite", "q4_0", "all"));
  const Metadata& m = f.metadata();
  for (const GgufKV& kv : g.metadata().entries()) EXPECT_TRUE(m.has(kv.key)) << kv.key;
  EXPECT_EQ(m.get_string_array("tokenizer.ggml.tokens"), g.metadata().get_string_array("tokenizer.ggml.tokens"));
  EXPECT_EQ(m.get_uint("tessera.source.size"), g.file_size());
  EXPECT_EQ(m.get_uint("tessera.source.metadata_hash"), source_metadata_hash(g));
  EXPECT_EQ(m.get_string("tessera.source.name"), std::filesystem::path(src).filename().string());
  EXPECT_EQ(m.get_string("tessera.composed_type"), "q8_0");
  EXPECT_EQ(m.get_uint("tessera.tile_layout"), 2u);
  EXPECT_EQ(m.get_uint("tessera.split_layout"), 1u);
  EXPECT_EQ(m.get_uint("tessera.format_version"), kTsrVersion);
  // Verifying against another original fails on provenance and bytes.
  const VerifyReport r = verify(synth_model("tiny-lite", "q8_0"), packed_model("tiny-lite", "q4_0", "all"));
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(failures(r, "metadata").empty());
  EXPECT_FALSE(failures(r, "bytes").empty());
  // An original of other shapes is refused before any comparison.
  const std::string msg = error_of([] { verify(synth_model("tiny", "q4_0"), packed_model("tiny-lite", "q4_0", "all")); });
  EXPECT_NE(msg.find("token_embd.weight' has shape {256, 1200}, expected {256, 1100}"), std::string::npos) << msg;
}

// One byte changed in a tensor of each kind, with the checksums re-sealed: the byte and composed
// comparisons must find it. Without re-sealing the tensor checksum finds it.
TEST(Convert, VerifyFindsAChangedByteInEveryTensorKind) {
  const std::string& src = synth_model("tiny", "q4_0");
  const std::string& packed = packed_model("tiny", "q4_0", "all");
  const Bytes good = read_file(packed);
  const TsrFile f = TsrFile::from_memory(good, "packed");
  // {tensor, byte offset inside it, the check that must fail}: a byte of real data in each kind.
  struct Target { const char* name; uint64_t at; const char* check; };
  const TsrTensor& q_a = f.require_tensor("blk.0.attn_q_a.weight");
  const TsrTensor& tile = f.require_tensor("blk.1.ffn_moe_tile");
  const TsrTensor& qk = f.require_tensor("blk.2.attn_qk.weight");
  const TsrTensor& vo = f.require_tensor("blk.1.attn_vo.weight");
  const Target targets[] = {{"blk.0.attn_norm.weight", 17, "bytes"},                                  // plain f32
                            {q_a.name.c_str(), q_a.split1().q_row_offset(q_a.split1().rows / 2) + 3, "bytes"},
                            {tile.name.c_str(), tile.moe_tile().gateup_at(1) + 5, "bytes"},         // expert 1 gate/up
                            {qk.name.c_str(), qk.split1().q_row_offset(qk.split1().rows / 2) + 3, "composed"},
                            {vo.name.c_str(), vo.split1().m_row_offset(5), "composed"}};             // a scale
  for (const Target& tg : targets) {
    SCOPED_TRACE(tg.name);
    const TsrTensor& t = f.require_tensor(tg.name);
    Bytes b = good;
    b[t.offset + tg.at] ^= 0x5A;
    const std::string path = temp_file("changed.tsr");
    write_file(path, b);
    const VerifyReport unsealed = verify(src, path);
    ASSERT_EQ(failures(unsealed, "checksum").size(), 2u) << unsealed.table(false);  // the tensor + the summary row
    EXPECT_EQ(failures(unsealed, "checksum")[0].subject, tg.name);
    testing::reseal(b);
    write_file(path, b);
    const VerifyReport sealed = verify(src, path);
    EXPECT_TRUE(failures(sealed, "checksum").empty());
    EXPECT_FALSE(failures(sealed, tg.check).empty()) << sealed.table(true);
  }
  // The split1 region M (scales) and a tile's shared slot too.
  {
    Bytes b = good;
    b[q_a.offset + q_a.split1().m_offset + 1] ^= 0x01;
    testing::reseal(b);
    write_file(temp_file("changed.tsr"), b);
    EXPECT_FALSE(failures(verify(src, temp_file("changed.tsr")), "bytes").empty());
    const TsrTensor& tile2 = f.require_tensor("blk.2.ffn_moe_tile");
    Bytes c = good;
    c[tile2.offset + tile2.moe_tile().shared_down_offset + 7] ^= 0x10;
    testing::reseal(c);
    write_file(temp_file("changed.tsr"), c);
    const auto rows = failures(verify(src, temp_file("changed.tsr")), "bytes");
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(rows[0].subject, "blk.2.ffn_down_shexp.weight");
  }
}

TEST(Convert, HeaderDirectoryAndMetadataDamageIsCaughtAtOpen) {
  const Bytes good = read_file(packed_model("tiny", "q8_0", "all"));
  const TsrFile f = TsrFile::from_memory(good, "packed");
  const uint64_t end = f.header().metadata_offset + f.header().metadata_size;
  size_t tried = 0;
  for (uint64_t i = 0; i < end; i += (i < kTsrHeaderBytes ? 1 : 61)) {
    Bytes b = good;
    b[i] ^= 0x04;
    EXPECT_FALSE(error_of([&] { TsrFile::from_memory(b, "x"); }).empty()) << "byte " << i;
    ++tried;
  }
  EXPECT_GT(tried, 300u);
  const std::string path = temp_file("damaged.tsr");
  Bytes b = good;
  b[f.header().metadata_offset + 3] ^= 0x01;
  write_file(path, b);
  EXPECT_NE(error_of([&] { verify(synth_model("tiny", "q8_0"), path); }).find("metadata checksum mismatch"), std::string::npos);
}

// A copy of `src` with edits: metadata changes, tensors dropped or replaced (zero bytes).
struct Edit {
  std::function<void(Metadata&)> metadata;
  std::string drop;
  std::string replace;
  GgmlType replace_type = GgmlType::F32;
  std::vector<uint64_t> replace_ne;
};
std::string rewrite(const std::string& src, const std::string& name, const Edit& e) {
  const GgufFile g = GgufFile::open(src);
  GgufWriter w;
  w.metadata() = g.metadata();
  if (e.metadata) e.metadata(w.metadata());
  std::vector<const GgufTensorInfo*> kept;
  for (const GgufTensorInfo& t : g.tensors()) {
    if (t.name == e.drop) continue;
    if (t.name == e.replace) w.add_tensor(t.name, e.replace_type, e.replace_ne);
    else w.add_tensor(t.name, t.type, std::vector<uint64_t>(t.ne.begin(), t.ne.begin() + t.n_dims));
    kept.push_back(&t);
  }
  const std::string path = temp_file(name);
  w.begin(path);
  for (size_t i = 0; i < kept.size(); ++i) {
    const GgufTensorInfo& out = w.tensors()[i];
    if (out.name == e.replace) {
      const Bytes zeros(out.nbytes, 0);
      w.write_tensor(i, zeros.data(), zeros.size());
    } else {
      w.write_tensor(i, g.tensor_data(*kept[i]), kept[i]->nbytes);
    }
  }
  w.finish();
  return path;
}

void expect_refused(const std::string& in, const std::string& phrase, ErrorKind kind = ErrorKind::BadInput) {
  const std::string out = temp_file("refused.tsr");
  try {
    convert_model(testing::convert_options(in, out));
    ADD_FAILURE() << "no error, expected \"" << phrase << "\"";
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), kind) << err.what();
    EXPECT_NE(std::string(err.what()).find(phrase), std::string::npos) << err.what();
  }
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(Convert, RefusesBadSourcesAndOptions) {
  const std::string& src = synth_model("tiny", "q4_0");
  expect_refused(rewrite(src, "llama.gguf", {[](Metadata& m) { m.set_string("general.architecture", "llama"); }}),
                 "general.architecture is 'llama', expected 'deepseek2'");
  expect_refused(rewrite(src, "missing.gguf", {nullptr, "blk.1.attn_kv_a_mqa.weight"}),
                 "missing tensor 'blk.1.attn_kv_a_mqa.weight'");
  expect_refused(rewrite(src, "shape.gguf", {nullptr, "", "blk.2.attn_norm.weight", GgmlType::F32, {128}}),
                 "'blk.2.attn_norm.weight' has shape {128}, expected {256}");
  const GgufFile g = GgufFile::open(src);
  const GgufTensorInfo& up = g.require_tensor("blk.1.ffn_up_exps.weight");
  expect_refused(rewrite(src, "mixed.gguf",
                         {nullptr, "", up.name, GgmlType::Q8_0, std::vector<uint64_t>(up.ne.begin(), up.ne.begin() + 3)}),
                 "gate and up of the same type");
  ConvertOptions same = testing::convert_options(src, src);
  EXPECT_NE(error_of([&] { convert_model(same); }).find("is the input file"), std::string::npos);
  // Another name for the same file.
  const std::string link = temp_file("link.gguf");
  std::filesystem::remove(link);
  std::filesystem::create_hard_link(src, link);
  ConvertOptions hard = testing::convert_options(src, link);
  EXPECT_NE(error_of([&] { convert_model(hard); }).find("is the same file as the input"), std::string::npos);
  ConvertOptions bad = testing::convert_options(src, temp_file("bad.tsr"), "qkv");
  EXPECT_NE(error_of([&] { convert_model(bad); }).find("--compose 'qkv'"), std::string::npos);
  bad = testing::convert_options(src, temp_file("bad.tsr"), "all", "q6_k");
  EXPECT_NE(error_of([&] { convert_model(bad); }).find("--composed-type 'q6_k'"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(temp_file("bad.tsr")));
}

TEST(Convert, AFailureMidwayLeavesNoOutput) {
  const std::string& src = synth_model("tiny", "q4_k_m");
  const std::string out = temp_file("failed.tsr");
  ConvertOptions o = testing::convert_options(src, out);
  o.after_tensor = [](size_t i, const std::string&) {
    if (i == 10) runtime_error("injected failure after tensor 10");
  };
  EXPECT_NE(error_of([&] { convert_model(o); }).find("injected failure"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_FALSE(std::filesystem::exists(out + ".tmp-" + std::to_string(getpid())));
  // An older OUT stays as it was.
  write_file(out, Bytes{1, 2, 3});
  EXPECT_FALSE(error_of([&] { convert_model(o); }).empty());
  EXPECT_EQ(read_file(out), (Bytes{1, 2, 3}));
}

TEST(Convert, AProcessKilledMidwayLeavesNoOutput) {
  const std::string& src = synth_model("tiny", "q4_0");
  const std::string out = temp_file("killed.tsr");
  std::filesystem::remove(out);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ConvertOptions o = testing::convert_options(src, out);
    o.threads = 1;
    o.after_tensor = [](size_t i, const std::string&) {
      if (i == 20) raise(SIGKILL);
    };
    try {
      convert_model(o);
    } catch (...) {
    }
    _exit(0);  // not reached when the kill lands
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  EXPECT_FALSE(std::filesystem::exists(out));
  // The half-written temporary file has no valid header (written last), so nothing can mistake it
  // for a packed model.
  const std::string tmp = out + ".tmp-" + std::to_string(child);
  ASSERT_TRUE(std::filesystem::exists(tmp));
  EXPECT_NE(error_of([&] { TsrFile::open(tmp); }).find("bad magic"), std::string::npos);
  std::filesystem::remove(tmp);
}

}  // namespace
}  // namespace tessera::convert
