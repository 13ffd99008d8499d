// GpuModel: the decode step's recording (record_step, record_head). Its kernels and barriers:
// docs/DECODE.md; load and run: gpu_model.cpp.
#include <algorithm>
#include <string>
#include <vector>

#include "format/error.h"
#include "runtime/model/gpu_model_internal.h"
#include "runtime/vulkan/kernels_attention.h"
#include "runtime/vulkan/kernels_basic.h"
#include "runtime/vulkan/kernels_matvec.h"
#include "runtime/vulkan/kernels_moe.h"
#include "runtime/vulkan/kernels_sample.h"

namespace tessera::model {

using namespace gpu_detail;

void GpuModel::record_step(vk::CommandRecorder& rec, uint32_t profile_kv_len) {
  const ModelConfig& c = config_;
  Weights& w = *w_;
  // The per-token words the kernels of every layer read (position, KV length). The step buffer
  // itself is host memory: on a discrete GPU each read of it crosses the bus. With step_local the
  // step opens with a copy into device memory (ordered by the embedding's barrier) and the layers
  // read that; the embedding (the token) and the sampler (writes the next token) use the host one,
  // as do indirect attention counts (host-written, read as indirect arguments).
  const vk::BufferSlice host_step = w.step.whole();
  const vk::BufferSlice step = options_.step_local ? w.step_local.whole() : host_step;
  // After the previous step (queued behind it by decode_steps, or before it in the same
  // recording): its sampler wrote the token, the position and the indirect counts this step
  // reads, and it used the same scratch buffers.
  rec.full_barrier();
  if (options_.step_local) rec.copy(host_step, step);
  const uint32_t H = c.n_head, R = c.kv_lora_rank;
  uint64_t weight_bytes = 0;
  // fold: the router fold's epilogue on this matvec (the one that writes x before a MoE FFN).
  auto matvec_op = [&](const std::string& name, vk::BufferSlice x, vk::BufferSlice y, vk::BufferSlice norm, bool acc,
                       const vk::RouterFold& fold = {}, vk::BufferSlice x_q8 = {}) {
    vk::MatvecOp op;
    op.w = w.matrix(name);
    op.x = x;
    op.x_q8 = x_q8;
    op.y = y;
    op.accumulate = acc;
    op.router_fold = fold;
    op.norm_weight = norm;
    op.norm_eps = c.eps;
    op.int8_activations = options_.int8_activations;
    op.tuning = options_.matvec;
    return op;
  };
  // Records a matvec (its label, the step's statistics and weight bytes).
  auto record_matvec = [&](vk::MatvecOp op, const std::string& name) {
    op.label = op.kernel_name(&ctx_) + " " + name;
    if (op.label.find(".q8act") != std::string::npos) stats_.int8_activations = true;
    op.record(rec);
    weight_bytes += op.w.read_bytes() + (op.router_fold.enabled() ? op.router_fold.router.read_bytes() : 0);
  };
  auto matvec = [&](const std::string& name, vk::BufferSlice x, vk::BufferSlice y, vk::BufferSlice norm, bool acc,
                    const vk::RouterFold& fold = {}, vk::BufferSlice x_q8 = {}) {
    record_matvec(matvec_op(name, x, y, norm, acc, fold, x_q8), name);
  };
  // An early start's wait on word `word` of `words` (a wait that gives up writes the host step
  // buffer's error words).
  auto gate_wait = [&](vk::BufferSlice words, uint32_t word, uint32_t target) {
    return vk::GateWait{words, word, target, host_step.sub(kGateErrorWord * 4, 8)};
  };
  auto gate_slice = [&](uint32_t l, uint32_t which, uint64_t bytes) {
    return w.gates.slice((uint64_t(l) * kGateSlices + which) * kGateStride, bytes);
  };

  // Weights of a later stage pulled into the L2 beside the kernels just recorded (no barrier).
  auto prefetch = [&](std::vector<vk::BufferSlice> spans, const std::string& label) {
    if (spans.empty()) return;
    vk::PrefetchOp op;
    op.spans = std::move(spans);
    op.sink = w.prefetch_sink.whole();
    op.label = label;
    op.record(rec);
  };

  // The router fold's accumulators start at zero in every step (the embedding's barrier orders the
  // fill before the first matvec that adds into them).
  bool any_fold = false;
  for (uint32_t l = 0; l < c.n_layer; ++l) any_fold = any_fold || fold_router(l);
  stats_.fused_router = any_fold;
  if (any_fold) rec.fill(w.fold_acc.whole(), 0);
  // The fused down's accumulators are left at zero by each use; the fill makes a step that was cut
  // short (a lost device, a timeout) not poison the next one.
  if (any_fold && options_.fused_down) rec.fill(w.down_acc.whole(), 0);
  // The early-start gate words count up within a step: zero at its start (ordered by the embedding's barrier).
  if (early_starts()) rec.fill(w.gates.whole(), 0);
  if (options_.early_vo && options_.gate_stats) rec.fill(w.gate_stats.whole(), 0);

  vk::EmbedOp embed;
  embed.table = w.matrix("token_embd.weight");
  embed.ids = host_step.sub(kTokenWord * 4, 4);
  embed.out = w.x.whole();
  embed.record(rec);
  rec.barrier();
  // The residual stream: w.x, and where a layer's x writer (W_vo / attn_output) takes its
  // residual from one buffer and writes the other (stage 2 started early), w.x2 from that layer on
  // (and back): the early-started kernels that read x after the writer then never meet lines of x
  // that stage 1 left in their SMs' L1 with no barrier since (session 34: early_qk's race).
  vk::BufferSlice cur_x = w.x.whole();

  const vk::AttentionShape ashape = vk::AttentionShape::from_config(c, n_ctx_);
  vk::KvWriteOp kv_write(ctx_, ashape);
  vk::AttentionOp& attn = *attn_;
  attn.set_profile_kv_len(std::max<uint32_t>(1, profile_kv_len));
  const vk::MoeRouting routing = vk::MoeRouting::from_config(c);

  // Stage 1 of layer l: the matvecs that read only x (q_a or the query, kv_a).
  struct Stage1 {
    std::string name;
    vk::BufferSlice y;
  };
  auto stage1 = [&](uint32_t l) {
    const std::string L = cat("blk.", l, ".");
    const bool qk = w.has(L + "attn_qk.weight");
    std::vector<Stage1> s;
    if (c.q_lora_rank) s.push_back({L + "attn_q_a.weight", w.cq.whole()});
    else s.push_back({qk ? L + "attn_qk.weight" : L + "attn_q.weight", qk ? w.q.whole() : w.qfull.whole()});
    s.push_back({L + "attn_kv_a_mqa.weight", w.kv.whole()});
    return s;
  };
  vk::GateWait x_gate;  // set by a MoE down that signals the next layer's stage 1 (no barrier after it)

  // The MoE FFN's gate-up and down of layer l, set up (nothing recorded): fuse_down where the down
  // is fused into the gate-up, early_down where the down starts beside the gate-up, gateup_gate
  // where the gate-up can open the down's gate words (and so start early itself).
  struct MoeOps {
    vk::MoeGateUpOp gu;
    vk::MoeDownOp down;
    vk::BufferSlice bias;  // the expert selection bias (exp_probs_b), or none
    bool fuse_down = false, early_down = false, gateup_gate = false;
  };
  auto moe_ops = [&](uint32_t l, bool fold, const vk::RouterFold& rfold, vk::BufferSlice ffn_norm, vk::BufferSlice x) {
    const std::string L = cat("blk.", l, ".");
    MoeOps m;
    m.bias = c.has_exp_probs_b ? w.vec(L + "exp_probs_b.bias", c.n_expert) : vk::BufferSlice{};
    const vk::BufferSlice bias = m.bias;
    vk::MoeGateUpOp& gu = m.gu;
    vk::MoeDownOp& down = m.down;
    const Weights::Loc& tile = w.at(L + "ffn_moe_tile");
    if (tile.tensor->layout != TsrLayout::MoeTile1)
      bad_input("packed model: ", tile.tensor->name, " has layout ", layout_name(tile.tensor->layout), ", expected moe_tile1");
    const vk::MoeTileRef tref{tile.buffer, tile.offset, tile.tensor->moe_tile()};
    gu.tile = tref;
    gu.n_used = c.n_expert_used;
    gu.h2 = w.h2.whole();
    gu.route = w.route.whole();
    gu.h = w.h.whole();
    if (fold) {  // routing and h2 from the fold's accumulators; workgroup 0 writes the route
      gu.fold_acc = rfold.acc;
      gu.x = x;
      gu.norm_weight = ffn_norm;
      gu.eps = c.eps;
      gu.routing = routing;
      gu.bias = bias;
      gu.logits = w.router_logits.whole();
    }
    if (options_.int8_activations && vk::moe_q8_usable(ctx_, tref.geometry, c.n_expert_used)) {
      gu.hq = w.hq.whole();
      stats_.int8_activations = true;
    }
    gu.tuning = options_.moe;
    m.fuse_down = fold && gu.hq.buffer && options_.fused_down &&
                  vk::moe_fused_down_supported(ctx_, tref.geometry, c.n_expert_used);
    if (m.fuse_down) gu.down_acc = w.down_acc.whole();
    down.tile = tref;
    down.n_used = c.n_expert_used;
    down.h = w.h.whole();
    down.route = w.route.whole();
    down.x = x;
    down.hq = gu.hq;
    down.tuning = options_.moe;
    // The down started early (no barrier after the gate-up) where both kernels take the gate.
    m.gateup_gate = !m.fuse_down && gu.gate_supported(ctx_);
    m.early_down = options_.early_down && m.gateup_gate && down.gate_supported(ctx_);
    return m;
  };

  for (uint32_t l = 0; l < c.n_layer; ++l) {
    const std::string L = cat("blk.", l, ".");
    const vk::BufferSlice xin = cur_x;  // this layer's input; xout: after the attention's residual add
    const bool qk = w.has(L + "attn_qk.weight"), vo = w.has(L + "attn_vo.weight");
    stats_.composed_qk = qk;
    stats_.composed_vo = vo;
    const vk::BufferSlice attn_norm = w.vec(L + "attn_norm.weight", c.n_embd);
    const std::string qname = qk ? L + "attn_qk.weight" : (c.q_lora_rank ? L + "attn_q_b.weight" : L + "attn_q.weight");
    const vk::BufferSlice qdst = qk ? w.q.whole() : w.qfull.whole();
    // W_vo's int8 kernel reads olat as the merge's int8 blocks (no staging) where both run.
    const vk::DecodeRange range = attn.decode_range(profile_kv_len);
    const bool olat_q8_ok = options_.int8_activations && options_.olat_q8 && attn.decode_writes_olat_q8(range);
    // The factored value path on the int8 kernels (vb_q8): attn_v_b as one matvec of stacked
    // per-head matrices on the attention's int8 olat, writing o as int8 blocks for attn_output.
    vk::MatvecOp vb, out;
    if (!vo) {
      vb = matvec_op(L + "attn_v_b.weight", w.olat.whole(), w.o.whole(), {}, false, {}, w.olat_q8.whole());
      vb.x_head_rows = c.n_v;
      vb.out_q8 = w.o_q8.whole();
      // Its int8 output takes 32 rows per workgroup: vb_teams subgroups of 32 / vb_teams rows
      // (the default split would be 32 subgroups of one row: workgroups of 1024 invocations that
      // start only as W_qk's leave, H100 timeline, session 13).
      if (!vb.tuning.teams && !vb.tuning.rows && options_.vb_teams) {
        vb.tuning.teams = options_.vb_teams;
        vb.tuning.rows = 32 / options_.vb_teams;
      }
      out = matvec_op(L + "attn_output.weight", w.o.whole(), xin, {}, true, {}, w.o_q8.whole());
    }
    const bool vb_q8 = !vo && options_.vb_q8 && olat_q8_ok && vb.head_x_supported(ctx_) && vb.out_q8_supported(ctx_) &&
                       out.kernel_name(&ctx_).find(".xq8") != std::string::npos;
    vk::BufferSlice olat_q8;
    if ((vo && olat_q8_ok && vk::q8_activations_type(ctx_, w.matrix(L + "attn_vo.weight").type)) || vb_q8)
      olat_q8 = w.olat_q8.whole();
    // The matvec that writes x after the attention (the residual add), as recorded below.
    const vk::MatvecOp x_writer = vo     ? matvec_op(L + "attn_vo.weight", w.olat.whole(), xin, {}, true, {}, olat_q8)
                                  : vb_q8 ? out
                                          : matvec_op(L + "attn_output.weight", w.o.whole(), xin, {}, true);
    // W_vo (or attn_v_b, then attn_output) started early (no barrier after the attention) where the
    // range's kernel opens a gate.
    const bool early = options_.early_vo && olat_q8.buffer && attn.decode_signals_gate(range) &&
                       (vo ? x_writer.gate_supported(ctx_)
                           : vb.gate_supported(ctx_) && vb.signal_supported(ctx_) && out.gate_supported(ctx_));
    const vk::BufferSlice gate = early ? gate_slice(l, kGateVo, 4) : vk::BufferSlice{};
    // Stage 2 started early (no barrier after stage 1) where q_a and kv_a open gates and the
    // query's matvec and kv_write wait on them: word 0 q_a's, word 1 kv_a's.
    const std::vector<Stage1> s1 = stage1(l);
    const vk::BufferSlice qk_words = gate_slice(l, kGateQk, 8);
    vk::MatvecOp query;
    const vk::BufferSlice q_a_norm = c.q_lora_rank ? w.vec(L + "attn_q_a_norm.weight", c.q_lora_rank) : vk::BufferSlice{};
    if (c.q_lora_rank) query = matvec_op(qname, w.cq.whole(), qdst, q_a_norm, false);
    // The q LoRA's output handed over as int8 blocks and sums of squares (qk_q8), where both ends
    // take them.
    bool qk_q8 = false;
    vk::MatvecOp producer;  // q_a with its int8 output, where qk_q8
    // q_a's int8 hand-over and stage 2's early start: by default where q_a's weights have
    // 32-element blocks (Q4_0 / Q8_0: +3.1-3.4 % on the H200; Q4_K -0.4 to -0.8 %; session 34).
    const bool qa_blocks32 = c.q_lora_rank && type_info(w.matrix(s1[0].name).type).block_elems == 32;
    auto chosen = [&](int option) { return option > 0 || (option < 0 && qa_blocks32); };
    if (chosen(options_.qk_q8) && c.q_lora_rank && s1.size() == 2) {
      producer = matvec_op(s1[0].name, xin, s1[0].y, attn_norm, false);
      producer.out_q8 = w.cq_q8.whole();
      producer.out_q8_norm = q_a_norm;
      producer.out_ss = w.cq_ss.whole();
      producer.out_q8_halves = options_.qk_q8_halves;
      vk::MatvecOp consumer = query;  // the query's matvec on the int8 cq, its norm from the sums
      consumer.norm_weight = {};
      consumer.x_q8 = w.cq_q8.whole();
      consumer.x_ss = w.cq_ss.whole();
      consumer.x_ss_parts = producer.out_parts(ctx_);
      consumer.x_q8_halves = producer.out_q8_halves;
      qk_q8 = producer.out_q8_supported(ctx_) && consumer.kernel_name(&ctx_).find(".xq8.rms") != std::string::npos;
      if (qk_q8) query = consumer;
    }
    // Only where the x writer can take its residual from xin and write the other buffer.
    // Not after a down that opened stage 1's gate (early_next): no barrier since the last
    // layer's FFN read the buffer this layer's add would write.
    bool early_qk = chosen(options_.early_qk) && !x_gate.enabled() && c.q_lora_rank && s1.size() == 2 &&
                    query.gate_supported(ctx_) &&
                    vk::KvWriteOp::gate_supported(ctx_) && x_writer.residual_supported(ctx_);
    // Stage 1: everything that reads only x (waiting on the previous MoE down's gate where it set one).
    std::vector<vk::MatvecOp> s1_ops;
    for (const Stage1& s : s1) {
      s1_ops.push_back(qk_q8 && s1_ops.empty() ? producer : matvec_op(s.name, xin, s.y, attn_norm, false));
      s1_ops.back().gate = x_gate;
      // x from the MoE down: other SMs' L1 may hold its sectors (the down read its old rows), so
      // coherent loads (matvec_q8.comp GATE_X 0) unless --tune gate_x says otherwise.
      if (x_gate.enabled() && !options_.matvec.gate_x) s1_ops.back().tuning.gate_x = 1;
      early_qk = early_qk && s1_ops.back().signal_supported(ctx_);
    }
    // The staged values loaded first (MatvecTuning::input_first) only where every stage-1 matvec
    // loads its weights first (q_a and kv_a): beside one that streams (DeepSeek-V2-Lite's q, 384
    // workgroups) the staging's registers crowd it out (tg128 -2.4 %, session 39).
    if (!std::all_of(s1_ops.begin(), s1_ops.end(), [&](const vk::MatvecOp& op) { return op.preloads_first(ctx_); }))
      for (vk::MatvecOp& op : s1_ops) op.tuning.input_first = false;
    for (size_t i = 0; i < s1.size(); ++i) {
      if (early_qk) {
        s1_ops[i].signal = qk_words;
        s1_ops[i].signal_word = uint32_t(i);
      }
      record_matvec(s1_ops[i], s1[i].name);
    }
    x_gate = {};
    // No barrier between stage 1's reads of x and the readers after the attention's residual add:
    // that add writes the other buffer.
    const vk::BufferSlice other_x = xin.buffer == w.x.handle() ? w.x2.whole() : w.x.whole();
    const vk::BufferSlice xout = early_qk ? other_x : xin;
    const vk::BufferSlice residual = early_qk ? xin : vk::BufferSlice{};
    cur_x = xout;
    if ((options_.prefetch & kPrefetchQuery) && c.q_lora_rank) prefetch({w.span(qname)}, "prefetch query " + L);
    if (!early_qk) rec.barrier();
    // Stage 2: the query from the q LoRA, the cache row, and (factored) the absorbed query. The
    // attention started early (no barrier after stage 2) where W_qk and kv_write open its gate.
    const bool early_attn = options_.early_attn && early && qk && c.q_lora_rank &&
                            attn.decode_waits(range) && query.signal_supported(ctx_) &&
                            vk::KvWriteOp::gate_supported(ctx_);
    const vk::BufferSlice attn_words = early_attn ? gate_slice(l, kGateAttn, 4) : vk::BufferSlice{};
    if (c.q_lora_rank) {
      query.gate = early_qk ? gate_wait(qk_words, 0, s1_ops[0].signal_count(ctx_)) : vk::GateWait{};
      query.signal = attn_words;
      // The rows the attention of this range reads, up to its bound: the single and mid ranges'
      // started early, and with row_prefetch 2 the short range's too.
      const bool waits = range == vk::DecodeRange::Single || range == vk::DecodeRange::Mid;
      const bool pf = waits ? options_.row_prefetch >= 1 && early_attn
                            : options_.row_prefetch >= 2 && range == vk::DecodeRange::Short;
      if (pf && query.row_prefetch_supported(ctx_)) {
        const uint32_t max_rows = range == vk::DecodeRange::Single ? attn.single_max_kv()
                                  : range == vk::DecodeRange::Mid  ? attn.mid_max_kv()
                                  : options_.row_prefetch_short_rows
                                      ? std::min(attn.short_max_kv(), options_.row_prefetch_short_rows)
                                      : attn.short_max_kv();
        query.row_prefetch = {w.cache[l].whole(), step, kPosWord, uint32_t(c.kv_row() * 2), std::min(max_rows, n_ctx_),
                              options_.row_prefetch_l1};
      }
      record_matvec(query, qname);
    }
    kv_write.record(rec, w.kv.whole(), w.vec(L + "attn_kv_a_norm.weight", R), step, kPosWord, w.cache[l].whole(),
                    std::string("kv_write") + (early_qk ? ".gate" : "") + (early_attn ? ".signal " : " ") + L,
                    early_qk ? gate_wait(qk_words, 1, s1_ops[1].signal_count(ctx_)) : vk::GateWait{}, attn_words);
    if (!qk) {
      if (c.q_lora_rank) rec.barrier();  // the absorb reads q_b's output
      vk::AbsorbOp a = vk::AbsorbOp::query(w.matrix(L + "attn_k_b.weight"), H, c.n_rot, w.qfull.whole(), w.q.whole());
      a.label = a.kernel_name() + " " + L + "attn_k_b";
      a.record(rec);
      weight_bytes += a.w.read_bytes();
    }
    if (!early_attn) rec.barrier();
    // The split ranges' merge chained to its partials by a gate (AttentionTuning::merge_wait).
    const bool chain_merge = early_starts() && olat_q8.buffer && attn.decode_chains_merge(range);
    attn.record_decode(rec, w.q.whole(), w.cache[l].whole(), step, kPosWord,
                       host_step.sub(kAttnCountsWord * 4, vk::AttentionOp::kDecodeCountWords * 4), w.partials.whole(),
                       w.attn_arrivals.whole(), w.olat.whole(), range, "attention " + L, olat_q8, gate,
                       early_attn ? gate_wait(attn_words, 0, query.signal_count(ctx_) + 1) : vk::GateWait{},
                       chain_merge ? gate_wait(gate_slice(l, kGateMerge, 4), 0, attn.decode_merge_target(range))
                                   : vk::GateWait{});
    {
      std::vector<vk::BufferSlice> spans;
      if (options_.prefetch & kPrefetchAttnOut) {
        if (vo) spans.push_back(w.span(L + "attn_vo.weight"));
        else spans.insert(spans.end(), {w.span(L + "attn_v_b.weight"), w.span(L + "attn_output.weight")});
      }
      if ((options_.prefetch & kPrefetchFfnIn) && c.is_moe(l)) {
        spans.push_back(w.span(L + "ffn_gate_inp.weight"));
        const Weights::Loc& tile = w.at(L + "ffn_moe_tile");
        const MoeTileGeometry g = tile.tensor->moe_tile();
        if (g.has_shared()) {
          const uint64_t from = std::min(g.shared_gateup_offset, g.shared_down_offset);
          spans.push_back(tile.buffer->slice(tile.offset + from, (g.total_bytes - from) / 4 * 4));
        }
      }
      prefetch(spans, "prefetch attn_out+ffn_in " + L);
    }
    if (!early) rec.barrier();
    const vk::BufferSlice ffn_norm = w.vec(L + "ffn_norm.weight", c.n_embd);
    const bool fold = fold_router(l);
    vk::RouterFold rfold;
    if (fold) {
      rfold.router = w.matrix(L + "ffn_gate_inp.weight");
      rfold.norm_weight = ffn_norm;
      rfold.acc = w.fold_acc.slice(l * w.fold_stride, vk::router_fold_acc_bytes(c.n_expert));
    }
    // The MoE FFN's kernels, set up before W_vo: the gate-up started early (no barrier after the
    // gated W_vo, which opens its gate once its rows of x and its fold sums are written) where the
    // gate-up also opens the down's (early_down).
    MoeOps moe;
    if (c.is_moe(l)) moe = moe_ops(l, fold, rfold, ffn_norm, xout);
    // Also where the down stays behind a barrier (DeepSeek-V2-Lite: its 2816-wide shared slot): the
    // gate-up then opens the down's words for no one (GATE_SIGNAL is part of the wait's variant).
    const bool early_gateup = options_.early_gateup && (vo || vb_q8) && early && fold && moe.gateup_gate;
    const vk::BufferSlice ffn_words = early_gateup ? gate_slice(l, kGateFfn, 4) : vk::BufferSlice{};
    uint32_t ffn_target = 0;
    if (vo) {
      vk::MatvecOp op = matvec_op(L + "attn_vo.weight", w.olat.whole(), xout, {}, true, rfold, olat_q8);
      op.residual = residual;
      if (early) {
        op.gate = gate_wait(gate, 0, attn.decode_gate_target(range) + (options_.fault_gate_never_opens ? 1u : 0u));
        const bool split = range == vk::DecodeRange::Short || range == vk::DecodeRange::Long;
        op.tuning.preload_early = split ? options_.vo_preload_split : options_.vo_preload;
        if (options_.gate_stats) op.gate_stats = w.gate_stats.slice(uint64_t(l) * kGateStride, vk::MatvecOp::kGateStatsBytes);
      }
      if (early_gateup && op.signal_supported(ctx_)) {
        op.signal = ffn_words;
        ffn_target = op.signal_count(ctx_);
      }
      record_matvec(op, L + "attn_vo.weight");
    } else if (vb_q8) {
      // attn_v_b waits on the attention's gate (early) and opens attn_output's (kGateVb), which
      // waits on it, wherever both kernels take the gate: also after a range whose attention opens
      // none (a barrier before attn_v_b, none after it).
      const bool vb_gate = options_.early_vo && vb.signal_supported(ctx_) && out.gate_supported(ctx_);
      const vk::BufferSlice vb_words = vb_gate ? gate_slice(l, kGateVb, 4) : vk::BufferSlice{};
      if (early) vb.gate = gate_wait(gate, 0, attn.decode_gate_target(range) + (options_.fault_gate_never_opens ? 1u : 0u));
      vb.signal = vb_words;
      record_matvec(vb, L + "attn_v_b.weight");
      if (!vb_gate) rec.barrier();
      out.router_fold = rfold;
      out.y = xout;
      out.residual = residual;
      if (vb_gate) out.gate = gate_wait(vb_words, 0, vb.signal_count(ctx_));
      if (early_gateup && out.signal_supported(ctx_)) {
        out.signal = ffn_words;
        ffn_target = out.signal_count(ctx_);
      }
      record_matvec(out, L + "attn_output.weight");
    } else {
      vk::AbsorbOp a = vk::AbsorbOp::value(w.matrix(L + "attn_v_b.weight"), H, w.olat.whole(), w.o.whole());
      a.label = a.kernel_name() + " " + L + "attn_v_b";
      a.record(rec);
      weight_bytes += a.w.read_bytes();
      rec.barrier();
      vk::MatvecOp op = matvec_op(L + "attn_output.weight", w.o.whole(), xout, {}, true, rfold);
      op.residual = residual;
      record_matvec(op, L + "attn_output.weight");
    }
    if (ffn_target == 0) rec.barrier();
    if (!c.is_moe(l)) {
      vk::DenseGateUpOp gu;
      gu.gate = w.matrix(L + "ffn_gate.weight");
      gu.up = w.matrix(L + "ffn_up.weight");
      gu.x = xout;
      gu.norm_weight = ffn_norm;
      gu.eps = c.eps;
      gu.h = w.hdense.whole();
      if (options_.int8_activations && vk::dense_q8_usable(ctx_, gu.gate, w.matrix(L + "ffn_down.weight")))
        gu.hq = w.hq.whole();
      gu.tuning = options_.moe;
      gu.label = (gu.hq.buffer ? "dense_gateup.q8act " : "dense_gateup ") + L;
      gu.record(rec);
      rec.barrier();
      weight_bytes += gu.gate.read_bytes() + gu.up.read_bytes();
      if (gu.hq.buffer && options_.dense_down_matvec) {
        // The int8 matvec on the gate-up's int8 h (nothing staged; long rows over two subgroups).
        matvec(L + "ffn_down.weight", w.hdense.whole(), xout, {}, true, {}, w.hq.whole());
      } else {
        vk::DenseDownOp dd;
        dd.down = w.matrix(L + "ffn_down.weight");
        dd.h = w.hdense.whole();
        dd.x = xout;
        dd.hq = gu.hq;
        dd.tuning = options_.moe;
        dd.label = (dd.hq.buffer ? "dense_down.q8act " : "dense_down ") + L;
        dd.record(rec);
        weight_bytes += dd.down.read_bytes();
      }
      rec.barrier();
      continue;
    }
    if (!fold) {
      vk::RouterOp router;
      router.w = w.matrix(L + "ffn_gate_inp.weight");
      router.x = xout;
      router.norm_weight = ffn_norm;
      router.eps = c.eps;
      router.routing = routing;
      router.bias = moe.bias;
      router.logits = w.router_logits.whole();
      router.h2 = w.h2.whole();
      router.route = w.route.whole();
      router.label = "router " + L;
      router.record(rec);
      rec.barrier();
      weight_bytes += router.w.read_bytes();
    }
    vk::MoeGateUpOp& gu = moe.gu;
    vk::MoeDownOp& down = moe.down;
    const bool fuse_down = moe.fuse_down, early_down = moe.early_down;
    if (ffn_target) gu.wait = gate_wait(ffn_words, 0, ffn_target);
    // ... and the next layer's stage 1 after it, where its matvecs can wait.
    // The next layer's attn_norm (its stage 1 reads x through it).
    const auto next_norm = [&] { return w.vec(cat("blk.", l + 1, ".attn_norm.weight"), c.n_embd); };
    bool next_early = early_down && options_.early_next && l + 1 < c.n_layer;
    if (next_early)
      for (const Stage1& s : stage1(l + 1))
        next_early = next_early && matvec_op(s.name, xout, s.y, next_norm(), false).gate_supported(ctx_);
    if (ffn_target && !early_down) gu.gate = gate_slice(l, kGateDown, 8);  // zeroed with the others every step
    if (early_down) {
      const vk::BufferSlice words = gate_slice(l, kGateDown, TS_DOWN_GATE_WORDS * 4);
      gu.gate = words.sub(0, 8);
      down.gate = words;
      down.gate_h_target = gu.gate_h_target(ctx_);
      down.gate_error = host_step.sub(kGateErrorWord * 4, 8);
      down.gate_signal_x = next_early;
      if (next_early) x_gate = gate_wait(words, 2, down.gate_x_target());
    }
    // .gate: it opens the early down's gate; .wait: it waits on W_vo's (neither with the fused down).
    gu.label = std::string(gu.hq.buffer ? "moe_gateup.q8act" : "moe_gateup") + (fold ? ".rfold" : "") +
               (fuse_down ? ".fdown" : cat(early_down ? ".gate" : "", ffn_target ? ".wait" : "")) + " " + L;
    gu.record(rec);
    if (!early_down) rec.barrier();
    if ((options_.prefetch & kPrefetchNextNorm) && l + 1 < c.n_layer)
      prefetch({next_norm()}, "prefetch next norm " + L);
    if (fuse_down) {
      weight_bytes += gu.bytes();
      continue;
    }
    down.label = (down.hq.buffer ? "moe_down.q8act" : "moe_down") + std::string(early_down ? ".gate " : " ") + L;
    down.record(rec);
    if (!x_gate.enabled()) rec.barrier();
    weight_bytes += gu.bytes() + down.bytes();
  }
  weight_bytes += record_head(rec, cur_x, w.h2.whole(), "", step);
  stats_.weight_bytes = weight_bytes;
}

uint64_t GpuModel::record_head(vk::CommandRecorder& rec, vk::BufferSlice x, vk::BufferSlice normed,
                               const std::string& what, vk::BufferSlice step_in) {
  const ModelConfig& c = config_;
  Weights& w = *w_;
  // The final norm as its own dispatch: fused into the LM head, every one of its ~39 K workgroups
  // (GLM: 154880 rows) would re-read x for the sum of squares.
  vk::RmsNormOp norm;
  norm.x = x;
  norm.weight = w.vec("output_norm.weight", c.n_embd);
  norm.y = normed;
  norm.n = c.n_embd;
  norm.eps = c.eps;
  norm.label = "rmsnorm output" + what;
  vk::MatvecOp lm;
  lm.w = w.matrix("output.weight");
  lm.x = normed;
  lm.y = w.logits.whole();
  lm.int8_activations = options_.int8_activations;
  lm.tuning = options_.matvec;
  // The int8 head reads the norm's int8 blocks instead of quantizing h2 in each of its ~10 K
  // workgroups (GpuModelOptions::head_q8).
  if (options_.head_q8 && c.n_embd % 32 == 0) {
    lm.x_q8 = w.head_q8.whole();
    if (lm.kernel_name(&ctx_).find(".xq8") != std::string::npos) norm.y_q8 = lm.x_q8;
    else lm.x_q8 = {};
  }
  norm.label = (norm.y_q8.buffer ? "rmsnorm.q8out output" : "rmsnorm output") + what;
  norm.record(rec);
  rec.barrier();
  lm.label = lm.kernel_name(&ctx_) + " output.weight" + what;
  if (lm.label.find(".q8act") != std::string::npos) stats_.int8_activations = true;
  lm.record(rec);
  rec.barrier();
  vk::SampleOp sample;
  sample.n_vocab = c.n_vocab;
  sample.params = options_.sampling;
  sample.logits = w.logits.whole();
  sample.scratch = w.sample_scratch.whole();
  sample.step = w.step.whole();
  sample.step_in = step_in;
  sample.token_word = kTokenWord;
  sample.pos_word = kPosWord;
  sample.advance_pos = true;
  sample.tokens_out = w.ring.whole();
  sample.out_ring = kRing;
  sample.counts_word = kAttnCountsWord;  // the step buffer ready for the next step: no host write
  sample.rule_word = kRuleWord;          // between queued steps (decode_steps)
  sample.input_word = kInputWord;
  sample.record(rec);
  return lm.w.read_bytes();
}

}  // namespace tessera::model
