#include "runtime/model/verify_logits.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "format/error.h"
#include "format/tsr.h"
#include "runtime/cpu/forward.h"
#include "runtime/cpu/weight_source.h"
#include "runtime/model/gpu_model.h"
#include "runtime/vulkan/context.h"

namespace tessera::model {

LogitsThresholds logits_thresholds(bool composed) {
  if (composed) return {0.0, 0.05, 0.75};
  return {1e-2, 1e-3, 0.95};
}

namespace {

// log-softmax of one row, in double.
std::vector<double> log_softmax(const float* x, size_t n) {
  const double mx = *std::max_element(x, x + n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += std::exp(double(x[i]) - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> r(n);
  for (size_t i = 0; i < n; ++i) r[i] = double(x[i]) - lse;
  return r;
}

}  // namespace

std::vector<convert::VerifyRow> verify_logits(const convert::VerifyOptions& opt, int device) {
  const int n = opt.logits_tokens;
  if (n <= 0) return {};
  const TsrFile packed = TsrFile::open(opt.packed_path);
  const bool composed = (packed.header().flags & (kTsrFlagComposedQk | kTsrFlagComposedVo)) != 0;
  vk::ContextOptions vo;
  vo.device = device;
  vk::Context ctx(vo);
  GpuModelOptions mo;
  mo.n_ctx = uint32_t(n);
  // The file is verified through the f32-activation kernels: the int8-activation path rounds
  // every matvec input (its own tests check it against the same rounding on the CPU).
  mo.int8_activations = false;
  GpuModel gpu(ctx, packed, mo);
  const uint32_t V = gpu.n_vocab();
  std::vector<int32_t> prompt;
  for (int i = 0; i < n; ++i) prompt.push_back(int32_t((uint64_t(i) * 7919 + 13) % V));
  const std::vector<float> lg = gpu.forward(prompt, false);

  GgufWeights original(opt.original_path);
  CpuModel cpu(original, n, opt.threads, AttentionPath::Absorbed);
  const std::vector<float> lc = cpu.forward(prompt, false);

  double diff = 0, ref = 0, kl_sum = 0, kl_max = 0;
  int top1 = 0;
  bool finite = true;
  for (int r = 0; r < n; ++r) {
    const float* a = lg.data() + size_t(r) * V;
    const float* b = lc.data() + size_t(r) * V;
    for (uint32_t i = 0; i < V; ++i) {
      finite = finite && std::isfinite(a[i]);
      diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
      ref = std::max(ref, std::abs(double(b[i])));
    }
    top1 += (std::max_element(a, a + V) - a) == (std::max_element(b, b + V) - b);
    const std::vector<double> la = log_softmax(a, V), lb = log_softmax(b, V);
    double kl = 0;
    for (uint32_t i = 0; i < V; ++i) kl += std::exp(lb[i]) * (lb[i] - la[i]);
    kl_sum += kl;
    kl_max = std::max(kl_max, kl);
  }
  const LogitsThresholds t = logits_thresholds(composed);
  const double max_rel = ref > 0 ? diff / ref : diff;
  const double mean_kl = kl_sum / n, agree = double(top1) / n;
  const std::string subject = cat(n, " tokens, ", ctx.info().name, composed ? ", composed weights" : "");
  auto fmt = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.3g", v);
    return std::string(b);
  };
  std::vector<convert::VerifyRow> rows;
  rows.push_back({"logits", subject + ": finite", finite, finite ? "all logits finite" : "NaN or inf in the GPU logits"});
  rows.push_back({"logits", subject + ": max |d|", t.max_rel <= 0 || max_rel <= t.max_rel,
                  cat("max |gpu - cpu| = ", fmt(diff), " (", fmt(max_rel), " of max |cpu|)",
                      t.max_rel > 0 ? cat(", limit ", fmt(t.max_rel)) : std::string(", reported only"))});
  rows.push_back({"logits", subject + ": KL", mean_kl <= t.mean_kl,
                  cat("mean KL(cpu || gpu) = ", fmt(mean_kl), " nats (worst ", fmt(kl_max), "), limit ", fmt(t.mean_kl))});
  rows.push_back({"logits", subject + ": top-1", agree >= t.top1,
                  cat("top-1 agreement ", top1, "/", n, ", limit ", fmt(t.top1 * 100), " %")});
  return rows;
}

}  // namespace tessera::model
