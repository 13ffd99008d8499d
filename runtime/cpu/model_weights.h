// The tensors one forward pass uses, named and shape-checked once when a model is opened, so
// that a malformed file fails with a clear message before any computation. Large matrices are
// kept as names (read row by row later through the WeightSource); small vectors (norms, the
// expert bias) are read into memory here.
#pragma once
#include <string>
#include <vector>

#include "format/model_config.h"
#include "runtime/cpu/weight_source.h"

namespace tessera {

// Two independent ways to compute MLA attention (forward.md §2 and §2.5).
enum class AttentionPath {
  Absorbed,  // MQA over the latent cache: q_lat = Kb·q_nope, o = Vb·(softmax · latent)
  Expanded,  // per-head MHA: k_nope = Kb^T·c and v = Vb·c expanded for every cached position
};
const char* attention_path_name(AttentionPath p);  // "absorbed" / "expanded"

}  // namespace tessera

namespace tessera::cpu {

// Sizes below: d = n_embd, H = n_head, Rq = q_lora_rank, Rkv = kv_lora_rank, Dr = n_rot,
// Dn = n_nope, Dk = Dn + Dr, Dv = n_v, F = n_ff, Fe = n_ff_exp, E = n_expert, S = n_expert_shared.
// An empty name means "this file does not have it / this layer does not use it".
struct LayerWeights {
  std::vector<float> attn_norm;  // [d]
  std::vector<float> q_a_norm;   // [Rq] (q LoRA only)
  std::vector<float> kv_a_norm;  // [Rkv]
  std::vector<float> ffn_norm;   // [d]
  std::string q_a;        // attn_q_a      {d, Rq}           (q LoRA only)
  std::string q;          // attn_q_b      {Rq, H*Dk} or attn_q {d, H*Dk}
  std::string qk;         // attn_qk       {q_in, H*(Rkv+Dr)} composed query (packed files)
  std::string kv_a;       // attn_kv_a_mqa {d, Rkv+Dr}
  std::string k_b;        // attn_k_b      {Dn, Rkv, H}
  std::string v_b;        // attn_v_b      {Rkv, Dv, H}
  std::string out;        // attn_output   {H*Dv, d}
  std::string vo;         // attn_vo       {H*Rkv, d} composed value+output (packed files)
  bool moe = false;
  std::string ffn_gate, ffn_up, ffn_down;        // dense: {d, F}, {d, F}, {F, d}
  std::string router;                            // ffn_gate_inp {d, E}
  std::vector<float> exp_probs_b;                // [E] selection bias, or empty
  std::string gate_exps, up_exps, down_exps;     // {d, Fe, E}, {d, Fe, E}, {Fe, d, E}
  std::string gate_shexp, up_shexp, down_shexp;  // {d, S*Fe}, {d, S*Fe}, {S*Fe, d} (S > 0 only)
};

struct ModelWeights {
  std::string token_embd;         // {d, V}
  std::vector<float> output_norm; // [d]
  std::string output;             // {d, V}; token_embd when the file has no output.weight (tied)
  std::vector<LayerWeights> layers;

  // Resolve and check every tensor the chosen attention path needs (composed attn_qk / attn_vo
  // are used by the absorbed path when present; the expanded path needs the split originals).
  // Throws Error(BadInput) naming the file, the tensor, expected and found shapes.
  static ModelWeights load(const WeightSource& w, const ModelConfig& c, AttentionPath path);
};

}  // namespace tessera::cpu
