#include "runtime/vulkan/recorder.h"

#include <algorithm>

#include "format/error.h"
#include "runtime/vulkan/vk_common.h"

namespace tessera::vk {
namespace {

constexpr uint32_t kSetsPerPool = 256;
constexpr uint32_t kDescriptorsPerPool = kSetsPerPool * 8;

constexpr VkPipelineStageFlags kWorkStages = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
constexpr VkAccessFlags kWrites = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
constexpr VkAccessFlags kReadsWrites = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                                       VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT |
                                       VK_ACCESS_INDIRECT_COMMAND_READ_BIT;

}  // namespace

GroupCounts split_workgroups(uint64_t n, const DeviceInfo& info) {
  const uint64_t max_x = info.max_workgroup_count[0];
  if (n <= max_x) return {static_cast<uint32_t>(std::max<uint64_t>(n, 1)), 1};
  const uint64_t y = (n + max_x - 1) / max_x;
  if (y > info.max_workgroup_count[1]) runtime_error("dispatch of ", n, " workgroups exceeds the device's grid limits");
  return {static_cast<uint32_t>((n + y - 1) / y), static_cast<uint32_t>(y)};
}

CommandRecorder::CommandRecorder(Context& ctx, RecorderOptions options)
    : ctx_(ctx), options_(options), device_(ctx.device().handle()) {
  auto pi = vk_struct<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
  pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pi.queueFamilyIndex = ctx.device().queue_family();
  check(vkCreateCommandPool(device_, &pi, nullptr, &cmd_pool_), "vkCreateCommandPool");
  auto ai = vk_struct<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
  ai.commandPool = cmd_pool_;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  check(vkAllocateCommandBuffers(device_, &ai, &cmd_), "vkAllocateCommandBuffers");
  if (options_.timeline.buffer != VK_NULL_HANDLE &&
      (timeline_dispatches() == 0 || options_.timeline_region % ctx.info().min_storage_buffer_offset_alignment != 0 ||
       options_.timeline_region > ctx.info().max_storage_buffer_range))
    runtime_error("CommandRecorder: timeline regions of ", options_.timeline_region, " bytes in a buffer of ",
                  options_.timeline.size, " (a region must fit, be a multiple of ",
                  ctx.info().min_storage_buffer_offset_alignment, " and at most ", ctx.info().max_storage_buffer_range,
                  " bytes)");
  auto fi = vk_struct<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
  check(vkCreateFence(device_, &fi, nullptr, &fence_), "vkCreateFence");
  if (options_.timestamps && ctx.device().has_timestamps() && options_.max_timed > 0) {
    auto qi = vk_struct<VkQueryPoolCreateInfo>(VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO);
    qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qi.queryCount = options_.max_timed + 1;
    check(vkCreateQueryPool(device_, &qi, nullptr, &query_pool_), "vkCreateQueryPool");
  }
}

uint32_t CommandRecorder::timeline_dispatches() const {
  if (options_.timeline.buffer == VK_NULL_HANDLE || options_.timeline_region == 0) return 0;
  const uint64_t regions = options_.timeline.size / options_.timeline_region;
  return regions ? uint32_t(regions - 1) : 0;
}

CommandRecorder::~CommandRecorder() {
  if (pending_) vkWaitForFences(device_, 1, &fence_, VK_TRUE, UINT64_MAX);
  for (VkDescriptorPool p : desc_pools_) vkDestroyDescriptorPool(device_, p, nullptr);
  if (query_pool_) vkDestroyQueryPool(device_, query_pool_, nullptr);
  vkDestroyFence(device_, fence_, nullptr);
  vkDestroyCommandPool(device_, cmd_pool_, nullptr);
}

void CommandRecorder::require_recording(const char* what) const {
  if (!recording_) runtime_error("CommandRecorder::", what, " called outside begin() ... end()");
}

void CommandRecorder::begin() {
  if (pending_) wait();
  if (recording_) runtime_error("CommandRecorder::begin called twice without end()");
  check(vkResetCommandBuffer(cmd_, 0), "vkResetCommandBuffer");
  for (VkDescriptorPool p : desc_pools_) check(vkResetDescriptorPool(device_, p, 0), "vkResetDescriptorPool");
  desc_pool_cur_ = 0;
  dispatches_.clear();
  barriers_ = 0;
  transfer_since_barrier_ = false;
  transfers_allowed_ = true;
  timed_ = 0;
  auto bi = vk_struct<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
  check(vkBeginCommandBuffer(cmd_, &bi), "vkBeginCommandBuffer");
  if (query_pool_) {
    vkCmdResetQueryPool(cmd_, query_pool_, 0, options_.max_timed + 1);
    vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, query_pool_, 0);
  }
  recording_ = true;
  recorded_ = false;
}

VkDescriptorSet CommandRecorder::allocate_set(VkDescriptorSetLayout layout) {
  for (;;) {
    if (desc_pool_cur_ == desc_pools_.size()) {
      VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kDescriptorsPerPool};
      auto ci = vk_struct<VkDescriptorPoolCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO);
      ci.maxSets = kSetsPerPool;
      ci.poolSizeCount = 1;
      ci.pPoolSizes = &size;
      VkDescriptorPool pool = VK_NULL_HANDLE;
      check(vkCreateDescriptorPool(device_, &ci, nullptr, &pool), "vkCreateDescriptorPool");
      desc_pools_.push_back(pool);
    }
    auto ai = vk_struct<VkDescriptorSetAllocateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO);
    ai.descriptorPool = desc_pools_[desc_pool_cur_];
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &layout;
    VkDescriptorSet set = VK_NULL_HANDLE;
    const VkResult r = vkAllocateDescriptorSets(device_, &ai, &set);
    if (r == VK_SUCCESS) return set;
    if (r != VK_ERROR_OUT_OF_POOL_MEMORY && r != VK_ERROR_FRAGMENTED_POOL) check(r, "vkAllocateDescriptorSets");
    ++desc_pool_cur_;  // this pool is full: move on to the next (created above when needed)
  }
}

void CommandRecorder::bind(const Pipeline& pipeline, std::span<const BufferSlice> buffers, const void* push,
                           uint32_t push_size, std::string_view label) {
  require_recording("dispatch");
  const DeviceInfo& info = ctx_.info();
  if (buffers.size() != pipeline.num_buffers())
    runtime_error("dispatch '", label, "': ", buffers.size(), " buffers given, pipeline ", pipeline.name(), " has ",
                  pipeline.num_buffers(), " bindings");
  if (push_size != pipeline.push_bytes())
    runtime_error("dispatch '", label, "': push constants of ", push_size, " bytes, pipeline ", pipeline.name(),
                  " declares ", pipeline.push_bytes());
  const bool timeline = pipeline.timeline();
  if (timeline && options_.timeline.buffer == VK_NULL_HANDLE)
    runtime_error("dispatch '", label, "': pipeline ", pipeline.name(),
                  " writes timeline records (made in timeline mode) and this recorder has no timeline buffer");
  std::vector<VkDescriptorBufferInfo> infos(buffers.size() + (timeline ? 1 : 0));
  if (timeline) {
    const uint64_t region = uint64_t(std::min<size_t>(dispatches_.size(), timeline_dispatches()));
    const BufferSlice t = options_.timeline.sub(region * options_.timeline_region, options_.timeline_region);
    infos.back() = {t.buffer, t.offset, t.size};
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    const BufferSlice& b = buffers[i];
    if (b.buffer == VK_NULL_HANDLE || b.size == 0) runtime_error("dispatch '", label, "': binding ", i, " is empty");
    if (b.offset % info.min_storage_buffer_offset_alignment != 0)
      runtime_error("dispatch '", label, "': binding ", i, " offset ", b.offset, " is not a multiple of ",
                    info.min_storage_buffer_offset_alignment, " (minStorageBufferOffsetAlignment)");
    if (b.size > info.max_storage_buffer_range)
      runtime_error("dispatch '", label, "': binding ", i, " spans ", b.size, " bytes, more than the device's ",
                    info.max_storage_buffer_range, " (maxStorageBufferRange)");
    infos[i] = {b.buffer, b.offset, b.size};
  }
  VkDescriptorSet set = allocate_set(pipeline.set_layout());
  std::vector<VkWriteDescriptorSet> writes(infos.size());
  for (size_t i = 0; i < infos.size(); ++i) {
    writes[i] = vk_struct<VkWriteDescriptorSet>(VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET);
    writes[i].dstSet = set;
    writes[i].dstBinding = static_cast<uint32_t>(i);
    writes[i].descriptorCount = 1;
    writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[i].pBufferInfo = &infos[i];
  }
  vkUpdateDescriptorSets(device_, static_cast<uint32_t>(writes.size()), writes.data(), 0, nullptr);
  vkCmdBindPipeline(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.handle());
  vkCmdBindDescriptorSets(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout(), 0, 1, &set, 0, nullptr);
  if (push_size) vkCmdPushConstants(cmd_, pipeline.layout(), VK_SHADER_STAGE_COMPUTE_BIT, 0, push_size, push);
}

void CommandRecorder::after_dispatch(std::string_view label, uint64_t bytes, uint32_t gx, uint32_t gy, uint32_t gz) {
  dispatches_.push_back({std::string(label), bytes, {gx, gy, gz}});
  transfers_allowed_ = false;
  if (query_pool_ && timed_ < options_.max_timed) {
    ++timed_;
    vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, query_pool_, timed_);
  }
}

void CommandRecorder::dispatch(const Pipeline& pipeline, std::span<const BufferSlice> buffers, const void* push,
                               uint32_t push_size, uint32_t gx, uint32_t gy, uint32_t gz, std::string_view label,
                               uint64_t bytes) {
  const auto& max = ctx_.info().max_workgroup_count;
  if (gx == 0 || gy == 0 || gz == 0 || gx > max[0] || gy > max[1] || gz > max[2])
    runtime_error("dispatch '", label, "': workgroup counts (", gx, ", ", gy, ", ", gz, ") outside 1..(", max[0], ", ",
                  max[1], ", ", max[2], ")");
  bind(pipeline, buffers, push, push_size, label);
  vkCmdDispatch(cmd_, gx, gy, gz);
  after_dispatch(label, bytes, gx, gy, gz);
}

void CommandRecorder::dispatch_indirect(const Pipeline& pipeline, std::span<const BufferSlice> buffers,
                                        const void* push, uint32_t push_size, BufferSlice counts,
                                        std::string_view label, uint64_t bytes) {
  if (counts.size < 12 || counts.offset % 4 != 0)
    runtime_error("dispatch '", label, "': indirect counts need 12 bytes at a 4-byte aligned offset");
  bind(pipeline, buffers, push, push_size, label);
  vkCmdDispatchIndirect(cmd_, counts.buffer, counts.offset);
  after_dispatch(label, bytes, 0, 0, 0);
}

void CommandRecorder::barrier() {
  require_recording("barrier");
  auto mb = vk_struct<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  VkPipelineStageFlags src = kWorkStages, dst = kWorkStages | VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT;
  mb.srcAccessMask = kWrites;
  mb.dstAccessMask = kReadsWrites;
  if (options_.barrier_scope != BarrierScope::Full) {
    src = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | (transfer_since_barrier_ ? VK_PIPELINE_STAGE_TRANSFER_BIT : 0);
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | (transfer_since_barrier_ ? VK_ACCESS_TRANSFER_WRITE_BIT : 0);
  }
  if (options_.barrier_scope == BarrierScope::ComputeOnly || options_.barrier_scope == BarrierScope::ExecutionOnly) {
    dst = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
    mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
  }
  // ExecutionOnly: compute after compute with no memory barrier (the shaders' coherent accesses
  // make the writes visible); a transfer since the last barrier still gets its memory barrier.
  const bool memory = options_.barrier_scope != BarrierScope::ExecutionOnly || transfer_since_barrier_;
  vkCmdPipelineBarrier(cmd_, src, dst, 0, memory ? 1u : 0u, memory ? &mb : nullptr, 0, nullptr, 0, nullptr);
  transfer_since_barrier_ = false;
  ++barriers_;
}

void CommandRecorder::full_barrier() {
  require_recording("full_barrier");
  auto mb = vk_struct<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  mb.srcAccessMask = kWrites;
  mb.dstAccessMask = kReadsWrites;
  vkCmdPipelineBarrier(cmd_, kWorkStages, kWorkStages | VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT, 0, 1, &mb, 0, nullptr, 0,
                       nullptr);
  if (!dispatches_.empty() || transfer_since_barrier_) ++barriers_;
  transfer_since_barrier_ = false;
  transfers_allowed_ = true;
}

void CommandRecorder::require_transfer_allowed(const char* what) const {
  require_recording(what);
  if ((options_.barrier_scope == BarrierScope::ComputeOnly || options_.barrier_scope == BarrierScope::ExecutionOnly) &&
      !transfers_allowed_)
    runtime_error(what, " after a dispatch (with no full_barrier() since) in a recording with compute-only barriers (BarrierScope::ComputeOnly or ExecutionOnly): "
                  "those barriers do not order transfers after compute work; record transfers first or use "
                  "BarrierScope::Compute");
}

void CommandRecorder::fill(BufferSlice dst, uint32_t value) {
  require_transfer_allowed("fill");
  if (dst.size % 4 != 0 || dst.offset % 4 != 0) runtime_error("fill: offset and size must be multiples of 4");
  vkCmdFillBuffer(cmd_, dst.buffer, dst.offset, dst.size, value);
  transfer_since_barrier_ = true;
}

void CommandRecorder::copy(BufferSlice src, BufferSlice dst) {
  require_transfer_allowed("copy");
  if (src.size != dst.size) runtime_error("copy: source has ", src.size, " bytes, destination ", dst.size);
  VkBufferCopy region{src.offset, dst.offset, src.size};
  vkCmdCopyBuffer(cmd_, src.buffer, dst.buffer, 1, &region);
  transfer_since_barrier_ = true;
}

void CommandRecorder::end() {
  require_recording("end");
  auto mb = vk_struct<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  mb.srcAccessMask = kWrites;
  mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
  vkCmdPipelineBarrier(cmd_, kWorkStages, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr);
  check(vkEndCommandBuffer(cmd_), "vkEndCommandBuffer");
  recording_ = false;
  recorded_ = true;
}

void CommandRecorder::submit() {
  if (!recorded_) runtime_error("CommandRecorder::submit: nothing recorded (call begin() ... end() first)");
  if (pending_) wait();
  check(vkResetFences(device_, 1, &fence_), "vkResetFences");
  auto si = vk_struct<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd_;
  check(vkQueueSubmit(ctx_.device().queue(), 1, &si, fence_), "vkQueueSubmit");
  pending_ = true;
}

void CommandRecorder::wait() {
  if (!pending_) return;
  const auto timeout = static_cast<uint64_t>(options_.fence_timeout_s * 1e9);
  const VkResult r = vkWaitForFences(device_, 1, &fence_, VK_TRUE, timeout);
  if (r == VK_TIMEOUT)
    runtime_error("Vulkan: the GPU did not finish a submission of ", dispatches_.size(), " dispatches within ",
                  options_.fence_timeout_s, " s");
  check(r, "vkWaitForFences");
  pending_ = false;
}

std::vector<DispatchTiming> CommandRecorder::timings() const {
  std::vector<DispatchTiming> out;
  if (!query_pool_ || pending_ || !recorded_ || timed_ == 0) return out;
  std::vector<uint64_t> ticks(timed_ + 1);
  check(vkGetQueryPoolResults(device_, query_pool_, 0, timed_ + 1, ticks.size() * 8, ticks.data(), 8,
                              VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
        "vkGetQueryPoolResults");
  const uint32_t bits = ctx_.device().timestamp_valid_bits();
  const uint64_t mask = bits >= 64 ? ~0ull : ((1ull << bits) - 1);
  const double ns_per_tick = ctx_.info().timestamp_period_ns;
  for (uint32_t i = 0; i < timed_; ++i) {
    const uint64_t dt = ((ticks[i + 1] & mask) - (ticks[i] & mask)) & mask;
    out.push_back({dispatches_[i].label, dispatches_[i].bytes, static_cast<double>(dt) * ns_per_tick / 1000.0});
  }
  return out;
}

}  // namespace tessera::vk
