// Small valid .tsr seeds for fuzz_tsr.cpp (~100-250 KB each, vs 1.1-1.6 MB for `tessera synth
// --preset tiny`, which makes the fuzzer ~8x slower): the tiny presets shrunk to n_embd 64, vocab
// 320, 2 blocks, written as `tessera synth` writes a GGUF (same type mix, values and vocab), then
// packed by `tessera convert` with several compose options. Not built by default; from the
// repository root, with a normal build in build/:
//
//   g++ -std=c++20 -O1 -I. tests/fuzz/make_tsr_seeds.cpp build/libtessera_convert.a
//       build/libtessera_text.a build/libtessera_format.a -lpcre2-8 -lzstd -lxxhash -pthread -o make_tsr_seeds
//   (one command line)
//   mkdir -p tsr-seeds && ./make_tsr_seeds tsr-seeds    # writes *.gguf and *.tsr; the .tsr are the seeds
#include <cstdio>
#include <string>
#include <vector>

#include "convert/convert.h"
#include "convert/synth.h"
#include "format/gguf.h"
#include "runtime/text/vocab_builder.h"

using namespace tessera;

namespace {

// The preset's structure (q LoRA or not, gating, YaRN, shared experts) at the smallest widths the
// layouts allow: 32-element blocks, a vocab holding the 256 byte tokens and the special block.
ModelConfig shrunk_config(const std::string& preset) {
  ModelConfig c = *ModelConfig::preset(preset);
  c.n_layer = 2; c.n_embd = 64; c.n_head = 2; c.kv_lora_rank = 32; c.n_rot = 16; c.n_nope = 32; c.n_v = 32;
  c.n_ff = 64; c.n_ff_exp = 32; c.n_expert = 4; c.n_expert_used = 2; c.n_vocab = 320; c.n_ctx_train = 256;
  if (c.q_lora_rank) c.q_lora_rank = 32;
  if (c.yarn) c.yarn_n_ctx_orig = 64;
  return c;
}

// synth::synthesize for a shrunk config (synth::make_plan takes presets only): same type mix,
// value generation (seed 7) and vocab flavor.
void write_gguf(const std::string& preset, const std::string& type, const std::string& path) {
  synth::Plan plan;
  plan.preset = preset;
  plan.type = type;
  plan.config = shrunk_config(preset);
  for (TensorSpec& s : expected_tensors(plan.config)) {
    synth::PlannedTensor p;
    p.type = synth::tensor_type(plan.config, s, type);
    uint64_t rows = 1;
    for (size_t i = 1; i < s.ne.size(); ++i) rows *= s.ne[i];
    p.nbytes = row_bytes(p.type, s.ne[0]) * rows;
    p.spec = std::move(s);
    plan.tensors.push_back(std::move(p));
  }
  GgufWriter w;
  plan.config.to_metadata(w.metadata());
  w.metadata().set_u32("general.quantization_version", 2);
  w.metadata().set_u32("general.file_type", synth::file_type(type));
  text::write_vocab(text::build_synthetic_vocab(preset == "tiny" ? "glm4" : "deepseek-llm", plan.config.n_vocab), w.metadata());
  for (const auto& t : plan.tensors) w.add_tensor(t.spec.name, t.type, t.spec.ne);
  w.begin(path);
  std::vector<float> scratch;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const auto& t = plan.tensors[i];
    const uint64_t rb = row_bytes(t.type, t.spec.ne[0]), rpc = synth::rows_per_chunk(t), rows = t.nbytes / rb;
    std::vector<uint8_t> buf(rpc * rb);
    for (uint64_t c = 0; c * rpc < rows; ++c) {
      const uint64_t n = synth::generate_chunk(plan, t, c, 7, buf.data(), scratch);
      w.write_tensor(i, buf.data(), n, c * rpc * rb);
    }
  }
  w.finish();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : ".";
  struct Seed { const char* preset; const char* type; const char* compose; };
  for (Seed s : {Seed{"tiny", "q4_0", "all"}, Seed{"tiny", "q4_0", "none"}, Seed{"tiny-lite", "q4_k_m", "all"},
                 Seed{"tiny", "q8_0", "qk"}, Seed{"tiny-lite", "f16", "vo"}, Seed{"tiny", "bf16", "none"}}) {
    const std::string base = dir + "/" + s.preset + "_" + s.type + "_" + s.compose;
    write_gguf(s.preset, s.type, base + ".gguf");
    convert::ConvertOptions o;
    o.in_path = base + ".gguf";
    o.out_path = base + ".tsr";
    o.compose = s.compose;
    const auto r = convert::convert_model(o);
    std::printf("%s: %zu tensors, %llu bytes\n", o.out_path.c_str(), r.n_tensors, (unsigned long long)r.out_file_bytes);
  }
}
