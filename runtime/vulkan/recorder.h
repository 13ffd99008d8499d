// CommandRecorder: owns one command buffer (and its pool), the descriptor sets of what it records
// (descriptor pools, reset by begin()), a fence, and optionally a timestamp query pool.
// Record once (begin, dispatch/barrier/fill/copy..., end), then submit as many times as needed:
// per-step values live in buffers (written by the host between submissions or by the GPU), never
// in push constants, so the recording stays valid. Counts dispatches and barriers per recording,
// and with timestamps on, times every dispatch (label + declared bytes -> GB/s in profiles).
#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/vulkan/context.h"
#include "runtime/vulkan/memory.h"

namespace tessera::vk {

// What barrier() orders (the results are the same where the recording fits the narrower scopes):
//   Full:        compute and transfer writes before -> compute, transfer and indirect-argument
//                reads and writes after (any recording).
//   Compute:     compute writes before (and transfer writes, where a fill or copy was recorded
//                since the last barrier) -> the same readers as Full.
//   ComputeOnly: as Compute before, compute shaders only after: for recordings whose transfers
//                all come before the first dispatch (fill / copy refuse otherwise) and whose
//                indirect arguments are host-written (the decode step and the prefill chunks; run()
//                waits for each submission, so an opening fill never overtakes earlier compute work).
//   ExecutionOnly: as ComputeOnly, but a barrier with no transfer since the last one is an
//                execution dependency between compute shaders only, with no memory barrier: only
//                for recordings whose shaders make their own writes visible (every buffer one
//                dispatch writes and a later one reads declared `coherent`). The model's kernels do
//                not, so it serves bench --roofline only: on the H100 it costs 2.24 us (ComputeOnly
//                2.27), and the decode step run under it decoded other tokens from run to run.
// Measured on an H100 (driver 580, bench --roofline): a dispatch + barrier costs 4.8 us with Full
// and Compute, 2.2 us with ComputeOnly, 0.18 us without a barrier; the indirect-argument stage in
// the destination is what costs. GLM-4.7-Flash decode: 216.6 -> 271.6 tok/s with ComputeOnly.
enum class BarrierScope { Full, Compute, ComputeOnly, ExecutionOnly };

struct RecorderOptions {
  bool timestamps = false;       // time each dispatch (ignored where the queue has no timestamps)
  BarrierScope barrier_scope = BarrierScope::Full;
  uint32_t max_timed = 4096;     // dispatches timed per recording (later ones are not timed)
  double fence_timeout_s = 300;  // wait() gives up with Error(Runtime) after this long
  // The timeline records (shaders/timeline.glsl), for pipelines made in timeline mode
  // (Pipeline::timeline(); a dispatch of one without them throws): dispatch i of a recording gets
  // [i * timeline_region, +timeline_region) bound at binding num_buffers, one 16-byte record per
  // workgroup; dispatches from timeline_dispatches() on all share the last region (their records
  // are not their own). timeline_region: a multiple of minStorageBufferOffsetAlignment; the
  // buffer holds at least two regions.
  BufferSlice timeline{};
  uint64_t timeline_region = 0;
};

struct DispatchInfo {
  std::string label;    // kernel name, e.g. "matvec.q4_0 blk.3.attn_q_a"
  uint64_t bytes = 0;   // bytes the kernel moves (declared by the caller)
  uint32_t groups[3] = {1, 1, 1};
};

struct DispatchTiming {
  std::string label;
  uint64_t bytes = 0;
  double microseconds = 0;  // from the previous timestamp (end of the previous dispatch) to this end
};

// Workgroup counts (x, y) for n linear workgroups: x <= maxComputeWorkGroupCount[0], x * y >= n.
// Shaders recover the linear index with linear_workgroup_id() (common.glsl) and skip ids >= n.
struct GroupCounts {
  uint32_t x = 1, y = 1;
};
GroupCounts split_workgroups(uint64_t n, const DeviceInfo& info);

class CommandRecorder {
 public:
  explicit CommandRecorder(Context& ctx, RecorderOptions options = {});
  ~CommandRecorder();
  CommandRecorder(const CommandRecorder&) = delete;
  CommandRecorder& operator=(const CommandRecorder&) = delete;

  Context& context() { return ctx_; }

  // Starts a new recording (waits for a pending submission, drops the previous recording).
  void begin();
  // Records a dispatch of `pipeline` with buffers[i] bound at binding i and `push` as its push
  // constants (push_size must equal pipeline.push_bytes()). Checks every binding (non-empty, offset
  // aligned to minStorageBufferOffsetAlignment, size <= maxStorageBufferRange) and the group counts
  // against the device limits; errors name `label` and the binding.
  void dispatch(const Pipeline& pipeline, std::span<const BufferSlice> buffers, const void* push, uint32_t push_size,
                uint32_t groups_x, uint32_t groups_y, uint32_t groups_z, std::string_view label, uint64_t bytes);
  template <class Args>
  void dispatch(const Pipeline& pipeline, std::span<const BufferSlice> buffers, const Args& push, uint32_t groups_x,
                uint32_t groups_y, uint32_t groups_z, std::string_view label, uint64_t bytes) {
    dispatch(pipeline, buffers, &push, sizeof(Args), groups_x, groups_y, groups_z, label, bytes);
  }
  // Like dispatch, group counts read by the GPU from `counts` (3 x uint32, 4-byte aligned). Under
  // BarrierScope::ComputeOnly the counts must be written by the host before submit(), since no
  // barrier of that scope orders a shader's write before the indirect-argument read.
  void dispatch_indirect(const Pipeline& pipeline, std::span<const BufferSlice> buffers, const void* push,
                         uint32_t push_size, BufferSlice counts, std::string_view label, uint64_t bytes);
  // Memory barrier: all earlier compute/transfer writes are visible to all later compute/transfer
  // reads and writes (narrower with RecorderOptions::barrier_scope). Counted by barrier_count().
  void barrier();
  // A barrier of full scope whatever barrier_scope says: every earlier compute and transfer write,
  // of this recording and of earlier submissions to the queue, is visible to every later
  // compute, transfer and indirect-argument read. Transfers (fill, copy) may follow it under any
  // scope. For a recording that is queued behind one whose writes it reads (the decode step), or
  // that holds several such steps. Counted by barrier_count() where it follows a command of this
  // recording.
  void full_barrier();
  // dst = value repeated (dst.size multiple of 4), dst = src (equal sizes). Follow with barrier()
  // before a dispatch reads the result. With BarrierScope::ComputeOnly only before the first
  // dispatch of the recording or after a full_barrier() (Error(Runtime) otherwise: those barriers
  // cannot order them).
  void fill(BufferSlice dst, uint32_t value);
  void copy(BufferSlice src, BufferSlice dst);
  // Ends the recording (adds the device -> host visibility barrier).
  void end();

  // Submits the recording; waits first if the previous submission is still running.
  void submit();
  // Waits for the last submission (Error(Runtime) on timeout or device loss).
  void wait();
  void run() {
    submit();
    wait();
  }

  uint32_t dispatch_count() const { return static_cast<uint32_t>(dispatches_.size()); }
  uint32_t barrier_count() const { return barriers_; }
  const std::vector<DispatchInfo>& dispatches() const { return dispatches_; }
  bool timing() const { return query_pool_ != VK_NULL_HANDLE; }
  // How many dispatches of a recording have timeline records of their own (the first ones):
  // the regions less the shared last one (RecorderOptions::timeline). 0 without a timeline.
  uint32_t timeline_dispatches() const;
  // Per-dispatch GPU times of the last completed submission (call after wait(); empty when
  // timestamps are off or unsupported).
  std::vector<DispatchTiming> timings() const;

 private:
  void bind(const Pipeline& pipeline, std::span<const BufferSlice> buffers, const void* push, uint32_t push_size,
            std::string_view label);
  void after_dispatch(std::string_view label, uint64_t bytes, uint32_t gx, uint32_t gy, uint32_t gz);
  VkDescriptorSet allocate_set(VkDescriptorSetLayout layout);
  void require_recording(const char* what) const;
  void require_transfer_allowed(const char* what) const;  // fill / copy: ComputeOnly's contract

  Context& ctx_;
  RecorderOptions options_;
  VkDevice device_;
  VkCommandPool cmd_pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  VkQueryPool query_pool_ = VK_NULL_HANDLE;
  std::vector<VkDescriptorPool> desc_pools_;
  size_t desc_pool_cur_ = 0;
  std::vector<DispatchInfo> dispatches_;
  uint32_t barriers_ = 0;
  bool transfer_since_barrier_ = false;  // a fill or copy recorded since the last barrier
  bool transfers_allowed_ = true;        // no dispatch since begin() or the last full_barrier()
  uint32_t timed_ = 0;  // dispatches with a timestamp in this recording
  bool recording_ = false, recorded_ = false, pending_ = false;
};

}  // namespace tessera::vk
