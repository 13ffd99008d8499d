#include "runtime/cpu/model_weights.h"

#include "format/error.h"

namespace tessera {
const char* attention_path_name(AttentionPath p) { return p == AttentionPath::Absorbed ? "absorbed" : "expanded"; }
}  // namespace tessera

namespace tessera::cpu {

namespace {

std::vector<float> read_vector(const WeightSource& w, const std::string& name, uint64_t n) {
  w.require(name, {n});
  return w.read_all(name);
}

void load_attention(const WeightSource& w, const ModelConfig& c, uint32_t l, AttentionPath path, LayerWeights& lw) {
  const uint64_t d = c.n_embd, H = c.n_head, Rq = c.q_lora_rank, Rkv = c.kv_lora_rank, Dr = c.n_rot;
  const uint64_t Dn = c.n_nope, Dk = c.n_qk(), Dv = c.n_v;
  const uint64_t q_in = Rq ? Rq : d;
  lw.attn_norm = read_vector(w, blk(l, "attn_norm.weight"), d);
  if (Rq) {
    lw.q_a = blk(l, "attn_q_a.weight");
    w.require(lw.q_a, {d, Rq});
    lw.q_a_norm = read_vector(w, blk(l, "attn_q_a_norm.weight"), Rq);
  }
  lw.kv_a = blk(l, "attn_kv_a_mqa.weight");
  w.require(lw.kv_a, {d, Rkv + Dr});
  lw.kv_a_norm = read_vector(w, blk(l, "attn_kv_a_norm.weight"), Rkv);

  const std::string qk = blk(l, "attn_qk.weight"), vo = blk(l, "attn_vo.weight");
  const bool use_qk = path == AttentionPath::Absorbed && w.has(qk);
  const bool use_vo = path == AttentionPath::Absorbed && w.has(vo);
  if (use_qk) {
    lw.qk = qk;
    w.require(qk, {q_in, H * (Rkv + Dr)});
  } else {
    lw.q = blk(l, Rq ? "attn_q_b.weight" : "attn_q.weight");
    lw.k_b = blk(l, "attn_k_b.weight");
    if (path == AttentionPath::Expanded && !w.has(lw.k_b) && w.has(qk))
      bad_input(w.metadata().origin(), ": the expanded attention path needs '", lw.k_b,
                "', but this file holds the composed '", qk, "' instead; use the absorbed path");
    w.require(lw.q, {q_in, H * Dk});
    w.require(lw.k_b, {Dn, Rkv, H});
  }
  if (use_vo) {
    lw.vo = vo;
    w.require(vo, {H * Rkv, d});
  } else {
    lw.v_b = blk(l, "attn_v_b.weight");
    lw.out = blk(l, "attn_output.weight");
    if (path == AttentionPath::Expanded && !w.has(lw.v_b) && w.has(vo))
      bad_input(w.metadata().origin(), ": the expanded attention path needs '", lw.v_b,
                "', but this file holds the composed '", vo, "' instead; use the absorbed path");
    w.require(lw.v_b, {Rkv, Dv, H});
    w.require(lw.out, {H * Dv, d});
  }
}

void load_ffn(const WeightSource& w, const ModelConfig& c, uint32_t l, LayerWeights& lw) {
  const uint64_t d = c.n_embd, F = c.n_ff, Fe = c.n_ff_exp, E = c.n_expert, S = c.n_expert_shared;
  lw.ffn_norm = read_vector(w, blk(l, "ffn_norm.weight"), d);
  lw.moe = c.is_moe(l);
  if (!lw.moe) {
    lw.ffn_gate = blk(l, "ffn_gate.weight");
    lw.ffn_up = blk(l, "ffn_up.weight");
    lw.ffn_down = blk(l, "ffn_down.weight");
    w.require(lw.ffn_gate, {d, F});
    w.require(lw.ffn_up, {d, F});
    w.require(lw.ffn_down, {F, d});
    return;
  }
  lw.router = blk(l, "ffn_gate_inp.weight");
  w.require(lw.router, {d, E});
  const std::string bias = blk(l, "exp_probs_b.bias");
  if (c.has_exp_probs_b || w.has(bias)) lw.exp_probs_b = read_vector(w, bias, E);
  lw.gate_exps = blk(l, "ffn_gate_exps.weight");
  lw.up_exps = blk(l, "ffn_up_exps.weight");
  lw.down_exps = blk(l, "ffn_down_exps.weight");
  w.require(lw.gate_exps, {d, Fe, E});
  w.require(lw.up_exps, {d, Fe, E});
  w.require(lw.down_exps, {Fe, d, E});
  if (S > 0) {
    lw.gate_shexp = blk(l, "ffn_gate_shexp.weight");
    lw.up_shexp = blk(l, "ffn_up_shexp.weight");
    lw.down_shexp = blk(l, "ffn_down_shexp.weight");
    w.require(lw.gate_shexp, {d, S * Fe});
    w.require(lw.up_shexp, {d, S * Fe});
    w.require(lw.down_shexp, {S * Fe, d});
  }
}

}  // namespace

ModelWeights ModelWeights::load(const WeightSource& w, const ModelConfig& c, AttentionPath path) {
  if (c.n_rot % 2 || c.n_head == 0 || c.n_embd == 0 || c.kv_lora_rank == 0 || c.n_vocab == 0)
    bad_input(w.metadata().origin(), ": unusable hyperparameters (n_embd ", c.n_embd, ", n_head ", c.n_head,
              ", kv_lora_rank ", c.kv_lora_rank, ", rope dims ", c.n_rot, ", vocab ", c.n_vocab, ")");
  if (c.n_leading_dense < c.n_layer && (c.n_expert_used == 0 || c.n_expert_used > c.n_expert))
    bad_input(w.metadata().origin(), ": expert_used_count ", c.n_expert_used, " must be in 1..expert_count (",
              c.n_expert, ")");
  ModelWeights m;
  m.token_embd = "token_embd.weight";
  w.require(m.token_embd, {c.n_embd, c.n_vocab});
  m.output_norm = read_vector(w, "output_norm.weight", c.n_embd);
  m.output = w.has("output.weight") ? "output.weight" : m.token_embd;
  w.require(m.output, {c.n_embd, c.n_vocab});
  // Grown block by block: block_count comes from the metadata, so a file claiming more blocks
  // than it holds fails on the first missing tensor instead of allocating them all up front.
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    if (!w.has(blk(l, "attn_norm.weight")))
      bad_input(w.metadata().origin(), ": the metadata says ", c.n_layer, " decoder blocks, the file has no tensors of block ",
                l, " ('", blk(l, "attn_norm.weight"), "' not found)");
    LayerWeights lw;
    load_attention(w, c, l, path, lw);
    load_ffn(w, c, l, lw);
    m.layers.push_back(std::move(lw));
  }
  return m;
}

}  // namespace tessera::cpu
