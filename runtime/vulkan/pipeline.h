// Compute pipelines.
//  - Pipeline owns one VkPipeline with its VkPipelineLayout and VkDescriptorSetLayout:
//    set 0 = `num_buffers` storage buffers at bindings 0..n-1, plus `push_bytes` of push constants.
//  - PipelineLibrary owns every Pipeline created on a device (deduplicated by file + defines) and
//    the VkPipelineCache, loaded from and saved to <cache dir>/pipelines-<device key>.bin.
//    It adds the device defines to every shader (see device_defines()).
//  - Timeline mode (PipelineLibrary::set_timeline, bench --timeline): pipelines made while it is
//    on have one more binding, at index num_buffers, where the recorder binds this dispatch's
//    range of the timeline records (shaders/timeline.glsl, RecorderOptions::timeline).
#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/vulkan/device.h"
#include "runtime/vulkan/shader_cache.h"

namespace tessera::vk {

struct PipelineDesc {
  std::string name;             // label for profiles/errors, e.g. "matvec.q4_0"
  std::string file;             // embedded entry file, e.g. "matvec.comp"
  ShaderDefines defines;        // kernel defines; they override the device defines of the same name
  uint32_t num_buffers = 0;     // storage buffers at bindings 0..num_buffers-1
  uint32_t push_bytes = 0;      // push-constant block size (multiple of 4, <= 128)
  bool full_subgroups = false;  // the kernel indexes subgroups: ask for full subgroups of
                                // SUBGROUP_SIZE when the device allows fixing it
  bool timeline = false;        // set by PipelineLibrary in timeline mode: binding num_buffers
                                // takes the timeline records (TS_TIMELINE, TS_TIMELINE_BINDING)
};

// One statistic the driver reports for a compiled kernel (VK_KHR_pipeline_executable_properties),
// e.g. a register count; the names and meanings are the driver's.
struct KernelStatistic {
  std::string name;
  std::string value;  // as text (integer, float or true/false)
};

// A statistic's value as text: an integer, a float, true/false, or "? (format N)" for a format
// this build does not know.
std::string statistic_text(VkPipelineExecutableStatisticFormatKHR format, const VkPipelineExecutableStatisticValueKHR& v);

class Pipeline {
 public:
  Pipeline(const Device& device, const PipelineDesc& desc, const std::vector<uint32_t>& spirv, VkPipelineCache cache);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  VkPipeline handle() const { return pipeline_; }
  VkPipelineLayout layout() const { return layout_; }
  VkDescriptorSetLayout set_layout() const { return set_layout_; }
  uint32_t num_buffers() const { return num_buffers_; }
  uint32_t push_bytes() const { return push_bytes_; }
  // Whether the kernel writes timeline records (binding num_buffers(); PipelineDesc::timeline).
  bool timeline() const { return timeline_; }
  const std::string& name() const { return name_; }
  // The driver's statistics of the compute executable; empty unless the device has
  // enabled().pipeline_statistics (ContextOptions::kernel_statistics).
  const std::vector<KernelStatistic>& statistics() const { return statistics_; }

 private:
  std::vector<KernelStatistic> statistics_;
  VkDevice device_;
  VkPipeline pipeline_ = VK_NULL_HANDLE;
  VkPipelineLayout layout_ = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
  uint32_t num_buffers_, push_bytes_;
  bool timeline_;
  std::string name_;
};

class PipelineLibrary {
 public:
  // no_subgroup_ops: USE_SUBGROUP=0 even where the device has subgroup arithmetic.
  PipelineLibrary(const Device& device, ShaderCache& shaders, bool no_subgroup_ops = false);
  ~PipelineLibrary();  // saves the pipeline cache
  PipelineLibrary(const PipelineLibrary&) = delete;
  PipelineLibrary& operator=(const PipelineLibrary&) = delete;

  // The pipeline for desc (created on first request: SPIR-V from the ShaderCache, then
  // vkCreateComputePipelines through the pipeline cache). The reference stays valid for the
  // library's lifetime.
  const Pipeline& get(const PipelineDesc& desc);

  // Defines every shader gets: SUBGROUP_SIZE (device subgroup size), USE_SUBGROUP (1 when
  // subgroup arithmetic works in compute), HAS_FLOAT16, HAS_INT8, HAS_INT_DOT (0/1).
  // Kernel wrappers read USE_SUBGROUP / SUBGROUP_SIZE from here to size their workgroups.
  ShaderDefines device_defines() const;
  // A define every shader gets from now on, after the device's (a process-wide tuning knob, e.g.
  // GATE_BACKOFF from bench --tune gate_backoff); pipelines made before keep theirs.
  void set_global_define(const std::string& name, const std::string& value) { global_defines_[name] = value; }
  // Timeline mode: pipelines made from now on (until it is turned off) write the device-clock
  // timeline (shaders/timeline.glsl: TS_TIMELINE=1, TS_TIMELINE_BINDING = the desc's num_buffers,
  // one binding more). They are other pipelines than the same descs made without it. Throws
  // Error(Runtime) when the device has no shader device clock (DeviceFeatures::device_clock).
  void set_timeline(bool on);
  bool timeline() const { return timeline_; }
  // Timeline mode on (when `on`) for the scope's lifetime, then as it was before.
  class TimelineScope {
   public:
    TimelineScope(PipelineLibrary& lib, bool on) : lib_(lib), before_(lib.timeline()) {
      if (on) lib.set_timeline(true);
    }
    ~TimelineScope() { lib_.timeline_ = before_; }
    TimelineScope(const TimelineScope&) = delete;
    TimelineScope& operator=(const TimelineScope&) = delete;

   private:
    PipelineLibrary& lib_;
    bool before_;
  };
  // The value of USE_SUBGROUP in device_defines().
  bool use_subgroup() const { return device_.enabled().subgroup_arithmetic && !no_subgroup_ops_; }
  // Writes the VkPipelineCache to disk now (also done by the destructor).
  void save();
  size_t size() const { return pipelines_.size(); }
  // Every pipeline created so far, by name (for bench --kernel-stats).
  std::vector<const Pipeline*> all() const;

 private:
  const Device& device_;
  ShaderCache& shaders_;
  bool no_subgroup_ops_;
  VkPipelineCache cache_ = VK_NULL_HANDLE;
  std::map<std::string, std::unique_ptr<Pipeline>> pipelines_;
  ShaderDefines global_defines_;
  bool timeline_ = false;
};

}  // namespace tessera::vk
