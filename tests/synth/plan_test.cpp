// The type mix and the file plan, checked against gguf.md §10 / forward.md §7.3 without writing.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "convert/synth.h"
#include "format/error.h"
#include "tests/synth/test_util.h"

namespace tessera::synth {
namespace {

using testing::options;

const PlannedTensor& find(const Plan& p, const std::string& name) {
  for (const PlannedTensor& t : p.tensors)
    if (t.spec.name == name) return t;
  ADD_FAILURE() << "no tensor " << name;
  static PlannedTensor none;
  return none;
}

std::map<GgmlType, size_t> counts(const Plan& p) {
  std::map<GgmlType, size_t> c;
  for (const PlannedTensor& t : p.tensors) ++c[t.type];
  return c;
}

GgmlType type_of(const Plan& p, const std::string& name) { return find(p, name).type; }

// Exact tensor-data sizes derived in gguf.md §10.1/§10.2 and forward.md §7.3: equality checks
// every shape and the whole type mix at once.
TEST(SynthPlan, GlmDataBytesMatchSpec) {
  EXPECT_EQ(make_plan(options("glm47flash", "q4_0")).data_bytes, 16'946'547'200ull);
  EXPECT_EQ(make_plan(options("glm47flash", "q4_k_m")).data_bytes, 18'123'246'080ull);
  EXPECT_EQ(make_plan(options("glm47flash", "q8_0")).data_bytes, 31'833'324'032ull);
  EXPECT_EQ(make_plan(options("glm47flash", "bf16")).data_bytes, 59'899'361'792ull);
  EXPECT_EQ(make_plan(options("glm47flash", "f16")).data_bytes, 59'899'361'792ull);
}

TEST(SynthPlan, Ds2LiteDataBytesMatchSpec) {
  EXPECT_EQ(make_plan(options("ds2lite", "q4_0")).data_bytes, 8'901'113'856ull);
  EXPECT_EQ(make_plan(options("ds2lite", "q4_k_m")).data_bytes, 10'363'959'296ull);
  EXPECT_EQ(make_plan(options("ds2lite", "q8_0")).data_bytes, 16'698'521'600ull);
  EXPECT_EQ(make_plan(options("ds2lite", "bf16")).data_bytes, 31'420'037'120ull);
}

TEST(SynthPlan, ParameterCountsAndTensorCounts) {
  const Plan glm = make_plan(options("glm47flash", "q4_0"));
  EXPECT_EQ(glm.tensors.size(), 844u);
  EXPECT_EQ(glm.n_params, 29'943'393'920ull);
  EXPECT_TRUE(glm.direct_blocks);
  const Plan ds2 = make_plan(options("ds2lite", "q4_0"));
  EXPECT_EQ(ds2.tensors.size(), 404u);
  EXPECT_EQ(ds2.n_params, 15'706'484'224ull);
  EXPECT_FALSE(make_plan(options("tiny", "q4_0")).direct_blocks);
}

TEST(SynthPlan, GlmQ4KMTypeCounts) {
  const auto c = counts(make_plan(options("glm47flash", "q4_k_m")));
  EXPECT_EQ(c.at(GgmlType::F32), 281u);
  EXPECT_EQ(c.at(GgmlType::Q4_K), 470u);
  EXPECT_EQ(c.at(GgmlType::Q6_K), 46u);
  EXPECT_EQ(c.at(GgmlType::Q5_0), 47u);
  EXPECT_EQ(c.size(), 4u);
}

TEST(SynthPlan, Ds2LiteQ4KMTypeCounts) {
  const auto c = counts(make_plan(options("ds2lite", "q4_k_m")));
  EXPECT_EQ(c.at(GgmlType::F32), 108u);
  EXPECT_EQ(c.at(GgmlType::Q4_K), 229u);
  EXPECT_EQ(c.at(GgmlType::Q6_K), 13u);
  EXPECT_EQ(c.at(GgmlType::Q5_0), 41u);
  EXPECT_EQ(c.at(GgmlType::Q8_0), 13u);
  EXPECT_EQ(c.size(), 5u);
}

TEST(SynthPlan, GlmSpecificTensorTypes) {
  const Plan km = make_plan(options("glm47flash", "q4_k_m"));
  EXPECT_EQ(type_of(km, "token_embd.weight"), GgmlType::Q4_K);
  EXPECT_EQ(type_of(km, "output.weight"), GgmlType::Q6_K);
  EXPECT_EQ(type_of(km, "output_norm.weight"), GgmlType::F32);
  EXPECT_EQ(type_of(km, "blk.3.attn_k_b.weight"), GgmlType::Q5_0);  // ne0 192: Q4_K -> Q5_0
  EXPECT_EQ(type_of(km, "blk.3.attn_v_b.weight"), GgmlType::Q4_K);
  EXPECT_EQ(type_of(km, "blk.3.attn_output.weight"), GgmlType::Q4_K);
  EXPECT_EQ(type_of(km, "blk.0.ffn_down.weight"), GgmlType::Q6_K);   // layer 0 in the set
  EXPECT_EQ(type_of(km, "blk.0.ffn_gate.weight"), GgmlType::Q4_K);
  EXPECT_EQ(type_of(km, "blk.5.ffn_down_exps.weight"), GgmlType::Q4_K);  // 5 not in the set
  EXPECT_EQ(type_of(km, "blk.7.ffn_down_exps.weight"), GgmlType::Q6_K);
  EXPECT_EQ(type_of(km, "blk.7.ffn_down_shexp.weight"), GgmlType::Q6_K);
  EXPECT_EQ(type_of(km, "blk.41.ffn_down_exps.weight"), GgmlType::Q6_K);
  EXPECT_EQ(type_of(km, "blk.7.ffn_up_exps.weight"), GgmlType::Q4_K);
  EXPECT_EQ(type_of(km, "blk.7.ffn_gate_inp.weight"), GgmlType::F32);
  EXPECT_EQ(type_of(km, "blk.7.exp_probs_b.bias"), GgmlType::F32);
  EXPECT_EQ(type_of(km, "blk.7.attn_q_a_norm.weight"), GgmlType::F32);

  const Plan q40 = make_plan(options("glm47flash", "q4_0"));
  EXPECT_EQ(type_of(q40, "output.weight"), GgmlType::Q6_K);
  EXPECT_EQ(type_of(q40, "token_embd.weight"), GgmlType::Q4_0);
  EXPECT_EQ(type_of(q40, "blk.3.attn_k_b.weight"), GgmlType::Q4_0);
  EXPECT_EQ(type_of(q40, "blk.7.ffn_down_exps.weight"), GgmlType::Q4_0);

  const Plan q80 = make_plan(options("glm47flash", "q8_0"));
  EXPECT_EQ(type_of(q80, "output.weight"), GgmlType::Q8_0);
  EXPECT_EQ(type_of(q80, "blk.1.ffn_gate_inp.weight"), GgmlType::F32);
}

// The use_more_bits set of gguf.md §10.1 for n = 47, layer by layer.
TEST(SynthPlan, GlmUseMoreBitsLayers) {
  const Plan km = make_plan(options("glm47flash", "q4_k_m"));
  const std::set<int> more = {0, 1, 2, 3, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 34, 37, 40, 41, 42, 43, 44, 45, 46};
  for (int l = 1; l < 47; ++l) {
    const std::string name = "blk." + std::to_string(l) + ".ffn_down_exps.weight";
    EXPECT_EQ(type_of(km, name), more.count(l) ? GgmlType::Q6_K : GgmlType::Q4_K) << name;
  }
}

TEST(SynthPlan, Ds2LiteShapeFallbacks) {
  const Plan km = make_plan(options("ds2lite", "q4_k_m"));
  EXPECT_EQ(type_of(km, "blk.0.ffn_down.weight"), GgmlType::Q8_0);       // Q6_K, ne0 10944
  EXPECT_EQ(type_of(km, "blk.1.ffn_down_exps.weight"), GgmlType::Q8_0);  // Q6_K, ne0 1408
  EXPECT_EQ(type_of(km, "blk.3.ffn_down_exps.weight"), GgmlType::Q5_0);  // Q4_K, ne0 1408
  EXPECT_EQ(type_of(km, "blk.3.ffn_down_shexp.weight"), GgmlType::Q4_K);  // ne0 2816 = 11 * 256
  EXPECT_EQ(type_of(km, "blk.5.ffn_down_shexp.weight"), GgmlType::Q6_K);  // 5 in the n = 27 set
  EXPECT_EQ(type_of(km, "blk.3.attn_k_b.weight"), GgmlType::Q5_0);       // ne0 128
  EXPECT_EQ(type_of(km, "blk.3.attn_q.weight"), GgmlType::Q4_K);
  EXPECT_EQ(type_of(km, "output.weight"), GgmlType::Q6_K);
  EXPECT_EQ(type_of(make_plan(options("ds2lite", "q4_0")), "output.weight"), GgmlType::Q6_K);
}

// tiny has 8 experts: llama.cpp's n_expert == 8 rule gives attn_output Q5_K, whose ne0 (192)
// falls back to Q5_1; output's ne0 256 keeps Q6_K; ne0 96 falls back Q4_K -> Q5_0, Q6_K -> Q8_0.
TEST(SynthPlan, TinyQ4KMMix) {
  const Plan km = make_plan(options("tiny", "q4_k_m"));
  EXPECT_EQ(type_of(km, "blk.1.attn_output.weight"), GgmlType::Q5_1);
  EXPECT_EQ(type_of(km, "output.weight"), GgmlType::Q6_K);
  EXPECT_EQ(type_of(km, "token_embd.weight"), GgmlType::Q4_K);
  EXPECT_EQ(type_of(km, "blk.1.attn_q_b.weight"), GgmlType::Q5_0);
  // n_layer 3: use_more_bits = {2} (i >= 7*3/8 = 2; i < 3/8 = 0 never; i % 3 == 2)
  EXPECT_EQ(type_of(km, "blk.0.ffn_down.weight"), GgmlType::Q5_0);       // Q4_K, ne0 320
  EXPECT_EQ(type_of(km, "blk.1.ffn_down_exps.weight"), GgmlType::Q5_0);  // Q4_K, ne0 96
  EXPECT_EQ(type_of(km, "blk.2.ffn_down_exps.weight"), GgmlType::Q8_0);  // Q6_K, ne0 96
  EXPECT_EQ(type_of(km, "blk.2.ffn_gate_exps.weight"), GgmlType::Q4_K);  // ne0 256
}

TEST(SynthPlan, PlainTypesAreUniform) {
  for (const char* type : {"f32", "f16", "bf16"}) {
    const Plan p = make_plan(options("tiny-lite", type));
    const GgmlType want = type == std::string("f32") ? GgmlType::F32 : type == std::string("f16") ? GgmlType::F16 : GgmlType::BF16;
    for (const PlannedTensor& t : p.tensors) {
      const bool always_f32 = t.spec.ne.size() == 1 || t.spec.role == TensorRole::Router;
      EXPECT_EQ(t.type, always_f32 ? GgmlType::F32 : want) << type << " " << t.spec.name;
    }
  }
}

TEST(SynthPlan, LayersOption) {
  const Plan p = make_plan(options("glm47flash", "q4_k_m", 1, 2));
  EXPECT_EQ(p.config.n_layer, 2u);
  EXPECT_EQ(p.tensors.size(), 3u + 2 * 10 + 3 + 8);
  // use_more_bits(i, 2): i >= 7*2/8 = 1 -> layer 1 gets Q6_K, layer 0 does not.
  EXPECT_EQ(type_of(p, "blk.0.ffn_down.weight"), GgmlType::Q4_K);
  EXPECT_EQ(type_of(p, "blk.1.ffn_down_exps.weight"), GgmlType::Q6_K);
  EXPECT_EQ(p.config.n_vocab, 154880u);
}

TEST(SynthPlan, FileTypes) {
  EXPECT_EQ(file_type("f32"), 0u);
  EXPECT_EQ(file_type("f16"), 1u);
  EXPECT_EQ(file_type("q4_0"), 2u);
  EXPECT_EQ(file_type("q8_0"), 7u);
  EXPECT_EQ(file_type("q4_k_m"), 15u);
  EXPECT_EQ(file_type("bf16"), 32u);
  EXPECT_EQ(type_names().size(), 6u);
}

void expect_usage_error(const SynthOptions& o, const std::string& needle) {
  try {
    make_plan(o);
    ADD_FAILURE() << "no error for preset '" << o.preset << "' type '" << o.type << "' layers " << o.layers;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(SynthPlan, BadOptionsAreUsageErrors) {
  expect_usage_error(options("llama3", "q4_0"), "glm47flash");     // lists the presets
  expect_usage_error(options("tiny", "q4_k_s"), "q4_k_m");         // lists the types
  expect_usage_error(options("tiny", "Q4_0x"), "unknown synth type");
  expect_usage_error(options("tiny", "q4_0", 1, 0), "--layers");
  expect_usage_error(options("tiny", "q4_0", 1, 1), "MoE");        // 1 leading dense layer + >= 1 MoE
  expect_usage_error(options("tiny", "q4_0", 1, -2), "--layers");
  expect_usage_error(options("tiny", "q4_0", 1, 100000), "--layers");
  EXPECT_THROW(tensor_type(*ModelConfig::preset("tiny"), expected_tensors(*ModelConfig::preset("tiny"))[1], "q5_0"), Error);
  try {
    synthesize(options("tiny", "q4_0"));  // no output path
    ADD_FAILURE() << "synthesize without out_path succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
  }
}

}  // namespace
}  // namespace tessera::synth
