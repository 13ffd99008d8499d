// `tessera synth`: option checking, the llama-quantize type mix, the file plan, and the parallel
// streaming writer. Values come from synth_values.cpp.
#include "convert/synth.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "format/error.h"
#include "format/gguf.h"
#include "runtime/text/vocab_builder.h"

namespace tessera::synth {

namespace {

// A --type: the base ggml type plus which llama-quantize mixture rules apply.
enum class Mix { Plain, Q4_0, Q4_K_M };
struct TypeDef {
  const char* name;
  GgmlType base;
  Mix mix;
  uint32_t file_type;  // llama_ftype
};
constexpr TypeDef kTypes[] = {
    {"f32", GgmlType::F32, Mix::Plain, 0},    {"f16", GgmlType::F16, Mix::Plain, 1},
    {"bf16", GgmlType::BF16, Mix::Plain, 32}, {"q8_0", GgmlType::Q8_0, Mix::Plain, 7},
    {"q4_0", GgmlType::Q4_0, Mix::Q4_0, 2},   {"q4_k_m", GgmlType::Q4_K, Mix::Q4_K_M, 15},
};

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

const TypeDef& find_type(std::string_view name) {
  for (const TypeDef& t : kTypes)
    if (name == t.name) return t;
  usage_error("unknown synth type '", name, "' (expected one of: ", joined(type_names()), ")");
}

bool is_block_quantized(GgmlType t) { return type_info(t).block_elems > 1; }
uint32_t block_of(GgmlType t) { return type_info(t).block_elems; }

// llama.cpp: more bits for the first and last eighth of the layers and every third in between.
bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// Mirrors llama.cpp's tensor_allows_quantization for deepseek2 names: only 2-D/3-D "*weight"
// tensors that are neither norms nor the router.
bool quantizable(const TensorSpec& s) {
  size_t n_dims = s.ne.size();
  while (n_dims > 1 && s.ne[n_dims - 1] == 1) --n_dims;
  if (n_dims < 2) return false;
  if (s.role == TensorRole::Norm || s.role == TensorRole::Router || s.role == TensorRole::ExpProbsBias) return false;
  const std::string_view n = s.name;
  if (n.size() < 6 || n.substr(n.size() - 6) != "weight") return false;
  return n.find("_norm.weight") == std::string_view::npos && n.find("ffn_gate_inp.weight") == std::string_view::npos;
}

// llama.cpp tensor_type_fallback: a type whose block does not divide ne0 is replaced; when even
// the replacement does not fit, F16. (llama.cpp refuses Q4_0/Q8_0 targets outright there; we
// fall back to F16 too, so that any preset shape can be synthesized.)
GgmlType shape_fallback(GgmlType t, uint64_t ne0) {
  if (ne0 % block_of(t) == 0) return t;
  GgmlType r = GgmlType::F16;
  switch (t) {
    case GgmlType::Q4_K: r = GgmlType::Q5_0; break;
    case GgmlType::Q5_K: r = GgmlType::Q5_1; break;
    case GgmlType::Q6_K: r = GgmlType::Q8_0; break;
    default: break;
  }
  return ne0 % block_of(r) == 0 ? r : GgmlType::F16;
}

int layer_of(const TensorSpec& s) {
  if (s.layer < 0) runtime_error("synth: cannot tell the layer of tensor ", s.name, " (needed by the type mix)");
  return s.layer;
}

std::string vocab_flavor(const std::string& preset, const ModelConfig& c) {
  if (preset == "glm47flash" || preset == "tiny") return "glm4";
  if (preset == "ds2lite" || preset == "tiny-lite") return "deepseek-llm";
  return c.gating == GatingFunc::Sigmoid ? "glm4" : "deepseek-llm";  // by model family
}

uint64_t align32(uint64_t n) { return (n + 31) / 32 * 32; }

// Progress bar on stderr: percentage, throughput, ETA. Redrawn in place with '\r'.
void draw_progress(uint64_t done, uint64_t total, double seconds, bool final) {
  const double frac = total ? double(done) / double(total) : 1.0;
  const double mbps = seconds > 0 ? double(done) / 1e6 / seconds : 0.0;
  const double eta = frac > 0 && frac < 1 ? seconds * (1 - frac) / frac : 0.0;
  char bar[31];
  const int filled = int(frac * 30);
  for (int i = 0; i < 30; ++i) bar[i] = i < filled ? '#' : '.';
  bar[30] = 0;
  std::fprintf(stderr, "\rsynth [%s] %5.1f%%  %8.1f MB/s  ETA %4.0f s ", bar, 100 * frac, mbps, eta);
  if (final) std::fputc('\n', stderr);
  std::fflush(stderr);
}

}  // namespace

const std::vector<std::string>& type_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const TypeDef& t : kTypes) v.push_back(t.name);
    return v;
  }();
  return names;
}

uint32_t file_type(std::string_view type) { return find_type(type).file_type; }

GgmlType tensor_type(const ModelConfig& config, const TensorSpec& spec, std::string_view type) {
  const TypeDef& td = find_type(type);
  if (!quantizable(spec)) return GgmlType::F32;
  if (!is_block_quantized(td.base)) return td.base;  // f32 / f16 / bf16: no mixture rules
  const uint64_t ne0 = spec.ne[0];
  const std::string_view name = spec.name;
  GgmlType t = td.base;
  if (name == "output.weight") {
    if (ne0 % block_of(td.base) != 0) t = GgmlType::Q8_0;
    else if (td.base != GgmlType::Q8_0) t = GgmlType::Q6_K;
  } else if (td.mix == Mix::Q4_K_M) {
    // Categories are substring matches, in llama.cpp's order: attn_k_b / attn_v_b match none.
    if (name.find("attn_kv_b.weight") != std::string_view::npos) {
      if (use_more_bits(layer_of(spec), config.n_layer)) t = GgmlType::Q6_K;
      if (config.n_expert == 8) t = GgmlType::Q8_0;
    } else if (name.find("attn_output.weight") != std::string_view::npos) {
      if (config.n_expert == 8) t = GgmlType::Q5_K;
    } else if (name.find("ffn_down") != std::string_view::npos) {
      if (use_more_bits(layer_of(spec), config.n_layer)) t = GgmlType::Q6_K;
    }
  }
  return shape_fallback(t, ne0);
}

Plan make_plan(const SynthOptions& o) {
  Plan plan;
  plan.preset = o.preset;
  plan.type = o.type;
  const auto preset = ModelConfig::preset(o.preset);
  if (!preset)
    usage_error("unknown preset '", o.preset, "' (expected one of: ", joined(ModelConfig::preset_names()), ")");
  find_type(o.type);
  plan.config = *preset;
  ModelConfig& c = plan.config;
  if (o.layers != -1) {
    constexpr int kMaxLayers = 1000;
    const bool has_moe = c.n_leading_dense < c.n_layer;
    const int min_layers = has_moe ? int(c.n_leading_dense) + 1 : 1;
    if (o.layers < min_layers || o.layers > kMaxLayers)
      usage_error("--layers ", o.layers, " is out of range for preset ", o.preset, ": expected ", min_layers, "..",
                  kMaxLayers, has_moe ? cat(" (", c.n_leading_dense, " leading dense + at least 1 MoE layer)") : "",
                  ", or -1 for the preset's ", c.n_layer, " layers");
    c.n_layer = uint32_t(o.layers);
  }
  for (TensorSpec& s : expected_tensors(c)) {
    PlannedTensor p;
    p.type = tensor_type(c, s, o.type);
    uint64_t rows = 1, elems = s.ne[0];
    for (size_t i = 1; i < s.ne.size(); ++i) rows *= s.ne[i];
    elems *= rows;
    p.nbytes = row_bytes(p.type, s.ne[0]) * rows;
    p.spec = std::move(s);
    plan.data_bytes += align32(p.nbytes);
    plan.n_params += elems;
    plan.tensors.push_back(std::move(p));
  }
  plan.direct_blocks = o.generation == Generation::Blocks ||
                       (o.generation == Generation::Auto && plan.n_params > kDirectBlocksMinParams);
  return plan;
}

SynthResult synthesize(const SynthOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const Plan plan = make_plan(o);
  if (o.out_path.empty()) usage_error("synth: no output file given (-o FILE.gguf)");

  GgufWriter writer;
  Metadata& md = writer.metadata();
  plan.config.to_metadata(md);
  md.set_u32("general.quantization_version", 2);
  md.set_u32("general.file_type", file_type(o.type));
  text::write_vocab(text::build_synthetic_vocab(vocab_flavor(o.preset, plan.config), plan.config.n_vocab), md);

  // Jobs: (tensor, chunk) pairs in file order, so the file fills roughly front to back.
  struct Job {
    uint32_t tensor;
    uint64_t chunk;
  };
  std::vector<Job> jobs;
  uint64_t total_bytes = 0;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const PlannedTensor& t = plan.tensors[i];
    writer.add_tensor(t.spec.name, t.type, t.spec.ne);
    const uint64_t rows = t.nbytes / row_bytes(t.type, t.spec.ne[0]);
    const uint64_t rpc = rows_per_chunk(t);
    for (uint64_t c = 0; c * rpc < rows; ++c) jobs.push_back({uint32_t(i), c});
    total_bytes += t.nbytes;
  }
  writer.begin(o.out_path);

  std::atomic<size_t> next_job{0};
  std::atomic<uint64_t> bytes_done{0};
  std::atomic<unsigned> workers_running{0};
  std::atomic<bool> failed{false};
  std::exception_ptr first_error;
  std::mutex error_mutex;
  auto worker = [&] {
    std::vector<float> scratch;
    std::vector<uint8_t> buf;
    try {
      while (!failed.load(std::memory_order_relaxed)) {
        const size_t j = next_job.fetch_add(1);
        if (j >= jobs.size()) break;
        const PlannedTensor& t = plan.tensors[jobs[j].tensor];
        const uint64_t row_size = row_bytes(t.type, t.spec.ne[0]);
        const uint64_t rpc = rows_per_chunk(t);
        buf.resize(size_t(rpc * row_size));
        const uint64_t n = generate_chunk(plan, t, jobs[j].chunk, o.seed, buf.data(), scratch);
        writer.write_tensor(jobs[j].tensor, buf.data(), n, jobs[j].chunk * rpc * row_size);
        bytes_done.fetch_add(n, std::memory_order_relaxed);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!first_error) first_error = std::current_exception();
      failed = true;
    }
    workers_running.fetch_sub(1);
  };

  unsigned n_threads = o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  n_threads = unsigned(std::min<size_t>(n_threads, std::max<size_t>(1, jobs.size())));
  workers_running = n_threads;
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < n_threads; ++i) pool.emplace_back(worker);
  const auto since = [&](auto start) { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  const auto w0 = std::chrono::steady_clock::now();
  while (o.progress && workers_running.load() > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    draw_progress(bytes_done.load(), total_bytes, since(w0), false);
  }
  for (std::thread& th : pool) th.join();
  if (first_error) std::rethrow_exception(first_error);
  if (o.progress) draw_progress(bytes_done.load(), total_bytes, since(w0), true);
  writer.finish();

  SynthResult r;
  r.bytes = writer.total_size();
  r.n_tensors = plan.tensors.size();
  std::map<uint32_t, size_t> counts;
  for (const PlannedTensor& t : plan.tensors) ++counts[uint32_t(t.type)];
  for (auto [type, n] : counts) r.type_counts.emplace_back(GgmlType(type), n);
  r.seconds = since(t0);
  return r;
}

}  // namespace tessera::synth
