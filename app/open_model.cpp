#include "app/open_model.h"

#include <cstdio>

#include "app/cli.h"
#include "format/error.h"
#include "runtime/cpu/forward.h"
#include "runtime/cpu/tsr_weights.h"
#include "runtime/model/gpu_model.h"

namespace tessera::app {

OpenModel open_model(const ModelRequest& r) {
  OpenModel m;
  m.weights = open_weights(r.path);
  const auto* packed = dynamic_cast<const TsrWeights*>(m.weights.get());
  m.backend = r.backend == "auto" ? (packed ? "vulkan" : "cpu") : r.backend;
  if (m.backend == "cpu") {
    m.model = std::make_unique<CpuModel>(*m.weights, r.n_ctx, r.threads, r.attention);
    return m;
  }
  if (!packed)
    usage_error(r.path, ": the Vulkan backend runs packed .tsr files; convert it first (tessera convert ", r.path,
                " -o MODEL.tsr) or use --backend cpu");
  vk::ContextOptions vo;
  vo.device = r.device;
  m.vk = std::make_unique<vk::Context>(vo);
  const text::SamplerParams& sp = r.sampling;
  model::GpuModelOptions mo;
  mo.n_ctx = uint32_t(r.n_ctx);
  mo.sampling = {.temperature = sp.temperature, .top_k = sp.top_k, .top_p = sp.top_p, .min_p = sp.min_p, .seed = sp.seed};
  // The GPU sampler has no repetition penalties: with penalties the host samples.
  mo.device_sampling = sp.repeat_penalty == 1.f && sp.presence_penalty == 0.f && sp.frequency_penalty == 0.f;
  mo.progress = stderr_is_tty();
  mo.int8_activations = !r.f32_activations;
  mo.prefill_chunk = r.prefill_chunk;
  auto gm = std::make_unique<model::GpuModel>(*m.vk, packed->file(), mo);
  if (r.verbose)
    std::fprintf(stderr, "tessera: %s on %s: %u dispatches and %u barriers per token (%u layers), %.1f MB of device memory\n",
                 r.path.c_str(), m.vk->info().name.c_str(), gm->stats().dispatches, gm->stats().barriers,
                 gm->stats().layers, gm->stats().device_bytes / 1e6);
  if (r.verbose && gm->prefill_stats().chunk)
    std::fprintf(stderr, "tessera: prefill in chunks of %u tokens: %u dispatches, %u barriers, %.1f MB of weights per chunk\n",
                 gm->prefill_stats().chunk, gm->prefill_stats().dispatches, gm->prefill_stats().barriers,
                 gm->prefill_stats().weight_bytes / 1e6);
  m.model = std::move(gm);
  return m;
}

}  // namespace tessera::app
