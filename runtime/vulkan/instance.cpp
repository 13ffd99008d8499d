#include "runtime/vulkan/instance.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "format/error.h"
#include "runtime/vulkan/vk_common.h"

namespace tessera::vk {
namespace {

constexpr const char* kValidationLayer = "VK_LAYER_KHRONOS_validation";

VKAPI_ATTR VkBool32 VKAPI_CALL debug_callback(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                              VkDebugUtilsMessageTypeFlagsEXT,
                                              const VkDebugUtilsMessengerCallbackDataEXT* data, void*) {
  const char* level = severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT ? "error" : "warning";
  std::fprintf(stderr, "tessera: vulkan validation %s: %s\n", level, data->pMessage);
  return VK_FALSE;
}

bool want_validation(int validation) {
  if (validation >= 0) return validation == 1;
  if (const char* env = std::getenv("TESSERA_VK_VALIDATION")) return std::strcmp(env, "0") != 0;
#ifdef NDEBUG
  return false;
#else
  return true;
#endif
}

bool layer_installed(const char* name) {
  uint32_t n = 0;
  vkEnumerateInstanceLayerProperties(&n, nullptr);
  std::vector<VkLayerProperties> layers(n);
  vkEnumerateInstanceLayerProperties(&n, layers.data());
  for (const auto& l : layers)
    if (std::strcmp(l.layerName, name) == 0) return true;
  return false;
}

// Whether VK_NV_cooperative_matrix offers the one shape tessera's kernels use: 16 x 16 x 16, f16
// A and B, f32 C and D, subgroup scope (matmul.comp).
bool coop_matrix_16x16x16_f16(VkInstance instance, VkPhysicalDevice pd) {
  const auto get = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV>(
      vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV"));
  if (!get) return false;
  uint32_t n = 0;
  if (get(pd, &n, nullptr) != VK_SUCCESS || n == 0) return false;
  std::vector<VkCooperativeMatrixPropertiesNV> props(n);
  for (auto& p : props) p = vk_struct<VkCooperativeMatrixPropertiesNV>(VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV);
  if (get(pd, &n, props.data()) != VK_SUCCESS) return false;
  for (const auto& p : props)
    if (p.MSize == 16 && p.NSize == 16 && p.KSize == 16 && p.AType == VK_COMPONENT_TYPE_FLOAT16_NV &&
        p.BType == VK_COMPONENT_TYPE_FLOAT16_NV && p.CType == VK_COMPONENT_TYPE_FLOAT32_NV &&
        p.DType == VK_COMPONENT_TYPE_FLOAT32_NV && p.scope == VK_SCOPE_SUBGROUP_NV)
      return true;
  return false;
}

DeviceInfo query_device(VkInstance instance, VkPhysicalDevice pd, uint32_t index) {
  DeviceInfo info;
  info.index = index;

  uint32_t n_ext = 0;
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &n_ext, nullptr);
  std::vector<VkExtensionProperties> exts(n_ext);
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &n_ext, exts.data());
  for (const auto& e : exts) info.extensions.emplace_back(e.extensionName);

  VkPhysicalDeviceProperties base{};
  vkGetPhysicalDeviceProperties(pd, &base);
  info.api_version = base.apiVersion;
  const bool v12 = base.apiVersion >= VK_API_VERSION_1_2;
  const bool v13 = base.apiVersion >= VK_API_VERSION_1_3;
  const bool has_sg_control = v13 || info.has_extension(VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME);
  const bool has_int_dot = v13 || info.has_extension(VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME);

  // Properties (chained structs only where the device version or an extension defines them).
  auto props = vk_struct<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
  auto sg = vk_struct<VkPhysicalDeviceSubgroupProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES);
  auto driver = vk_struct<VkPhysicalDeviceDriverProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES);
  auto sgc = vk_struct<VkPhysicalDeviceSubgroupSizeControlProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES);
  auto dotp = vk_struct<VkPhysicalDeviceShaderIntegerDotProductProperties>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_PROPERTIES);
  props.pNext = &sg;
  void** tail = &sg.pNext;
  if (v12) { *tail = &driver; tail = &driver.pNext; }
  if (has_sg_control) { *tail = &sgc; tail = &sgc.pNext; }
  if (has_int_dot) { *tail = &dotp; tail = &dotp.pNext; }
  auto smb = vk_struct<VkPhysicalDeviceShaderSMBuiltinsPropertiesNV>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV);
  const bool has_sm = info.has_extension(VK_NV_SHADER_SM_BUILTINS_EXTENSION_NAME);
  if (has_sm) { *tail = &smb; tail = &smb.pNext; }
  vkGetPhysicalDeviceProperties2(pd, &props);
  info.sm_count = has_sm ? smb.shaderSMCount : 0;

  const VkPhysicalDeviceLimits& lim = props.properties.limits;
  info.name = props.properties.deviceName;
  info.type = props.properties.deviceType;
  info.driver_version = props.properties.driverVersion;
  info.vendor_id = props.properties.vendorID;
  info.device_id = props.properties.deviceID;
  std::memcpy(info.pipeline_cache_uuid.data(), props.properties.pipelineCacheUUID, VK_UUID_SIZE);
  if (v12) {
    info.driver_name = driver.driverName;
    info.driver_info = driver.driverInfo;
  }
  info.subgroup_size = sg.subgroupSize;
  info.min_subgroup_size = has_sg_control ? sgc.minSubgroupSize : sg.subgroupSize;
  info.max_subgroup_size = has_sg_control ? sgc.maxSubgroupSize : sg.subgroupSize;
  info.max_storage_buffer_range = lim.maxStorageBufferRange;
  info.min_storage_buffer_offset_alignment = lim.minStorageBufferOffsetAlignment;
  info.max_compute_workgroup_invocations = lim.maxComputeWorkGroupInvocations;
  info.max_compute_shared_memory = lim.maxComputeSharedMemorySize;
  for (int i = 0; i < 3; ++i) info.max_workgroup_count[i] = lim.maxComputeWorkGroupCount[i];
  info.max_push_constants_size = lim.maxPushConstantsSize;
  info.timestamp_period_ns = lim.timestampComputeAndGraphics ? lim.timestampPeriod : 0.f;
  info.max_memory_allocation_size = 1ull << 30;  // Vulkan 1.1 guarantees at least 1 GiB
  {
    auto p2 = vk_struct<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
    auto m3 = vk_struct<VkPhysicalDeviceMaintenance3Properties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES);
    p2.pNext = &m3;
    vkGetPhysicalDeviceProperties2(pd, &p2);
    info.max_memory_allocation_size = m3.maxMemoryAllocationSize;
  }

  // Features.
  auto feats = vk_struct<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
  auto f16s = vk_struct<VkPhysicalDevice16BitStorageFeatures>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES);
  auto f12 = vk_struct<VkPhysicalDeviceVulkan12Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES);
  auto fsgc = vk_struct<VkPhysicalDeviceSubgroupSizeControlFeatures>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES);
  auto fdot = vk_struct<VkPhysicalDeviceShaderIntegerDotProductFeatures>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES);
  auto fexe = vk_struct<VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR);
  const bool has_exe = info.has_extension(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
  auto fclk = vk_struct<VkPhysicalDeviceShaderClockFeaturesKHR>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CLOCK_FEATURES_KHR);
  const bool has_clock = info.has_extension(VK_KHR_SHADER_CLOCK_EXTENSION_NAME);
  auto fcm = vk_struct<VkPhysicalDeviceCooperativeMatrixFeaturesNV>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV);
  const bool has_coop_nv = info.has_extension(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
  feats.pNext = &f16s;
  tail = &f16s.pNext;
  if (v12) { *tail = &f12; tail = &f12.pNext; }
  if (has_sg_control) { *tail = &fsgc; tail = &fsgc.pNext; }
  if (has_int_dot) { *tail = &fdot; tail = &fdot.pNext; }
  if (has_exe) { *tail = &fexe; tail = &fexe.pNext; }
  if (has_clock) { *tail = &fclk; tail = &fclk.pNext; }
  if (has_coop_nv) { *tail = &fcm; tail = &fcm.pNext; }
  vkGetPhysicalDeviceFeatures2(pd, &feats);

  DeviceFeatures& f = info.features;
  f.storage_buffer_16bit = f16s.storageBuffer16BitAccess;
  f.shader_int16 = feats.features.shaderInt16;
  f.shader_int64 = feats.features.shaderInt64;
  if (v12) {
    f.shader_float16 = f12.shaderFloat16;
    f.shader_int8 = f12.shaderInt8;
    f.storage_buffer_8bit = f12.storageBuffer8BitAccess;
    f.host_query_reset = f12.hostQueryReset;
    f.buffer_int64_atomics = f12.shaderBufferInt64Atomics;
  }
  if (has_sg_control) {
    f.subgroup_size_control = fsgc.subgroupSizeControl &&
                              (sgc.requiredSubgroupSizeStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0;
    f.compute_full_subgroups = fsgc.computeFullSubgroups;
  }
  if (has_int_dot) {
    f.integer_dot_product = fdot.shaderIntegerDotProduct;
    f.int_dot_4x8_accelerated = fdot.shaderIntegerDotProduct && dotp.integerDotProduct4x8BitPackedSignedAccelerated;
  }
  f.subgroup_arithmetic = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                          (sg.supportedOperations & VK_SUBGROUP_FEATURE_BASIC_BIT) &&
                          (sg.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT);
  f.subgroup_shuffle = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                       (sg.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT);
  f.pipeline_statistics = has_exe && fexe.pipelineExecutableInfo;
  f.device_clock = has_clock && fclk.shaderDeviceClock;
  f.cooperative_matrix_khr = info.has_extension("VK_KHR_cooperative_matrix");
  f.cooperative_matrix_nv = has_coop_nv && fcm.cooperativeMatrix && coop_matrix_16x16x16_f16(instance, pd);

  // Memory.
  VkPhysicalDeviceMemoryProperties mem{};
  vkGetPhysicalDeviceMemoryProperties(pd, &mem);
  info.heaps.resize(mem.memoryHeapCount);
  for (uint32_t h = 0; h < mem.memoryHeapCount; ++h) {
    info.heaps[h].size = mem.memoryHeaps[h].size;
    info.heaps[h].device_local = (mem.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0;
  }
  bool any_device_local = false, all_device_local_mappable = true;
  for (uint32_t t = 0; t < mem.memoryTypeCount; ++t) {
    const VkMemoryPropertyFlags fl = mem.memoryTypes[t].propertyFlags;
    if (fl & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) info.heaps[mem.memoryTypes[t].heapIndex].host_visible = true;
    if (fl & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) {
      any_device_local = true;
      if (!(fl & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)) all_device_local_mappable = false;
    }
  }
  info.unified_memory = any_device_local && all_device_local_mappable;
  return info;
}

int type_rank(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 3;
    default: return 4;
  }
}

}  // namespace

const char* DeviceInfo::type_name() const {
  switch (type) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete GPU";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated GPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "CPU";
    default: return "other";
  }
}

std::string DeviceInfo::unsupported_reason() const {
  if (api_version < VK_API_VERSION_1_2)
    return cat("Vulkan ", version_string(api_version), " < 1.2 (tessera needs Vulkan 1.2)");
  if (!features.storage_buffer_16bit) return "no storageBuffer16BitAccess (16-bit storage is required)";
  if (max_compute_workgroup_invocations < 256)
    return cat("maxComputeWorkGroupInvocations ", max_compute_workgroup_invocations, " < 256");
  if (max_push_constants_size < 128) return cat("maxPushConstantsSize ", max_push_constants_size, " < 128");
  return {};
}

bool DeviceInfo::has_extension(const char* ext) const {
  return std::find(extensions.begin(), extensions.end(), ext) != extensions.end();
}

uint64_t DeviceInfo::device_local_bytes() const {
  uint64_t best = 0;
  for (const auto& h : heaps)
    if (h.device_local) best = std::max(best, h.size);
  return best;
}

Instance::Instance(int validation) {
  uint32_t loader_version = VK_API_VERSION_1_0;
  auto enumerate_version =
      reinterpret_cast<PFN_vkEnumerateInstanceVersion>(vkGetInstanceProcAddr(nullptr, "vkEnumerateInstanceVersion"));
  if (enumerate_version) enumerate_version(&loader_version);
  if (loader_version < VK_API_VERSION_1_2)
    runtime_error("Vulkan: the installed loader supports Vulkan ", version_string(loader_version),
                  ", tessera needs 1.2 or newer");

  std::vector<const char*> layers, extensions;
  const bool validate = want_validation(validation) && layer_installed(kValidationLayer);
  if (validate) {
    layers.push_back(kValidationLayer);
    extensions.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
  }

  auto app = vk_struct<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
  app.pApplicationName = "tessera";
  app.pEngineName = "tessera";
  app.apiVersion = VK_API_VERSION_1_3;  // the highest version tessera uses; devices may be lower
  auto ci = vk_struct<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
  ci.pApplicationInfo = &app;
  ci.enabledLayerCount = static_cast<uint32_t>(layers.size());
  ci.ppEnabledLayerNames = layers.data();
  ci.enabledExtensionCount = static_cast<uint32_t>(extensions.size());
  ci.ppEnabledExtensionNames = extensions.data();
  VkResult r = vkCreateInstance(&ci, nullptr, &instance_);
  if (r == VK_ERROR_INCOMPATIBLE_DRIVER)
    runtime_error("Vulkan: no compatible Vulkan driver found (vkCreateInstance: VK_ERROR_INCOMPATIBLE_DRIVER); "
                  "install a Vulkan ICD or set VK_DRIVER_FILES");
  check(r, "vkCreateInstance");

  if (validate) {
    auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkCreateDebugUtilsMessengerEXT"));
    if (create) {
      auto mi = vk_struct<VkDebugUtilsMessengerCreateInfoEXT>(VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT);
      mi.messageSeverity =
          VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
      mi.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
      mi.pfnUserCallback = debug_callback;
      create(instance_, &mi, nullptr, &messenger_);
    }
  }

  uint32_t n = 0;
  check(vkEnumeratePhysicalDevices(instance_, &n, nullptr), "vkEnumeratePhysicalDevices");
  physical_.resize(n);
  check(vkEnumeratePhysicalDevices(instance_, &n, physical_.data()), "vkEnumeratePhysicalDevices");
  physical_.resize(n);
  for (uint32_t i = 0; i < n; ++i) devices_.push_back(query_device(instance_, physical_[i], i));
}

Instance::~Instance() {
  if (messenger_ != VK_NULL_HANDLE) {
    auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
    if (destroy) destroy(instance_, messenger_, nullptr);
  }
  if (instance_ != VK_NULL_HANDLE) vkDestroyInstance(instance_, nullptr);
}

uint32_t Instance::choose_device(int requested) const {
  if (devices_.empty()) runtime_error("Vulkan: no Vulkan devices found (the driver enumerated none)");
  if (requested >= 0) {
    if (static_cast<size_t>(requested) >= devices_.size())
      usage_error("--device ", requested, ": only ", devices_.size(), " Vulkan device(s) exist (0..",
                  devices_.size() - 1, "); see `tessera devices`");
    const DeviceInfo& d = devices_[requested];
    std::string why = d.unsupported_reason();
    if (!why.empty()) runtime_error("Vulkan device ", requested, " (", d.name, ") cannot run tessera: ", why);
    return static_cast<uint32_t>(requested);
  }
  int best = -1;
  for (const DeviceInfo& d : devices_) {
    if (!d.unsupported_reason().empty()) continue;
    if (best < 0 || type_rank(d.type) < type_rank(devices_[best].type)) best = static_cast<int>(d.index);
  }
  if (best < 0) {
    std::string list;
    for (const DeviceInfo& d : devices_) list += cat("\n  ", d.index, ": ", d.name, ": ", d.unsupported_reason());
    runtime_error("Vulkan: no device can run tessera:", list);
  }
  return static_cast<uint32_t>(best);
}

}  // namespace tessera::vk
