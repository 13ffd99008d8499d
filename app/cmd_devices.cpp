// `tessera devices`: every Vulkan device with what tessera needs and uses. Logic: runtime/vulkan.
#include <cstdio>
#include <memory>

#include "app/cli.h"
#include "format/error.h"
#include "runtime/vulkan/instance.h"
#include "runtime/vulkan/vk_common.h"

namespace tessera::app {
namespace {

struct DevicesOptions {
  int device = -1;  // only this one (-1: all)
};

const char* yes_no(bool b) { return b ? "yes" : "no"; }

void print_device(const vk::DeviceInfo& d, bool chosen) {
  const std::string why = d.unsupported_reason();
  std::printf("device %u: %s%s\n", d.index, d.name.c_str(), chosen ? "  [default]" : "");
  std::printf("  type                     %s\n", d.type_name());
  std::printf("  vulkan                   %s\n", vk::version_string(d.api_version).c_str());
  std::printf("  driver                   %s %s\n", d.driver_name.c_str(), d.driver_info.c_str());
  std::printf("  vendor / device id       0x%04x / 0x%04x\n", d.vendor_id, d.device_id);
  for (size_t h = 0; h < d.heaps.size(); ++h)
    std::printf("  memory heap %zu            %s%s%s\n", h, vk::format_bytes(d.heaps[h].size).c_str(),
                d.heaps[h].device_local ? ", device-local" : "", d.heaps[h].host_visible ? ", host-visible" : "");
  std::printf("  unified memory           %s\n", yes_no(d.unified_memory));
  std::printf("  subgroup size            %u (min %u, max %u)\n", d.subgroup_size, d.min_subgroup_size,
              d.max_subgroup_size);
  std::printf("  maxStorageBufferRange    %s\n", vk::format_bytes(d.max_storage_buffer_range).c_str());
  std::printf("  maxMemoryAllocationSize  %s\n", vk::format_bytes(d.max_memory_allocation_size).c_str());
  std::printf("  shared memory / group    %s\n", vk::format_bytes(d.max_compute_shared_memory).c_str());
  if (d.sm_count) std::printf("  SMs                      %u\n", d.sm_count);
  const vk::DeviceFeatures& f = d.features;
  std::printf("  16-bit storage           %s (required)\n", yes_no(f.storage_buffer_16bit));
  std::printf("  subgroup arithmetic      %s (used when present)\n", yes_no(f.subgroup_arithmetic));
  std::printf("  shaderFloat16            %s (used when present)\n", yes_no(f.shader_float16));
  std::printf("  int8 storage / arith     %s / %s (used when present)\n", yes_no(f.storage_buffer_8bit),
              yes_no(f.shader_int8));
  std::printf("  integer dot product      %s%s (used when present)\n", yes_no(f.integer_dot_product),
              f.int_dot_4x8_accelerated ? ", 4x8 accelerated" : "");
  std::printf("  int64 buffer atomics     %s (used when present: router fold)\n",
              yes_no(f.buffer_int64_atomics && f.shader_int64));
  std::printf("  subgroup size control    %s%s (used when present)\n", yes_no(f.subgroup_size_control),
              f.compute_full_subgroups ? ", full subgroups" : "");
  // Used by the prefill's matmuls (shaders/matmul.comp, session 19) and attention (session 20),
  // and by the decode's attention past 6144 positions (session 26); below that the rows kernel wins.
  std::printf("  cooperative matrix       %s\n",
              f.cooperative_matrix_nv    ? "NV, 16x16x16 f16 (used: the prefill's matrix products and attention, the decode's long-context attention)"
              : f.cooperative_matrix_khr ? "KHR only (not used: glslang 12 compiles only the NV extension)"
                                         : "no (plain matvecs in the prefill)");
  std::printf("  timestamps               %s\n", d.timestamp_period_ns > 0 ? "yes" : "no");
  std::printf("  kernel statistics        %s (bench --kernel-stats)\n", yes_no(f.pipeline_statistics));
  std::printf("  device clock in shaders  %s (bench --tune gate_stats=1 timeline)\n", yes_no(f.device_clock));
  std::printf("  usable by tessera        %s%s\n", why.empty() ? "yes" : "no: ", why.c_str());
}

Action setup(CLI::App& sub, const Globals&) {
  auto opt = std::make_shared<DevicesOptions>();
  sub.add_option("--device", opt->device, "Show only device N")->check(CLI::NonNegativeNumber);
  return [opt]() -> int {
    vk::Instance instance;
    const auto& devices = instance.devices();
    if (devices.empty()) {
      std::printf("no Vulkan devices found\n");
      return 3;
    }
    int chosen = -1;
    try {
      chosen = static_cast<int>(instance.choose_device(-1));
    } catch (const Error&) {
      chosen = -1;  // no usable device: every entry below says why
    }
    if (opt->device >= 0) {
      if (static_cast<size_t>(opt->device) >= devices.size())
        usage_error("--device ", opt->device, ": only ", devices.size(), " Vulkan device(s) exist");
      print_device(devices[opt->device], opt->device == chosen);
      return 0;
    }
    for (size_t i = 0; i < devices.size(); ++i) {
      if (i) std::printf("\n");
      print_device(devices[i], static_cast<int>(i) == chosen);
    }
    return chosen >= 0 ? 0 : 3;
  };
}

CommandRegistrar reg("devices", "List Vulkan devices and the features tessera uses", &setup, 90);

}  // namespace
}  // namespace tessera::app
