// Opening a model for generation, shared by `run` and `chat`: the weights, the backend (Vulkan
// for a packed .tsr, the CPU reference for a .gguf, or as asked) and the model itself.
#pragma once
#include <memory>
#include <string>

#include "runtime/cpu/generate.h"
#include "runtime/model/gpu_model.h"
#include "runtime/cpu/model_weights.h"
#include "runtime/cpu/weight_source.h"
#include "runtime/text/sampler.h"
#include "runtime/vulkan/context.h"

namespace tessera::app {

struct ModelRequest {
  std::string path;
  std::string backend = "auto";  // auto | cpu | vulkan
  int device = -1;               // Vulkan device number
  int n_ctx = 4096;
  unsigned threads = 1;          // CPU backend
  AttentionPath attention = AttentionPath::Absorbed;  // CPU backend
  text::SamplerParams sampling;  // the GPU sampler takes these (penalties: the host samples)
  int verbose = 0;
  bool f32_activations = false;  // Vulkan: no int8-activation kernels
  uint32_t prefill_chunk = model::kPrefillChunkAuto;  // Vulkan: prompt tokens per prefill chunk (0: token by token)
};

struct OpenModel {
  std::unique_ptr<WeightSource> weights;  // outlives everything below
  std::unique_ptr<vk::Context> vk;        // outlives the model that uses it
  std::unique_ptr<LanguageModel> model;
  std::string backend;                    // "cpu" or "vulkan"
};

// Throws Error(Usage) for a .gguf with --backend vulkan (it must be converted first), and what
// opening the file or the device throws.
OpenModel open_model(const ModelRequest& r);

}  // namespace tessera::app
