#include "runtime/text/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "format/error.h"

namespace tessera::text {

Sampler::Sampler(SamplerParams params) : params_(params), rng_(params.seed) {}

void Sampler::reset() {
  history_.clear();
  rng_.seed(params_.seed);
}

void Sampler::accept(int32_t token) {
  if (params_.penalty_last_n <= 0) return;
  history_.push_back(token);
  while (history_.size() > static_cast<size_t>(params_.penalty_last_n)) history_.pop_front();
}

std::vector<float> Sampler::penalized(std::span<const float> logits) const {
  std::vector<float> out(logits.begin(), logits.end());
  for (float& l : out)
    if (std::isnan(l)) l = -std::numeric_limits<float>::infinity();  // NaN never wins and never breaks sorting
  if (history_.empty()) return out;
  std::unordered_map<int32_t, int> counts;
  for (int32_t t : history_)
    if (t >= 0 && static_cast<size_t>(t) < out.size()) ++counts[t];
  for (const auto& [id, count] : counts) {
    float& l = out[id];
    if (params_.repeat_penalty != 1.0f) l = l > 0 ? l / params_.repeat_penalty : l * params_.repeat_penalty;
    l -= static_cast<float>(count) * params_.frequency_penalty + params_.presence_penalty;
  }
  return out;
}

std::vector<Sampler::Candidate> Sampler::filter(std::span<const float> logits) const {
  const std::vector<float> pen = penalized(logits);
  std::vector<Candidate> cand(pen.size());
  for (size_t i = 0; i < pen.size(); ++i) cand[i] = {static_cast<int32_t>(i), pen[i]};
  const auto more_likely = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };

  // top-k (sorting only what survives it)
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < cand.size()) {
    std::partial_sort(cand.begin(), cand.begin() + params_.top_k, cand.end(), more_likely);
    cand.resize(params_.top_k);
  } else {
    std::sort(cand.begin(), cand.end(), more_likely);
  }
  const float max_logit = cand.front().logit;
  if (std::isinf(max_logit) && max_logit < 0) return {cand.front()};  // nothing is possible: lowest id

  // top-p over the softmax of the survivors
  if (params_.top_p < 1.0f) {
    double sum = 0;
    for (const Candidate& c : cand) sum += std::exp(static_cast<double>(c.logit) - max_logit);
    double cumulative = 0;
    size_t keep = cand.size();
    for (size_t i = 0; i < cand.size(); ++i) {
      cumulative += std::exp(static_cast<double>(cand[i].logit) - max_logit) / sum;
      if (cumulative >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
    cand.resize(keep);
  }

  // min-p relative to the most likely survivor: p_i / p_max = exp(l_i - l_max)
  if (params_.min_p > 0.0f) {
    const double min_logit = max_logit + std::log(static_cast<double>(params_.min_p));
    size_t keep = 1;
    while (keep < cand.size() && cand[keep].logit >= min_logit) ++keep;
    cand.resize(keep);
  }
  return cand;
}

std::vector<int32_t> Sampler::kept_candidates(std::span<const float> logits) const {
  if (logits.empty()) return {};
  std::vector<int32_t> ids;
  for (const Candidate& c : filter(logits)) ids.push_back(c.id);
  return ids;
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (logits.empty()) runtime_error("sampler: empty logits");
  if (params_.temperature <= 0.0f) {
    const std::vector<float> pen = penalized(logits);
    return static_cast<int32_t>(std::max_element(pen.begin(), pen.end()) - pen.begin());  // first max
  }
  const std::vector<Candidate> cand = filter(logits);
  if (cand.size() == 1) return cand.front().id;
  const double max_logit = cand.front().logit;
  std::vector<double> weight(cand.size());
  double sum = 0;
  for (size_t i = 0; i < cand.size(); ++i) {
    weight[i] = std::exp((cand[i].logit - max_logit) / params_.temperature);
    sum += weight[i];
  }
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * sum;  // uniform in [0, sum)
  double cumulative = 0;
  for (size_t i = 0; i < cand.size(); ++i) {
    cumulative += weight[i];
    if (u < cumulative) return cand[i].id;
  }
  return cand.back().id;  // rounding: u landed on the total
}

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_ += text;
  size_t first = std::string::npos;
  const std::string* hit = nullptr;
  for (const std::string& stop : stops_) {
    const size_t pos = held_.find(stop);
    if (pos == std::string::npos) continue;
    if (pos < first || (pos == first && stop.size() > hit->size())) {
      first = pos;
      hit = &stop;
    }
  }
  if (hit) {
    std::string out = held_.substr(0, first);
    matched_ = *hit;
    stopped_ = true;
    held_.clear();
    return out;
  }
  // Hold back the longest tail of held_ that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& stop : stops_) {
    for (size_t k = std::min(stop.size() - 1, held_.size()); k > keep; --k) {
      if (held_.compare(held_.size() - k, k, stop, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace tessera::text
