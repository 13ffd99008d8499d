// tessera's Vulkan runtime (namespace tessera::vk) - overview
//
//   Context          instance + device + shader cache + pipeline library: one per process/run
//     Instance       VkInstance, DeviceInfo of every physical device        (instance.h)
//     Device         VkDevice, compute queue, memory types, enabled features (device.h)
//     ShaderCache    GLSL -> SPIR-V with libshaderc, disk cache by xxh64    (shader_cache.h)
//     PipelineLibrary VkPipelines by (file, defines), VkPipelineCache on disk (pipeline.h)
//   MemoryPool / Buffer / BufferSlice / MemoryPlan                           (memory.h)
//   Transfer         host <-> device copies through a staging ring           (transfer.h)
//   CommandRecorder  records dispatches + barriers once, resubmits, timestamps (recorder.h)
//   kernels: MatvecOp (kernels_matvec.h), RmsNormOp, EmbedOp (kernels_basic.h); weight
//            matrices described by MatrixRef (split1.h)
//
// Typical use:
//   vk::Context ctx({.device = -1});
//   vk::MemoryPool pool(ctx.device(), vk::MemoryKind::DeviceLocal);
//   vk::Buffer w = pool.create_buffer(bytes, "w");  ... vk::Transfer(ctx).upload(w, 0, data, bytes);
//   vk::CommandRecorder rec(ctx);
//   rec.begin(); op.record(rec); rec.barrier(); ...; rec.end();
//   rec.run();   // submit + wait; resubmit as often as needed
#pragma once
#include <filesystem>
#include <memory>

#include "runtime/vulkan/device.h"
#include "runtime/vulkan/instance.h"
#include "runtime/vulkan/pipeline.h"
#include "runtime/vulkan/shader_cache.h"

namespace tessera::vk {

struct ContextOptions {
  int device = -1;                  // --device N; -1 = best supported device
  std::filesystem::path cache_dir;  // empty = ShaderCache::default_dir()
  int validation = -1;              // see Instance
  bool no_subgroup_ops = false;     // behave as if the device lacked subgroup arithmetic
                                    // (USE_SUBGROUP=0 everywhere: tests the shared-memory paths)
  bool no_int64_atomics = false;    // leave 64-bit integer buffer atomics off (the router fold's
                                    // requirement: tests its fallback to the router dispatch)
  bool kernel_statistics = false;   // capture the driver's statistics of every pipeline where the
                                    // device can (Pipeline::statistics(); bench --kernel-stats)
};

class Context {
 public:
  // Throws Error(Runtime) when no usable device exists, Error(Usage) for a bad --device number.
  explicit Context(const ContextOptions& options = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Instance& instance() { return *instance_; }
  const Device& device() const { return *device_; }
  const DeviceInfo& info() const { return device_->info(); }
  ShaderCache& shaders() { return *shaders_; }
  PipelineLibrary& pipelines() { return *pipelines_; }
  // Shorthand for pipelines().get(desc).
  const Pipeline& pipeline(const PipelineDesc& desc) { return pipelines_->get(desc); }

 private:
  std::unique_ptr<Instance> instance_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<ShaderCache> shaders_;
  std::unique_ptr<PipelineLibrary> pipelines_;
};

}  // namespace tessera::vk
