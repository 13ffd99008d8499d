#include "runtime/vulkan/vk_common.h"

#include <cstdio>

#include "format/error.h"

namespace tessera::vk {

const char* result_name(VkResult r) {
  switch (r) {
#define TS_CASE(x) \
  case x:          \
    return #x;
    TS_CASE(VK_SUCCESS)
    TS_CASE(VK_NOT_READY)
    TS_CASE(VK_TIMEOUT)
    TS_CASE(VK_EVENT_SET)
    TS_CASE(VK_EVENT_RESET)
    TS_CASE(VK_INCOMPLETE)
    TS_CASE(VK_ERROR_OUT_OF_HOST_MEMORY)
    TS_CASE(VK_ERROR_OUT_OF_DEVICE_MEMORY)
    TS_CASE(VK_ERROR_INITIALIZATION_FAILED)
    TS_CASE(VK_ERROR_DEVICE_LOST)
    TS_CASE(VK_ERROR_MEMORY_MAP_FAILED)
    TS_CASE(VK_ERROR_LAYER_NOT_PRESENT)
    TS_CASE(VK_ERROR_EXTENSION_NOT_PRESENT)
    TS_CASE(VK_ERROR_FEATURE_NOT_PRESENT)
    TS_CASE(VK_ERROR_INCOMPATIBLE_DRIVER)
    TS_CASE(VK_ERROR_TOO_MANY_OBJECTS)
    TS_CASE(VK_ERROR_FORMAT_NOT_SUPPORTED)
    TS_CASE(VK_ERROR_FRAGMENTED_POOL)
    TS_CASE(VK_ERROR_UNKNOWN)
    TS_CASE(VK_ERROR_OUT_OF_POOL_MEMORY)
    TS_CASE(VK_ERROR_INVALID_EXTERNAL_HANDLE)
    TS_CASE(VK_ERROR_FRAGMENTATION)
    TS_CASE(VK_PIPELINE_COMPILE_REQUIRED)
#undef TS_CASE
    default: {
      static thread_local char buf[32];
      std::snprintf(buf, sizeof buf, "VkResult(%d)", static_cast<int>(r));
      return buf;
    }
  }
}

void check(VkResult r, const char* what) {
  if (r != VK_SUCCESS) runtime_error("Vulkan: ", what, " failed: ", result_name(r));
}

std::string version_string(uint32_t v) {
  return cat(VK_API_VERSION_MAJOR(v), ".", VK_API_VERSION_MINOR(v), ".", VK_API_VERSION_PATCH(v));
}

std::string format_bytes(uint64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ull << 30));
  else if (bytes >= (1ull << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(1ull << 20));
  else if (bytes >= (1ull << 10))
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  return buf;
}

}  // namespace tessera::vk
