// deepseek2 hyper-parameters: reading/writing GGUF keys, presets, and the expected tensor table.
#include "format/model_config.h"

#include <cmath>

#include "format/error.h"

namespace tessera {

namespace {

constexpr const char* kArch = "deepseek2";

std::string key(const char* suffix) { return std::string(kArch) + "." + suffix; }

uint32_t req_u32(const Metadata& md, const char* suffix) {
  const std::string k = key(suffix);
  const uint64_t v = md.require_uint(k);
  if (v > 0xffffffffull) bad_input(md.origin(), ": ", k, " = ", v, " is out of range (expected a 32-bit count)");
  return uint32_t(v);
}

uint32_t opt_u32(const Metadata& md, const char* suffix, uint32_t dflt) {
  const std::string k = key(suffix);
  const auto v = md.get_uint(k);
  if (!v) return dflt;
  if (*v > 0xffffffffull) bad_input(md.origin(), ": ", k, " = ", *v, " is out of range (expected a 32-bit count)");
  return uint32_t(*v);
}

// A float key as f32; NaN, infinities and values past f32 are refused.
float finite_f32(const Metadata& md, const char* suffix, double v) {
  if (!std::isfinite(float(v))) bad_input(md.origin(), ": ", key(suffix), " = ", v, ", expected a finite number");
  return float(v);
}

float req_f32(const Metadata& md, const char* suffix) { return finite_f32(md, suffix, md.require_float(key(suffix))); }

float opt_f32(const Metadata& md, const char* suffix, float dflt) {
  const auto v = md.get_float(key(suffix));
  return v ? finite_f32(md, suffix, *v) : dflt;
}

void expect_positive(const Metadata& md, const char* suffix, uint64_t v) {
  if (v == 0) bad_input(md.origin(), ": ", key(suffix), " is 0, expected a positive value");
}

}  // namespace

std::string blk(uint32_t layer, const char* suffix) { return cat("blk.", layer, ".", suffix); }

float ModelConfig::rope_attn_factor() const {
  // llama.cpp pre-divides attn_factor by YaRN's magnitude correction so that the rope kernel's
  // cos/sin magnitude is exactly 1 for deepseek2 (forward.md §3.2).
  if (!yarn || rope_freq_scale == 1.f) return 1.f;
  return 1.f / (1.f + 0.1f * std::log(1.f / rope_freq_scale));
}

float ModelConfig::kq_scale() const {
  double mscale = 1.0;
  if (yarn && rope_freq_scale != 1.f) {
    const double ln_inv = std::log(1.0 / rope_freq_scale);
    const double attn_factor_org = rope_attn_factor() * (1.0 + 0.1 * ln_inv);
    mscale = attn_factor_org * (1.0 + 0.1 * yarn_log_mul * ln_inv);
  }
  return float(mscale * mscale / std::sqrt(double(n_qk())));
}

ModelConfig ModelConfig::from_metadata(const Metadata& md) {
  const std::string arch = md.require_string("general.architecture");
  if (arch != kArch)
    bad_input(md.origin(), ": general.architecture is '", arch,
              "', expected 'deepseek2' (tessera runs GLM-4.7-Flash and DeepSeek-V2-Lite style MLA + MoE models)");
  ModelConfig c;
  c.name = md.get_string("general.name").value_or("");
  const uint32_t block_count = req_u32(md, "block_count");
  const uint32_t nextn = opt_u32(md, "nextn_predict_layers", 0);
  if (nextn >= block_count)
    bad_input(md.origin(), ": deepseek2.nextn_predict_layers = ", nextn, " leaves no decoder block (block_count ", block_count, ")");
  c.n_layer = block_count - nextn;
  c.n_embd = req_u32(md, "embedding_length");
  c.n_head = req_u32(md, "attention.head_count");
  const uint32_t n_head_kv = opt_u32(md, "attention.head_count_kv", c.n_head);
  c.q_lora_rank = opt_u32(md, "attention.q_lora_rank", 0);
  c.kv_lora_rank = req_u32(md, "attention.kv_lora_rank");
  c.n_rot = req_u32(md, "rope.dimension_count");
  const uint32_t key_length = req_u32(md, "attention.key_length");
  const uint32_t value_length = req_u32(md, "attention.value_length");
  if (!md.has(key("attention.key_length_mla")) || !md.has(key("attention.value_length_mla")))
    bad_input(md.origin(), ": deepseek2.attention.key_length_mla / value_length_mla are missing: this is a legacy "
              "file with attn_kv_b (no split attn_k_b/attn_v_b); reconvert it with a current llama.cpp");
  const uint32_t k_mla = req_u32(md, "attention.key_length_mla");
  c.n_v = req_u32(md, "attention.value_length_mla");
  if (n_head_kv != 1)
    bad_input(md.origin(), ": deepseek2.attention.head_count_kv = ", n_head_kv, ", expected 1 (MLA as MQA over the latent)");
  if (k_mla <= c.n_rot)
    bad_input(md.origin(), ": deepseek2.attention.key_length_mla = ", k_mla, " must exceed rope.dimension_count = ", c.n_rot);
  c.n_nope = k_mla - c.n_rot;
  if (key_length != c.kv_lora_rank + c.n_rot)
    bad_input(md.origin(), ": deepseek2.attention.key_length = ", key_length, ", expected kv_lora_rank + rope dims = ",
              c.kv_lora_rank + c.n_rot);
  if (value_length != c.kv_lora_rank)
    bad_input(md.origin(), ": deepseek2.attention.value_length = ", value_length, ", expected kv_lora_rank = ", c.kv_lora_rank);
  if (c.n_rot % 2) bad_input(md.origin(), ": deepseek2.rope.dimension_count = ", c.n_rot, " must be even");
  c.n_ff = req_u32(md, "feed_forward_length");
  c.n_leading_dense = opt_u32(md, "leading_dense_block_count", 0);
  c.n_expert = opt_u32(md, "expert_count", 0);
  c.n_expert_used = opt_u32(md, "expert_used_count", 0);
  c.n_expert_shared = opt_u32(md, "expert_shared_count", 0);
  c.n_ff_exp = opt_u32(md, "expert_feed_forward_length", 0);
  if (c.n_leading_dense > c.n_layer)
    bad_input(md.origin(), ": deepseek2.leading_dense_block_count = ", c.n_leading_dense, " exceeds block_count ", c.n_layer);
  if (c.n_leading_dense < c.n_layer) {  // MoE layers exist: their keys are required
    for (const char* k : {"expert_count", "expert_used_count", "expert_shared_count", "expert_feed_forward_length"})
      if (!md.has(key(k))) bad_input(md.origin(), ": missing key ", key(k), " (required for MoE layers)");
    expect_positive(md, "expert_count", c.n_expert);
    expect_positive(md, "expert_used_count", c.n_expert_used);
    expect_positive(md, "expert_feed_forward_length", c.n_ff_exp);
    if (c.n_expert_used > c.n_expert)
      bad_input(md.origin(), ": deepseek2.expert_used_count = ", c.n_expert_used, " exceeds expert_count = ", c.n_expert);
    if (opt_u32(md, "expert_group_count", 1) > 1)
      bad_input(md.origin(), ": deepseek2.expert_group_count > 1 (group-limited routing) is not supported");
  }
  for (auto [k, v] : {std::pair{"embedding_length", c.n_embd}, {"attention.head_count", c.n_head},
                      {"attention.kv_lora_rank", c.kv_lora_rank}, {"rope.dimension_count", c.n_rot},
                      {"attention.value_length_mla", c.n_v}, {"block_count", c.n_layer}})
    expect_positive(md, k, v);

  c.n_ctx_train = opt_u32(md, "context_length", 4096);
  c.eps = req_f32(md, "attention.layer_norm_rms_epsilon");
  if (!(c.eps > 0.f && c.eps < 1.f))
    bad_input(md.origin(), ": deepseek2.attention.layer_norm_rms_epsilon = ", c.eps, ", expected 0 < eps < 1");
  c.rope_base = opt_f32(md, "rope.freq_base", 10000.f);
  if (!(c.rope_base > 1.f)) bad_input(md.origin(), ": deepseek2.rope.freq_base = ", c.rope_base, ", expected > 1");
  const std::string scaling = md.get_string(key("rope.scaling.type")).value_or("none");
  if (scaling == "yarn") {
    c.yarn = true;
    const float factor = opt_f32(md, "rope.scaling.factor", 1.f);
    if (!(factor >= 1.f)) bad_input(md.origin(), ": deepseek2.rope.scaling.factor = ", factor, ", expected >= 1");
    c.rope_freq_scale = 1.f / factor;
    c.yarn_n_ctx_orig = opt_u32(md, "rope.scaling.original_context_length", c.n_ctx_train);
    c.yarn_log_mul = opt_f32(md, "rope.scaling.yarn_log_multiplier", 0.f) / 0.1f;
    c.yarn_beta_fast = opt_f32(md, "rope.scaling.yarn_beta_fast", 32.f);
    c.yarn_beta_slow = opt_f32(md, "rope.scaling.yarn_beta_slow", 1.f);
  } else if (scaling == "none" || scaling == "linear") {
    const float factor = opt_f32(md, "rope.scaling.factor", 1.f);
    if (factor != 1.f && factor != 0.f)
      bad_input(md.origin(), ": deepseek2.rope.scaling.type 'linear' with factor ", factor, " is not supported (only yarn)");
  } else {
    bad_input(md.origin(), ": deepseek2.rope.scaling.type '", scaling, "' is not supported (expected none or yarn)");
  }

  c.n_vocab = md.get_uint(key("vocab_size")) ? opt_u32(md, "vocab_size", 0)
                                              : uint32_t(md.get_string_array("tokenizer.ggml.tokens").size());
  if (c.n_vocab == 0) bad_input(md.origin(), ": no deepseek2.vocab_size and no tokenizer.ggml.tokens: vocabulary size unknown");

  const uint32_t gating = opt_u32(md, "expert_gating_func", 0);
  if (gating == 0) {
    // Files converted before llama.cpp PR #18980 lack the key: GLM-4.7-Flash uses sigmoid.
    const bool glm_lite = (block_count == 47 || block_count == 48) && c.n_vocab == 154880;
    c.gating = glm_lite ? GatingFunc::Sigmoid : GatingFunc::Softmax;
  } else if (gating == 1 || gating == 2) {
    c.gating = GatingFunc(gating);
  } else {
    bad_input(md.origin(), ": deepseek2.expert_gating_func = ", gating, " is not supported (expected 1 softmax or 2 sigmoid)");
  }
  c.has_exp_probs_b = c.gating == GatingFunc::Sigmoid;
  c.expert_weights_scale = opt_f32(md, "expert_weights_scale", 0.f);
  c.expert_weights_norm = md.get_bool(key("expert_weights_norm")).value_or(false);
  return c;
}

void ModelConfig::to_metadata(Metadata& md) const {
  md.set_string("general.architecture", kArch);
  if (!name.empty()) md.set_string("general.name", name);
  md.set_u32(key("block_count"), n_layer);
  md.set_u32(key("context_length"), n_ctx_train);
  md.set_u32(key("embedding_length"), n_embd);
  md.set_u32(key("feed_forward_length"), n_ff);
  md.set_u32(key("attention.head_count"), n_head);
  md.set_u32(key("attention.head_count_kv"), 1);
  if (q_lora_rank) md.set_u32(key("attention.q_lora_rank"), q_lora_rank);
  md.set_u32(key("attention.kv_lora_rank"), kv_lora_rank);
  md.set_u32(key("attention.key_length"), kv_lora_rank + n_rot);
  md.set_u32(key("attention.value_length"), kv_lora_rank);
  md.set_u32(key("attention.key_length_mla"), n_nope + n_rot);
  md.set_u32(key("attention.value_length_mla"), n_v);
  md.set_f32(key("attention.layer_norm_rms_epsilon"), eps);
  md.set_u32(key("rope.dimension_count"), n_rot);
  md.set_f32(key("rope.freq_base"), rope_base);
  if (yarn) {
    md.set_string(key("rope.scaling.type"), "yarn");
    md.set_f32(key("rope.scaling.factor"), 1.f / rope_freq_scale);
    md.set_u32(key("rope.scaling.original_context_length"), yarn_n_ctx_orig);
    md.set_f32(key("rope.scaling.yarn_log_multiplier"), yarn_log_mul * 0.1f);
  }
  if (n_leading_dense < n_layer) {
    md.set_u32(key("leading_dense_block_count"), n_leading_dense);
    md.set_u32(key("expert_count"), n_expert);
    md.set_u32(key("expert_used_count"), n_expert_used);
    md.set_u32(key("expert_shared_count"), n_expert_shared);
    md.set_u32(key("expert_feed_forward_length"), n_ff_exp);
    md.set_f32(key("expert_weights_scale"), expert_weights_scale);
    if (expert_weights_norm) md.set_bool(key("expert_weights_norm"), true);
    md.set_u32(key("expert_gating_func"), uint32_t(gating));
  }
  md.set_u32(key("vocab_size"), n_vocab);
}

std::vector<std::string> ModelConfig::preset_names() { return {"glm47flash", "ds2lite", "tiny", "tiny-lite"}; }

std::optional<ModelConfig> ModelConfig::preset(const std::string& which) {
  ModelConfig c;
  if (which == "glm47flash" || which == "tiny") {
    // GLM-4.7-Flash structure: q LoRA, sigmoid router + selection bias, norm then x1.8, 1 shared.
    c.gating = GatingFunc::Sigmoid;
    c.has_exp_probs_b = true;
    c.expert_weights_scale = 1.8f;
    c.expert_weights_norm = true;
    c.eps = 1e-5f;
    c.rope_base = 1e6f;
    c.n_leading_dense = 1;
    c.n_expert_shared = 1;
    if (which == "glm47flash") {
      c.name = "GLM-4.7-Flash (tessera synthetic)";
      c.n_layer = 47; c.n_embd = 2048; c.n_head = 20; c.q_lora_rank = 768; c.kv_lora_rank = 512;
      c.n_rot = 64; c.n_nope = 192; c.n_v = 256; c.n_ff = 10240; c.n_ff_exp = 1536;
      c.n_expert = 64; c.n_expert_used = 4; c.n_vocab = 154880; c.n_ctx_train = 202752;
    } else {
      // Small, but every path: non-multiple-of-32 output sizes (vocab, heads x dims), q4_k_m
      // shape fallbacks (ne0 not a multiple of 256), several experts per token.
      c.name = "tiny GLM-structured (tessera synthetic)";
      c.n_layer = 3; c.n_embd = 256; c.n_head = 4; c.q_lora_rank = 96; c.kv_lora_rank = 128;
      c.n_rot = 16; c.n_nope = 32; c.n_v = 48; c.n_ff = 320; c.n_ff_exp = 96;
      c.n_expert = 8; c.n_expert_used = 3; c.n_vocab = 1200; c.n_ctx_train = 4096;
    }
    return c;
  }
  if (which == "ds2lite" || which == "tiny-lite") {
    // DeepSeek-V2-Lite structure: no q LoRA, softmax router, no weight norm, YaRN, 2 shared.
    c.gating = GatingFunc::Softmax;
    c.has_exp_probs_b = false;
    c.expert_weights_scale = 1.f;
    c.expert_weights_norm = false;
    c.eps = 1e-6f;
    c.rope_base = 10000.f;
    c.n_leading_dense = 1;
    c.n_expert_shared = 2;
    c.yarn = true;
    c.yarn_log_mul = 0.707f;
    if (which == "ds2lite") {
      c.name = "DeepSeek-V2-Lite (tessera synthetic)";
      c.n_layer = 27; c.n_embd = 2048; c.n_head = 16; c.q_lora_rank = 0; c.kv_lora_rank = 512;
      c.n_rot = 64; c.n_nope = 128; c.n_v = 128; c.n_ff = 10944; c.n_ff_exp = 1408;
      c.n_expert = 64; c.n_expert_used = 6; c.n_vocab = 102400; c.n_ctx_train = 163840;
      c.rope_freq_scale = 1.f / 40.f; c.yarn_n_ctx_orig = 4096;
    } else {
      c.name = "tiny V2-Lite-structured (tessera synthetic)";
      c.n_layer = 3; c.n_embd = 256; c.n_head = 4; c.q_lora_rank = 0; c.kv_lora_rank = 128;
      c.n_rot = 16; c.n_nope = 32; c.n_v = 32; c.n_ff = 384; c.n_ff_exp = 64;
      c.n_expert = 8; c.n_expert_used = 3; c.n_vocab = 1100; c.n_ctx_train = 4096;
      c.rope_freq_scale = 1.f / 4.f; c.yarn_n_ctx_orig = 256;
    }
    return c;
  }
  return std::nullopt;
}

std::vector<TensorSpec> expected_tensors(const ModelConfig& c) {
  using R = TensorRole;
  std::vector<TensorSpec> t;
  const uint64_t d = c.n_embd, H = c.n_head;
  t.push_back({"token_embd.weight", {d, c.n_vocab}, R::TokenEmbd, -1});
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    const int li = int(l);
    auto add = [&](const char* suffix, std::vector<uint64_t> ne, R role) { t.push_back({blk(l, suffix), std::move(ne), role, li}); };
    add("attn_norm.weight", {d}, R::Norm);
    if (c.q_lora_rank) {
      add("attn_q_a.weight", {d, c.q_lora_rank}, R::Matrix);
      add("attn_q_a_norm.weight", {c.q_lora_rank}, R::Norm);
      add("attn_q_b.weight", {c.q_lora_rank, H * c.n_qk()}, R::Matrix);
    } else {
      add("attn_q.weight", {d, H * c.n_qk()}, R::Matrix);
    }
    add("attn_kv_a_mqa.weight", {d, uint64_t(c.kv_lora_rank) + c.n_rot}, R::Matrix);
    add("attn_kv_a_norm.weight", {c.kv_lora_rank}, R::Norm);
    add("attn_k_b.weight", {c.n_nope, c.kv_lora_rank, H}, R::Matrix);
    add("attn_v_b.weight", {c.kv_lora_rank, c.n_v, H}, R::Matrix);
    add("attn_output.weight", {H * c.n_v, d}, R::Matrix);
    add("ffn_norm.weight", {d}, R::Norm);
    if (!c.is_moe(l)) {
      add("ffn_gate.weight", {d, c.n_ff}, R::Matrix);
      add("ffn_up.weight", {d, c.n_ff}, R::Matrix);
      add("ffn_down.weight", {c.n_ff, d}, R::Matrix);
    } else {
      add("ffn_gate_inp.weight", {d, c.n_expert}, R::Router);
      if (c.has_exp_probs_b) add("exp_probs_b.bias", {c.n_expert}, R::ExpProbsBias);
      add("ffn_gate_exps.weight", {d, c.n_ff_exp, c.n_expert}, R::Experts);
      add("ffn_up_exps.weight", {d, c.n_ff_exp, c.n_expert}, R::Experts);
      add("ffn_down_exps.weight", {c.n_ff_exp, d, c.n_expert}, R::Experts);
      if (c.n_expert_shared) {
        add("ffn_gate_shexp.weight", {d, c.n_ff_shared()}, R::Matrix);
        add("ffn_up_shexp.weight", {d, c.n_ff_shared()}, R::Matrix);
        add("ffn_down_shexp.weight", {c.n_ff_shared(), d}, R::Matrix);
      }
    }
  }
  t.push_back({"output_norm.weight", {d}, R::Norm, -1});
  t.push_back({"output.weight", {d, c.n_vocab}, R::Output, -1});
  return t;
}

}  // namespace tessera
