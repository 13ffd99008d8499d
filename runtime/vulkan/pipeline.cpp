#include "runtime/vulkan/pipeline.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "format/error.h"
#include "runtime/vulkan/vk_common.h"

namespace tessera::vk {
namespace fs = std::filesystem;
namespace {

fs::path cache_file(const ShaderCache& shaders) { return shaders.dir() / ("pipelines-" + shaders.device_key() + ".bin"); }

// Pipeline-cache data is accepted only when its header matches this device: drivers are meant
// to check, but a stale file should never reach one that does not.
bool header_matches(const std::vector<char>& data, const DeviceInfo& info) {
  if (data.size() < 16 + VK_UUID_SIZE) return false;
  uint32_t header[4];
  std::memcpy(header, data.data(), sizeof header);
  return header[1] == VK_PIPELINE_CACHE_HEADER_VERSION_ONE && header[2] == info.vendor_id &&
         header[3] == info.device_id && std::memcmp(data.data() + 16, info.pipeline_cache_uuid.data(), VK_UUID_SIZE) == 0;
}

// The statistics of the compute executable of `pipeline`, created with
// VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR on a device with the extension enabled; empty when
// the driver returns none.
std::vector<KernelStatistic> read_statistics(VkDevice device, VkPipeline pipeline) {
  auto props = reinterpret_cast<PFN_vkGetPipelineExecutablePropertiesKHR>(
      vkGetDeviceProcAddr(device, "vkGetPipelineExecutablePropertiesKHR"));
  auto get = reinterpret_cast<PFN_vkGetPipelineExecutableStatisticsKHR>(
      vkGetDeviceProcAddr(device, "vkGetPipelineExecutableStatisticsKHR"));
  if (props == nullptr || get == nullptr) return {};
  auto pinfo = vk_struct<VkPipelineInfoKHR>(VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR);
  pinfo.pipeline = pipeline;
  uint32_t n_exe = 0;
  if (props(device, &pinfo, &n_exe, nullptr) != VK_SUCCESS || n_exe == 0) return {};
  auto info = vk_struct<VkPipelineExecutableInfoKHR>(VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR);
  info.pipeline = pipeline;
  info.executableIndex = 0;  // a compute pipeline's one executable
  uint32_t n = 0;
  if (get(device, &info, &n, nullptr) != VK_SUCCESS) return {};
  std::vector<VkPipelineExecutableStatisticKHR> raw(
      n, vk_struct<VkPipelineExecutableStatisticKHR>(VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR));
  if (get(device, &info, &n, raw.data()) != VK_SUCCESS) return {};
  std::vector<KernelStatistic> out;
  for (uint32_t i = 0; i < n; ++i)
    out.push_back({raw[i].name, statistic_text(raw[i].format, raw[i].value)});
  return out;
}

}  // namespace

std::string statistic_text(VkPipelineExecutableStatisticFormatKHR format, const VkPipelineExecutableStatisticValueKHR& v) {
  switch (format) {
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: return v.b32 ? "true" : "false";
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: return std::to_string(v.i64);
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: return std::to_string(v.u64);
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: return cat(v.f64);
    default: return cat("? (format ", uint32_t(format), ")");
  }
}

Pipeline::Pipeline(const Device& device, const PipelineDesc& desc, const std::vector<uint32_t>& spirv,
                   VkPipelineCache cache)
    : device_(device.handle()),
      num_buffers_(desc.num_buffers),
      push_bytes_(desc.push_bytes),
      timeline_(desc.timeline),
      name_(desc.name) {
  if (desc.push_bytes % 4 != 0 || desc.push_bytes > device.info().max_push_constants_size)
    runtime_error("pipeline ", desc.name, ": push-constant size ", desc.push_bytes, " is not a multiple of 4 <= ",
                  device.info().max_push_constants_size);
  const uint32_t n_bindings = desc.num_buffers + (desc.timeline ? 1 : 0);
  std::vector<VkDescriptorSetLayoutBinding> bindings(n_bindings);
  for (uint32_t i = 0; i < n_bindings; ++i) {
    bindings[i].binding = i;
    bindings[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    bindings[i].descriptorCount = 1;
    bindings[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
  }
  auto dl = vk_struct<VkDescriptorSetLayoutCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO);
  dl.bindingCount = n_bindings;
  dl.pBindings = bindings.data();
  check(vkCreateDescriptorSetLayout(device_, &dl, nullptr, &set_layout_), "vkCreateDescriptorSetLayout");

  VkPushConstantRange pc{VK_SHADER_STAGE_COMPUTE_BIT, 0, desc.push_bytes};
  auto pl = vk_struct<VkPipelineLayoutCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO);
  pl.setLayoutCount = 1;
  pl.pSetLayouts = &set_layout_;
  pl.pushConstantRangeCount = desc.push_bytes ? 1 : 0;
  pl.pPushConstantRanges = &pc;
  check(vkCreatePipelineLayout(device_, &pl, nullptr, &layout_), "vkCreatePipelineLayout");

  auto sm = vk_struct<VkShaderModuleCreateInfo>(VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO);
  sm.codeSize = spirv.size() * 4;
  sm.pCode = spirv.data();
  VkShaderModule module = VK_NULL_HANDLE;
  check(vkCreateShaderModule(device_, &sm, nullptr, &module), "vkCreateShaderModule");

  auto ci = vk_struct<VkComputePipelineCreateInfo>(VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO);
  ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = module;
  ci.stage.pName = "main";
  auto req = vk_struct<VkPipelineShaderStageRequiredSubgroupSizeCreateInfo>(
      VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO);
  const DeviceFeatures& f = device.enabled();
  if (desc.full_subgroups && f.subgroup_size_control) {
    req.requiredSubgroupSize = device.info().subgroup_size;
    ci.stage.pNext = &req;
    if (f.compute_full_subgroups) ci.stage.flags |= VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT;
  }
  ci.layout = layout_;
  if (f.pipeline_statistics) ci.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
  const VkResult r = vkCreateComputePipelines(device_, cache, 1, &ci, nullptr, &pipeline_);
  vkDestroyShaderModule(device_, module, nullptr);
  if (r != VK_SUCCESS) runtime_error("Vulkan: creating pipeline ", desc.name, " failed: ", result_name(r));
  if (f.pipeline_statistics) statistics_ = read_statistics(device_, pipeline_);
}

Pipeline::~Pipeline() {
  if (pipeline_) vkDestroyPipeline(device_, pipeline_, nullptr);
  if (layout_) vkDestroyPipelineLayout(device_, layout_, nullptr);
  if (set_layout_) vkDestroyDescriptorSetLayout(device_, set_layout_, nullptr);
}

PipelineLibrary::PipelineLibrary(const Device& device, ShaderCache& shaders, bool no_subgroup_ops)
    : device_(device), shaders_(shaders), no_subgroup_ops_(no_subgroup_ops) {
  std::vector<char> data;
  if (std::ifstream in(cache_file(shaders), std::ios::binary); in)
    data.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (!header_matches(data, device.info())) data.clear();
  auto ci = vk_struct<VkPipelineCacheCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO);
  ci.initialDataSize = data.size();
  ci.pInitialData = data.empty() ? nullptr : data.data();
  if (vkCreatePipelineCache(device.handle(), &ci, nullptr, &cache_) != VK_SUCCESS) {
    ci.initialDataSize = 0;  // a driver that rejects the stored data: start empty
    ci.pInitialData = nullptr;
    check(vkCreatePipelineCache(device.handle(), &ci, nullptr, &cache_), "vkCreatePipelineCache");
  }
}

PipelineLibrary::~PipelineLibrary() {
  save();
  pipelines_.clear();
  vkDestroyPipelineCache(device_.handle(), cache_, nullptr);
}

void PipelineLibrary::save() {
  size_t size = 0;
  if (vkGetPipelineCacheData(device_.handle(), cache_, &size, nullptr) != VK_SUCCESS || size == 0) return;
  std::vector<char> data(size);
  if (vkGetPipelineCacheData(device_.handle(), cache_, &size, data.data()) != VK_SUCCESS) return;
  ShaderCache::write_file_atomic(cache_file(shaders_), data.data(), size);
}

ShaderDefines PipelineLibrary::device_defines() const {
  const DeviceFeatures& f = device_.enabled();
  return {
      {"SUBGROUP_SIZE", std::to_string(device_.info().subgroup_size)},
      {"USE_SUBGROUP", use_subgroup() ? "1" : "0"},
      {"HAS_FLOAT16", f.shader_float16 ? "1" : "0"},
      {"HAS_INT8", (f.shader_int8 && f.storage_buffer_8bit) ? "1" : "0"},
      {"HAS_INT_DOT", f.integer_dot_product ? "1" : "0"},
  };
}

void PipelineLibrary::set_timeline(bool on) {
  if (on && !device_.enabled().device_clock)
    runtime_error("timeline: ", device_.info().name, " has no device clock in shaders (VK_KHR_shader_clock shaderDeviceClock)");
  timeline_ = on;
}

const Pipeline& PipelineLibrary::get(const PipelineDesc& desc_in) {
  PipelineDesc desc = desc_in;
  desc.timeline = timeline_;
  ShaderDefines defines = device_defines();
  for (const auto& [k, v] : global_defines_) defines[k] = v;
  for (const auto& [k, v] : desc.defines) defines[k] = v;
  if (desc.timeline) {
    defines["TS_TIMELINE"] = "1";
    defines["TS_TIMELINE_BINDING"] = std::to_string(desc.num_buffers);
  }
  std::string key = desc.file;
  for (const auto& [k, v] : defines) key += cat(";", k, "=", v);
  key += cat(";nb=", desc.num_buffers, ";pc=", desc.push_bytes, ";fs=", desc.full_subgroups);
  auto it = pipelines_.find(key);
  if (it != pipelines_.end()) return *it->second;
  const std::vector<uint32_t> code = shaders_.spirv(desc.file, defines);
  auto p = std::make_unique<Pipeline>(device_, desc, code, cache_);
  const Pipeline& ref = *p;
  pipelines_.emplace(std::move(key), std::move(p));
  return ref;
}

std::vector<const Pipeline*> PipelineLibrary::all() const {
  std::vector<const Pipeline*> out;
  for (const auto& [key, p] : pipelines_) out.push_back(p.get());
  std::sort(out.begin(), out.end(), [](const Pipeline* a, const Pipeline* b) { return a->name() < b->name(); });
  return out;
}

}  // namespace tessera::vk
