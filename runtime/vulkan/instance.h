// Instance: owns the VkInstance (and, in Debug builds or with TESSERA_VK_VALIDATION=1, the
// Khronos validation layer and a debug messenger printing to stderr). On creation it queries
// every physical device once into a DeviceInfo: what `tessera devices` prints and what the runtime
// uses to choose kernels (subgroup size, limits, optional features).
#pragma once
#include <vulkan/vulkan.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::vk {

// Optional and required device capabilities tessera looks at.
struct DeviceFeatures {
  bool storage_buffer_16bit = false;  // REQUIRED (storageBuffer16BitAccess)
  bool shader_float16 = false;        // used when present
  bool shader_int16 = false;          // used when present
  bool shader_int64 = false;          // used when present
  bool buffer_int64_atomics = false;  // shaderBufferInt64Atomics; used when present (router fold)
  bool storage_buffer_8bit = false;   // used when present
  bool shader_int8 = false;           // used when present
  bool integer_dot_product = false;   // shaderIntegerDotProduct; used when present
  bool int_dot_4x8_accelerated = false;  // packed 4x8-bit signed dot product runs in hardware
  bool subgroup_size_control = false;    // used when present (fixes the compute subgroup size)
  bool compute_full_subgroups = false;
  bool subgroup_arithmetic = false;  // subgroupAdd etc. in compute; else shared-memory reductions
  bool subgroup_shuffle = false;     // subgroupShuffleXor in compute (the prefill attention on tensor cores)
  bool cooperative_matrix_khr = false;  // VK_KHR_cooperative_matrix extension present
  bool cooperative_matrix_nv = false;   // VK_NV_cooperative_matrix with 16x16x16 f16 -> f32 products (used when present)
  bool host_query_reset = false;
  bool pipeline_statistics = false;  // VK_KHR_pipeline_executable_properties; enabled on request
  bool device_clock = false;  // VK_KHR_shader_clock shaderDeviceClock (clockRealtimeEXT); used when present
                              // (the early start's trace, GpuModelOptions::gate_stats)
                                     // (ContextOptions::kernel_statistics): the driver's per-kernel
                                     // statistics (registers, shared memory, ...) for bench
};

struct MemoryHeapInfo {
  uint64_t size = 0;
  bool device_local = false;
  bool host_visible = false;  // some memory type of this heap is host-visible
};

// Everything known about one physical device.
struct DeviceInfo {
  uint32_t index = 0;  // position in vkEnumeratePhysicalDevices (the --device number)
  std::string name;
  VkPhysicalDeviceType type = VK_PHYSICAL_DEVICE_TYPE_OTHER;
  uint32_t api_version = 0;
  uint32_t driver_version = 0;
  uint32_t vendor_id = 0, device_id = 0;
  std::string driver_name;  // "NVIDIA", "llvmpipe"
  std::string driver_info;  // "580.159", "Mesa 22.3.6 (LLVM 15.0.6)"
  std::array<uint8_t, VK_UUID_SIZE> pipeline_cache_uuid{};
  std::vector<MemoryHeapInfo> heaps;
  bool unified_memory = false;  // every device-local memory type is also host-visible (CPU / iGPU)
  uint32_t subgroup_size = 0, min_subgroup_size = 0, max_subgroup_size = 0;
  uint64_t max_storage_buffer_range = 0;
  uint64_t max_memory_allocation_size = 0;
  uint64_t min_storage_buffer_offset_alignment = 0;
  uint32_t max_compute_workgroup_invocations = 0;
  uint32_t max_compute_shared_memory = 0;
  std::array<uint32_t, 3> max_workgroup_count{};
  uint32_t max_push_constants_size = 0;
  uint32_t sm_count = 0;  // streaming multiprocessors (VK_NV_shader_sm_builtins), 0 where unknown
  float timestamp_period_ns = 0;  // ns per timestamp tick
  DeviceFeatures features;
  std::vector<std::string> extensions;  // device extensions the driver offers

  const char* type_name() const;  // "discrete GPU", "CPU", ...
  // Empty when tessera can run on the device, else why not ("Vulkan 1.1.0 < 1.2", ...).
  std::string unsupported_reason() const;
  bool has_extension(const char* name) const;
  // Size of the largest device-local heap.
  uint64_t device_local_bytes() const;
};

class Instance {
 public:
  // Creates a Vulkan >= 1.2 instance. validation: -1 = default (Debug builds or env
  // TESSERA_VK_VALIDATION=1; enabled only if the layer is installed), 0 = off, 1 = on if installed.
  // Throws Error(Runtime) when no Vulkan loader/driver is usable, naming what failed.
  explicit Instance(int validation = -1);
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  VkInstance handle() const { return instance_; }
  const std::vector<DeviceInfo>& devices() const { return devices_; }
  VkPhysicalDevice physical_device(uint32_t index) const { return physical_[index]; }
  bool validation_enabled() const { return messenger_ != VK_NULL_HANDLE; }

  // The --device choice: `requested` >= 0 picks that index (Error(Usage) if out of range,
  // Error(Runtime) if unsupported, naming the reason); -1 picks the first supported device,
  // preferring discrete > integrated > virtual > CPU. Throws when none is usable, listing why.
  uint32_t choose_device(int requested) const;

 private:
  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  std::vector<VkPhysicalDevice> physical_;
  std::vector<DeviceInfo> devices_;
};

}  // namespace tessera::vk
