// Small Vulkan helpers shared by runtime/vulkan: result checking and result names.
// Namespace tessera::vk holds the whole Vulkan runtime; see context.h for the overview.
#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>
#include <string>

namespace tessera::vk {

// A zero-initialized Vulkan struct with its sType set.
template <class T>
T vk_struct(VkStructureType type) {
  T v{};
  v.sType = type;
  return v;
}

// "VK_ERROR_OUT_OF_DEVICE_MEMORY" etc.; "VkResult(<n>)" for values it does not know.
const char* result_name(VkResult r);

// Throws Error(Runtime) "<what> failed: <result name>" unless r is VK_SUCCESS.
void check(VkResult r, const char* what);

// "1.3.239" from a VK_MAKE_API_VERSION value.
std::string version_string(uint32_t v);

// Bytes as "1.50 GiB" / "12.0 MiB" / "512 B" for messages and listings.
std::string format_bytes(uint64_t bytes);

}  // namespace tessera::vk
