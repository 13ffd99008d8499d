// synthesize() -> GgufFile::open round trips: names, shapes, types, metadata, determinism.
#include <gtest/gtest.h>

#include <cstring>

#include "convert/synth.h"
#include "format/error.h"
#include "format/gguf.h"
#include "tests/synth/test_util.h"

namespace tessera::synth {
namespace {

using testing::options;

using testing::read_bytes;
using testing::ScratchDir;

// Opens `path` and checks it against the plan of `o`: tensor order, names, shapes, types, sizes,
// the metadata keys synth promises, and that the config read back equals the plan's.
void check_file(const SynthOptions& o, const SynthResult& r) {
  SCOPED_TRACE(o.preset + " " + o.type);
  const Plan plan = make_plan(o);
  const GgufFile f = GgufFile::open(o.out_path);
  EXPECT_EQ(r.bytes, f.file_size());
  EXPECT_EQ(r.n_tensors, plan.tensors.size());

  const std::vector<TensorSpec> expected = expected_tensors(plan.config);
  ASSERT_EQ(f.tensors().size(), expected.size());
  size_t n_total = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const GgufTensorInfo& t = f.tensors()[i];
    EXPECT_EQ(t.name, expected[i].name);
    ASSERT_EQ(t.n_dims, expected[i].ne.size()) << t.name;
    for (size_t d = 0; d < 4; ++d) EXPECT_EQ(t.ne[d], d < expected[i].ne.size() ? expected[i].ne[d] : 1u) << t.name;
    EXPECT_EQ(t.type, tensor_type(plan.config, expected[i], o.type)) << t.name;
    EXPECT_EQ(t.nbytes, plan.tensors[i].nbytes) << t.name;
  }
  for (auto [type, n] : r.type_counts) n_total += n;
  EXPECT_EQ(n_total, expected.size());

  const Metadata& md = f.metadata();
  EXPECT_EQ(md.get_string("general.architecture"), "deepseek2");
  EXPECT_EQ(md.get_uint("general.file_type"), file_type(o.type));
  EXPECT_EQ(md.get_uint("general.quantization_version"), 2u);
  EXPECT_EQ(md.get_string_array("tokenizer.ggml.tokens").size(), plan.config.n_vocab);
  EXPECT_EQ(md.get_int_array("tokenizer.ggml.token_type").size(), plan.config.n_vocab);
  EXPECT_FALSE(md.get_string_array("tokenizer.ggml.merges").empty());
  const bool glm = o.preset == "glm47flash" || o.preset == "tiny";
  EXPECT_EQ(md.get_string("tokenizer.ggml.pre"), glm ? "glm4" : "deepseek-llm");
  EXPECT_TRUE(md.has("tokenizer.chat_template"));

  const ModelConfig c = ModelConfig::from_metadata(md);
  const ModelConfig& w = plan.config;
  EXPECT_EQ(c.n_layer, w.n_layer);
  EXPECT_EQ(c.n_embd, w.n_embd);
  EXPECT_EQ(c.n_head, w.n_head);
  EXPECT_EQ(c.q_lora_rank, w.q_lora_rank);
  EXPECT_EQ(c.kv_lora_rank, w.kv_lora_rank);
  EXPECT_EQ(c.n_rot, w.n_rot);
  EXPECT_EQ(c.n_nope, w.n_nope);
  EXPECT_EQ(c.n_v, w.n_v);
  EXPECT_EQ(c.n_ff, w.n_ff);
  EXPECT_EQ(c.n_ff_exp, w.n_ff_exp);
  EXPECT_EQ(c.n_expert, w.n_expert);
  EXPECT_EQ(c.n_expert_used, w.n_expert_used);
  EXPECT_EQ(c.n_expert_shared, w.n_expert_shared);
  EXPECT_EQ(c.n_leading_dense, w.n_leading_dense);
  EXPECT_EQ(c.n_vocab, w.n_vocab);
  EXPECT_EQ(c.gating, w.gating);
  EXPECT_EQ(c.has_exp_probs_b, w.has_exp_probs_b);
  EXPECT_EQ(c.expert_weights_norm, w.expert_weights_norm);
  EXPECT_FLOAT_EQ(c.expert_weights_scale, w.expert_weights_scale);
  EXPECT_EQ(c.yarn, w.yarn);
  EXPECT_FLOAT_EQ(c.rope_freq_scale, w.rope_freq_scale);
  EXPECT_FLOAT_EQ(c.kq_scale(), w.kq_scale());
}

TEST(SynthFile, TinyPresetsEveryType) {
  ScratchDir dir;
  for (const char* preset : {"tiny", "tiny-lite"}) {
    for (const std::string& type : type_names()) {
      SynthOptions o = options(preset, type, 3, -1, dir.file(std::string(preset) + "-" + type + ".gguf"), 2);
      const SynthResult r = synthesize(o);
      check_file(o, r);
      std::filesystem::remove(o.out_path);
    }
  }
}

// Chunks `chunks` of tensor `name` in the file equal generate_chunk's bytes: chunk placement
// (offsets) is right, so the file is the same whatever thread wrote which chunk.
void expect_chunks_in_place(const SynthOptions& o, const std::string& name, std::initializer_list<uint64_t> chunks) {
  const Plan plan = make_plan(o);
  const GgufFile f = GgufFile::open(o.out_path);
  const GgufTensorInfo& info = f.require_tensor(name);
  for (const PlannedTensor& t : plan.tensors) {
    if (t.spec.name != name) continue;
    const uint64_t chunk_bytes = rows_per_chunk(t) * row_bytes(t.type, t.spec.ne[0]);
    std::vector<uint8_t> want(chunk_bytes);
    std::vector<float> scratch;
    for (uint64_t c : chunks) {
      const uint64_t n = generate_chunk(plan, t, c, o.seed, want.data(), scratch);
      ASSERT_LE(c * chunk_bytes + n, info.nbytes);
      EXPECT_EQ(std::memcmp(f.tensor_data(info) + c * chunk_bytes, want.data(), n), 0) << name << " chunk " << c;
    }
  }
}

// Full-size shapes with 2 layers (token_embd / output at full vocab): the direct-block path.
TEST(SynthFile, FullSizePresetsTwoLayers) {
  ScratchDir dir;
  for (const char* preset : {"glm47flash", "ds2lite"}) {
    for (const char* type : {"q4_0", "q4_k_m"}) {
      SynthOptions o = options(preset, type, 1, 2, dir.file(std::string(preset) + "-" + type + ".gguf"), 0);
      ASSERT_TRUE(make_plan(o).direct_blocks);
      const SynthResult r = synthesize(o);
      check_file(o, r);
      // token_embd: n_vocab rows of 2048 in chunks of 512 rows (glm: 302.5 chunks, the last partial).
      const uint64_t n_chunks = (make_plan(o).config.n_vocab + 511) / 512;
      expect_chunks_in_place(o, "token_embd.weight", {0, 1, 77, n_chunks - 1});
      expect_chunks_in_place(o, "blk.1.ffn_down_exps.weight", {0, 5, 63});
      if (std::string(preset) == "glm47flash" && std::string(type) == "q4_k_m") {
        const GgufFile f = GgufFile::open(o.out_path);
        EXPECT_EQ(f.require_tensor("blk.1.attn_k_b.weight").type, GgmlType::Q5_0);
        EXPECT_EQ(f.require_tensor("output.weight").type, GgmlType::Q6_K);
        EXPECT_EQ(f.require_tensor("token_embd.weight").type, GgmlType::Q4_K);
        EXPECT_EQ(f.require_tensor("blk.1.exp_probs_b.bias").type, GgmlType::F32);
        EXPECT_EQ(f.require_tensor("blk.1.ffn_gate_exps.weight").ne[2], 64u);
      }
      std::filesystem::remove(o.out_path);
    }
  }
}

TEST(SynthFile, DeterministicForASeedAndThreadCount) {
  ScratchDir dir;
  for (Generation g : {Generation::Floats, Generation::Blocks}) {
    SynthOptions a = options("tiny", "q4_k_m", 11, -1, dir.file("a.gguf"), 1, g);
    SynthOptions b = a, c = a;
    b.out_path = dir.file("b.gguf");
    b.threads = 3;
    c.out_path = dir.file("c.gguf");
    c.seed = 12;
    synthesize(a);
    synthesize(b);
    synthesize(c);
    const auto ba = read_bytes(a.out_path), bb = read_bytes(b.out_path), bc = read_bytes(c.out_path);
    ASSERT_FALSE(ba.empty());
    EXPECT_TRUE(ba == bb) << "same seed, 1 vs 3 threads: files differ";
    ASSERT_EQ(ba.size(), bc.size());
    EXPECT_FALSE(ba == bc) << "different seeds gave the same file";
  }
}

// A tensor's values depend on (seed, name), not on how many layers the file has.
TEST(SynthFile, TensorsIndependentOfLayerCount) {
  ScratchDir dir;
  SynthOptions a = options("tiny", "q8_0", 4, 2, dir.file("a.gguf"), 2);
  SynthOptions b = options("tiny", "q8_0", 4, 3, dir.file("b.gguf"), 2);
  synthesize(a);
  synthesize(b);
  const GgufFile fa = GgufFile::open(a.out_path), fb = GgufFile::open(b.out_path);
  for (const char* name : {"token_embd.weight", "blk.0.attn_q_a.weight", "blk.1.ffn_up_exps.weight", "output.weight"}) {
    const GgufTensorInfo& ta = fa.require_tensor(name);
    const GgufTensorInfo& tb = fb.require_tensor(name);
    ASSERT_EQ(ta.nbytes, tb.nbytes) << name;
    EXPECT_EQ(std::memcmp(fa.tensor_data(ta), fb.tensor_data(tb), ta.nbytes), 0) << name;
  }
}

TEST(SynthFile, UnwritableDestinationIsRuntimeErrorAndLeavesNoFile) {
  ScratchDir dir;
  const std::string path = dir.file("missing-folder/x.gguf");
  try {
    synthesize(options("tiny", "q4_0", 1, -1, path, 1));
    ADD_FAILURE() << "writing into a missing folder succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Runtime) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace tessera::synth
