#include "runtime/vulkan/memory.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "format/error.h"
#include "runtime/vulkan/vk_common.h"

namespace tessera::vk {
namespace {
const char* kind_name(MemoryKind k) { return k == MemoryKind::Host ? "host-visible" : "device-local"; }
VkDeviceSize align_up(VkDeviceSize v, VkDeviceSize a) { return (v + a - 1) / a * a; }
}  // namespace

BufferSlice BufferSlice::sub(VkDeviceSize off, VkDeviceSize bytes) const {
  if (off > size || bytes > size - off)
    runtime_error("buffer slice [", off, ", ", off + bytes, ") is outside a slice of ", size, " bytes");
  return {buffer, offset + off, bytes};
}

Buffer::~Buffer() {
  if (buffer_ != VK_NULL_HANDLE) vkDestroyBuffer(device_, buffer_, nullptr);
}

Buffer::Buffer(Buffer&& o) noexcept { *this = std::move(o); }

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    if (buffer_ != VK_NULL_HANDLE) vkDestroyBuffer(device_, buffer_, nullptr);
    device_ = std::exchange(o.device_, VK_NULL_HANDLE);
    buffer_ = std::exchange(o.buffer_, VK_NULL_HANDLE);
    size_ = std::exchange(o.size_, 0);
    kind_ = o.kind_;
    mapped_ = std::exchange(o.mapped_, nullptr);
    name_ = std::move(o.name_);
  }
  return *this;
}

BufferSlice Buffer::slice(VkDeviceSize offset, VkDeviceSize bytes) const {
  if (offset > size_ || bytes > size_ - offset)
    runtime_error("buffer '", name_, "': range [", offset, ", ", offset + bytes, ") is outside its ", size_, " bytes");
  return {buffer_, offset, bytes};
}

void Buffer::write(VkDeviceSize offset, const void* src, size_t bytes) {
  if (!mapped_) runtime_error("buffer '", name_, "' is not host-visible; cannot write it from the host");
  (void)slice(offset, bytes);
  if (bytes) std::memcpy(mapped_ + offset, src, bytes);
}

void Buffer::read(VkDeviceSize offset, void* dst, size_t bytes) const {
  if (!mapped_) runtime_error("buffer '", name_, "' is not host-visible; cannot read it from the host");
  (void)slice(offset, bytes);
  if (bytes) std::memcpy(dst, mapped_ + offset, bytes);
}

MemoryPool::MemoryPool(const Device& device, MemoryKind kind, VkDeviceSize block_size)
    : device_(device), kind_(kind), block_size_(std::min<VkDeviceSize>(block_size, device.info().max_memory_allocation_size)) {}

MemoryPool::~MemoryPool() { reset(); }

VkDeviceSize MemoryPool::allocated() const {
  VkDeviceSize s = 0;
  for (const Block& b : blocks_) s += b.size;
  return s;
}

void MemoryPool::reset() {
  for (Block& b : blocks_) {
    if (b.mapped) vkUnmapMemory(device_.handle(), b.memory);
    vkFreeMemory(device_.handle(), b.memory, nullptr);
  }
  blocks_.clear();
  used_ = 0;
}

MemoryPool::Block& MemoryPool::block_for(VkDeviceSize bytes, VkDeviceSize align, const std::string& name) {
  for (Block& b : blocks_)
    if (align_up(b.top, align) + bytes <= b.size) return b;
  const VkDeviceSize limit = device_.info().max_memory_allocation_size;
  if (bytes > limit)
    runtime_error("buffer '", name, "' needs ", bytes, " bytes (", format_bytes(bytes), ") in one allocation, but ",
                  device_.info().name, " allows at most ", limit, " bytes (", format_bytes(limit),
                  ", maxMemoryAllocationSize)");
  Block b;
  b.size = std::max(block_size_, bytes);
  auto ai = vk_struct<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
  ai.allocationSize = b.size;
  ai.memoryTypeIndex = device_.memory_type(kind_);
  VkResult r = vkAllocateMemory(device_.handle(), &ai, nullptr, &b.memory);
  if (r != VK_SUCCESS)
    runtime_error("Vulkan: allocating ", format_bytes(b.size), " of ", kind_name(kind_), " memory for buffer '", name,
                  "' failed: ", result_name(r), " (", format_bytes(allocated()), " already allocated by this pool)");
  if (device_.mappable(kind_)) {
    void* p = nullptr;
    check(vkMapMemory(device_.handle(), b.memory, 0, VK_WHOLE_SIZE, 0, &p), "vkMapMemory");
    b.mapped = static_cast<uint8_t*>(p);
  }
  blocks_.push_back(b);
  return blocks_.back();
}

Buffer MemoryPool::create_buffer(VkDeviceSize bytes, std::string name) {
  if (bytes == 0) runtime_error("buffer '", name, "': size 0 requested");
  Buffer buf;
  buf.device_ = device_.handle();
  buf.kind_ = kind_;
  buf.name_ = std::move(name);
  buf.size_ = bytes;
  auto bi = vk_struct<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
  bi.size = bytes;
  bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT |
             VK_BUFFER_USAGE_INDIRECT_BUFFER_BIT;
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  check(vkCreateBuffer(device_.handle(), &bi, nullptr, &buf.buffer_), "vkCreateBuffer");
  VkMemoryRequirements req{};
  vkGetBufferMemoryRequirements(device_.handle(), buf.buffer_, &req);
  if (!(req.memoryTypeBits & (1u << device_.memory_type(kind_))))
    runtime_error("Vulkan: buffer '", buf.name_, "' cannot live in the chosen ", kind_name(kind_), " memory type");
  // 256-byte alignment at least: offsets inside the buffer then meet every descriptor alignment.
  const VkDeviceSize align = std::max<VkDeviceSize>(req.alignment, 256);
  Block& b = block_for(req.size, align, buf.name_);
  const VkDeviceSize at = align_up(b.top, align);
  check(vkBindBufferMemory(device_.handle(), buf.buffer_, b.memory, at), "vkBindBufferMemory");
  b.top = at + req.size;
  used_ += req.size;
  if (b.mapped) buf.mapped_ = b.mapped + at;
  return buf;
}

void MemoryPlan::add(std::string what, MemoryKind kind, uint64_t bytes) {
  items_.push_back({std::move(what), kind, bytes});
}

uint64_t MemoryPlan::total(MemoryKind kind) const {
  uint64_t s = 0;
  for (const Item& i : items_)
    if (i.kind == kind) s += i.bytes;
  return s;
}

void MemoryPlan::check(const Device& device) const {
  const DeviceInfo& info = device.info();
  for (const Item& i : items_)
    if (i.bytes > info.max_memory_allocation_size)
      runtime_error("memory plan: '", i.what, "' needs ", i.bytes, " bytes (", format_bytes(i.bytes),
                    ") in one allocation, but ", info.name, " allows at most ", info.max_memory_allocation_size,
                    " bytes (", format_bytes(info.max_memory_allocation_size), ")");
  auto refuse = [&](const char* what, uint64_t need, uint64_t have) {
    runtime_error("memory plan: needs ", need, " bytes (", format_bytes(need), ") of ", what, " memory, but ",
                  info.name, " has ", have, " bytes (", format_bytes(have), "); the plan:\n", summary());
  };
  const uint64_t local = total(MemoryKind::DeviceLocal), host = total(MemoryKind::Host);
  if (device.kinds_share_heap()) {
    const uint64_t heap = device.heap_size(MemoryKind::DeviceLocal);
    if (local + host > heap) refuse("device", local + host, heap);
    return;
  }
  if (local > device.heap_size(MemoryKind::DeviceLocal)) refuse("device-local", local, device.heap_size(MemoryKind::DeviceLocal));
  if (host > device.heap_size(MemoryKind::Host)) refuse("host-visible", host, device.heap_size(MemoryKind::Host));
}

std::string MemoryPlan::summary() const {
  std::string s;
  for (const Item& i : items_) s += cat("  ", i.what, ": ", format_bytes(i.bytes), " ", kind_name(i.kind), "\n");
  s += cat("  total: ", format_bytes(total(MemoryKind::DeviceLocal)), " device-local, ",
           format_bytes(total(MemoryKind::Host)), " host-visible");
  return s;
}

}  // namespace tessera::vk
