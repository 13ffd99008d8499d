#include "runtime/vulkan/transfer.h"

#include <algorithm>
#include <cstring>

#include "format/error.h"
#include "runtime/vulkan/vk_common.h"

namespace tessera::vk {
namespace {

constexpr uint64_t kFenceTimeoutNs = 120ull * 1000 * 1000 * 1000;

void global_barrier(VkCommandBuffer cmd, VkPipelineStageFlags src_stage, VkAccessFlags src_access,
                    VkPipelineStageFlags dst_stage, VkAccessFlags dst_access) {
  auto mb = vk_struct<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  mb.srcAccessMask = src_access;
  mb.dstAccessMask = dst_access;
  vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 1, &mb, 0, nullptr, 0, nullptr);
}

}  // namespace

Transfer::Transfer(const Device& device, VkDeviceSize ring_bytes, uint32_t slots, bool always_stage)
    : device_(device), pool_(device, MemoryKind::Host, ring_bytes), always_stage_(always_stage) {
  slots = std::max(slots, 1u);
  slot_bytes_ = std::max<VkDeviceSize>(ring_bytes / slots / 256 * 256, 256);
  ring_ = pool_.create_buffer(slot_bytes_ * slots, "staging ring");
  auto pi = vk_struct<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
  pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pi.queueFamilyIndex = device.queue_family();
  check(vkCreateCommandPool(device.handle(), &pi, nullptr, &cmd_pool_), "vkCreateCommandPool");
  slots_.resize(slots);
  for (uint32_t i = 0; i < slots; ++i) {
    Slot& s = slots_[i];
    s.base = i * slot_bytes_;
    auto ai = vk_struct<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
    ai.commandPool = cmd_pool_;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    check(vkAllocateCommandBuffers(device.handle(), &ai, &s.cmd), "vkAllocateCommandBuffers");
    auto fi = vk_struct<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
    check(vkCreateFence(device.handle(), &fi, nullptr, &s.fence), "vkCreateFence");
  }
}

Transfer::~Transfer() {
  try {
    finish();
  } catch (...) {
    // Destructors must not throw; a failed copy was already reported by the call that queued it
    // or will show as wrong results. Nothing else to do here.
  }
  for (Slot& s : slots_) vkDestroyFence(device_.handle(), s.fence, nullptr);
  vkDestroyCommandPool(device_.handle(), cmd_pool_, nullptr);
}

void Transfer::wait(Slot& s) {
  if (!s.pending) return;
  const VkResult r = vkWaitForFences(device_.handle(), 1, &s.fence, VK_TRUE, kFenceTimeoutNs);
  if (r == VK_TIMEOUT) runtime_error("Vulkan: a staging copy did not finish within 120 s");
  check(r, "vkWaitForFences (staging)");
  check(vkResetFences(device_.handle(), 1, &s.fence), "vkResetFences");
  s.pending = false;
  s.used = 0;
}

Transfer::Slot& Transfer::current() {
  Slot& s = slots_[cur_];
  wait(s);
  if (!s.recording) {
    check(vkResetCommandBuffer(s.cmd, 0), "vkResetCommandBuffer");
    auto bi = vk_struct<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    check(vkBeginCommandBuffer(s.cmd, &bi), "vkBeginCommandBuffer");
    // Earlier GPU work (shader or transfer writes, e.g. a buffer being downloaded) happens-before.
    global_barrier(s.cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                   VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                   VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT);
    s.recording = true;
  }
  return s;
}

void Transfer::submit(Slot& s) {
  if (!s.recording) return;
  global_barrier(s.cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                 VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_HOST_BIT,
                 VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                     VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_READ_BIT);
  check(vkEndCommandBuffer(s.cmd), "vkEndCommandBuffer");
  auto si = vk_struct<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
  si.commandBufferCount = 1;
  si.pCommandBuffers = &s.cmd;
  check(vkQueueSubmit(device_.queue(), 1, &si, s.fence), "vkQueueSubmit (staging)");
  s.recording = false;
  s.pending = true;
}

void Transfer::upload(Buffer& dst, VkDeviceSize dst_offset, const void* src, size_t bytes) {
  (void)dst.slice(dst_offset, bytes);  // range check, names the buffer
  if (dst.mapped() && !always_stage_) {
    dst.write(dst_offset, src, bytes);
    return;
  }
  const auto* p = static_cast<const uint8_t*>(src);
  while (bytes > 0) {
    Slot* s = &current();
    if (s->used == slot_bytes_) {
      submit(*s);
      cur_ = (cur_ + 1) % slots_.size();
      s = &current();
    }
    const VkDeviceSize n = std::min<VkDeviceSize>(bytes, slot_bytes_ - s->used);
    std::memcpy(ring_.mapped() + s->base + s->used, p, n);
    VkBufferCopy region{s->base + s->used, dst_offset, n};
    vkCmdCopyBuffer(s->cmd, ring_.handle(), dst.handle(), 1, &region);
    s->used += n;
    staged_ += n;
    p += n;
    dst_offset += n;
    bytes -= n;
  }
}

void Transfer::download(const Buffer& src, VkDeviceSize src_offset, void* dst, size_t bytes) {
  (void)src.slice(src_offset, bytes);
  if (src.mapped() && !always_stage_) {
    src.read(src_offset, dst, bytes);
    return;
  }
  auto* p = static_cast<uint8_t*>(dst);
  while (bytes > 0) {
    finish();
    Slot& s = current();
    const VkDeviceSize n = std::min<VkDeviceSize>(bytes, slot_bytes_);
    VkBufferCopy region{src_offset, s.base, n};
    vkCmdCopyBuffer(s.cmd, src.handle(), ring_.handle(), 1, &region);
    submit(s);
    wait(s);
    std::memcpy(p, ring_.mapped() + s.base, n);
    staged_ += n;
    p += n;
    src_offset += n;
    bytes -= n;
  }
}

void Transfer::finish() {
  submit(slots_[cur_]);
  for (Slot& s : slots_) wait(s);
}

}  // namespace tessera::vk
