// GpuModel's private parts, shared by gpu_model.cpp (load, run) and gpu_model_step.cpp (the
// decode step's recording): the step buffer's layout and every device buffer of the model.
// Not part of the runtime's interface: include only from runtime/model/gpu_model*.cpp.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "format/error.h"
#include "runtime/model/gpu_model.h"
#include "runtime/vulkan/kernels_attention.h"
#include "shaders/gate_args.h"

namespace tessera::model::gpu_detail {

constexpr uint32_t kTokenWord = 0;  // step buffer: [token, position]
constexpr uint32_t kPosWord = 1;
constexpr uint32_t kMaxDispatchesPerLayer = 12;  // decode step budget (issue 5) ...
constexpr uint32_t kStepDispatches = 4;           // ... besides the layers: embedding, output norm, LM head, sampler
constexpr uint32_t kGateErrorWord = 64;  // step buffer: set by a W_vo early start that gave up waiting
                                         // (byte 256: any storage-buffer offset alignment)
constexpr uint32_t kGateStride = 256;   // bytes between gate slices (binding offsets)
// Gate slices per layer: W_vo's (or attn_v_b's), the MoE down's, stage 2's, the attention's, the
// FFN's, attn_output's, the attention merge's (vk::AttentionTuning::merge_wait).
constexpr uint32_t kGateSlices = 7;
constexpr uint32_t kGateVo = 0, kGateDown = 1, kGateQk = 2, kGateAttn = 3, kGateFfn = 4, kGateVb = 5, kGateMerge = 6;
constexpr uint32_t kAttnCountsWord = 4;  // step buffer: the decode attention's indirect group counts (6 words)
constexpr uint32_t kRuleWord = 16;       // step buffer: their rule (gpu::AttnDecodeRule, 12 words), for the sampler
constexpr uint32_t kRing = 64;           // sampled-token ring (host-visible); the forced-input ring's size
// Step buffer: forced inputs (GpuModel::decode_steps with forced tokens): while word kInputWord is
// set, the sampler takes the next step's input from word kInputWord + 1 + (position % kRing).
constexpr uint32_t kInputWord = 128;
constexpr uint32_t kStepBytes = (kInputWord + 1 + kRing) * 4;
static_assert(kAttnCountsWord + vk::AttentionOp::kDecodeCountWords <= kRuleWord);
static_assert(kRuleWord + sizeof(gpu::AttnDecodeRule) / 4 <= kGateErrorWord && kGateErrorWord + 2 <= kInputWord);
static_assert(TS_DOWN_GATE_WORDS * 4 <= kGateStride, "the MoE down's gate words fit a gate slice");
// GpuModelOptions::timeline: one region of records per dispatch (16 bytes per workgroup, up to
// kTimelineRegionRecords workgroups), kTimelineRegions regions (the decode step has < 400 dispatches).
constexpr uint64_t kTimelineRegionRecords = 16384;
constexpr uint64_t kTimelineRegionBytes = kTimelineRegionRecords * 16;
constexpr uint32_t kTimelineRegions = 512;

}  // namespace tessera::model::gpu_detail

namespace tessera::model {

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
  vk::Buffer x, x2, cq, kv, qfull, q, olat, o, router_logits, h2, route, h, hdense, logits, partials, sample_scratch;
  vk::Buffer hq;  // int8 blocks of h / hdense (the int8-activation FFN path)
  vk::Buffer prefetch_sink;  // PrefetchOp's fold word
  vk::Buffer attn_arrivals;  // the rows attention's merge-tail arrival counters (zero between dispatches)
  vk::Buffer olat_q8;        // olat as int8 blocks (the merge writes it for W_vo's or attn_v_b's int8 kernel)
  vk::Buffer o_q8;           // o as int8 blocks (attn_v_b writes it for attn_output's int8 kernel)
  vk::Buffer cq_q8, cq_ss;   // GpuModelOptions::qk_q8: cq times attn_q_a_norm as int8 blocks, and
                             // q_a's per-workgroup sums of squares (W_qk / q_b reads them)
  vk::Buffer down_acc;       // the fused MoE down's accumulators and arrival counter (zero between uses)
  vk::Buffer head_q8;        // the output norm's result as int8 blocks (the LM head's input)
  vk::Buffer fold_acc;       // the router fold's accumulators: one array per layer, fold_stride apart
  vk::Buffer gates;          // early-start gate words, kGateSlices slices of kGateStride bytes per layer
                             // (kGateVo: W_vo's; kGateDown: the MoE down's route, h and x; kGateQk:
                             // the q LoRA's for W_qk / q_b and kv_a's for kv_write; kGateAttn: W_qk's
                             // and kv_write's for the attention; kGateFfn: W_vo's for the gate-up)
  vk::Buffer gate_stats;     // GpuModelOptions::gate_stats: per layer (kGateStride apart) the gated
                             // W_vo's counters and times, zeroed each step, summed on the host
  vk::Buffer timeline;       // GpuModelOptions::timeline: kTimelineRegions regions of records (timeline.glsl)
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

}  // namespace tessera::model
