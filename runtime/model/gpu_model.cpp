// GpuModel: load (plan, upload) and the decode step recording. See gpu_model.h.
#include "runtime/model/gpu_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>

#include "format/error.h"
#include "shaders/moe_args.h"
#include "runtime/vulkan/kernels_attention.h"
#include "runtime/vulkan/kernels_basic.h"
#include "runtime/vulkan/kernels_matvec.h"
#include "runtime/vulkan/kernels_moe.h"
#include "runtime/vulkan/transfer.h"

namespace tessera::model {

namespace {

constexpr uint32_t kTokenWord = 0;  // step buffer: [token, position]
constexpr uint32_t kPosWord = 1;
constexpr uint32_t kMaxDispatchesPerLayer = 12;  // decode step budget (issue 5) ...
constexpr uint32_t kStepDispatches = 4;           // ... besides the layers: embedding, output norm, LM head, sampler
constexpr uint32_t kGateErrorWord = 64;  // step buffer: set by a W_vo early start that gave up waiting
                                         // (byte 256: any storage-buffer offset alignment)
constexpr uint32_t kGateStride = 256;   // bytes between the layers' gate words (binding offsets)
constexpr uint32_t kAttnCountsWord = 4;  // step buffer: the decode attention's indirect group counts (6 words)
constexpr uint32_t kStepBytes = (kGateErrorWord + 2) * 4;  // the error word and the gate it saw
static_assert(kAttnCountsWord + vk::AttentionOp::kDecodeCountWords <= kGateErrorWord);
constexpr uint32_t kRing = 64;      // sampled-token ring (host-visible)

void progress(bool on, uint64_t done, uint64_t total) {
  if (!on || total == 0) return;
  const int pct = int(100.0 * double(done) / double(total));
  std::fprintf(stderr, "\rupload %3d%% (%.1f / %.1f MB)", pct, done / 1e6, total / 1e6);
  if (done == total) std::fputc('\n', stderr);
}

}  // namespace

// Every device buffer of the model. A tensor is found by name: its buffer and byte offset.
struct GpuModel::Weights {
  struct Loc {
    const vk::Buffer* buffer = nullptr;
    uint64_t offset = 0;
    const TsrTensor* tensor = nullptr;
  };
  std::vector<vk::Buffer> weight_buffers;  // one per decoder block + one per other tensor
  std::map<std::string, Loc, std::less<>> loc;

  // activations (f32) and state
  vk::Buffer x, cq, kv, qfull, q, olat, o, router_logits, h2, route, h, hdense, logits, partials, sample_scratch;
  vk::Buffer hq;  // int8 blocks of h / hdense (the int8-activation FFN path)
  vk::Buffer prefetch_sink;  // PrefetchOp's fold word
  vk::Buffer attn_arrivals;  // the rows attention's merge-tail arrival counters (zero between dispatches)
  vk::Buffer olat_q8;        // olat as int8 blocks (the merge writes it for W_vo's int8 kernel)
  vk::Buffer down_acc;       // the fused MoE down's accumulators and arrival counter (zero between uses)
  vk::Buffer head_q8;        // the output norm's result as int8 blocks (the LM head's input)
  vk::Buffer fold_acc;       // the router fold's accumulators: one array per layer, fold_stride apart
  vk::Buffer gates;          // early-start gate words: per layer W_vo's, then the MoE down's two, kGateStride apart
  vk::Buffer gate_stats;     // GpuModelOptions::gate_stats: per layer (kGateStride apart) the gated
                             // W_vo's counters and times, zeroed each step, summed on the host
  uint64_t fold_stride = 0;  // bytes per layer (0: no router fold)
  std::vector<vk::Buffer> cache;  // per layer: f16 [n_ctx][kv_lora + rope]
  vk::Buffer step, ring;          // host-visible
  vk::Buffer step_local;          // device-local copy of step, made at the start of each step

  const Loc& at(std::string_view name) const {
    auto it = loc.find(name);
    if (it == loc.end()) bad_input("packed model: tensor '", name, "' is missing");
    return it->second;
  }
  bool has(std::string_view name) const { return loc.find(name) != loc.end(); }

  // The tensor as a matrix of n_rows x ne[0] (3-D tensors: slabs stacked).
  vk::MatrixRef matrix(std::string_view name) const {
    const Loc& l = at(name);
    const TsrTensor& t = *l.tensor;
    vk::MatrixRef m;
    m.buffer = l.buffer;
    m.offset = l.offset;
    m.type = t.type;
    if (t.layout == TsrLayout::Split1) m.layout = vk::WeightLayout::Split1;
    else if (t.layout == TsrLayout::Plain) m.layout = vk::WeightLayout::Plain;
    else bad_input("packed model: tensor '", name, "' has layout ", layout_name(t.layout), ", expected a matrix layout");
    m.rows = uint32_t(t.n_rows());
    m.cols = uint32_t(t.ne[0]);
    m.validate(t.name.c_str());
    return m;
  }
  // Every byte of a tensor (whole 32-bit words): what a prefetch reads.
  vk::BufferSlice span(std::string_view name) const {
    const Loc& l = at(name);
    return l.buffer->slice(l.offset, l.tensor->nbytes / 4 * 4);
  }
  // A plain F32 vector (norm weights, biases).
  vk::BufferSlice vec(std::string_view name, uint64_t n) const {
    const Loc& l = at(name);
    const TsrTensor& t = *l.tensor;
    if (t.layout != TsrLayout::Plain || t.type != GgmlType::F32 || t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3] != n)
      bad_input("packed model: tensor '", name, "' is ", type_name(t.type), " ", t.shape_string(), ", expected F32 {", n, "}");
    return l.buffer->slice(l.offset, n * 4);
  }
};

GpuModel::GpuModel(vk::Context& ctx, const TsrFile& file, const GpuModelOptions& options)
    : ctx_(ctx), options_(options), config_(ModelConfig::from_metadata(file.metadata())) {
  n_ctx_ = std::max<uint32_t>(1, std::min(options.n_ctx, std::max<uint32_t>(config_.n_ctx_train, 1)));
  options_.prefill_chunk = std::min(options_.prefill_chunk, n_ctx_);  // a chunk never exceeds the context
  w_ = std::make_unique<Weights>();
  for (uint32_t l = 0; l < config_.n_layer; ++l)
    if (config_.is_moe(l) && config_.has_exp_probs_b && !file.find_tensor(blk(l, "exp_probs_b.bias")))
      config_.has_exp_probs_b = false;  // a softmax-routed file without selection bias
  plan_and_upload(file);
  rec_ = step_recorder(false);
  // Zero the sampler's scratch once (its arrival counter must start at 0), the router's arrival
  // counter (layers without the fold) and the attention's merge-tail counters.
  rec_->begin();
  rec_->fill(w_->sample_scratch.whole(), 0);
  rec_->fill(w_->route.whole(), 0);
  rec_->fill(w_->attn_arrivals.whole(), 0);
  rec_->end();
  rec_->run();
  record_steps();
  // The dispatch budget of the decode step (issue 5): 12 per layer, plus the embedding, the output
  // norm, the head and the sampler. Where a recording breaks it, the short-context attention
  // variant goes if that lowers the count. With one recording per range it usually does not (the
  // short range's recording has at most the long one's dispatches): then dropping it would only
  // lose the short variant's speed, and it stays.
  const uint32_t budget = kMaxDispatchesPerLayer * config_.n_layer + kStepDispatches;
  uint32_t most = rec_->dispatch_count();
  for (const auto& r : rec_more_) most = std::max(most, r->dispatch_count());
  if (most > budget && attn_->short_max_kv()) {
    vk::AttentionTuning t = options_.attention;
    t.gate_signal = options_.early_vo;
    t.short_variant = false;
    std::unique_ptr<vk::AttentionOp> with_short = std::move(attn_);
    attn_ = std::make_unique<vk::AttentionOp>(ctx_, vk::AttentionShape::from_config(config_, n_ctx_), t);
    // Without the short variant there is one recording, for every context: count it first.
    const std::unique_ptr<vk::CommandRecorder> probe = step_recorder(false);
    record_aside(*probe, n_ctx_);
    if (probe->dispatch_count() < most) record_steps();
    else attn_ = std::move(with_short);  // rec_ and rec_more_ stay as recorded with it
  }
  stats_.dispatches = rec_->dispatch_count();
  stats_.barriers = rec_->barrier_count();
  stats_.layers = config_.n_layer;
  if (options_.prefill_chunk) create_prefill();
}

void GpuModel::record_steps() {
  // One recording per attention range (AttentionOp::decode_ranges: the single-workgroup one, the
  // mid one, the short one, the long one, as far as the context reaches), each for its largest
  // context.
  const auto ranges = attn_->decode_ranges();
  rec_->begin();
  record_step(*rec_, ranges.front().second);
  rec_->end();
  rec_more_.clear();
  for (size_t i = 1; i < ranges.size(); ++i) {
    rec_more_.push_back(step_recorder(false));
    record_aside(*rec_more_.back(), ranges[i].second);  // the stats describe the first range's recording
  }
}

std::unique_ptr<vk::CommandRecorder> GpuModel::step_recorder(bool timestamps) const {
  return std::make_unique<vk::CommandRecorder>(
      ctx_, vk::RecorderOptions{.timestamps = timestamps, .barrier_scope = options_.barrier_scope});
}

void GpuModel::record_aside(vk::CommandRecorder& rec, uint32_t profile_kv_len) {
  const DecodeStats keep = stats_;
  rec.begin();
  record_step(rec, profile_kv_len);
  rec.end();
  stats_ = keep;
}

GpuModel::~GpuModel() {
  prefill_.reset();
  prof_rec_.reset();
  rec_more_.clear();
  rec_.reset();
  xfer_.reset();
  w_.reset();
}

void GpuModel::plan_and_upload(const TsrFile& file) {
  const ModelConfig& c = config_;
  const vk::Device& dev = ctx_.device();
  // Which bytes go to which buffer: each decoder block's span, then every tensor outside blocks.
  struct Upload {
    std::string what;
    uint64_t offset, size;
    std::vector<const TsrTensor*> tensors;
  };
  std::vector<Upload> uploads;
  for (int l = 0; l < file.n_layer_groups(); ++l) {
    const TsrSpan s = file.layer_span(l);
    uploads.push_back({cat("blk.", l), s.offset, s.size, {}});
  }
  for (const TsrTensor& t : file.tensors()) {
    if (t.layer >= 0 && t.layer < file.n_layer_groups()) {
      uploads[size_t(t.layer)].tensors.push_back(&t);
    } else {
      uploads.push_back({t.name, t.offset, (t.nbytes + 255) / 256 * 256, {&t}});
    }
  }
  if (uint32_t(file.n_layer_groups()) < c.n_layer)
    bad_input(file.path(), ": holds tensors of ", file.n_layer_groups(), " decoder blocks, the metadata says ", c.n_layer);

  // Activation sizes.
  const uint64_t H = c.n_head, R = c.kv_lora_rank, row = c.kv_row();
  uint64_t moe_h = 4, hq_bytes = 48;
  for (const TsrTensor& t : file.tensors())
    if (t.layout == TsrLayout::MoeTile1) {
      moe_h = std::max<uint64_t>(moe_h, vk::moe_h_floats(t.moe_tile(), c.n_expert_used));
      hq_bytes = std::max<uint64_t>(hq_bytes, vk::moe_hq_bytes(t.moe_tile(), c.n_expert_used));
    }
  hq_bytes = std::max<uint64_t>(hq_bytes, vk::dense_hq_bytes(c.n_ff));
  const vk::AttentionShape ashape = vk::AttentionShape::from_config(c, n_ctx_);
  vk::AttentionTuning at = options_.attention;
  at.gate_signal = options_.early_vo;
  attn_ = std::make_unique<vk::AttentionOp>(ctx_, ashape, at);
  // The router fold's accumulators (one array per layer, at 256-byte aligned offsets).
  if (options_.fused_router && vk::router_fold_supported(ctx_) && c.n_expert > 0 && c.n_expert <= TS_ROUTE_MAX_E)
    w_->fold_stride = (vk::router_fold_acc_bytes(c.n_expert) + 255) / 256 * 256;
  const vk::AttentionOp& probe = *attn_;
  struct Act {
    vk::Buffer* buf;
    const char* name;
    uint64_t bytes;
  };
  Weights& w = *w_;
  const std::vector<Act> acts = {
      {&w.x, "x", c.n_embd * 4ull},
      {&w.cq, "cq", std::max<uint64_t>(c.q_lora_rank, 4) * 4},
      {&w.kv, "kv", row * 4},
      {&w.qfull, "q_b out", H * c.n_qk() * 4},
      {&w.q, "q", H * row * 4},
      {&w.olat, "olat", H * R * 4},
      {&w.o, "o", H * c.n_v * 4},
      {&w.router_logits, "router logits", std::max<uint64_t>(c.n_expert, 4) * 4},
      {&w.h2, "h2", c.n_embd * 4ull},
      {&w.route, "route", (2ull * std::max<uint32_t>(c.n_expert_used, 1) + 1) * 4},
      {&w.h, "moe h", moe_h * 4},
      {&w.hdense, "dense h", std::max<uint64_t>(c.n_ff, 4) * 4},
      {&w.hq, "int8 h", hq_bytes},
      {&w.logits, "logits", uint64_t(c.n_vocab) * 4},
      {&w.partials, "attention partials", probe.partials_bytes()},
      {&w.sample_scratch, "sampler scratch", vk::SampleOp::scratch_bytes(c.n_vocab)},
      {&w.prefetch_sink, "prefetch sink", 16},
      {&w.attn_arrivals, "attention arrival counters", std::max<uint64_t>(probe.arrivals_bytes(), 16)},
      {&w.olat_q8, "int8 olat", std::max<uint64_t>(probe.olat_q8_bytes(), 48)},
      {&w.fold_acc, "router fold accumulators", std::max<uint64_t>(w.fold_stride * c.n_layer, 16)},
      {&w.down_acc, "fused down accumulators", vk::moe_down_acc_bytes(c.n_embd)},
      {&w.head_q8, "int8 head input", std::max<uint64_t>(c.n_embd / 32 * 48, 48)},
      {&w.step_local, "step values (device copy)", kStepBytes},
      {&w.gates, "early-start gates", uint64_t(kGateStride) * 2 * std::max<uint32_t>(c.n_layer, 1)},
      {&w.gate_stats, "early-start counters", uint64_t(kGateStride) * std::max<uint32_t>(c.n_layer, 1)},
  };

  vk::MemoryPlan plan;
  uint64_t weight_total = 0;
  for (const Upload& u : uploads) weight_total += u.size;
  // One item per allocation: each must also fit maxMemoryAllocationSize.
  for (const Upload& u : uploads) plan.add("weights " + u.what, vk::MemoryKind::DeviceLocal, u.size);
  for (uint32_t l = 0; l < c.n_layer; ++l)
    plan.add(cat("KV cache blk.", l, " (", n_ctx_, " positions x ", row, " f16)"), vk::MemoryKind::DeviceLocal,
             ashape.cache_bytes());
  uint64_t act_total = 0;
  for (const Act& a : acts) act_total += (a.bytes + 255) / 256 * 256;
  plan.add("activations and scratch", vk::MemoryKind::DeviceLocal, act_total);
  plan.add("step values", vk::MemoryKind::Host, 4096);
  if (options_.prefill_chunk) {
    plan.add(cat("prefill scratch (chunks of ", options_.prefill_chunk, " tokens)"), vk::MemoryKind::DeviceLocal,
             prefill_scratch_bytes());
    plan.add("prefill chunk values", vk::MemoryKind::Host, 4096 + options_.prefill_chunk * 4ull);
  }
  const uint64_t need = plan.total(vk::MemoryKind::DeviceLocal) + plan.total(vk::MemoryKind::Host);
  if (options_.memory_limit && need > options_.memory_limit)
    runtime_error("memory plan: needs ", need, " bytes, but the memory limit is ", options_.memory_limit,
                  " bytes; the plan:\n", plan.summary(), "use a smaller --ctx or a device with more memory");
  plan.check(dev);
  stats_.device_bytes = need;

  local_ = std::make_unique<vk::MemoryPool>(dev, vk::MemoryKind::DeviceLocal, 256ull << 20);
  host_ = std::make_unique<vk::MemoryPool>(dev, vk::MemoryKind::Host, 1ull << 20);
  {
    vk::Transfer xfer(dev);
    uint64_t done = 0;
    const auto bytes = file.bytes();
    for (const Upload& u : uploads) {
      vk::Buffer b = local_->create_buffer(u.size, u.what);
      // Upload in pieces so the staging ring overlaps copies and the progress bar moves.
      for (uint64_t off = 0; off < u.size; off += 16ull << 20) {
        const uint64_t n = std::min<uint64_t>(16ull << 20, u.size - off);
        const uint64_t avail = u.offset + off < bytes.size() ? std::min<uint64_t>(n, bytes.size() - u.offset - off) : 0;
        if (avail) xfer.upload(b, off, bytes.data() + u.offset + off, avail);
        done += n;
        progress(options_.progress, done, weight_total);
      }
      w.weight_buffers.push_back(std::move(b));
    }
    xfer.finish();
    for (size_t i = 0; i < uploads.size(); ++i)
      for (const TsrTensor* t : uploads[i].tensors)
        w.loc[t->name] = {&w.weight_buffers[i], t->offset - uploads[i].offset, t};
  }
  for (const Act& a : acts) *a.buf = local_->create_buffer(std::max<uint64_t>(a.bytes, 16), a.name);
  for (uint32_t l = 0; l < c.n_layer; ++l) w.cache.push_back(local_->create_buffer(ashape.cache_bytes(), cat("KV cache blk.", l)));
  w.step = host_->create_buffer(kStepBytes, "step");
  w.ring = host_->create_buffer(kRing * 4, "sampled tokens");
  std::memset(w.step.mapped(), 0, kStepBytes);
}

bool GpuModel::fold_router(uint32_t layer) const {
  const ModelConfig& c = config_;
  if (!options_.fused_router || w_->fold_stride == 0 || !c.is_moe(layer)) return false;
  if (c.n_expert_used == 0 || c.n_expert_used > std::min(c.n_expert, TS_ROUTE_MAX_K)) return false;
  if (c.gating != GatingFunc::Softmax && c.gating != GatingFunc::Sigmoid) return false;
  const std::string name = blk(layer, "ffn_gate_inp.weight");
  if (!w_->has(name)) return false;
  const vk::MatrixRef r = w_->matrix(name);
  const bool plain = r.layout == vk::WeightLayout::Plain &&
                     (r.type == GgmlType::F32 || r.type == GgmlType::F16 || r.type == GgmlType::BF16);
  return plain && r.rows == c.n_expert && r.cols == c.n_embd && c.n_embd % 2 == 0 &&
         r.offset % std::max<uint64_t>(ctx_.info().min_storage_buffer_offset_alignment, 4) == 0;
}

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
  if (options_.step_local) rec.copy(host_step, step);
  const uint32_t H = c.n_head, R = c.kv_lora_rank;
  uint64_t weight_bytes = 0;
  // fold: the router fold's epilogue on this matvec (the one that writes x before a MoE FFN).
  uint32_t gate_layer = 0;  // the layer being recorded (W_vo's gate statistics slice)
  // gate: W_vo's early start (the gate word; target n_head, errors to the host step buffer).
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
  // A gate to wait on: the words, the one polled, its target; stats: W_vo's counters (gate_stats).
  struct Gate {
    vk::BufferSlice words;
    uint32_t word = 0, target = 0;
    bool stats = false;
  };
  auto matvec = [&](const std::string& name, vk::BufferSlice x, vk::BufferSlice y, vk::BufferSlice norm, bool acc,
                    const vk::RouterFold& fold = {}, vk::BufferSlice x_q8 = {}, const Gate& gate = {}) {
    vk::MatvecOp op = matvec_op(name, x, y, norm, acc, fold, x_q8);
    if (gate.words.buffer) {
      op.gate = gate.words;
      op.gate_word = gate.word;
      op.gate_target = gate.target;
      op.gate_error = host_step.sub(kGateErrorWord * 4, 8);
      if (options_.gate_stats && gate.stats)
        op.gate_stats = w.gate_stats.slice(uint64_t(gate_layer) * kGateStride, vk::MatvecOp::kGateStatsBytes);
    }
    op.label = op.kernel_name(&ctx_) + " " + name;
    if (op.label.find(".q8act") != std::string::npos) stats_.int8_activations = true;
    op.record(rec);
    weight_bytes += op.w.read_bytes() + (fold.enabled() ? fold.router.read_bytes() : 0);
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
  if (options_.early_vo || options_.early_down) rec.fill(w.gates.whole(), 0);
  if (options_.early_vo && options_.gate_stats) rec.fill(w.gate_stats.whole(), 0);

  vk::EmbedOp embed;
  embed.table = w.matrix("token_embd.weight");
  embed.ids = host_step.sub(kTokenWord * 4, 4);
  embed.out = w.x.whole();
  embed.record(rec);
  rec.barrier();

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
  Gate x_gate;  // set by a MoE down that signals the next layer's stage 1 (no barrier after it)

  for (uint32_t l = 0; l < c.n_layer; ++l) {
    const std::string L = cat("blk.", l, ".");
    gate_layer = l;
    const bool qk = w.has(L + "attn_qk.weight"), vo = w.has(L + "attn_vo.weight");
    stats_.composed_qk = qk;
    stats_.composed_vo = vo;
    const vk::BufferSlice attn_norm = w.vec(L + "attn_norm.weight", c.n_embd);
    const std::string qname = qk ? L + "attn_qk.weight" : (c.q_lora_rank ? L + "attn_q_b.weight" : L + "attn_q.weight");
    const vk::BufferSlice qdst = qk ? w.q.whole() : w.qfull.whole();
    // Stage 1: everything that reads only x (waiting on the previous MoE down's gate where it set one).
    for (const Stage1& s : stage1(l)) matvec(s.name, w.x.whole(), s.y, attn_norm, false, {}, {}, x_gate);
    x_gate = {};
    if ((options_.prefetch & kPrefetchQuery) && c.q_lora_rank) prefetch({w.span(qname)}, "prefetch query " + L);
    rec.barrier();
    // Stage 2: the query from the q LoRA, the cache row, and (factored) the absorbed query.
    if (c.q_lora_rank)
      matvec(qname, w.cq.whole(), qdst, w.vec(L + "attn_q_a_norm.weight", c.q_lora_rank), false);
    kv_write.record(rec, w.kv.whole(), w.vec(L + "attn_kv_a_norm.weight", R), step, kPosWord, w.cache[l].whole(),
                    "kv_write " + L);
    if (!qk) {
      if (c.q_lora_rank) rec.barrier();  // the absorb reads q_b's output
      vk::AbsorbOp a = vk::AbsorbOp::query(w.matrix(L + "attn_k_b.weight"), H, c.n_rot, w.qfull.whole(), w.q.whole());
      a.label = a.kernel_name() + " " + L + "attn_k_b";
      a.record(rec);
      weight_bytes += a.w.read_bytes();
    }
    rec.barrier();
    // W_vo's int8 kernel reads olat as the merge's int8 blocks (no staging) where both run.
    const vk::DecodeRange range = attn.decode_range(profile_kv_len);
    vk::BufferSlice olat_q8;
    if (vo && options_.int8_activations && options_.olat_q8 && attn.decode_writes_olat_q8(range) &&
        vk::q8_activations_type(ctx_, w.matrix(L + "attn_vo.weight").type))
      olat_q8 = w.olat_q8.whole();
    // W_vo started early (no barrier after the attention) where the range's kernel opens a gate.
    const bool early = options_.early_vo && olat_q8.buffer && attn.decode_signals_gate(range) &&
                       matvec_op(L + "attn_vo.weight", w.olat.whole(), w.x.whole(), {}, true, {}, olat_q8).gate_supported(ctx_);
    const vk::BufferSlice gate = early ? w.gates.slice(uint64_t(2 * l) * kGateStride, 4) : vk::BufferSlice{};
    attn.record_decode(rec, w.q.whole(), w.cache[l].whole(), step, kPosWord,
                       host_step.sub(kAttnCountsWord * 4, vk::AttentionOp::kDecodeCountWords * 4), w.partials.whole(),
                       w.attn_arrivals.whole(), w.olat.whole(), range, "attention " + L, olat_q8, gate);
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
    if (vo) {
      matvec(L + "attn_vo.weight", w.olat.whole(), w.x.whole(), {}, true, rfold, olat_q8,
             Gate{gate, 0, attn.decode_gate_target(range), true});
    } else {
      vk::AbsorbOp a = vk::AbsorbOp::value(w.matrix(L + "attn_v_b.weight"), H, w.olat.whole(), w.o.whole());
      a.label = a.kernel_name() + " " + L + "attn_v_b";
      a.record(rec);
      weight_bytes += a.w.read_bytes();
      rec.barrier();
      matvec(L + "attn_output.weight", w.o.whole(), w.x.whole(), {}, true, rfold);
    }
    rec.barrier();
    if (!c.is_moe(l)) {
      vk::DenseGateUpOp gu;
      gu.gate = w.matrix(L + "ffn_gate.weight");
      gu.up = w.matrix(L + "ffn_up.weight");
      gu.x = w.x.whole();
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
        matvec(L + "ffn_down.weight", w.hdense.whole(), w.x.whole(), {}, true, {}, w.hq.whole());
      } else {
        vk::DenseDownOp dd;
        dd.down = w.matrix(L + "ffn_down.weight");
        dd.h = w.hdense.whole();
        dd.x = w.x.whole();
        dd.hq = gu.hq;
        dd.tuning = options_.moe;
        dd.label = (dd.hq.buffer ? "dense_down.q8act " : "dense_down ") + L;
        dd.record(rec);
        weight_bytes += dd.down.read_bytes();
      }
      rec.barrier();
      continue;
    }
    const vk::BufferSlice bias = c.has_exp_probs_b ? w.vec(L + "exp_probs_b.bias", c.n_expert) : vk::BufferSlice{};
    if (!fold) {
      vk::RouterOp router;
      router.w = w.matrix(L + "ffn_gate_inp.weight");
      router.x = w.x.whole();
      router.norm_weight = ffn_norm;
      router.eps = c.eps;
      router.routing = routing;
      router.bias = bias;
      router.logits = w.router_logits.whole();
      router.h2 = w.h2.whole();
      router.route = w.route.whole();
      router.label = "router " + L;
      router.record(rec);
      rec.barrier();
      weight_bytes += router.w.read_bytes();
    }
    const Weights::Loc& tile = w.at(L + "ffn_moe_tile");
    if (tile.tensor->layout != TsrLayout::MoeTile1)
      bad_input("packed model: ", tile.tensor->name, " has layout ", layout_name(tile.tensor->layout), ", expected moe_tile1");
    const vk::MoeTileRef tref{tile.buffer, tile.offset, tile.tensor->moe_tile()};
    vk::MoeGateUpOp gu;
    gu.tile = tref;
    gu.n_used = c.n_expert_used;
    gu.h2 = w.h2.whole();
    gu.route = w.route.whole();
    gu.h = w.h.whole();
    if (fold) {  // routing and h2 from the fold's accumulators; workgroup 0 writes the route
      gu.fold_acc = rfold.acc;
      gu.x = w.x.whole();
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
    const bool fuse_down = fold && gu.hq.buffer && options_.fused_down &&
                           vk::moe_fused_down_supported(ctx_, tref.geometry, c.n_expert_used);
    if (fuse_down) gu.down_acc = w.down_acc.whole();
    vk::MoeDownOp down;
    down.tile = tref;
    down.n_used = c.n_expert_used;
    down.h = w.h.whole();
    down.route = w.route.whole();
    down.x = w.x.whole();
    down.hq = gu.hq;
    down.tuning = options_.moe;
    // The down started early (no barrier after the gate-up) where both kernels take the gate.
    const bool early_down = options_.early_down && !fuse_down && gu.gate_supported(ctx_) && down.gate_supported(ctx_);
    // ... and the next layer's stage 1 after it, where its matvecs can wait.
    bool next_early = early_down && options_.early_next && l + 1 < c.n_layer;
    if (next_early)
      for (const Stage1& s : stage1(l + 1))
        next_early = next_early && matvec_op(s.name, w.x.whole(), s.y, w.vec(cat("blk.", l + 1, ".attn_norm.weight"), c.n_embd),
                                             false).gate_supported(ctx_);
    if (early_down) {
      const vk::BufferSlice words = w.gates.slice(uint64_t(2 * l + 1) * kGateStride, 12);
      gu.gate = words.sub(0, 8);
      down.gate = words;
      down.gate_h_target = gu.gate_h_target(ctx_);
      down.gate_error = host_step.sub(kGateErrorWord * 4, 8);
      down.gate_signal_x = next_early;
      if (next_early) x_gate = Gate{words, 2, down.gate_x_target(ctx_), false};
    }
    gu.label = std::string(gu.hq.buffer ? "moe_gateup.q8act" : "moe_gateup") + (fold ? ".rfold" : "") +
               (fuse_down ? ".fdown " : early_down ? ".gate " : " ") + L;
    gu.record(rec);
    if (!early_down) rec.barrier();
    if (fuse_down) {
      weight_bytes += gu.bytes();
      continue;
    }
    down.label = (down.hq.buffer ? "moe_down.q8act" : "moe_down") + std::string(early_down ? ".gate " : " ") + L;
    down.record(rec);
    if (!x_gate.words.buffer) rec.barrier();
    weight_bytes += gu.bytes() + down.bytes();
  }
  weight_bytes += record_head(rec, w.x.whole(), w.h2.whole(), "");
  stats_.weight_bytes = weight_bytes;
}

uint64_t GpuModel::record_head(vk::CommandRecorder& rec, vk::BufferSlice x, vk::BufferSlice normed,
                               const std::string& what) {
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
  sample.token_word = kTokenWord;
  sample.pos_word = kPosWord;
  sample.advance_pos = true;
  sample.tokens_out = w.ring.whole();
  sample.out_ring = kRing;
  sample.record(rec);
  return lm.w.read_bytes();
}

void GpuModel::run_step(int32_t token, uint32_t pos) {
  const auto ranges = attn_->decode_ranges();
  size_t i = 0;
  while (i + 1 < ranges.size() && pos + 1 > ranges[i].second) ++i;
  run_step(i == 0 ? *rec_ : *rec_more_.at(i - 1), token, pos);
}

void GpuModel::run_step(vk::CommandRecorder& rec, int32_t token, uint32_t pos) {
  if (pos >= n_ctx_)
    usage_error("context full: position ", pos, " needs a KV cache of more than ", n_ctx_,
                " positions (start a new context, or raise --ctx)");
  if (token < 0 || uint32_t(token) >= config_.n_vocab)
    bad_input("token id ", token, " is outside the vocabulary (", config_.n_vocab, " tokens)");
  write_step(uint32_t(token), pos);
  rec.run();
  if (!options_.early_vo && !options_.early_down) return;
  if (options_.gate_stats && options_.early_vo) collect_gate_stats();
  uint32_t gave_up[2] = {};
  w_->step.read(kGateErrorWord * 4, gave_up, 8);
  if (!gave_up[0]) return;
  // A consumer waited for a producer this device did not run beside it: the step's x is wrong.
  // Re-record without the early start and run the step again (it rewrites the same cache row).
  const uint32_t zero[2] = {};
  w_->step.write(kGateErrorWord * 4, zero, 8);
  std::fprintf(stderr, "tessera: %s did not run a consumer beside its producer (an early start's wait gave up with the "
               "gate at %u, position %u); recording the decode step without early starts\n", ctx_.info().name.c_str(),
               gave_up[1], pos);
  options_.early_vo = false;
  options_.early_down = false;
  const bool profiled = &rec == prof_rec_.get();
  record_steps();
  if (!profiled) return run_step(token, pos);
  record_aside(*prof_rec_, prof_kv_len_);
  run_step(*prof_rec_, token, pos);
}

std::vector<float> GpuModel::forward(std::span<const int32_t> tokens, bool last_only) {
  if (uint64_t(n_past_) + tokens.size() > n_ctx_)
    usage_error("context full: ", n_past_, " cached + ", tokens.size(), " new tokens exceed the context of ", n_ctx_,
                " positions (reset, or raise --ctx)");
  if (tokens.size() > 1 && prefill_) return run_prefill(tokens, last_only);
  std::vector<float> out;
  const size_t V = config_.n_vocab;
  out.reserve(last_only ? V : V * tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    run_step(tokens[i], n_past_);
    ++n_past_;
    if (!last_only || i + 1 == tokens.size()) {
      const std::vector<float> l = last_logits();
      out.insert(out.end(), l.begin(), l.end());
    }
  }
  return out;
}

int32_t GpuModel::sampled_token() const {
  uint32_t t = 0;
  w_->step.read(kTokenWord * 4, &t, 4);
  return int32_t(t);
}

int32_t GpuModel::decode_step() { return decode_step(sampled_token()); }

int32_t GpuModel::decode_step(int32_t token) {
  run_step(token, n_past_);
  ++n_past_;
  return sampled_token();
}

std::vector<float> GpuModel::last_logits() const {
  std::vector<float> l(config_.n_vocab);
  if (w_->logits.mapped()) {
    w_->logits.read(0, l.data(), l.size() * 4);
  } else {
    if (!xfer_) xfer_ = std::make_unique<vk::Transfer>(ctx_.device(), 4ull << 20, 2);
    xfer_->download(w_->logits, 0, l.data(), l.size() * 4);
  }
  return l;
}

std::vector<vk::DispatchTiming> GpuModel::profile_step(uint32_t kv_len, double* wall_us) {
  if (!ctx_.device().has_timestamps()) runtime_error("profile: ", ctx_.info().name, " has no timestamp queries");
  if (kv_len == 0 || kv_len > n_ctx_) usage_error("profile_step: context length ", kv_len, " outside 1..", n_ctx_);
  // A second recording of the step with timestamps after every dispatch and the byte counts of
  // this context length (the decode recording stays as it is), run once at position kv_len - 1.
  if (!prof_rec_)
    prof_rec_ = step_recorder(true);
  if (prof_kv_len_ != kv_len) {
    record_aside(*prof_rec_, kv_len);
    prof_kv_len_ = kv_len;
  }
  const int32_t token = sampled_token();
  const auto t0 = std::chrono::steady_clock::now();
  run_step(*prof_rec_, token, kv_len - 1);
  if (wall_us) *wall_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  std::vector<vk::DispatchTiming> t = prof_rec_->timings();
  // Leave the step buffer as it was for the session (position n_past, same token).
  write_step(uint32_t(token), n_past_);
  return t;
}

vk::MatrixRef GpuModel::weight_matrix(std::string_view name) const { return w_->matrix(name); }
vk::BufferSlice GpuModel::weight_vec(std::string_view name, uint64_t n) const { return w_->vec(name, n); }
bool GpuModel::has_weight(std::string_view name) const { return w_->has(name); }

vk::MoeTileRef GpuModel::moe_tile(std::string_view name) const {
  const Weights::Loc& tile = w_->at(name);
  if (tile.tensor->layout != TsrLayout::MoeTile1)
    bad_input("packed model: ", tile.tensor->name, " has layout ", layout_name(tile.tensor->layout), ", expected moe_tile1");
  return {tile.buffer, tile.offset, tile.tensor->moe_tile()};
}

void GpuModel::write_step(uint32_t token, uint32_t pos) {
  const uint32_t words[2] = {token, pos};
  w_->step.write(0, words, sizeof words);
  uint32_t counts[vk::AttentionOp::kDecodeCountWords];
  attn_->decode_counts(pos + 1, counts);
  w_->step.write(kAttnCountsWord * 4, counts, sizeof counts);
}

void GpuModel::collect_gate_stats() {
  std::vector<uint32_t> v(w_->gate_stats.size() / 4);
  if (!xfer_) xfer_ = std::make_unique<vk::Transfer>(ctx_.device(), 4ull << 20, 2);
  xfer_->download(w_->gate_stats, 0, v.data(), v.size() * 4);
  for (uint32_t l = 0; l < config_.n_layer; ++l) {
    const uint32_t* s = v.data() + l * (kGateStride / 4);
    if (s[1] == 0) continue;  // no gated W_vo in this layer
    gate_trace_.closed += s[0];
    gate_trace_.workgroups += s[1];
    uint64_t t[4];
    std::memcpy(t, s + 4, sizeof t);
    if (t[3] == 0) continue;  // no device clock
    const uint64_t start = ~t[0], open_first = ~t[1], open_last = t[2], end = t[3];
    if (open_first < start || open_last < open_first || end < open_last) continue;  // clock wrapped
    gate_trace_.layers += 1;
    gate_trace_.wait_ns += open_first - start;
    gate_trace_.open_spread_ns += open_last - open_first;
    gate_trace_.after_open_ns += end - open_first;
  }
}

vk::BufferSlice GpuModel::kv_cache(uint32_t layer) const { return w_->cache.at(layer).whole(); }

}  // namespace tessera::model
