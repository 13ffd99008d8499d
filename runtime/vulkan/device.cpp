#include "runtime/vulkan/device.h"

#include <vector>

#include "format/error.h"
#include "runtime/vulkan/vk_common.h"

namespace tessera::vk {
namespace {

// The compute queue family: prefer one with timestamps; among those the first (usually the
// universal graphics+compute family, which every driver schedules well).
uint32_t pick_queue_family(VkPhysicalDevice pd, uint32_t& valid_bits) {
  uint32_t n = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, nullptr);
  std::vector<VkQueueFamilyProperties> fams(n);
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, fams.data());
  int best = -1;
  for (uint32_t i = 0; i < n; ++i) {
    if (!(fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT) || fams[i].queueCount == 0) continue;
    if (best < 0 || (fams[best].timestampValidBits == 0 && fams[i].timestampValidBits > 0)) best = static_cast<int>(i);
  }
  if (best < 0) runtime_error("Vulkan: the device has no queue family with compute support");
  valid_bits = fams[best].timestampValidBits;
  return static_cast<uint32_t>(best);
}

// Device-local: the largest device-local heap, preferring a type that is not host-visible (real
// VRAM rather than a BAR window), falling back to any device-local type.
// Host: host-visible + coherent, preferring host-cached (fast read-back), then non-device-local.
void pick_memory_types(VkPhysicalDevice pd, uint32_t& local, bool& local_mappable, uint32_t& local_heap,
                       uint32_t& host, uint32_t& host_heap) {
  VkPhysicalDeviceMemoryProperties mem{};
  vkGetPhysicalDeviceMemoryProperties(pd, &mem);
  int best_local = -1;
  auto local_score = [&](uint32_t t) {
    const VkMemoryType& mt = mem.memoryTypes[t];
    uint64_t score = mem.memoryHeaps[mt.heapIndex].size;
    if (!(mt.propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)) score += 1;  // tie-break
    return score;
  };
  for (uint32_t t = 0; t < mem.memoryTypeCount; ++t) {
    if (!(mem.memoryTypes[t].propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)) continue;
    if (best_local < 0 || local_score(t) > local_score(best_local)) best_local = static_cast<int>(t);
  }
  int best_host = -1;
  auto host_score = [&](uint32_t t) {
    const VkMemoryPropertyFlags f = mem.memoryTypes[t].propertyFlags;
    return ((f & VK_MEMORY_PROPERTY_HOST_CACHED_BIT) ? 2 : 0) + ((f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) ? 0 : 1);
  };
  const VkMemoryPropertyFlags host_need = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  for (uint32_t t = 0; t < mem.memoryTypeCount; ++t) {
    if ((mem.memoryTypes[t].propertyFlags & host_need) != host_need) continue;
    if (best_host < 0 || host_score(t) > host_score(best_host)) best_host = static_cast<int>(t);
  }
  if (best_host < 0) runtime_error("Vulkan: the device has no host-visible coherent memory type");
  if (best_local < 0) best_local = best_host;  // no device-local type at all: use host memory
  local = static_cast<uint32_t>(best_local);
  host = static_cast<uint32_t>(best_host);
  local_heap = mem.memoryTypes[local].heapIndex;
  host_heap = mem.memoryTypes[host].heapIndex;
  const VkMemoryPropertyFlags lf = mem.memoryTypes[local].propertyFlags;
  local_mappable = (lf & host_need) == host_need;
}

}  // namespace

Device::Device(const Instance& instance, uint32_t index, bool no_int64_atomics, bool kernel_statistics) {
  if (index >= instance.devices().size())
    usage_error("Vulkan device ", index, " does not exist (", instance.devices().size(), " device(s))");
  info_ = instance.devices()[index];
  physical_ = instance.physical_device(index);
  if (std::string why = info_.unsupported_reason(); !why.empty())
    runtime_error("Vulkan device ", index, " (", info_.name, ") cannot run tessera: ", why);

  queue_family_ = pick_queue_family(physical_, timestamp_valid_bits_);
  pick_memory_types(physical_, local_type_, local_mappable_, local_heap_, host_type_, host_heap_);

  const DeviceFeatures& have = info_.features;
  const bool v13 = info_.api_version >= VK_API_VERSION_1_3;
  std::vector<const char*> extensions;

  auto feats = vk_struct<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
  feats.features.shaderInt16 = have.shader_int16;
  feats.features.shaderInt64 = have.shader_int64;
  auto f11 = vk_struct<VkPhysicalDeviceVulkan11Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES);
  f11.storageBuffer16BitAccess = VK_TRUE;
  auto f12 = vk_struct<VkPhysicalDeviceVulkan12Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES);
  f12.shaderFloat16 = have.shader_float16;
  f12.shaderInt8 = have.shader_int8;
  f12.storageBuffer8BitAccess = have.storage_buffer_8bit;
  f12.hostQueryReset = have.host_query_reset;
  const bool int64_atomics = have.buffer_int64_atomics && have.shader_int64 && !no_int64_atomics;
  f12.shaderBufferInt64Atomics = int64_atomics;
  auto fsgc = vk_struct<VkPhysicalDeviceSubgroupSizeControlFeatures>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES);
  fsgc.subgroupSizeControl = have.subgroup_size_control;
  fsgc.computeFullSubgroups = have.compute_full_subgroups;
  auto fdot = vk_struct<VkPhysicalDeviceShaderIntegerDotProductFeatures>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES);
  fdot.shaderIntegerDotProduct = have.integer_dot_product;

  feats.pNext = &f11;
  f11.pNext = &f12;
  void** tail = &f12.pNext;
  if (have.subgroup_size_control || have.compute_full_subgroups) {
    if (!v13) extensions.push_back(VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME);
    *tail = &fsgc;
    tail = &fsgc.pNext;
  }
  if (have.integer_dot_product) {
    if (!v13) extensions.push_back(VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME);
    *tail = &fdot;
    tail = &fdot.pNext;
  }
  auto fexe = vk_struct<VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR);
  const bool statistics = kernel_statistics && have.pipeline_statistics;
  if (statistics) {
    extensions.push_back(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
    fexe.pipelineExecutableInfo = VK_TRUE;
    *tail = &fexe;
    tail = &fexe.pNext;
  }

  auto fclk = vk_struct<VkPhysicalDeviceShaderClockFeaturesKHR>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CLOCK_FEATURES_KHR);
  if (have.device_clock) {
    extensions.push_back(VK_KHR_SHADER_CLOCK_EXTENSION_NAME);
    fclk.shaderDeviceClock = VK_TRUE;
    *tail = &fclk;
    tail = &fclk.pNext;
  }

  auto fcm = vk_struct<VkPhysicalDeviceCooperativeMatrixFeaturesNV>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV);
  if (have.cooperative_matrix_nv) {  // matmul.comp (f16 arithmetic too: shaderFloat16)
    extensions.push_back(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
    fcm.cooperativeMatrix = VK_TRUE;
    *tail = &fcm;
    tail = &fcm.pNext;
  }

  const float priority = 1.0f;
  auto qci = vk_struct<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
  qci.queueFamilyIndex = queue_family_;
  qci.queueCount = 1;
  qci.pQueuePriorities = &priority;
  auto dci = vk_struct<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
  dci.pNext = &feats;
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  dci.enabledExtensionCount = static_cast<uint32_t>(extensions.size());
  dci.ppEnabledExtensionNames = extensions.data();
  check(vkCreateDevice(physical_, &dci, nullptr, &device_), "vkCreateDevice");
  vkGetDeviceQueue(device_, queue_family_, 0, &queue_);

  enabled_ = have;
  enabled_.buffer_int64_atomics = int64_atomics;
  enabled_.pipeline_statistics = statistics;
  enabled_.cooperative_matrix_khr = false;  // not enabled: glslang 12 has no GL_KHR_cooperative_matrix
}

Device::~Device() {
  if (device_ != VK_NULL_HANDLE) {
    vkDeviceWaitIdle(device_);
    vkDestroyDevice(device_, nullptr);
  }
}

uint64_t Device::heap_size(MemoryKind kind) const {
  const uint32_t heap = kind == MemoryKind::Host ? host_heap_ : local_heap_;
  return heap < info_.heaps.size() ? info_.heaps[heap].size : 0;
}

}  // namespace tessera::vk
