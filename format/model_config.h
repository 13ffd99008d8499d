// deepseek2 hyper-parameters (GLM-4.7-Flash, DeepSeek-V2-Lite and the tiny test presets) and the
// tensor table they imply. One place that knows the model's shapes: the synthesizer writes from
// it, the CPU reference, converter and runtime check files against it.
// Keys and tensors: ../shared/spec/deepseek2.md; math: ../shared/spec/forward.md.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "format/gguf.h"

namespace tessera {

enum class GatingFunc : uint32_t { None = 0, Softmax = 1, Sigmoid = 2 };

struct ModelConfig {
  std::string name;            // general.name
  uint32_t n_layer = 0;        // effective decoder blocks (block_count - nextn_predict_layers)
  uint32_t n_embd = 0;         // d
  uint32_t n_head = 0;         // H
  uint32_t q_lora_rank = 0;    // Rq; 0 = no q LoRA (attn_q instead of attn_q_a/attn_q_b)
  uint32_t kv_lora_rank = 0;   // Rkv (latent width)
  uint32_t n_rot = 0;          // Dr, rope dims per head
  uint32_t n_nope = 0;         // Dn = key_length_mla - n_rot
  uint32_t n_v = 0;            // Dv = value_length_mla
  uint32_t n_ff = 0;           // dense FFN width (layers < n_leading_dense)
  uint32_t n_ff_exp = 0;       // expert FFN width
  uint32_t n_expert = 0;       // E
  uint32_t n_expert_used = 0;  // K
  uint32_t n_expert_shared = 0;  // S (shared FFN width = S * n_ff_exp)
  uint32_t n_leading_dense = 0;
  uint32_t n_vocab = 0;
  uint32_t n_ctx_train = 0;
  float eps = 1e-6f;
  float rope_base = 10000.f;
  // YaRN (rope.scaling.type == "yarn"); freq_scale == 1 means no scaling.
  bool yarn = false;
  float rope_freq_scale = 1.f;   // 1 / rope.scaling.factor
  uint32_t yarn_n_ctx_orig = 0;
  float yarn_beta_fast = 32.f, yarn_beta_slow = 1.f;
  float yarn_log_mul = 0.f;      // as llama.cpp uses it: GGUF value / 0.1 (forward.md §3.2)
  GatingFunc gating = GatingFunc::Softmax;
  float expert_weights_scale = 0.f;  // applied only when not in {0, 1}
  bool expert_weights_norm = false;
  bool has_exp_probs_b = false;      // GLM: selection bias (exp_probs_b.bias per MoE layer)

  uint32_t n_qk() const { return n_nope + n_rot; }          // Dk: MHA head dim (256 / 192)
  uint32_t kv_row() const { return kv_lora_rank + n_rot; }  // latent cache row (576)
  bool is_moe(uint32_t layer) const { return layer >= n_leading_dense; }
  uint32_t n_ff_shared() const { return n_expert_shared * n_ff_exp; }
  // Attention score scale with YaRN's mscale (forward.md §4).
  float kq_scale() const;
  // YaRN helpers (forward.md §3.2): attn_factor passed to rope and ext_factor.
  float yarn_ext_factor() const { return yarn ? 1.f : 0.f; }
  float rope_attn_factor() const;

  // Read and validate from GGUF / .tsr metadata; throws BadInput naming the key and the file.
  static ModelConfig from_metadata(const Metadata& md);
  // Write every deepseek2.* and general.* key llama.cpp reads for this config.
  void to_metadata(Metadata& md) const;

  // Presets: "glm47flash", "ds2lite", "tiny", "tiny-lite". nullopt for an unknown name.
  static std::optional<ModelConfig> preset(const std::string& name);
  static std::vector<std::string> preset_names();
};

// What a tensor is for; drives quant-type choice (synth), layout choice (convert) and checks.
enum class TensorRole {
  TokenEmbd, Output, Norm, Matrix, Router, ExpProbsBias, Experts,
};

struct TensorSpec {
  std::string name;          // GGUF name, e.g. "blk.3.ffn_up_exps.weight"
  std::vector<uint64_t> ne;  // GGUF order: {in, out[, slabs]}
  TensorRole role;
  int layer = -1;            // -1 for token_embd / output_norm / output
};

// Every tensor a file of this config must hold, in llama.cpp's converter order.
std::vector<TensorSpec> expected_tensors(const ModelConfig& c);

// "blk.<layer>.<suffix>" (suffix like "attn_q_a.weight").
std::string blk(uint32_t layer, const char* suffix);

}  // namespace tessera
