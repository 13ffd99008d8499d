// GpuModel's batched prefill (docs/PREFILL.md): the prompt in chunks of up to T tokens, one
// pre-recorded command buffer resubmitted per chunk. Per-chunk values (first position p0, token
// count n, the T token ids) live in a host-visible buffer; kernels skip tokens t >= n, so one
// recording serves every chunk length. Dense matrices run as matmuls (each read once per 64
// tokens, on tensor cores; GpuModelOptions::prefill_matmul) or as batched matvecs (8 tokens per
// dispatch), the MoE expert-major (each expert read once per chunk), attention as T causal
// queries over the cache the same chunk just wrote (PrefillAttentionOp: groups of queries share
// each staged cache tile, then the per-query merge).
#include <algorithm>
#include <chrono>
#include <cstring>

#include "format/error.h"
#include "runtime/model/gpu_model.h"
#include "runtime/vulkan/kernels_attention.h"
#include "runtime/vulkan/kernels_basic.h"
#include "runtime/vulkan/kernels_matmul.h"
#include "runtime/vulkan/kernels_matvec.h"
#include "runtime/vulkan/kernels_prefill.h"

namespace tessera::model {

namespace {

constexpr uint32_t kPrefillColumns = 8;  // tokens per batched matvec dispatch

// Chunk buffer words: [first position, token count, ids of tokens 0..T-1].
constexpr uint32_t kPosWord = 0;
constexpr uint32_t kCountWord = 1;
constexpr uint32_t kIdsWord = 2;
// The prefill attention's split along the context: about kPrefillAttnQueryChunks (query,
// context chunk) pairs per chunk of T tokens (T = 512: 4 chunks per query, T = 64: 32), chunks of
// at least kPrefillAttnMinChunk positions. Each chunk's partials are written and merged (20 heads
// x 514 floats per query and chunk): the decode step's split (32 chunks of >= 8 positions) cost a
// 512-token chunk 1.24 ms per layer in partials and merge at depth 0, and fewer, longer chunks
// beat it at every depth measured (H100, session 20: pp512 2415 -> 2703 at depth 0 with chunks
// of >= 128, 972 -> 1023 at 4096 with 4 chunks per query). Options override both.
constexpr uint32_t kPrefillAttnQueryChunks = 2048;
constexpr uint32_t kPrefillAttnMaxGroups = 32;
constexpr uint32_t kPrefillAttnMinChunk = 128;
vk::AttentionTuning prefill_attention_split(const GpuModelOptions& o, uint32_t T) {
  vk::AttentionTuning t;
  t.n_groups = o.prefill_attention_groups ? o.prefill_attention_groups
                                          : std::clamp(kPrefillAttnQueryChunks / std::max(T, 1u), 1u, kPrefillAttnMaxGroups);
  t.min_chunk = o.prefill_attention_min_chunk ? o.prefill_attention_min_chunk : kPrefillAttnMinChunk;
  return t;
}

// The attention of a recording of chunks of T tokens under options o; f16_olat: also the
// tensor-core kernel's variant writing olat as f16 (PrefillAttentionTuning::tc_f16_olat); deep:
// the recording for chunks past prefill_tc_split_depth (the tensor-core walks split as
// o.prefill_attention.tc_split says), else none split.
vk::PrefillAttentionOp prefill_attention(vk::Context& ctx, const ModelConfig& c, uint32_t n_ctx, const GpuModelOptions& o,
                                         uint32_t T, bool f16_olat = false, bool deep = false) {
  vk::PrefillAttentionTuning tuning = o.prefill_attention;
  tuning.tc_f16_olat = f16_olat;
  tuning.chunk_queries = T;
  if (!deep) tuning.tc_split = 1;
  return vk::PrefillAttentionOp(ctx, vk::AttentionShape::from_config(c, n_ctx), prefill_attention_split(o, T), tuning);
}
constexpr uint64_t kMatmulsPerStage = 2;     // matmuls reading one x16 (q_a and kv_a)

enum class Head { None, Last, All };  // LM head of a chunk: none, last token (+ sampler), all tokens

}  // namespace

// The tail recording's chunk under options with chunks of T (0: none).
static uint32_t tail_chunk(const GpuModelOptions& o, uint32_t T) { return o.prefill_tail_chunk < T ? o.prefill_tail_chunk : 0; }

bool prefill_uses_matmul(int option, vk::Context& ctx) {
  if (option == 0 || !vk::matmul_supported(ctx)) return false;
  return option >= 1 || vk::matmul_coop_supported(ctx);
}

struct GpuModel::Prefill {
  uint32_t T = 0;
  vk::Buffer chunk;  // host-visible: kPosWord, kCountWord, ids
  vk::Buffer x, cq, kv, qfull, q, olat, o, h2, router_logits, route, lists, h, y, partials, xlast, logits_all;
  vk::Buffer h2_q8;  // h2 as int8 blocks (RmsNormOp::y_q8) for the FFN's int8 kernels (16 bytes: none)
  vk::Buffer x16;       // the matmuls' f16 input rows (T rounded up to 16; prefill_matmul)
  vk::Buffer mm_partials;  // their split-K partial sums: one region per matmul of a stage
  bool matmul = false;
  vk::MatmulKernel kernel = vk::MatmulKernel::Auto;  // the matmuls' kernel (prefill_matmul 2: Plain)
  // Per [deep][Head], recorded on first use; deep: chunks from prefill_tc_split_depth T on.
  std::unique_ptr<vk::CommandRecorder> rec[2][3];
  // The tail recording (GpuModelOptions::prefill_tail_chunk; 0: none): chunks of T_tail tokens on
  // the same buffers.
  uint32_t T_tail = 0;
  std::unique_ptr<vk::CommandRecorder> rec_tail[2][3];
  std::unique_ptr<vk::CommandRecorder> profiled[2], profiled_tail[2];  // [deep], Head::None with timestamps
  // [tail]: whether the deep recording's attention splits its walks (where it would not, it would
  // be the near recording again, and deep chunks take that one).
  bool deep_splits[2] = {false, false};

  // Whether a chunk of the main (tail: the tail) recording from position p0 takes the deep one.
  bool deep(bool tail, uint64_t p0, uint32_t depth) const {
    return deep_splits[tail] && p0 >= uint64_t(depth) * (tail ? T_tail : T);
  }
};

void GpuModel::PrefillDeleter::operator()(Prefill* p) const { delete p; }

namespace {

struct Sizes {
  uint64_t x, cq, kv, qfull, q, olat, o, router_logits, route, lists, h, y, partials, logits_all, x16, mm_partials, h2_q8;
  uint64_t total() const {
    uint64_t s = 0;
    for (uint64_t b : {x, x /* h2 */, cq, kv, qfull, q, olat, o, router_logits, route, lists, h, y, partials, x /* xlast */,
                       logits_all, x16, mm_partials, h2_q8})
      s += (std::max<uint64_t>(b, 16) + 255) / 256 * 256;
    return s;
  }
};

// Buffer sizes of a chunk of T tokens. moe: the first MoE tile's geometry (0 experts: none);
// matmul: the dense matrices run as matmuls (x16 holds the widest input of T rounded up to 16);
// tail: the tail recording's chunk (0: none).
Sizes sizes(const ModelConfig& c, uint32_t T, uint64_t attention_partials, const MoeTileGeometry* moe, bool matmul,
            uint32_t tail) {
  const uint64_t H = c.n_head, R = c.kv_lora_rank, row = c.kv_row();
  const uint32_t K = moe ? c.n_expert_used : 0;
  Sizes s{};
  s.x = T * uint64_t(c.n_embd) * 4;
  s.cq = T * std::max<uint64_t>(c.q_lora_rank, 4) * 4;
  s.kv = T * row * 4;
  s.qfull = T * H * c.n_qk() * 4;
  s.q = T * H * row * 4;
  s.olat = T * H * R * 4;
  s.o = T * H * c.n_v * 4;
  s.router_logits = T * std::max<uint64_t>(c.n_expert, 1) * 4;
  s.route = vk::prefill_route_bytes(T, std::max<uint32_t>(K, 1));
  s.lists = vk::prefill_list_bytes(T, std::max<uint32_t>(c.n_expert, 1));
  s.h = T * std::max<uint64_t>(c.n_ff, 4) * 4;
  s.y = s.x;
  s.h2_q8 = c.n_embd % 32 == 0 ? T * uint64_t(c.n_embd) / 32 * 48 : 0;
  if (moe) {
    s.h = std::max<uint64_t>(s.h, vk::prefill_pairs(T, K) * vk::moe_h_stride(*moe) * 4);
    s.y = std::max<uint64_t>(s.y, vk::prefill_pairs(T, K) * c.n_embd * 4);
  }
  s.partials = attention_partials;
  s.logits_all = T * uint64_t(c.n_vocab) * 4;
  const uint64_t widest = std::max({uint64_t(c.n_embd), uint64_t(c.q_lora_rank), H * R, H * c.n_v});
  s.x16 = matmul ? (T + 15) / 16 * 16 * widest * 2 : 0;
  s.mm_partials = matmul ? kMatmulsPerStage * vk::kMatmulMaxPartialBytes : 0;
  return s;
}

// The attention partials of the recordings of chunks of T and tail tokens (tail 0: none), near
// the start and deep, each with its own split (prefill_attention_split); none where the
// tensor-core kernel runs unsplit.
uint64_t attention_partials(vk::Context& ctx, const ModelConfig& c, uint32_t n_ctx, const GpuModelOptions& o, uint32_t T,
                            uint32_t tail) {
  uint64_t most = 0;
  for (uint32_t t : {T, tail}) {
    if (t == 0) continue;
    for (bool deep : {false, true}) {
      const vk::PrefillAttentionOp probe = prefill_attention(ctx, c, n_ctx, o, t, false, deep);
      most = std::max(most, t * probe.needed_partials_bytes());
    }
  }
  return most;
}

}  // namespace

uint64_t GpuModel::prefill_scratch_bytes() const {
  // Called by the plan before any weight is on the device: the MoE geometry comes from the
  // configuration (the tile widths; the strides only matter for h).
  const ModelConfig& c = config_;
  const uint32_t T = options_.prefill_chunk;
  MoeTileGeometry g;
  g.w_routed = c.n_ff_exp;
  g.w_shared = uint64_t(c.n_expert_shared) * c.n_ff_exp;
  const bool any_moe = c.n_expert > 0 && c.n_layer > c.n_leading_dense;
  const uint32_t tail = tail_chunk(options_, T);
  return sizes(c, T, attention_partials(ctx_, c, n_ctx_, options_, T, tail), any_moe ? &g : nullptr,
               prefill_uses_matmul(options_.prefill_matmul, ctx_), tail)
      .total();
}

void GpuModel::create_prefill() {
  const ModelConfig& c = config_;
  auto p = std::unique_ptr<Prefill, PrefillDeleter>(new Prefill);
  p->T = options_.prefill_chunk;
  MoeTileGeometry g;
  g.w_routed = c.n_ff_exp;
  g.w_shared = uint64_t(c.n_expert_shared) * c.n_ff_exp;
  const bool any_moe = c.n_expert > 0 && c.n_layer > c.n_leading_dense;
  p->matmul = prefill_uses_matmul(options_.prefill_matmul, ctx_);
  p->kernel = options_.prefill_matmul == 2 ? vk::MatmulKernel::Plain : vk::MatmulKernel::Auto;
  p->T_tail = tail_chunk(options_, p->T);
  const Sizes s = sizes(c, p->T, attention_partials(ctx_, c, n_ctx_, options_, p->T, p->T_tail), any_moe ? &g : nullptr,
                        p->matmul, p->T_tail);
  struct Item {
    vk::Buffer* buf;
    const char* name;
    uint64_t bytes;
  };
  const Item items[] = {{&p->x, "prefill x", s.x}, {&p->h2, "prefill h2", s.x}, {&p->cq, "prefill cq", s.cq},
                        {&p->kv, "prefill kv", s.kv}, {&p->qfull, "prefill q_b out", s.qfull}, {&p->q, "prefill q", s.q},
                        {&p->olat, "prefill olat", s.olat}, {&p->o, "prefill o", s.o},
                        {&p->router_logits, "prefill router logits", s.router_logits}, {&p->route, "prefill route", s.route},
                        {&p->lists, "prefill expert lists", s.lists}, {&p->h, "prefill ffn h", s.h},
                        {&p->y, "prefill ffn y", s.y}, {&p->partials, "prefill attention partials", s.partials},
                        {&p->xlast, "prefill last row", s.x / p->T}, {&p->logits_all, "prefill logits", s.logits_all},
                        {&p->x16, "prefill f16 rows", s.x16}, {&p->mm_partials, "prefill matmul partial sums", s.mm_partials},
                        {&p->h2_q8, "prefill h2 int8 blocks", s.h2_q8}};
  for (const Item& it : items) *it.buf = local_->create_buffer(std::max<uint64_t>(it.bytes, 16), it.name);
  p->chunk = host_->create_buffer((kIdsWord + p->T) * 4ull, "prefill chunk values");
  std::memset(p->chunk.mapped(), 0, (kIdsWord + p->T) * 4ull);
  // Zero everything once: padding tokens then only ever see finite values.
  vk::CommandRecorder init(ctx_);
  init.begin();
  for (const Item& it : items) init.fill(it.buf->whole(), 0);
  init.end();
  init.run();
  prefill_stats_.chunk = p->T;
  prefill_stats_.tail_chunk = p->T_tail;
  prefill_stats_.scratch_bytes = s.total();
  prefill_stats_.matmul = p->matmul;
  prefill_stats_.matmul_coop = p->matmul && vk::matmul_uses_coop(ctx_, p->kernel);
  prefill_stats_.attention_tc = prefill_attention(ctx_, c, n_ctx_, options_, p->T).tensor_cores();
  for (bool tail : {false, true})
    if (const uint32_t t = tail ? p->T_tail : p->T)
      p->deep_splits[tail] = prefill_attention(ctx_, c, n_ctx_, options_, t, false, true).tc_split() > 1;
  prefill_ = std::move(p);
  // The body without a head: recorded now for the stats (and compiles the pipelines at load).
  prefill_->rec[0][int(Head::None)] = record_prefill(int(Head::None));
}

namespace {

// PrefillRecorder::dense()'s options.
struct DenseFlags {
  bool x16_ready = false;          // x16 already holds the input rows, behind a barrier (finish_layer)
  vk::BufferSlice norm_first_out;  // set: where the first output's matmul splits along K, its parts
                                   // are summed (into y) by its norm with this weight beside the
                                   // other sums, which writes its f16 rows into x16 (the next
                                   // dense() then takes x16_ready); first_out_normed says so
  bool* first_out_normed = nullptr;
};

// Records one chunk (see the file comment); `head` selects the LM head part.
struct PrefillRecorder {
  vk::CommandRecorder& rec;
  const ModelConfig& c;
  uint32_t T;
  bool int8_activations;
  vk::MatvecTuning tuning;
  const vk::Buffer* x16 = nullptr;  // set: dense matrices as matmuls reading these f16 rows
  const vk::Buffer* partials = nullptr;  // their split-K partial sums (kMatmulsPerStage regions)
  vk::MatmulTuning matmul_tuning;
  vk::MatmulKernel matmul_kernel = vk::MatmulKernel::Auto;
  vk::BufferSlice chunk;  // the chunk words (kCountWord: its live tokens)
  uint64_t weight_bytes = 0;

  struct Out {
    vk::MatrixRef w;
    std::string name;
    const vk::Buffer* y;
  };
  // y = W x[t] (+ y[t]) for each of `outs` (at most kMatmulsPerStage), all reading x (W.cols
  // floats per token), normalized with `norm` where set: matmuls where x16 is set (x normalized
  // into x16 first, then a barrier; split-K matmuls: a barrier and their sums after them), else
  // batched matvecs. No barrier after. Returns whether x16 now holds the (normalized) rows.
  bool dense(std::initializer_list<Out> outs, const vk::Buffer& x, vk::BufferSlice norm, bool acc, DenseFlags f = {}) {
    const bool x16_ready = f.x16_ready;
    if (f.first_out_normed) *f.first_out_normed = false;
    const uint32_t cols = outs.begin()->w.cols;
    bool matmul = x16 != nullptr;
    for (const Out& o : outs) matmul = matmul && o.w.cols == cols && o.w.cols % 32 == 0;
    if (x16_ready && !matmul) runtime_error(outs.begin()->name, ": f16 rows prepared for matrices that do not run as matmuls");
    if (!matmul) {
      for (const Out& o : outs) matvec(o.w, o.name, x, *o.y, norm, acc);
      return false;
    }
    if (outs.size() > kMatmulsPerStage) runtime_error(outs.begin()->name, ": more matmuls on one input than partial-sum regions");
    if (!x16_ready) record_norm(x, norm, cols, outs.begin()->name);
    std::vector<vk::MatmulOp> ops;
    bool split = false;
    for (const Out& o : outs) {
      vk::MatmulOp op;
      op.w = o.w;
      op.x16 = x16->whole();
      op.y = o.y->whole();
      op.partials = partials->whole().sub(ops.size() * vk::kMatmulMaxPartialBytes, vk::kMatmulMaxPartialBytes);
      op.n_tokens = T;
      op.live_count = chunk;  // the chunk's live tokens: a short chunk costs its own tokens
      op.count_word = kCountWord;
      op.accumulate = acc;
      op.tuning = matmul_tuning;
      op.kernel = matmul_kernel;
      // The profile keeps the shapes and split counts apart (one line per matrix shape).
      op.label = cat(op.kernel_name(rec.context()), " ", o.w.rows, "x", o.w.cols, ".k", op.splits(rec.context()), " ", o.name);
      op.record(rec);
      split = split || op.splits(rec.context()) > 1;
      weight_bytes += o.w.read_bytes() * ((T + 63) / 64);
      ops.push_back(op);
    }
    if (split) {
      rec.barrier();
      for (size_t i = 0; i < ops.size(); ++i) {
        const vk::MatmulOp& op = ops[i];
        if (i == 0 && f.norm_first_out.buffer != VK_NULL_HANDLE && op.splits(rec.context()) > 1 && !acc &&
            op.w.rows % 32 == 0) {  // its parts summed by its norm (rmsnorm.comp SUM_IN, replace); rows
                                    // of a multiple of 32: the next dense() runs as a matmul
          const vk::RmsNormOp::ResidualSum parts = op.split_parts(rec.context());
          record_norm(*outs.begin()->y, f.norm_first_out, op.w.rows, outs.begin()->name, &parts, false);
          if (f.first_out_normed) *f.first_out_normed = true;
          continue;
        }
        op.record_sum(rec);
      }
    }
    return true;
  }

  // x16 = f16(RMSNorm(x; norm)) (or x as it is without a norm) for the T tokens' rows of `cols`;
  // with `add`, the sum into x first (RmsNormOp::add). Then a barrier unless `barrier` is false.
  void record_norm(const vk::Buffer& x, vk::BufferSlice norm, uint32_t cols, const std::string& name,
                   const vk::RmsNormOp::ResidualSum* add = nullptr, bool barrier = true) {
    vk::RmsNormOp n;
    n.x = x.whole();
    n.weight = norm;
    n.normalize = norm.buffer != VK_NULL_HANDLE;
    n.y = x16->whole();
    n.n = cols;
    n.rows = T;
    n.eps = c.eps;
    n.f16_out = true;
    n.label = (add ? "sum_rmsnorm.f16out " : n.normalize ? "rmsnorm.f16out " : "to_f16 ") + name;
    if (add) n.add = *add;
    n.record(rec);
    if (barrier) rec.barrier();
  }

  // y[t] = W x[t] (+ y[t]) for the T tokens: dispatches of 8 tokens, no barrier between. (The
  // int8 path takes 16 columns, but on an H200 that was slower overall: pp512 907 -> 796 tok/s,
  // W_qk's 768-long rows paying for the larger staging; docs/PERFORMANCE.md.)
  void matvec(const vk::MatrixRef& w, const std::string& name, const vk::Buffer& x, const vk::Buffer& y,
              vk::BufferSlice norm, bool acc) {
    for (uint32_t c0 = 0; c0 < T; c0 += kPrefillColumns) {
      vk::MatvecOp op;
      op.w = w;
      op.batch = std::min(kPrefillColumns, T - c0);
      op.x = x.whole();
      op.x_offset = c0 * w.cols;
      op.x_stride = w.cols;
      op.y = y.whole().sub(uint64_t(c0) * w.rows * 4, uint64_t(op.batch) * w.rows * 4);
      op.y_stride = w.rows;
      op.accumulate = acc;
      op.norm_weight = norm;
      op.norm_eps = c.eps;
      op.int8_activations = int8_activations;
      op.tuning = tuning;
      op.label = op.kernel_name(&rec.context()) + " " + name;
      op.record(rec);
      weight_bytes += w.read_bytes();
    }
  }
};

}  // namespace

std::unique_ptr<vk::CommandRecorder> GpuModel::record_prefill(int head_index, bool timestamps, bool tail, bool deep) {
  Prefill& p = *prefill_;
  const uint32_t T = tail ? p.T_tail : p.T;
  const vk::Buffer& route_buf = p.route;
  const ModelConfig& c = config_;
  const Head head = Head(head_index);
  const vk::BufferSlice chunk = p.chunk.whole();
  {
    auto rec = step_recorder(timestamps);
    rec->begin();
    PrefillRecorder r{*rec, c, T, options_.int8_activations, options_.matvec, p.matmul ? &p.x16 : nullptr, p.matmul ? &p.mm_partials : nullptr,
                      options_.matmul, p.kernel, chunk};
    const uint32_t H = c.n_head, R = c.kv_lora_rank;
    vk::EmbedOp embed;
    embed.table = weight_matrix("token_embd.weight");
    embed.ids = chunk;
    embed.id_offset = kIdsWord;
    embed.n_tokens = T;
    embed.out = p.x.whole();
    embed.record(*rec);
    rec->barrier();

    const vk::AttentionShape ashape = vk::AttentionShape::from_config(c, n_ctx_);
    vk::KvWriteOp kv_write(ctx_, ashape);
    // Composed W_vo as a matmul: the tensor-core attention writes its f16 input rows itself.
    const bool f16_olat = options_.prefill_f16_olat && p.matmul && has_weight("blk.0.attn_vo.weight") &&
                          uint64_t(c.n_head) * c.kv_lora_rank % 32 == 0;  // W_vo's rows then run as a matmul
    const vk::PrefillAttentionOp attn = prefill_attention(ctx_, c, n_ctx_, options_, T, f16_olat, deep);
    const vk::QueryBatch batch{T, kCountWord};
    // The FFN's matmul form (experts and dense layers) in this recording's chunks; else its int8
    // kernels read h2 as int8 blocks written by the FFN's RMSNorm, once per token, instead of
    // quantizing it in each workgroup.
    const bool ffn_matmul = p.matmul && (options_.prefill_moe_matmul == 1 ||
                                         (options_.prefill_moe_matmul < 0 && T >= kMoeMatmulMinChunk));
    const bool ffn_q8_in = !ffn_matmul && options_.int8_activations && options_.prefill_q8_input && c.n_embd % 32 == 0 &&
                           ctx_.device().enabled().integer_dot_product;
    vk::FfnForm ffn_form;
    ffn_form.int8_activations = options_.int8_activations;
    ffn_form.int8_tuning = options_.matmul.ffn_int8;
    ffn_form.matmul = ffn_matmul;
    ffn_form.matmul_kernel = p.kernel;
    ffn_form.matmul_tuning = options_.matmul.ffn;
    // The FFN's sum into x, then a barrier. Where the next layer's first matrices run as matmuls,
    // fused with their norm (rmsnorm.comp SUM_IN: a dispatch and a barrier fewer per layer;
    // GpuModelOptions::prefill_sum_norm): returns whether x16 then holds the next layer's rows.
    const auto finish_layer = [&](const vk::PrefillSumOp& sum, uint32_t l) {
      if (!options_.prefill_sum_norm || !r.x16 || l + 1 >= c.n_layer || c.n_embd % 32 != 0) {
        sum.record(*rec);
        rec->barrier();
        return false;
      }
      const vk::RmsNormOp::ResidualSum add = sum.residual_sum();
      const std::string next = cat("blk.", l + 1, ".attn_norm");
      r.record_norm(p.x, weight_vec(next + ".weight", c.n_embd), c.n_embd, next, &add);
      return true;
    };
    bool x16_ready = false;  // x16 holds RMSNorm(x; this layer's attn_norm) (finish_layer)
    for (uint32_t l = 0; l < c.n_layer; ++l) {
      const std::string L = cat("blk.", l, ".");
      const bool qk = has_weight(L + "attn_qk.weight"), vo = has_weight(L + "attn_vo.weight");
      const vk::BufferSlice attn_norm = weight_vec(L + "attn_norm.weight", c.n_embd);
      const std::string qname = qk ? L + "attn_qk.weight" : (c.q_lora_rank ? L + "attn_q_b.weight" : L + "attn_q.weight");
      const vk::Buffer& qdst = qk ? p.q : p.qfull;
      // Stage 1: what reads only x.
      const std::string qlabel = qname.substr(0, qname.size() - 7);  // without ".weight"
      const PrefillRecorder::Out kv_a{weight_matrix(L + "attn_kv_a_mqa.weight"), L + "attn_kv_a_mqa", &p.kv};
      bool cq_normed = false;  // x16 holds RMSNorm(cq; attn_q_a_norm) (q_a's parts summed by that norm)
      if (c.q_lora_rank) {
        const vk::BufferSlice q_a_norm = weight_vec(L + "attn_q_a_norm.weight", c.q_lora_rank);
        r.dense({{weight_matrix(L + "attn_q_a.weight"), L + "attn_q_a", &p.cq}, kv_a}, p.x, attn_norm, false,
                {.x16_ready = x16_ready, .norm_first_out = options_.prefill_split_norm ? q_a_norm : vk::BufferSlice{},
                 .first_out_normed = &cq_normed});
      } else {
        r.dense({{weight_matrix(qname), qlabel, &qdst}, kv_a}, p.x, attn_norm, false, {.x16_ready = x16_ready});
      }
      rec->barrier();
      // Stage 2: queries, cache rows, (factored) absorbed queries.
      if (c.q_lora_rank)
        r.dense({{weight_matrix(qname), qlabel, &qdst}}, p.cq, weight_vec(L + "attn_q_a_norm.weight", c.q_lora_rank), false,
                {.x16_ready = cq_normed});
      kv_write.record_rows(*rec, p.kv.whole(), weight_vec(L + "attn_kv_a_norm.weight", R), chunk, kPosWord, batch,
                           kv_cache(l), "kv_write " + L);
      if (!qk) {
        if (c.q_lora_rank) rec->barrier();
        vk::AbsorbOp a = vk::AbsorbOp::query(weight_matrix(L + "attn_k_b.weight"), H, c.n_rot, p.qfull.whole(), p.q.whole());
        a.n_tokens = T;  // the per-head matrices read once for the chunk
        a.label = a.kernel_name() + " " + L + "attn_k_b";
        a.record(*rec);
        r.weight_bytes += a.w.read_bytes();
      }
      rec->barrier();
      const bool olat16 = vo && attn.writes_f16_olat();  // W_vo's f16 rows straight from the attention
      attn.record(*rec, p.q.whole(), kv_cache(l), chunk, kPosWord, p.partials.whole(),
                  olat16 ? p.x16.whole() : p.olat.whole(), "attention " + L, batch, olat16);
      rec->barrier();
      if (vo) {
        r.dense({{weight_matrix(L + "attn_vo.weight"), L + "attn_vo", &p.x}}, p.olat, {}, true, {.x16_ready = olat16});
      } else {
        vk::AbsorbOp a = vk::AbsorbOp::value(weight_matrix(L + "attn_v_b.weight"), H, p.olat.whole(), p.o.whole());
        a.n_tokens = T;
        a.label = a.kernel_name() + " " + L + "attn_v_b";
        a.record(*rec);
        r.weight_bytes += a.w.read_bytes();
        rec->barrier();
        r.dense({{weight_matrix(L + "attn_output.weight"), L + "attn_output", &p.x}}, p.o, {}, true);
      }
      rec->barrier();
      // FFN: h2 = RMSNorm(x; ffn_norm) per token (and the router logits), then expert-major.
      const vk::BufferSlice ffn_norm = weight_vec(L + "ffn_norm.weight", c.n_embd);
      vk::RmsNormOp norm;
      norm.x = p.x.whole();
      norm.weight = ffn_norm;
      norm.y = p.h2.whole();
      norm.n = c.n_embd;
      norm.rows = T;
      norm.eps = c.eps;
      norm.label = "rmsnorm ffn " + L;
      if (ffn_q8_in) norm.y_q8 = p.h2_q8.whole();
      norm.record(*rec);
      vk::PrefillSumOp sum;
      sum.n_embd = c.n_embd;
      sum.t_max = T;
      sum.x = p.x.whole();
      sum.y = p.y.whole();
      sum.step = chunk;
      sum.count_word = kCountWord;
      sum.label = "prefill_sum " + L;
      if (!c.is_moe(l)) {
        rec->barrier();
        vk::DensePrefillOp d;
        d.form = ffn_form;
        d.gate = weight_matrix(L + "ffn_gate.weight");
        d.up = weight_matrix(L + "ffn_up.weight");
        d.down = weight_matrix(L + "ffn_down.weight");
        d.t_max = T;
        d.step = chunk;
        d.count_word = kCountWord;
        d.h2 = p.h2.whole();
        if (ffn_q8_in) d.h2_q8 = p.h2_q8.whole();
        d.h = p.h.whole();
        d.y = p.y.whole();
        d.label = "dense_prefill " + L;
        d.record_gateup(*rec);
        rec->barrier();
        d.record_down(*rec);
        rec->barrier();
        sum.n_used = 0;
        x16_ready = finish_layer(sum, l);
        r.weight_bytes += d.gate.read_bytes() + d.up.read_bytes() + d.down.read_bytes();
        continue;
      }
      // The router's logits: from x in the routing dispatch, or a matmul (x16 then holds
      // RMSNorm(x; ffn_norm) as f16: the experts' matmul form reads it).
      const vk::MatrixRef router = weight_matrix(L + "ffn_gate_inp.weight");
      const bool router_from_x = options_.prefill_router == 2 || (options_.prefill_router == 0 && !ffn_form.matmul &&
                                                                  vk::route_from_x_supported(router));
      bool normed_f16 = false;
      if (!router_from_x) {
        normed_f16 = r.dense({{router, L + "ffn_gate_inp", &p.router_logits}}, p.x, ffn_norm, false);
        rec->barrier();
      }
      vk::PrefillRouteOp route;
      route.n_expert = c.n_expert;
      route.routing = vk::MoeRouting::from_config(c);
      route.t_max = T;
      route.logits = p.router_logits.whole();
      if (c.has_exp_probs_b) route.bias = weight_vec(L + "exp_probs_b.bias", c.n_expert);
      route.step = chunk;
      route.count_word = kCountWord;
      route.route = route_buf.whole();
      route.lists = p.lists.whole();
      route.label = "moe_prefill_route " + L;
      if (router_from_x) {  // beside the FFN norm (both only read x)
        route.router = router;
        route.x = p.x.whole();
        route.norm = ffn_norm;
        route.eps = c.eps;
        route.tuning = options_.prefill_route_x;
        r.weight_bytes += router.read_bytes();
      }
      route.record(*rec);
      rec->barrier();
      vk::MoePrefillOp moe;
      moe.form = ffn_form;
      moe.tile = moe_tile(L + "ffn_moe_tile");
      moe.n_used = c.n_expert_used;
      moe.t_max = T;
      moe.step = chunk;
      moe.count_word = kCountWord;
      moe.h2 = p.h2.whole();
      if (ffn_q8_in) moe.h2_q8 = p.h2_q8.whole();
      if (moe.form.matmul && normed_f16 && options_.prefill_moe_f16_input) moe.h2_f16 = p.x16.whole();
      moe.route = route_buf.whole();
      moe.lists = p.lists.whole();
      moe.h = p.h.whole();
      moe.y = p.y.whole();
      moe.label = "moe_prefill " + L;
      moe.record_gateup(*rec);
      rec->barrier();
      moe.record_down(*rec);
      rec->barrier();
      sum.n_used = c.n_expert_used;
      sum.has_shared = moe.tile.geometry.has_shared();
      x16_ready = finish_layer(sum, l);
      const MoeTileGeometry& g = moe.tile.geometry;
      r.weight_bytes += uint64_t(g.n_expert) * (g.gateup(0).total_bytes + g.down(0).total_bytes) +
                        (g.has_shared() ? g.gateup(g.n_expert).total_bytes + g.down(g.n_expert).total_bytes : 0);
    }
    if (head == Head::None) {
      prefill_stats_.dispatches = rec->dispatch_count();
      prefill_stats_.barriers = rec->barrier_count();
      prefill_stats_.weight_bytes = r.weight_bytes;
    } else {
      const vk::BufferSlice out_norm = weight_vec("output_norm.weight", c.n_embd);
      const vk::MatrixRef out_w = weight_matrix("output.weight");
      vk::PrefillGatherOp gather;
      gather.n_embd = c.n_embd;
      gather.x = p.x.whole();
      gather.out = p.xlast.whole();
      gather.step = chunk;
      gather.count_word = kCountWord;
      gather.record(*rec);
      if (head == Head::All) r.dense({{out_w, "output", &p.logits_all}}, p.x, out_norm, false);
      rec->barrier();
      record_head(*rec, p.xlast.whole(), p.h2.whole(), " (last token)");  // h2's first row is free here
    }
    rec->end();
    return rec;
  }
}

std::vector<vk::DispatchTiming> GpuModel::profile_prefill(double* wall_us, bool tail) {
  if (!prefill_) usage_error("profile_prefill: the model was loaded without the prefill graph (prefill_chunk 0)");
  if (!ctx_.device().has_timestamps()) runtime_error("profile: ", ctx_.info().name, " has no timestamp queries");
  Prefill& p = *prefill_;
  if (tail && !p.T_tail) usage_error("profile_prefill: the model has no tail recording (prefill_tail_chunk)");
  const uint32_t T = tail ? p.T_tail : p.T;
  if (uint64_t(n_past_) + T > n_ctx_)
    usage_error("profile_prefill: a chunk of ", T, " tokens at position ", n_past_, " exceeds the context of ", n_ctx_);
  const bool deep = p.deep(tail, n_past_, options_.prefill_tc_split_depth);
  std::unique_ptr<vk::CommandRecorder>& rec = tail ? p.profiled_tail[deep] : p.profiled[deep];
  if (!rec) {
    const PrefillStats keep = prefill_stats_;
    rec = record_prefill(int(Head::None), true, tail, deep);
    prefill_stats_ = keep;
  }
  std::vector<uint32_t> words(kIdsWord + p.T, 0);
  words[kPosWord] = n_past_;
  words[kCountWord] = T;
  for (uint32_t t = 0; t < T; ++t) words[kIdsWord + t] = uint32_t((uint64_t(t) * 7919 + 13) % config_.n_vocab);
  p.chunk.write(0, words.data(), words.size() * 4);
  const auto t0 = std::chrono::steady_clock::now();
  rec->run();
  if (wall_us) *wall_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  return rec->timings();
}

std::vector<float> GpuModel::run_prefill(std::span<const int32_t> tokens, bool last_only) {
  Prefill& p = *prefill_;
  const ModelConfig& c = config_;
  for (int32_t t : tokens)
    if (t < 0 || uint32_t(t) >= c.n_vocab) bad_input("token id ", t, " is outside the vocabulary (", c.n_vocab, " tokens)");

  std::vector<float> out;
  const size_t V = c.n_vocab;
  if (!last_only) out.reserve(V * tokens.size());
  for (size_t i0 = 0; i0 < tokens.size();) {
    // The tail recording where at most prefill_tail_chunks of its chunks remain.
    const size_t left = tokens.size() - i0;
    const bool tail = p.T_tail && left <= uint64_t(options_.prefill_tail_chunks) * p.T_tail;
    const uint32_t n = uint32_t(std::min<size_t>(tail ? p.T_tail : p.T, left));
    const bool last_chunk = i0 + n == tokens.size();
    const Head head = !last_only ? Head::All : last_chunk ? Head::Last : Head::None;
    const bool deep = p.deep(tail, n_past_, options_.prefill_tc_split_depth);
    std::unique_ptr<vk::CommandRecorder>& rec = tail ? p.rec_tail[deep][int(head)] : p.rec[deep][int(head)];
    if (!rec) rec = record_prefill(int(head), false, tail, deep);
    std::vector<uint32_t> words(kIdsWord + p.T, 0);
    words[kPosWord] = n_past_;
    words[kCountWord] = n;
    for (uint32_t t = 0; t < n; ++t) words[kIdsWord + t] = uint32_t(tokens[i0 + t]);
    p.chunk.write(0, words.data(), words.size() * 4);
    if (head != Head::None) {
      // The sampler reads the position of the token whose logits it samples, and advances it.
      write_step(0, n_past_ + n - 1);
    }
    rec->run();
    n_past_ += n;
    if (!last_only) {
      const size_t at = out.size();
      out.resize(at + size_t(n) * V);
      read_back(p.logits_all, out.data() + at, size_t(n) * V * 4);
    }
    i0 += n;
  }
  if (last_only) out = last_logits();
  return out;
}

}  // namespace tessera::model
