// Transfer: host <-> device copies. Owns a host-visible staging ring (a few slots, each with its
// own command buffer and fence), a command pool, and nothing else.
// Buffers whose memory is mapped (host memory, or device-local memory on unified-memory devices
// like lavapipe) are written/read directly with memcpy; others go through the ring: uploads are
// batched and asynchronous until finish(), downloads are synchronous.
// Ordering: every staging submission ends with a transfer -> compute/transfer/host barrier, so any
// later submission on the queue sees the data once finish() returned.
#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>
#include <vector>

#include "runtime/vulkan/device.h"
#include "runtime/vulkan/memory.h"

namespace tessera::vk {

class Transfer {
 public:
  // always_stage: copy through the ring even where a buffer is mapped (tests the ring on
  // unified-memory devices).
  explicit Transfer(const Device& device, VkDeviceSize ring_bytes = 32ull << 20, uint32_t slots = 4,
                    bool always_stage = false);
  ~Transfer();  // finishes pending uploads
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;

  // dst[dst_offset .. +bytes) = src. Throws Error(Runtime) if the range is outside dst.
  // Through the ring the copy completes by finish(); `src` may be reused as soon as this returns.
  void upload(Buffer& dst, VkDeviceSize dst_offset, const void* src, size_t bytes);
  // dst = src[src_offset .. +bytes), synchronous. The caller must have waited for the GPU work
  // that wrote src (CommandRecorder::wait).
  void download(const Buffer& src, VkDeviceSize src_offset, void* dst, size_t bytes);
  // Submits the batched uploads and waits until every staging copy is done.
  void finish();
  // Bytes that went through the staging ring (0 on unified-memory devices).
  uint64_t bytes_staged() const { return staged_; }

 private:
  struct Slot {
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    VkFence fence = VK_NULL_HANDLE;
    VkDeviceSize base = 0, used = 0;  // region [base, base + slot_bytes_) of the ring
    bool recording = false, pending = false;
  };
  Slot& current();
  void submit(Slot& s);
  void wait(Slot& s);

  const Device& device_;
  MemoryPool pool_;
  Buffer ring_;
  VkCommandPool cmd_pool_ = VK_NULL_HANDLE;
  std::vector<Slot> slots_;
  VkDeviceSize slot_bytes_ = 0;
  uint32_t cur_ = 0;
  uint64_t staged_ = 0;
  bool always_stage_ = false;
};

}  // namespace tessera::vk
