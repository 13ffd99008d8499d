// `tessera bench` output: markdown, JSON and CSV. See bench.h.
#include <cmath>
#include <cstdio>
#include <span>
#include <string>

#include "format/error.h"
#include "runtime/model/bench.h"

namespace tessera::model {
namespace {

// Text for a markdown table cell: '|' escaped (driver strings may hold one).
std::string md_cell(const std::string& t) {
  std::string r;
  for (char ch : t) r += ch == '|' ? std::string("\\|") : std::string(1, ch);
  return r;
}

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string f(const char* fmt, double v) {
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

// A JSON string literal.
std::string js(std::string_view s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += char(c);
    } else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += char(c);
    }
  }
  return o + "\"";
}

// A JSON number (null for NaN / infinity, which JSON cannot hold).
std::string jn(double v) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

std::string ju(uint64_t v) { return std::to_string(v); }

// A CSV field (quoted when it holds a separator, a quote or a line break).
std::string cs(std::string_view s) {
  if (s.find_first_of(",\"\n") == std::string_view::npos) return std::string(s);
  std::string o = "\"";
  for (char c : s) o += c == '"' ? std::string("\"\"") : std::string(1, c);
  return o + "\"";
}

std::string composition_words(const std::string& c) {
  if (c == "qk+vo") return "composed W_qk and W_vo";
  if (c == "qk") return "composed W_qk, factored V/O";
  if (c == "vo") return "factored Q/K, composed W_vo";
  return "factored (none composed)";
}

}  // namespace

std::string bench_markdown(const BenchReport& r) {
  const BenchHeader& h = r.header;
  std::string s;
  s += "device:     " + h.device + (h.driver.empty() ? "" : "  (driver " + h.driver + ")") + "\n";
  s += "tessera:    " + h.version + " (commit " + h.commit + "), backend " + h.backend + "\n";
  if (!h.model_path.empty()) {
    s += "model:      " + h.model_path + (h.model_name.empty() ? "" : "  (" + h.model_name + ")") +
         f(", %.3f GB of weights", h.model_bytes / 1e9) + "\n";
    s += "types:      " + h.types + "\n";
    s += "mla:        " + composition_words(h.composition) + "\n";
    s += "context:    " + std::to_string(h.n_ctx) + " positions\n";
    if (h.dispatches)
      s += "per token:  " + std::to_string(h.dispatches) + " dispatches, " + std::to_string(h.barriers) + " barriers, " +
           f("%.3f GB of weights read", h.weight_bytes_per_token / 1e9) + "\n";
    if (!h.activations.empty()) s += "activations: " + h.activations + "\n";
    if (!h.router.empty())
      s += "router:     " +
           std::string(h.router == "fused" ? "fused (logits in the W_vo / attn_output epilogue, routing in the gate-up)"
                                           : "its own dispatch") +
           "\n";
    if (!h.barrier_scope.empty()) s += "barriers:   " + h.barrier_scope + "\n";
    if (!h.early_start.empty()) s += "early W_vo: " + h.early_start + "\n";
    if (h.forced_tokens) s += "decode:     fed fixed token ids, not its own samples (--forced-tokens)\n";
    if (h.timeline) s += "timeline:   every kernel records its workgroups' device-clock times, in these tests too (--timeline)\n";
    if (h.backend == "vulkan" && h.prefill_chunk)
      s += "prefill:    chunks of " + std::to_string(h.prefill_chunk) + " tokens: " + std::to_string(h.prefill_dispatches) +
           " dispatches, " + std::to_string(h.prefill_barriers) + " barriers, " +
           f("%.3f GB of weights read per chunk", h.prefill_weight_bytes / 1e9) +
           (h.prefill_dense.empty() ? "" : "; dense matrices: " + h.prefill_dense) +
           (h.prefill_attention.empty() ? "" : "; attention: " + h.prefill_attention) + "\n";
    else if (h.backend == "vulkan") s += "prefill:    the decode graph token by token\n";
  }
  if (!r.results.empty()) {
    s += "\n| test | depth | reps | tok/s (mean ± sd) | tok/s (median) | ms/token (median) | token ids (FNV-1a) |\n";
    s += "|---|---:|---:|---:|---:|---:|---|\n";
    for (const BenchResult& b : r.results) {
      s += "| " + b.kind + std::to_string(b.n_tokens) + " | " + std::to_string(b.depth) + " | " +
           std::to_string(b.seconds.size()) + " | " + f("%.2f", b.tps_mean) + f(" ± %.2f", b.tps_stddev) + " | " +
           f("%.2f", b.tps_median) + " | " + f("%.3f", b.tps_median > 0 ? 1e3 / b.tps_median : 0.0) + " | " +
           (b.kind == "tg" ? hex64(b.ids_digest) : std::string("-")) +
           (b.runs_differ ? cat(" (", b.runs_differ, " runs differ)") : std::string()) + " |\n";
    }
  }
  for (const TokenProfile& p : r.profiles) s += "\n" + profile_markdown(p);
  for (const TokenTimeline& t : r.timelines) s += "\n" + timeline_markdown(t);
  if (r.roofline) s += "\ndevice ceilings\n\n" + roofline_markdown(*r.roofline);
  if (!r.kernel_stats_note.empty()) s += "\nkernel statistics: " + r.kernel_stats_note + "\n";
  if (!r.kernel_stats.empty()) {
    s += "\nkernel statistics (the driver's, VK_KHR_pipeline_executable_properties)\n\n| kernel | statistics |\n|---|---|\n";
    for (const KernelStats& k : r.kernel_stats) {
      std::string v;
      for (const auto& [name, value] : k.values) v += (v.empty() ? "" : "; ") + name + " " + value;
      s += "| " + md_cell(k.kernel) + " | " + md_cell(v) + " |\n";
    }
  }
  return s;
}

std::string bench_json(const BenchReport& r) {
  const BenchHeader& h = r.header;
  std::string s = "{\n";
  s += "  \"tessera\": {\"version\": " + js(h.version) + ", \"commit\": " + js(h.commit) + "},\n";
  s += "  \"device\": {\"name\": " + js(h.device) + ", \"driver\": " + js(h.driver) + ", \"backend\": " +
       js(h.backend) + "},\n";
  s += "  \"model\": {\"path\": " + js(h.model_path) + ", \"name\": " + js(h.model_name) + ", \"types\": " +
       js(h.types) + ", \"composition\": " + js(h.composition) + ", \"weight_bytes\": " + ju(h.model_bytes) +
       ", \"n_ctx\": " + ju(h.n_ctx) + ", \"dispatches_per_token\": " + ju(h.dispatches) +
       ", \"barriers_per_token\": " + ju(h.barriers) + ", \"weight_bytes_per_token\": " +
       ju(h.weight_bytes_per_token) + ", \"activations\": " + js(h.activations) + ", \"router\": " + js(h.router) +
       ", \"forced_tokens\": " + (h.forced_tokens ? "true" : "false") + ", \"prefill_chunk\": " + ju(h.prefill_chunk) +
       ", \"prefill_dispatches_per_chunk\": " + ju(h.prefill_dispatches) + ", \"prefill_barriers_per_chunk\": " +
       ju(h.prefill_barriers) + ", \"prefill_weight_bytes_per_chunk\": " + ju(h.prefill_weight_bytes) + "},\n";
  s += "  \"results\": [";
  for (size_t i = 0; i < r.results.size(); ++i) {
    const BenchResult& b = r.results[i];
    s += i ? ",\n    " : "\n    ";
    s += "{\"test\": " + js(b.kind + std::to_string(b.n_tokens)) + ", \"kind\": " +
         js(b.kind == "pp" ? "prefill" : "decode") + ", \"n_tokens\": " + ju(b.n_tokens) + ", \"depth\": " +
         ju(b.depth) + ", \"repetitions\": " + ju(b.seconds.size()) + ", \"warmup_runs\": " + ju(b.warmup_runs) +
         ", \"tok_per_s_mean\": " + jn(b.tps_mean) +
         ", \"tok_per_s_stddev\": " + jn(b.tps_stddev) + ", \"tok_per_s_median\": " + jn(b.tps_median) +
         (b.kind == "tg" ? ", \"ids_digest\": " + js(hex64(b.ids_digest)) + ", \"runs_differ\": " + ju(b.runs_differ)
                         : std::string()) +
         ", \"seconds\": [";
    for (size_t k = 0; k < b.seconds.size(); ++k) s += (k ? ", " : "") + jn(b.seconds[k]);
    s += "]}";
  }
  s += r.results.empty() ? "]" : "\n  ]";
  if (!r.profiles.empty()) {
    s += ",\n  \"profiles\": [";
    for (size_t i = 0; i < r.profiles.size(); ++i) {
      const TokenProfile& p = r.profiles[i];
      s += i ? ",\n    " : "\n    ";
      s += "{\"what\": " + js(p.what) + ", \"depth\": " + ju(p.depth) + ", \"tokens\": " + ju(uint64_t(p.tokens)) + ", \"dispatches\": " +
           ju(p.dispatches) + ", \"kernel_us\": " + jn(p.kernel_us) + ", \"token_us\": " + jn(p.token_us) +
           ", \"outside_us\": " + jn(p.outside_us) + ", \"bytes_per_token\": " + ju(p.bytes_per_token) +
           ", \"read_gbps\": " + jn(p.read_gbps) + ", \"floor_us\": " + jn(p.floor_us) + ", \"kernels\": [";
      for (size_t k = 0; k < p.families.size(); ++k) {
        const KernelFamilyStats& q = p.families[k];
        s += (k ? ",\n      " : "\n      ");
        s += "{\"kernel\": " + js(q.family) + ", \"calls_per_token\": " + jn(q.calls_per_token) +
             ", \"us_per_call\": " + jn(q.us_per_call) + ", \"us_per_token\": " + jn(q.us_per_token) +
             ", \"bytes_per_call\": " + jn(q.bytes_per_call) + ", \"gbps\": " + jn(q.gbps) + ", \"share\": " +
             jn(q.share) + "}";
      }
      s += "]}";
    }
    s += "\n  ]";
  }
  if (!r.timelines.empty()) {
    s += ",\n  \"timelines\": [";
    for (size_t i = 0; i < r.timelines.size(); ++i) {
      const TokenTimeline& t = r.timelines[i];
      s += i ? ",\n    " : "\n    ";
      s += "{\"depth\": " + ju(t.depth) + ", \"tokens\": " + ju(uint64_t(t.tokens)) + ", \"dispatches\": " +
           ju(t.dispatches) + ", \"device_us\": " + jn(t.device_us) + ", \"token_us\": " + jn(t.token_us) +
           ", \"bytes_per_token\": " + ju(t.bytes_per_token) + ", \"read_gbps\": " + jn(t.read_gbps) +
           ", \"layer\": " + std::to_string(t.layer) +
           ", \"layer_us\": " + jn(t.layer_us) + ", \"kernels\": [";
      for (size_t k = 0; k < t.families.size(); ++k) {
        const TimelineFamily& f = t.families[k];
        s += (k ? ",\n      " : "\n      ");
        s += "{\"kernel\": " + js(f.family) + ", \"calls_per_token\": " + jn(f.calls_per_token) +
             ", \"us_per_call\": " + jn(f.us_per_call) + ", \"launch_us_per_call\": " + jn(f.launch_us_per_call) +
             ", \"bytes_per_call\": " + jn(f.bytes_per_call) + ", \"gbps\": " + jn(f.gbps) +
             ", \"early_gbps\": " + jn(f.early_gbps) + ", \"ceiling_gbps\": " + jn(f.ceiling_gbps) +
             ", \"gated_ceiling_gbps\": " + jn(f.gated_ceiling_gbps) + "}";
      }
      s += "], \"layer_dispatches\": [";
      for (size_t k = 0; k < t.layer_rows.size(); ++k) {
        const LayerRow& l = t.layer_rows[k];
        s += (k ? ",\n      " : "\n      ");
        s += "{\"label\": " + js(l.label) + ", \"bytes\": " + ju(l.bytes) + ", \"workgroups\": " + ju(l.workgroups) +
             ", \"start_us\": " + jn(l.start_us) + ", \"last_start_us\": " + jn(l.last_start_us) +
             ", \"end_us\": " + jn(l.end_us) + "}";
      }
      s += "]}";
    }
    s += "\n  ]";
  }
  if (r.roofline) {
    const RooflineResult& q = *r.roofline;
    std::string shorts;
    for (const ShortRead& t : q.short_reads)
      shorts += (shorts.empty() ? "" : ", ") + std::string("{\"bytes\": ") + ju(t.bytes) + ", \"us\": " + jn(t.us) +
                ", \"gbps\": " + jn(t.gbps) + "}";
    std::string gated;
    for (const ShortRead& t : q.gated_reads)
      gated += (gated.empty() ? "" : ", ") + std::string("{\"bytes\": ") + ju(t.bytes) + ", \"us\": " + jn(t.us) +
               ", \"open_us\": " + jn(t.open_us) + ", \"open_last_us\": " + jn(t.open_last_us) +
               ", \"gbps\": " + jn(t.gbps) + "}";
    const auto hop_list = [](std::span<const GateHop> hs) {
      std::string out;
      for (const GateHop& h : hs)
        out += (out.empty() ? "" : ", ") + std::string("{\"first_us\": ") + jn(h.first_us) + ", \"last_us\": " + jn(h.last_us) + "}";
      return out;
    };
    const std::string hops = hop_list(q.gate_hops), broadcast = hop_list(q.gated_broadcast);
    s += ",\n  \"roofline\": {\"read_bytes\": " + ju(q.read_bytes) + ", \"read_gbps\": " + jn(q.read_gbps) +
         ", \"read_us\": " + jn(q.read_us) + ", \"gpu_timestamps\": " + (q.gpu_timestamps ? "true" : "false") +
         ", \"short_reads\": [" + shorts + "]" + ", \"gated_reads\": [" + gated + "]" +
         ", \"gate_hops\": [" + hops + "]" + ", \"gated_broadcast\": [" + broadcast + "]" +
         ", \"gated_read_gave_up\": " + (q.gated_read_gave_up ? "true" : "false") +
         ", \"dispatches\": " + ju(q.dispatches) + ", \"dispatch_barrier_us\": " + jn(q.dispatch_barrier_us) +
         ", \"dispatch_barrier_compute_us\": " + jn(q.dispatch_barrier_compute_us) +
         ", \"dispatch_barrier_compute_only_us\": " + jn(q.dispatch_barrier_compute_only_us) +
         ", \"dispatch_barrier_execution_only_us\": " + jn(q.dispatch_barrier_execution_only_us) +
         ", \"wide_groups\": " + ju(q.wide_groups) + ", \"dispatch_barrier_wide_us\": " + jn(q.dispatch_barrier_wide_us) +
         ", \"dispatch_chained_us\": " + jn(q.dispatch_chained_us) +
         ", \"dispatch_chained_wide_us\": " + jn(q.dispatch_chained_wide_us) +
         ", \"chained_timed_out\": " + (q.chained_timed_out ? "true" : "false") +
         ", \"dispatch_gated_us\": " + jn(q.dispatch_gated_us) +
         ", \"dispatch_gated_wide_us\": " + jn(q.dispatch_gated_wide_us) +
         ", \"gated_timed_out\": " + (q.gated_timed_out ? "true" : "false") +
         ", \"grid_groups\": " + ju(q.grid_groups) + ", \"grid_barrier_us\": " + jn(q.grid_barrier_us) +
         ", \"grid_barrier_fenced_us\": " + jn(q.grid_barrier_fenced_us) +
         ", \"grid_timed_out\": " + (q.grid_timed_out ? "true" : "false") +
         ", \"dispatch_us\": " + jn(q.dispatch_us) + ", \"dispatch_indirect_us\": " + jn(q.dispatch_indirect_us) +
         ", \"dispatch_indirect_barrier_us\": " + jn(q.dispatch_indirect_barrier_us) + ", \"submit_us\": " + jn(q.submit_us) + "}";
  }
  if (!r.kernel_stats.empty() || !r.kernel_stats_note.empty()) {
    s += ",\n  \"kernel_statistics\": {\"note\": " + js(r.kernel_stats_note) + ", \"kernels\": [";
    for (size_t i = 0; i < r.kernel_stats.size(); ++i) {
      const KernelStats& k = r.kernel_stats[i];
      s += (i ? ",\n    " : "\n    ") + std::string("{\"kernel\": ") + js(k.kernel) + ", \"statistics\": {";
      for (size_t j = 0; j < k.values.size(); ++j) s += (j ? ", " : "") + js(k.values[j].first) + ": " + js(k.values[j].second);
      s += "}}";
    }
    s += r.kernel_stats.empty() ? "]}" : "\n  ]}";
  }
  s += "\n}\n";
  return s;
}

std::string bench_csv(const BenchReport& r) {
  const BenchHeader& h = r.header;
  std::string s =
      "device,driver,backend,version,commit,model,types,composition,n_ctx,dispatches,barriers,test,kind,n_tokens,"
      "depth,repetitions,tok_per_s_mean,tok_per_s_stddev,tok_per_s_median\n";
  for (const BenchResult& b : r.results) {
    s += cs(h.device) + "," + cs(h.driver) + "," + cs(h.backend) + "," + cs(h.version) + "," + cs(h.commit) + "," +
         cs(h.model_path) + "," + cs(h.types) + "," + cs(h.composition) + "," + ju(h.n_ctx) + "," + ju(h.dispatches) +
         "," + ju(h.barriers) + "," + b.kind + std::to_string(b.n_tokens) + "," +
         (b.kind == "pp" ? "prefill" : "decode") + "," + ju(b.n_tokens) + "," + ju(b.depth) + "," +
         ju(b.seconds.size()) + "," + f("%.4f", b.tps_mean) + "," + f("%.4f", b.tps_stddev) + "," +
         f("%.4f", b.tps_median) + "\n";
  }
  return s;
}

}  // namespace tessera::model
