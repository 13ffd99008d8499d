// GpuModel: load (plan, upload), run, and the early starts' fallback. The decode step's
// recording: gpu_model_step.cpp. See gpu_model.h.
#include "runtime/model/gpu_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>

#include "format/error.h"
#include "runtime/model/gpu_model_internal.h"
#include "runtime/model/profile.h"
#include "shaders/moe_args.h"
#include "runtime/vulkan/kernels_attention.h"
#include "runtime/vulkan/kernels_basic.h"
#include "runtime/vulkan/kernels_matvec.h"
#include "runtime/vulkan/kernels_moe.h"
#include "runtime/vulkan/transfer.h"

namespace tessera::model {

using namespace gpu_detail;

namespace {

void progress(bool on, uint64_t done, uint64_t total) {
  if (!on || total == 0) return;
  const int pct = int(100.0 * double(done) / double(total));
  std::fprintf(stderr, "\rupload %3d%% (%.1f / %.1f MB)", pct, done / 1e6, total / 1e6);
  if (done == total) std::fputc('\n', stderr);
}

}  // namespace

GpuModel::GpuModel(vk::Context& ctx, const TsrFile& file, const GpuModelOptions& options)
    : ctx_(ctx),
      options_(options),
      timeline_scope_(ctx.pipelines(), options.timeline),
      config_(ModelConfig::from_metadata(file.metadata())) {
  n_ctx_ = std::max<uint32_t>(1, std::min(options.n_ctx, std::max<uint32_t>(config_.n_ctx_train, 1)));
  if (options_.prefill_chunk == kPrefillChunkAuto)
    options_.prefill_chunk = prefill_uses_matmul(options_.prefill_matmul, ctx_) ? kPrefillChunkMatmul : kPrefillChunkMatvec;
  options_.prefill_chunk = std::min(options_.prefill_chunk, n_ctx_);  // a chunk never exceeds the context
  // Process-wide shader defines, set both ways: a model made earlier in the process may have set them.
  ctx_.pipelines().set_global_define("GATE_BACKOFF", std::to_string(options_.gate_backoff));
  ctx_.pipelines().set_global_define("Q8_RAW", options_.q8_raw ? "1" : "0");
  ctx_.pipelines().set_global_define("KQ_PAIRS", options_.kq_pairs ? "1" : "0");
  ctx_.pipelines().set_global_define("TS_MARK_GATES", options_.mark_gates ? "1" : "0");
  if (options_.tc_phases > 4) usage_error("tc_phases ", options_.tc_phases, ", expected 0..4");
  ctx_.pipelines().set_global_define("TS_TC_PHASES", std::to_string(options_.tc_phases));
  if (options_.vb_teams != 0 && options_.vb_teams != 8 && options_.vb_teams != 16)
    usage_error("attn_v_b: ", options_.vb_teams, " subgroups per workgroup; expected 8 or 16 (0: automatic)");
  if (options_.steps_per_submit < 1 || options_.steps_per_submit > kRing / 4)
    usage_error("decode steps per submission: ", options_.steps_per_submit, "; expected 1..", kRing / 4,
                " (the sampled-token ring holds two submissions)");
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
  twins_.clear();
  batches_.clear();
  for (size_t i = 1; i < ranges.size(); ++i) {
    rec_more_.push_back(step_recorder(false));
    record_aside(*rec_more_.back(), ranges[i].second);  // the stats describe the first range's recording
  }
}

std::unique_ptr<vk::CommandRecorder> GpuModel::step_recorder(bool timestamps) const {
  vk::RecorderOptions o{.timestamps = timestamps, .barrier_scope = options_.barrier_scope};
  if (options_.timeline) {
    o.timeline = w_->timeline.whole();
    o.timeline_region = kTimelineRegionBytes;
  }
  return std::make_unique<vk::CommandRecorder>(ctx_, o);
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
  twins_.clear();
  batches_.clear();
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
      {&w.x2, "x (second buffer)", c.n_embd * 4ull},
      {&w.cq, "cq", std::max<uint64_t>(c.q_lora_rank, 4) * 4},
      {&w.cq_q8, "int8 cq", std::max<uint64_t>(c.q_lora_rank / 32 * 48, 48)},
      {&w.cq_ss, "cq sums of squares", std::max<uint64_t>(c.q_lora_rank / 16, 4) * 4},  // per 16 rows at most
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
      {&w.o_q8, "int8 o", std::max<uint64_t>(H * c.n_v / 32 * 48, 48)},
      {&w.fold_acc, "router fold accumulators", std::max<uint64_t>(w.fold_stride * c.n_layer, 16)},
      {&w.down_acc, "fused down accumulators", vk::moe_down_acc_bytes(c.n_embd)},
      {&w.head_q8, "int8 head input", std::max<uint64_t>(c.n_embd / 32 * 48, 48)},
      {&w.step_local, "step values (device copy)", kStepBytes},
      {&w.gates, "early-start gates", uint64_t(kGateStride) * kGateSlices * std::max<uint32_t>(c.n_layer, 1)},
      {&w.gate_stats, "early-start counters", uint64_t(kGateStride) * std::max<uint32_t>(c.n_layer, 1)},
      {&w.timeline, "timeline records", options_.timeline ? kTimelineRegionBytes * kTimelineRegions : 16},
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

size_t GpuModel::step_range_index(uint32_t pos) const {
  const auto ranges = attn_->decode_ranges();
  size_t i = 0;
  while (i + 1 < ranges.size() && pos + 1 > ranges[i].second) ++i;
  return i;
}

vk::CommandRecorder& GpuModel::step_recording(uint32_t pos) {
  const size_t i = step_range_index(pos);
  return i == 0 ? *rec_ : *rec_more_.at(i - 1);
}

vk::CommandRecorder& GpuModel::twin_recording(uint32_t pos) {
  const size_t i = step_range_index(pos);
  if (twins_.size() <= i) twins_.resize(i + 1);
  if (!twins_[i]) {
    twins_[i] = step_recorder(false);
    record_aside(*twins_[i], attn_->decode_ranges()[i].second);
  }
  return *twins_[i];
}

vk::CommandRecorder& GpuModel::batch_recording(uint32_t pos, uint32_t twin) {
  const size_t i = 2 * step_range_index(pos) + twin;
  if (batches_.size() <= i) batches_.resize(i + 1);
  if (!batches_[i]) {
    batches_[i] = step_recorder(false);
    const DecodeStats keep = stats_;
    batches_[i]->begin();
    for (uint32_t k = 0; k < options_.steps_per_submit; ++k)
      record_step(*batches_[i], attn_->decode_ranges()[i / 2].second);
    batches_[i]->end();
    stats_ = keep;
  }
  return *batches_[i];
}

void GpuModel::run_step(int32_t token, uint32_t pos) { run_step(step_recording(pos), token, pos); }

void GpuModel::run_step(vk::CommandRecorder& rec, int32_t token, uint32_t pos) {
  if (pos >= n_ctx_)
    usage_error("context full: position ", pos, " needs a KV cache of more than ", n_ctx_,
                " positions (start a new context, or raise --ctx)");
  if (token < 0 || uint32_t(token) >= config_.n_vocab)
    bad_input("token id ", token, " is outside the vocabulary (", config_.n_vocab, " tokens)");
  write_step(uint32_t(token), pos);
  rec.run();
  if (!step_gave_up()) return;
  // The step's x is wrong: run it again (it rewrites the same cache row) on the new recording.
  if (&rec != prof_rec_.get()) return run_step(token, pos);
  record_aside(*prof_rec_, prof_kv_len_);
  run_step(*prof_rec_, token, pos);
}

bool GpuModel::step_gave_up() {
  if (!early_starts()) return false;
  if (options_.gate_stats && options_.early_vo) collect_gate_stats();
  uint32_t gave_up[2] = {};
  w_->step.read(kGateErrorWord * 4, gave_up, 8);
  if (!gave_up[0]) return false;
  // A consumer waited for a producer this device did not run beside it: re-record without early starts.
  const uint32_t zero[2] = {};
  w_->step.write(kGateErrorWord * 4, zero, 8);
  std::fprintf(stderr, "tessera: %s did not run a consumer beside its producer (an early start's wait gave up with the "
               "gate at %u); recording the decode step without early starts\n", ctx_.info().name.c_str(), gave_up[1]);
  options_.early_vo = false;
  options_.early_down = false;
  options_.early_qk = 0;
  options_.early_attn = false;
  options_.early_gateup = false;
  record_steps();
  return true;
}

uint32_t GpuModel::decode_steps(uint32_t n, std::span<const int32_t> forced,
                                const std::function<bool(int32_t)>& on_token) {
  if (n == 0) return 0;
  const bool forcing = !forced.empty();
  if (forcing && forced.size() < n) usage_error("decode_steps: ", n, " steps but ", forced.size(), " forced tokens");
  if (uint64_t(n_past_) + n > n_ctx_)
    usage_error("context full: ", n_past_, " cached + ", n, " decode steps exceed the context of ", n_ctx_,
                " positions (reset, or raise --ctx)");
  for (uint32_t i = 0; forcing && i < n; ++i)
    if (forced[i] < 0 || uint32_t(forced[i]) >= config_.n_vocab)
      bad_input("token id ", forced[i], " is outside the vocabulary (", config_.n_vocab, " tokens)");
  if (!options_.pipeline || (options_.gate_stats && options_.early_vo)) {  // gate statistics: read after each step
    for (uint32_t i = 0; i < n; ++i)
      if (!on_token(forcing ? decode_step(forced[i]) : decode_step())) return i + 1;
    return n;
  }
  const uint32_t start = n_past_;
  const int32_t first = forcing ? forced[0] : sampled_token();
  int32_t last = first;  // the last reported token (before any: the first input)
  // The step buffer for step i (nothing queued): its input and position; the sampler of each step
  // then writes the next one's (forced: from the ring, filled as steps are queued).
  auto restart = [&](uint32_t i) {
    write_step(uint32_t(forcing ? forced[i] : i == 0 ? first : last), start + i);
    const uint32_t on = forcing ? 1u : 0u;
    w_->step.write(kInputWord * 4, &on, 4);
  };
  struct Queued {
    vk::CommandRecorder* rec;
    uint32_t pos, steps;  // the first step's position, the steps it runs
  };
  std::vector<Queued> queued;  // oldest first, at most two
  uint32_t next = 0, done = 0, twin = 0;
  auto drain = [&] {
    for (Queued& q : queued) q.rec->wait();
    queued.clear();
  };
  // As after `done` decode_step calls: nothing queued, the last sample is the next input, no
  // forced inputs.
  auto finish = [&] {
    drain();
    write_step(uint32_t(last), n_past_);
    const uint32_t off = 0;
    w_->step.write(kInputWord * 4, &off, 4);
  };
  const uint32_t batch = options_.steps_per_submit;  // 1..kRing / 4 (checked when the model is made)
  restart(0);
  bool stop = false;
  while (done < n && !stop) {
    while (next < n && queued.size() < 2) {
      const uint32_t pos = start + next;
      // A batch where its steps stay in one attention range (one recording), else one step.
      const uint32_t steps =
          batch > 1 && next + batch <= n && step_range_index(pos) == step_range_index(pos + batch - 1) ? batch : 1;
      // Forced: the inputs of its steps after the first, and of the one after it.
      for (uint32_t k = 1; forcing && k <= steps && next + k < n; ++k) {
        const uint32_t t = uint32_t(forced[next + k]);
        w_->step.write((kInputWord + 1 + (pos + k) % kRing) * 4, &t, 4);
      }
      vk::CommandRecorder& rec =
          steps > 1 ? batch_recording(pos, twin) : twin ? twin_recording(pos) : step_recording(pos);
      rec.submit();
      queued.push_back({&rec, pos, steps});
      next += steps;
      twin ^= 1;
    }
    const Queued q = queued.front();
    queued.erase(queued.begin());
    q.rec->wait();
    uint32_t gave_up = 0;
    w_->step.read(kGateErrorWord * 4, &gave_up, 4);
    if (gave_up && early_starts()) {  // re-record (nothing queued), then run these steps and the ones after again
      drain();
      step_gave_up();
      next = done;
      restart(done);
      continue;
    }
    uint32_t tokens[kRing / 4];
    for (uint32_t k = 0; k < q.steps; ++k) w_->ring.read(((q.pos + k) % kRing) * 4, &tokens[k], 4);
    for (uint32_t k = 0; k < q.steps && !stop; ++k) {
      ++done;
      n_past_ = q.pos + k + 1;
      last = int32_t(tokens[k]);
      try {
        stop = !on_token(last);
      } catch (...) {  // the caller stops by throwing (chat's Ctrl-C): nothing may stay queued
        finish();
        throw;
      }
    }
  }
  finish();
  return done;
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

void GpuModel::read_back(const vk::Buffer& b, void* dst, size_t bytes) const {
  if (b.mapped()) return b.read(0, dst, bytes);
  if (!xfer_) xfer_ = std::make_unique<vk::Transfer>(ctx_.device(), 4ull << 20, 2);
  xfer_->download(b, 0, dst, bytes);
}

std::vector<float> GpuModel::last_logits() const {
  std::vector<float> l(config_.n_vocab);
  read_back(w_->logits, l.data(), l.size() * 4);
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

std::vector<DispatchSpan> GpuModel::timeline_step(uint32_t kv_len, double* wall_us) {
  if (!options_.timeline) usage_error("timeline_step: the model was made without GpuModelOptions::timeline");
  if (kv_len == 0 || kv_len > n_ctx_) usage_error("timeline_step: context length ", kv_len, " outside 1..", n_ctx_);
  {
    vk::CommandRecorder zero(ctx_);  // records from earlier steps must not count
    zero.begin();
    zero.fill(w_->timeline.whole(), 0);
    zero.end();
    zero.run();
  }
  const uint32_t pos = kv_len - 1;
  const int32_t token = sampled_token();
  const auto t0 = std::chrono::steady_clock::now();
  run_step(token, pos);
  if (wall_us) *wall_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  write_step(uint32_t(token), n_past_);  // the step buffer as it was for the session
  const vk::CommandRecorder& rec = step_recording(pos);  // (re-recorded if an early start gave up)
  const uint32_t timed = std::min<uint32_t>(rec.dispatch_count(), rec.timeline_dispatches());
  std::vector<uint32_t> raw(size_t(timed) * kTimelineRegionBytes / 4);
  if (!raw.empty()) read_back(w_->timeline, raw.data(), raw.size() * 4);
  std::vector<DispatchRecords> records;
  for (uint32_t d = 0; d < timed; ++d) {
    const vk::DispatchInfo& info = rec.dispatches()[d];
    const uint32_t wgs = info.groups[0] * info.groups[1] * info.groups[2];
    records.push_back({info.label, info.bytes, wgs, raw.data() + size_t(d) * (kTimelineRegionBytes / 4),
                       wgs ? std::min<uint64_t>(wgs, kTimelineRegionRecords) : kTimelineRegionRecords});
  }
  return spans_from_records(records);
}

uint32_t GpuModel::timeline_untimed() const {
  if (!options_.timeline) return 0;
  const uint32_t own = rec_->timeline_dispatches();
  return rec_->dispatch_count() > own ? rec_->dispatch_count() - own : 0;
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
  const gpu::AttnDecodeRule rule = attn_->decode_rule();  // the sampler's, for the step after
  w_->step.write(kRuleWord * 4, &rule, sizeof rule);
}

void GpuModel::collect_gate_stats() {
  std::vector<uint32_t> v(w_->gate_stats.size() / 4);
  read_back(w_->gate_stats, v.data(), v.size() * 4);
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
