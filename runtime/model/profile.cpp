// Per-kernel profile: grouping, statistics, markdown and SVG. See profile.h.
#include "runtime/model/profile.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "format/error.h"

namespace tessera::model {
namespace {

// A word of a label that names a tensor or a block rather than a kernel.
bool names_tensor(std::string_view w) {
  auto ends = [&](std::string_view s) { return w.size() >= s.size() && w.substr(w.size() - s.size()) == s; };
  return w.rfind("blk.", 0) == 0 || ends(".weight") || ends(".bias");
}

std::string xml_escape(std::string_view s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}


}  // namespace

std::string number_text(const char* f, double a) {
  char b[64];
  std::snprintf(b, sizeof b, f, a);
  return b;
}

std::string gbps_text(double gbps) { return number_text(gbps < 10 ? "%.3f" : "%.1f", gbps); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string kernel_family(std::string_view label) {
  std::string family;
  size_t i = 0;
  while (i < label.size()) {
    while (i < label.size() && label[i] == ' ') ++i;
    size_t j = i;
    while (j < label.size() && label[j] != ' ') ++j;
    const std::string_view word = label.substr(i, j - i);
    if (!word.empty() && !names_tensor(word)) family += (family.empty() ? "" : ".") + std::string(word);
    i = j;
  }
  return family.empty() ? std::string("unnamed") : family;
}

TokenProfile summarize_profile(std::span<const std::vector<vk::DispatchTiming>> steps,
                               std::span<const double> token_wall_us, double read_gbps, uint32_t depth) {
  if (steps.empty() || steps[0].empty()) runtime_error("profile: no timed dispatches (does the device have timestamps?)");
  const size_t n_dispatch = steps[0].size();
  for (const auto& s : steps)
    if (s.size() != n_dispatch)
      runtime_error("profile: profiled tokens disagree on their dispatch count (", s.size(), " vs ", n_dispatch, ")");

  struct Acc {
    uint32_t calls = 0;            // per token
    uint64_t bytes = 0;            // per token
    std::vector<double> call_us;   // every call of every token
    std::vector<double> token_us;  // per token
    double total_us = 0;
  };
  std::map<std::string, Acc> acc;
  std::vector<std::string> family_of(n_dispatch);
  for (size_t d = 0; d < n_dispatch; ++d) {
    family_of[d] = kernel_family(steps[0][d].label);
    Acc& a = acc[family_of[d]];
    a.calls += 1;
    a.bytes += steps[0][d].bytes;
  }
  TokenProfile p;
  p.depth = depth;
  p.tokens = int(steps.size());
  p.dispatches = uint32_t(n_dispatch);
  std::vector<double> kernel_totals;
  for (const auto& s : steps) {
    std::map<std::string, double> per_token;
    double total = 0;
    for (size_t d = 0; d < n_dispatch; ++d) {
      Acc& a = acc[family_of[d]];
      a.call_us.push_back(s[d].microseconds);
      a.total_us += s[d].microseconds;
      per_token[family_of[d]] += s[d].microseconds;
      total += s[d].microseconds;
    }
    for (auto& [f, us] : per_token) acc[f].token_us.push_back(us);
    kernel_totals.push_back(total);
  }
  p.kernel_us = median(kernel_totals);
  for (auto& [f, a] : acc) {
    KernelFamilyStats k;
    k.family = f;
    k.calls_per_token = a.calls;
    k.us_per_call = median(a.call_us);
    k.us_per_token = median(a.token_us);
    k.bytes_per_call = double(a.bytes) / a.calls;
    k.gbps = a.total_us > 0 ? double(a.bytes) * double(steps.size()) / (a.total_us * 1e3) : 0;
    k.share = p.kernel_us > 0 ? k.us_per_token / p.kernel_us : 0;
    p.bytes_per_token += a.bytes;
    p.families.push_back(std::move(k));
  }
  std::sort(p.families.begin(), p.families.end(),
            [](const KernelFamilyStats& a, const KernelFamilyStats& b) { return a.us_per_token > b.us_per_token; });
  p.token_us = median(std::vector<double>(token_wall_us.begin(), token_wall_us.end()));
  p.outside_us = p.token_us > 0 ? p.token_us - p.kernel_us : 0;
  p.read_gbps = read_gbps;
  p.floor_us = read_gbps > 0 ? double(p.bytes_per_token) / (read_gbps * 1e3) : 0;
  return p;
}

std::string profile_markdown(const TokenProfile& p) {
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line, "per-kernel profile of one %s at depth %u (%d profiled, %u dispatches; per token = per %s)\n\n",
                p.what.c_str(), p.depth, p.tokens, p.dispatches, p.what.c_str());
  s += line;
  s += "| kernel | calls/token | µs/call (median) | bytes/call | GB/s | µs/token | share |\n";
  s += "|---|---:|---:|---:|---:|---:|---:|\n";
  for (const KernelFamilyStats& k : p.families) {
    std::snprintf(line, sizeof line, "| %s | %.0f | %.2f | %.0f | %s | %.1f | %.1f %% |\n", k.family.c_str(),
                  k.calls_per_token, k.us_per_call, k.bytes_per_call, gbps_text(k.gbps).c_str(), k.us_per_token,
                  100 * k.share);
    s += line;
  }
  s += "\n| token | value |\n|---|---:|\n";
  std::snprintf(line, sizeof line, "| kernel time (sum of dispatches, median) | %.1f µs |\n", p.kernel_us);
  s += line;
  std::snprintf(line, sizeof line, "| measured token time (submit to done, median) | %.1f µs |\n", p.token_us);
  s += line;
  std::snprintf(line, sizeof line, "| outside kernels | %.1f µs (%.1f %%) |\n", p.outside_us,
                p.token_us > 0 ? 100 * p.outside_us / p.token_us : 0.0);
  s += line;
  std::snprintf(line, sizeof line, "| bytes per token (declared by the kernels) | %.3f MB |\n", p.bytes_per_token / 1e6);
  s += line;
  if (p.read_gbps > 0) {
    std::snprintf(line, sizeof line, "| floor (bytes / %.1f GB/s measured read bandwidth) | %.1f µs (token = %.2f x floor) |\n",
                  p.read_gbps, p.floor_us, p.floor_us > 0 ? p.token_us / p.floor_us : 0.0);
    s += line;
  }
  return s;
}

std::string profile_svg(std::span<const TokenProfile> profiles, std::string_view title) {
  constexpr int kWidth = 960, kLabelW = 230, kBarMax = 520, kRow = 22, kBar = 16, kMargin = 16;
  double max_us = 0;
  int rows = 0;
  for (const TokenProfile& p : profiles) {
    for (const KernelFamilyStats& k : p.families) max_us = std::max(max_us, k.us_per_token);
    rows += int(p.families.size()) + 3;  // heading, totals line, gap
  }
  if (max_us <= 0) max_us = 1;
  const int height = kMargin * 2 + 30 + rows * kRow;
  std::string s;
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(kWidth) + "\" height=\"" +
       std::to_string(height) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"" + std::to_string(kMargin) + "\" y=\"" + std::to_string(kMargin + 14) +
       "\" font-size=\"16\" font-weight=\"bold\">" + xml_escape(title) + "</text>\n";
  int y = kMargin + 30;
  static const char* kColors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                  "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
  for (const TokenProfile& p : profiles) {
    y += kRow;
    s += "<text x=\"" + std::to_string(kMargin) + "\" y=\"" + std::to_string(y - 6) + "\" font-weight=\"bold\">" +
         xml_escape(p.what + " at depth " + std::to_string(p.depth) + ": µs per step by kernel family") +
         "</text>\n";
    size_t i = 0;
    for (const KernelFamilyStats& k : p.families) {
      const int w = std::max(1, int(std::lround(kBarMax * k.us_per_token / max_us)));
      const int x = kMargin + kLabelW;
      s += "<text x=\"" + std::to_string(x - 6) + "\" y=\"" + std::to_string(y + kBar - 4) +
           "\" text-anchor=\"end\">" + xml_escape(k.family) + "</text>\n";
      s += "<rect x=\"" + std::to_string(x) + "\" y=\"" + std::to_string(y) + "\" width=\"" + std::to_string(w) +
           "\" height=\"" + std::to_string(kBar) + "\" fill=\"" + kColors[i++ % 10] + "\"/>\n";
      s += "<text x=\"" + std::to_string(x + w + 6) + "\" y=\"" + std::to_string(y + kBar - 4) + "\">" +
           xml_escape(number_text("%.1f µs", k.us_per_token) + number_text(" (%.1f %%", 100 * k.share) +
                      number_text(", %.0f calls", k.calls_per_token) + number_text(", %.3g GB/s)", k.gbps)) +
           "</text>\n";
      y += kRow;
    }
    std::string totals = number_text("kernels %.1f µs", p.kernel_us) + number_text(", token %.1f µs", p.token_us) +
                         number_text(", outside kernels %.1f µs", p.outside_us);
    if (p.floor_us > 0) totals += number_text(", floor %.1f µs", p.floor_us) + number_text(" at %.0f GB/s", p.read_gbps);
    s += "<text x=\"" + std::to_string(kMargin) + "\" y=\"" + std::to_string(y + kBar - 4) + "\">" +
         xml_escape(totals) + "</text>\n";
    y += 2 * kRow;
  }
  s += "</svg>\n";
  return s;
}

}  // namespace tessera::model
