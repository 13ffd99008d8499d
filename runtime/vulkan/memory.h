// Device memory: few large allocations, sub-allocated.
//  - MemoryPool owns VkDeviceMemory blocks of one MemoryKind and bump-allocates Buffers in them
//    (no free list: pools live as long as the model / the test; reset() frees everything).
//  - Buffer owns one VkBuffer bound to a range of a pool block (persistently mapped when the
//    memory is host-visible, which includes device-local memory on unified-memory devices).
//  - BufferSlice is a (buffer, offset, size) view: what a descriptor binding points at.
//  - MemoryPlan sums sizes before anything is allocated and refuses, naming both numbers, when
//    the device cannot hold them.
#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/vulkan/device.h"

namespace tessera::vk {

// A byte range of a VkBuffer. size is what a descriptor binds (must be <= maxStorageBufferRange
// when bound; CommandRecorder checks).
struct BufferSlice {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceSize offset = 0;
  VkDeviceSize size = 0;
  // A sub-range [offset+off, offset+off+bytes) of this slice; throws Error(Runtime) if outside.
  BufferSlice sub(VkDeviceSize off, VkDeviceSize bytes) const;
};

class Buffer {
 public:
  Buffer() = default;
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  VkBuffer handle() const { return buffer_; }
  VkDeviceSize size() const { return size_; }
  MemoryKind kind() const { return kind_; }
  const std::string& name() const { return name_; }
  // Host pointer to byte 0 of the buffer, or nullptr when the memory is not host-visible.
  uint8_t* mapped() const { return mapped_; }

  BufferSlice whole() const { return {buffer_, 0, size_}; }
  // [offset, offset+bytes); throws Error(Runtime) naming the buffer if outside.
  BufferSlice slice(VkDeviceSize offset, VkDeviceSize bytes) const;
  // memcpy into / out of a mapped buffer; throws if the buffer is not mapped or the range is
  // outside it. (Use Transfer for device-local buffers on discrete GPUs.)
  void write(VkDeviceSize offset, const void* src, size_t bytes);
  void read(VkDeviceSize offset, void* dst, size_t bytes) const;

 private:
  friend class MemoryPool;
  VkDevice device_ = VK_NULL_HANDLE;
  VkBuffer buffer_ = VK_NULL_HANDLE;
  VkDeviceSize size_ = 0;
  MemoryKind kind_ = MemoryKind::DeviceLocal;
  uint8_t* mapped_ = nullptr;
  std::string name_;
};

class MemoryPool {
 public:
  // Blocks are allocated lazily, block_size bytes each (a larger buffer gets a block of its own
  // size); every block <= maxMemoryAllocationSize.
  MemoryPool(const Device& device, MemoryKind kind, VkDeviceSize block_size = 64ull << 20);
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // A new buffer of `bytes` (> 0) usable as storage buffer, transfer source/destination and
  // indirect-dispatch arguments.
  // Throws Error(Runtime) naming `name`, the size and the device limit on failure.
  Buffer create_buffer(VkDeviceSize bytes, std::string name);
  MemoryKind kind() const { return kind_; }
  // Bytes handed out / bytes allocated from the device.
  VkDeviceSize used() const { return used_; }
  VkDeviceSize allocated() const;
  // Frees every block. All buffers created from this pool must be destroyed before.
  void reset();

 private:
  struct Block {
    VkDeviceMemory memory = VK_NULL_HANDLE;
    VkDeviceSize size = 0, top = 0;
    uint8_t* mapped = nullptr;
  };
  Block& block_for(VkDeviceSize bytes, VkDeviceSize align, const std::string& name);

  const Device& device_;
  MemoryKind kind_;
  VkDeviceSize block_size_;
  VkDeviceSize used_ = 0;
  std::vector<Block> blocks_;
};

// What a model run needs, summed before any allocation.
class MemoryPlan {
 public:
  void add(std::string what, MemoryKind kind, uint64_t bytes);
  uint64_t total(MemoryKind kind) const;
  // Throws Error(Runtime) when the device cannot hold the plan: "needs X of device memory (...)
  // but <device> has Y", or when one item exceeds maxMemoryAllocationSize.
  void check(const Device& device) const;
  // One line per item and the totals, for -v output.
  std::string summary() const;

 private:
  struct Item {
    std::string what;
    MemoryKind kind;
    uint64_t bytes;
  };
  std::vector<Item> items_;
};

}  // namespace tessera::vk
