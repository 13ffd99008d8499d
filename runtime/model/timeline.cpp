// The device-clock timeline: statistics and markdown. See timeline.h.
#include "runtime/model/timeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "format/error.h"
#include "runtime/model/profile.h"

namespace tessera::model {
namespace {

// The layer a label names ("... blk.12.attn_q_a.weight" -> 12), or -1.
int label_layer(const std::string& label) {
  const size_t at = label.find("blk.");
  if (at == std::string::npos) return -1;
  size_t i = at + 4;
  int n = 0;
  bool digits = false;
  while (i < label.size() && label[i] >= '0' && label[i] <= '9') {
    n = n * 10 + (label[i++] - '0');
    digits = true;
  }
  return digits ? n : -1;
}

std::string fmt2(double v) { return number_text("%.2f", v); }

}  // namespace

std::vector<DispatchSpan> spans_from_records(std::span<const DispatchRecords> dispatches) {
  std::vector<DispatchSpan> out;
  // Ticks from the first record's start (shaders/timeline.glsl keeps the clock's low 32 bits; a
  // step is far shorter than their wrap, so signed differences order them).
  int64_t ref = 0;
  bool have_ref = false;
  struct Ticks {
    int64_t first = INT64_MAX, last = INT64_MIN, end = INT64_MIN;
    int64_t mark[2][2] = {{INT64_MAX, INT64_MIN}, {INT64_MAX, INT64_MIN}};  // [early, mark][first, last]
  };
  const size_t timed = dispatches.size();
  std::vector<Ticks> ticks(timed);
  for (size_t d = 0; d < timed; ++d) {
    const DispatchRecords& in = dispatches[d];
    DispatchSpan sp;
    sp.label = in.label;
    sp.bytes = in.bytes;
    sp.workgroups = in.workgroups;
    const uint64_t n = in.n_records;
    const uint32_t* r = in.words;
    Ticks& k = ticks[d];
    std::vector<double> wg_ns, tail_ns, early_ns;
    for (uint64_t g = 0; g < n; ++g) {  // shaders/timeline.glsl's record
      const uint32_t* rec_g = r + 4 * g;
      if (rec_g[3] == 0 && rec_g[0] == 0) continue;  // no record (a workgroup past the region, or none ran)
      if (!have_ref) {
        ref = rec_g[0];
        have_ref = true;
      }
      const int64_t start = int64_t(int32_t(rec_g[0] - uint32_t(ref)));
      sp.recorded += 1;
      k.first = std::min(k.first, start);
      k.last = std::max(k.last, start);
      k.end = std::max(k.end, start + rec_g[3]);
      wg_ns.push_back(rec_g[3]);
      for (int m = 0; m < 2; ++m) {  // m 0: the early mark, 1: the mark
        if (rec_g[1 + m] == 0) continue;
        const uint32_t since = rec_g[1 + m] - 1;  // ns after the start
        k.mark[m][0] = std::min(k.mark[m][0], start + since);
        k.mark[m][1] = std::max(k.mark[m][1], start + since);
        if (m == 0) {
          early_ns.push_back(since);
        } else {
          sp.marked += 1;
          tail_ns.push_back(double(rec_g[3]) - double(since));
        }
      }
    }
    sp.wg_us = median(wg_ns) / 1e3;
    sp.wg_tail_us = median(tail_ns) / 1e3;
    sp.wg_early_us = median(early_ns) / 1e3;
    out.push_back(std::move(sp));
  }
  int64_t origin = INT64_MAX;
  for (size_t d = 0; d < timed; ++d)
    if (out[d].recorded) origin = std::min(origin, ticks[d].first);
  const auto us = [&](int64_t t) { return double(t - origin) / 1e3; };  // device clock ticks read as ns
  for (size_t d = 0; d < timed; ++d) {
    const Ticks& k = ticks[d];
    DispatchSpan& sp = out[d];
    if (!sp.recorded) continue;
    sp.start_us = us(k.first);
    sp.last_start_us = us(k.last);
    sp.end_us = us(k.end);
    if (k.mark[0][1] != INT64_MIN) {
      sp.early_marked = true;
      sp.first_early_us = us(k.mark[0][0]);
      sp.last_early_us = us(k.mark[0][1]);
    }
    if (!sp.marked) continue;
    sp.first_mark_us = us(k.mark[1][0]);
    sp.last_mark_us = us(k.mark[1][1]);
  }
  return out;
}

TokenTimeline summarize_timeline(std::span<const std::vector<DispatchSpan>> steps, std::span<const double> token_wall_us,
                                 uint32_t depth, uint32_t untimed) {
  if (steps.empty() || steps[0].empty()) runtime_error("timeline: no dispatch spans to summarize");
  const size_t n = steps[0].size();
  for (const auto& s : steps)
    if (s.size() != n) runtime_error("timeline: the steps disagree on their dispatch count (", s.size(), " vs ", n, ")");

  TokenTimeline t;
  t.depth = depth;
  t.tokens = int(steps.size());
  t.dispatches = uint32_t(n);
  t.untimed = untimed;
  t.token_us = median(std::vector<double>(token_wall_us.begin(), token_wall_us.end()));

  struct Acc {
    uint32_t calls = 0;
    uint64_t bytes = 0;  // per token
    std::vector<double> span, launch, tail;
    double span_sum = 0;
    double early_sum = 0;  // first early mark -> last end, over the calls with one
    uint32_t early_calls = 0;
  };
  std::map<std::string, Acc> acc;
  std::vector<double> device;
  for (const auto& s : steps) {
    double end = 0;
    for (const DispatchSpan& d : s)
      if (d.recorded) end = std::max(end, d.end_us);
    device.push_back(end);
  }
  t.device_us = median(device);
  for (size_t d = 0; d < n; ++d) {
    Acc& a = acc[kernel_family(steps[0][d].label)];
    a.calls += 1;
    a.bytes += steps[0][d].bytes;
    t.bytes_per_token += steps[0][d].bytes;
    for (const auto& s : steps) {
      if (!s[d].recorded) continue;
      a.span.push_back(s[d].span_us());
      a.launch.push_back(s[d].last_start_us - s[d].start_us);
      if (s[d].marked) a.tail.push_back(s[d].end_us - s[d].last_mark_us);
      a.span_sum += s[d].span_us();
      if (s[d].early_marked) {
        a.early_sum += s[d].end_us - s[d].first_early_us;
        a.early_calls += 1;
      }
    }
  }
  for (auto& [family, a] : acc) {
    TimelineFamily f;
    f.family = family;
    f.calls_per_token = a.calls;
    f.us_per_call = median(a.span);
    f.launch_us_per_call = median(a.launch);
    f.tail_us_per_call = median(a.tail);
    f.bytes_per_call = double(a.bytes) / a.calls;
    const double timed_calls = double(a.span.size());
    f.gbps = a.span_sum > 0 ? f.bytes_per_call * timed_calls / (a.span_sum * 1e3) : 0;
    f.early_gbps = a.early_sum > 0 ? f.bytes_per_call * a.early_calls / (a.early_sum * 1e3) : 0;
    t.families.push_back(std::move(f));
  }
  std::sort(t.families.begin(), t.families.end(), [](const TimelineFamily& a, const TimelineFamily& b) {
    return a.us_per_call * a.calls_per_token > b.us_per_call * b.calls_per_token;
  });

  // The middle layer: its dispatches relative to its first start, medians over the steps.
  int max_layer = -1;
  for (const DispatchSpan& d : steps[0]) max_layer = std::max(max_layer, label_layer(d.label));
  if (max_layer < 0) return t;
  t.layer = max_layer / 2;
  std::vector<size_t> rows;
  for (size_t d = 0; d < n; ++d)
    if (label_layer(steps[0][d].label) == t.layer) rows.push_back(d);
  std::vector<double> layer_us;
  std::vector<std::vector<double>> start(rows.size()), last(rows.size()), end(rows.size());
  std::vector<std::vector<double>> mark0(rows.size()), mark1(rows.size()), wg(rows.size()), wg_tail(rows.size());
  std::vector<std::vector<double>> early0(rows.size()), early1(rows.size()), wg_early(rows.size());
  for (const auto& s : steps) {
    double origin = 1e300, next = 1e300;
    for (size_t d = 0; d < n; ++d) {
      if (!s[d].recorded) continue;
      const int l = label_layer(s[d].label);
      if (l == t.layer) origin = std::min(origin, s[d].start_us);
      if (l == t.layer + 1) next = std::min(next, s[d].start_us);
    }
    if (origin == 1e300) continue;
    if (next != 1e300) layer_us.push_back(next - origin);
    for (size_t i = 0; i < rows.size(); ++i) {
      const DispatchSpan& d = s[rows[i]];
      if (!d.recorded) continue;
      start[i].push_back(d.start_us - origin);
      last[i].push_back(d.last_start_us - origin);
      end[i].push_back(d.end_us - origin);
      wg[i].push_back(d.wg_us);
      if (d.early_marked) {
        early0[i].push_back(d.first_early_us - origin);
        early1[i].push_back(d.last_early_us - origin);
        wg_early[i].push_back(d.wg_early_us);
      }
      if (!d.marked) continue;
      wg_tail[i].push_back(d.wg_tail_us);
      mark0[i].push_back(d.first_mark_us - origin);
      mark1[i].push_back(d.last_mark_us - origin);
    }
  }
  t.layer_us = median(layer_us);
  for (size_t i = 0; i < rows.size(); ++i) {
    const DispatchSpan& d = steps[0][rows[i]];
    t.layer_rows.push_back({d.label, d.bytes, d.workgroups, median(start[i]), median(last[i]), median(end[i]),
                            !mark1[i].empty(), median(mark0[i]), median(mark1[i]), !early1[i].empty(),
                            median(early0[i]), median(early1[i]), median(wg[i]), median(wg_tail[i]),
                            median(wg_early[i])});
  }
  return t;
}

std::string timeline_markdown(const TokenTimeline& t) {
  std::string s;
  char line[640];
  std::snprintf(line, sizeof line,
                "device-clock timeline of one decoded token at depth %u (%d tokens, %u dispatches; every workgroup's "
                "start and end, nothing serialized)\n\n",
                t.depth, t.tokens, t.dispatches);
  s += line;
  if (t.tc_phases >= 1 && t.tc_phases <= 4) {
    static const char* const kPhases[4][2] = {{"staging its blocks' rows", "its blocks' partial scores"},
                                              {"its blocks' statistics and P", "its blocks' O products"},
                                              {"loading its query's tiles into registers", "writing its output"},
                                              {"reading the step words", "staging its query"}};
    s += cat("(tc_phases=", t.tc_phases, ": the tensor-core attention's (partial.tc) marks are sums of its phases, not ",
             "points in time, so its rates from the early mark and its times from the mark mean nothing here; a ",
             "workgroup's early mark = the time in ", kPhases[t.tc_phases - 1][0], ", its mark = the time in ",
             kPhases[t.tc_phases - 1][1], ")\n\n");
  }
  s += "| kernel | calls/token | µs/call (first start -> last end, median) | µs to start all workgroups | µs from the "
       "last mark to the end | bytes/call | GB/s | GB/s from the first early mark";
  // The rate's shares: of the read bandwidth (where measured), of a bare read of the family's
  // size (where its ceiling is), of a gated read of that size (where measured), joined by "; " / ", ".
  const auto shares = [](const std::string& of_read, std::string of_size, const std::string& of_gated) {
    if (!of_gated.empty()) of_size += (of_size.empty() ? "" : ", ") + of_gated;
    const std::string both = of_read + (!of_read.empty() && !of_size.empty() ? "; " : "") + of_size;
    return both.empty() ? both : " (" + both + ")";
  };
  const bool ceilings = std::any_of(t.families.begin(), t.families.end(), [](const TimelineFamily& f) { return f.ceiling_gbps > 0; });
  const bool gated = std::any_of(t.families.begin(), t.families.end(), [](const TimelineFamily& f) { return f.gated_ceiling_gbps > 0; });
  s += shares(t.read_gbps > 0 ? "% of the read bandwidth" : "",
              ceilings ? (t.read_gbps > 0 ? "of a bare read of its size" : "% of a bare read of its size") : "",
              gated ? "of a gated read of its size" : "");
  s += " |\n|---|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const TimelineFamily& f : t.families) {
    const std::string tail = f.tail_us_per_call > 0 ? fmt2(f.tail_us_per_call) : "-";
    std::string early = "-";
    if (f.early_gbps > 0)
      early = gbps_text(f.early_gbps) +
              shares(t.read_gbps > 0 ? number_text("%.0f %%", 100.0 * f.early_gbps / t.read_gbps) : "",
                     f.ceiling_gbps > 0 ? number_text("%.0f %% of ", 100.0 * f.early_gbps / f.ceiling_gbps) + gbps_text(f.ceiling_gbps)
                                        : "",
                     f.gated_ceiling_gbps > 0
                         ? number_text("%.0f %% of ", 100.0 * f.early_gbps / f.gated_ceiling_gbps) + gbps_text(f.gated_ceiling_gbps)
                         : "");
    std::snprintf(line, sizeof line, "| %s | %.0f | %.2f | %.2f | %s | %.0f | %s | %s |\n", f.family.c_str(),
                  f.calls_per_token, f.us_per_call, f.launch_us_per_call, tail.c_str(), f.bytes_per_call,
                  gbps_text(f.gbps).c_str(), early.c_str());
    s += line;
  }
  s += "\n| token | value |\n|---|---:|\n";
  std::snprintf(line, sizeof line, "| device span (first start -> last end, median) | %.1f µs |\n", t.device_us);
  s += line;
  std::snprintf(line, sizeof line, "| host time (submit to done, median) | %.1f µs |\n", t.token_us);
  s += line;
  std::snprintf(line, sizeof line, "| bytes per token (declared by the kernels) | %.3f MB (%.1f GB/s over the device span) |\n",
                t.bytes_per_token / 1e6, t.device_us > 0 ? t.bytes_per_token / (t.device_us * 1e3) : 0.0);
  s += line;
  if (t.untimed) {
    std::snprintf(line, sizeof line, "| dispatches without records (past the timeline's regions) | %u |\n", t.untimed);
    s += line;
  }
  if (t.layer < 0 || t.layer_rows.empty()) return s;
  // Bar scale: a round number of µs per character that fits the layer into ~80 characters.
  double layer_end = 0;
  for (const LayerRow& r : t.layer_rows) layer_end = std::max(layer_end, r.end_us);
  double per_char = 0.25;
  for (const double step : {0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0}) {
    per_char = step;
    if (layer_end / step <= 80) break;
  }
  std::snprintf(line, sizeof line,
                "\nlayer %d, µs from its first start (median; %.2f µs to the next layer's first start); marks: the "
                "kernel's TS_MARK_EARLY and TS_MARK (e.g. the route seen, a gated wait's end); bar: %g µs per character, '-' while its workgroups start, "
                "'#' all started, '+' after the last mark; a workgroup: medians over its workgroups of the times from "
                "their start to their early mark, their mark and their end\n\n",
                t.layer, t.layer_us, per_char);
  s += line;
  s += "| dispatch | workgroups | start | last start | early marks | marks | end | a workgroup: early, mark, end | GB/s | |\n"
       "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
  const auto range = [](bool on, double a, double b) { return on ? fmt2(a) + " - " + fmt2(b) : std::string("-"); };
  for (const LayerRow& r : t.layer_rows) {
    std::string bar;
    const auto col = [&](double us) { return size_t(std::max(0.0, std::floor(us / per_char))); };
    for (size_t c = 0; c < std::min<size_t>(col(r.end_us) + 1, 120); ++c)
      bar += c < col(r.start_us) ? '.' : c < col(r.last_start_us) ? '-' : r.marked && c > col(r.last_mark_us) ? '+' : '#';
    const double span = r.end_us - r.start_us;
    const std::string one = (r.early_marked ? fmt2(r.wg_early_us) : std::string("-")) + ", " +
                            (r.marked ? fmt2(r.wg_us - r.wg_tail_us) : std::string("-")) + ", " + fmt2(r.wg_us);
    std::snprintf(line, sizeof line, "| %s | %u | %.2f | %.2f | %s | %s | %.2f | %s | %.1f | `%s` |\n", r.label.c_str(),
                  r.workgroups, r.start_us, r.last_start_us, range(r.early_marked, r.first_early_us, r.last_early_us).c_str(),
                  range(r.marked, r.first_mark_us, r.last_mark_us).c_str(), r.end_us, one.c_str(),
                  span > 0 ? r.bytes / (span * 1e3) : 0.0, bar.c_str());
    s += line;
  }
  return s;
}

}  // namespace tessera::model
