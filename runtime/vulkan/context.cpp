#include "runtime/vulkan/context.h"

namespace tessera::vk {

Context::Context(const ContextOptions& options) {
  instance_ = std::make_unique<Instance>(options.validation);
  const uint32_t index = instance_->choose_device(options.device);
  device_ = std::make_unique<Device>(*instance_, index, options.no_int64_atomics, options.kernel_statistics);
  shaders_ = std::make_unique<ShaderCache>(device_->info(), options.cache_dir);
  pipelines_ = std::make_unique<PipelineLibrary>(*device_, *shaders_, options.no_subgroup_ops);
}

Context::~Context() {
  // Destroy in dependency order: pipelines (and the saved cache) before the device.
  pipelines_.reset();
  shaders_.reset();
  device_.reset();
  instance_.reset();
}

}  // namespace tessera::vk
