// Device: owns the logical VkDevice and its one compute queue. Enables 16-bit storage (required)
// and, when the physical device has them, fp16 arithmetic, int8 storage/arithmetic, integer dot
// product, 64-bit integer buffer atomics and subgroup size control; `enabled()` says which ones
// shaders may use. On request (bench --kernel-stats) also VK_KHR_pipeline_executable_properties,
// for the driver's statistics of each pipeline.
// Also owns the memory-type choice for the two memory kinds (memory.h).
#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>

#include "runtime/vulkan/instance.h"

namespace tessera::vk {

enum class MemoryKind {
  DeviceLocal,  // weights, activations, KV cache (host-visible too on unified-memory devices)
  Host,         // host-visible + coherent: staging, read-back, per-token step values
};

class Device {
 public:
  // Creates the logical device for instance.devices()[index]. Throws Error(Runtime) naming the
  // reason when the device is unsupported (DeviceInfo::unsupported_reason) or creation fails.
  // no_int64_atomics: leave shaderBufferInt64Atomics off even where the device has it (tests of
  // the fallbacks of the kernels that need it). kernel_statistics: enable
  // VK_KHR_pipeline_executable_properties where present (enabled().pipeline_statistics).
  Device(const Instance& instance, uint32_t index, bool no_int64_atomics = false, bool kernel_statistics = false);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  VkDevice handle() const { return device_; }
  VkPhysicalDevice physical() const { return physical_; }
  VkQueue queue() const { return queue_; }
  uint32_t queue_family() const { return queue_family_; }
  const DeviceInfo& info() const { return info_; }
  // The optional features actually enabled on this VkDevice (a subset of info().features).
  const DeviceFeatures& enabled() const { return enabled_; }
  // Timestamps work on the queue (timestampValidBits > 0 and a non-zero period).
  bool has_timestamps() const { return timestamp_valid_bits_ > 0 && info_.timestamp_period_ns > 0; }
  uint32_t timestamp_valid_bits() const { return timestamp_valid_bits_; }

  // The memory type index used for `kind` allocations, and whether it is host-visible (mappable).
  uint32_t memory_type(MemoryKind kind) const { return kind == MemoryKind::Host ? host_type_ : local_type_; }
  bool mappable(MemoryKind kind) const { return kind == MemoryKind::Host || local_mappable_; }
  // Size of the heap behind `kind`'s memory type.
  uint64_t heap_size(MemoryKind kind) const;
  // True when both kinds draw from the same heap (unified memory: lavapipe, integrated GPUs).
  bool kinds_share_heap() const { return local_heap_ == host_heap_; }

 private:
  VkDevice device_ = VK_NULL_HANDLE;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  uint32_t timestamp_valid_bits_ = 0;
  DeviceInfo info_;
  DeviceFeatures enabled_;
  uint32_t local_type_ = 0, host_type_ = 0, local_heap_ = 0, host_heap_ = 0;
  bool local_mappable_ = false;
};

}  // namespace tessera::vk
