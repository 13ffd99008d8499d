// The GPU front ends through the real binary: `run` on a .tsr (Vulkan by default) gives the same
// greedy ids as the CPU reference on the original GGUF; `chat` keeps going across turns and
// /reset; `verify --logits` passes (also with q6_K-composed weights); a .gguf with --backend
// vulkan is a usage error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "convert/convert.h"
#include "convert/synth.h"
#include "runtime/vulkan/context.h"
#include "tests/model/model_fixture.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

struct Out {
  int code;
  std::string text;
};
// Runs a shell command line, capturing stdout (and stderr when asked).
Out sh(const std::string& cmd) {
  Out o{-1, {}};
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return o;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) o.text.append(buf, n);
  const int st = pclose(p);
  o.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return o;
}

class CliGpu : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("tessera-test-cli-gpu-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    try {
      vk::Context ctx;
      have_vulkan_ = true;
    } catch (...) {
      have_vulkan_ = false;
    }
    gguf_ = (dir_ / "tiny.gguf").string();
    tsr_ = (dir_ / "tiny.tsr").string();
    synth::SynthOptions so;
    so.preset = "tiny";
    so.type = "q8_0";
    so.seed = 5;
    so.out_path = gguf_;
    synth::synthesize(so);
    convert::ConvertOptions co;
    co.in_path = gguf_;
    co.out_path = tsr_;
    co.compose = "none";
    convert::convert_model(co);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  void SetUp() override {
    if (!have_vulkan_) GTEST_SKIP() << "no Vulkan device";
  }
  static std::string bin() { return TESSERA_BINARY; }
  static inline fs::path dir_;
  static inline std::string gguf_, tsr_;
  static inline bool have_vulkan_ = false;
};

std::string last_line(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  const size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

TEST_F(CliGpu, RunOnVulkanMatchesTheCpuReferenceGreedy) {
  const std::string args = " --tokens 5,17,300,42 -n 12 --temp 0 --print-ids 2>/dev/null";
  const Out gpu = sh(bin() + " run " + tsr_ + args);
  const Out cpu = sh(bin() + " run " + gguf_ + " --backend cpu" + args);
  ASSERT_EQ(gpu.code, 0) << gpu.text;
  ASSERT_EQ(cpu.code, 0) << cpu.text;
  EXPECT_FALSE(last_line(gpu.text).empty());
  EXPECT_EQ(last_line(gpu.text), last_line(cpu.text));
}

// Little-endian f32 values of a file (--dump-logits).
std::vector<float> read_floats(const std::string& path) {
  std::vector<float> v(fs::file_size(path) / 4);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f) {
    v.resize(std::fread(v.data(), 4, v.size(), f));
    std::fclose(f);
  }
  return v;
}

// --prefill-chunk reaches the model (-v says the chunk); chunks of 3 give the greedy tokens of
// the default chunk. Token by token (--prefill-chunk 0) the prompt runs through the decode step,
// whose int8 hand-over of q_a's output (GpuModelOptions::qk_q8) rounds otherwise than the
// prefill's staging: its prompt logits are held to the int8 path's bound (GpuModel.
// Int8ActivationsTrackTheReference: tiny's random weights amplify a rounding), not to the bits.
TEST_F(CliGpu, RunTakesThePrefillChunk) {
  const std::string args = " --tokens 5,17,300,42,9,77,1000 -n 8 --temp 0 --print-ids";
  const std::string def_logits = (dir_ / "chunk-default.f32").string(), none_logits = (dir_ / "chunk-0.f32").string();
  const Out def = sh(bin() + " run " + tsr_ + args + " --dump-logits " + def_logits + " 2>/dev/null");
  const std::string err = (dir_ / "chunk3.err").string();
  const Out three = sh(bin() + " -v run " + tsr_ + args + " --prefill-chunk 3 2>" + err);
  const Out none = sh(bin() + " run " + tsr_ + args + " --prefill-chunk 0 --dump-logits " + none_logits + " 2>/dev/null");
  ASSERT_EQ(def.code, 0) << def.text;
  ASSERT_EQ(three.code, 0) << three.text;
  ASSERT_EQ(none.code, 0) << none.text;
  const Out said = sh("cat " + err);
  EXPECT_NE(said.text.find("prefill in chunks of 3 tokens"), std::string::npos) << said.text;
  EXPECT_EQ(last_line(three.text), last_line(def.text));
  const std::vector<float> a = read_floats(def_logits), b = read_floats(none_logits);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size() % 7, 0u);
  const testfx::LogitGap gap = testfx::compare_logits(b, a, a.size() / 7);  // token by token against the chunks
  EXPECT_EQ(gap.rows, 7u);
  EXPECT_LT(gap.max_rel, 0.35);
  EXPECT_GE(2 * gap.top1_same, gap.rows);
  const std::string ids = last_line(none.text);  // 8 greedy ids
  EXPECT_EQ(std::count(ids.begin(), ids.end(), ' '), 7) << ids;
}

TEST_F(CliGpu, VulkanBackendRefusesAGguf) {
  const Out o = sh(bin() + " run " + gguf_ + " --backend vulkan --tokens 1 -n 1 2>&1");
  EXPECT_EQ(o.code, 1) << o.text;
  EXPECT_NE(o.text.find("convert it first"), std::string::npos) << o.text;
}

TEST_F(CliGpu, ChatKeepsTurnsAndResets) {
  const Out o = sh("printf 'Hello\\nAnd again\\n/reset\\nHi\\n/quit\\n' | " + bin() + " chat " + tsr_ +
                   " --temp 0 -n 6 2>&1");
  ASSERT_EQ(o.code, 0) << o.text;
  EXPECT_NE(o.text.find("(conversation reset)"), std::string::npos) << o.text;
  EXPECT_GE(std::count(o.text.begin(), o.text.end(), '>'), 4) << o.text;  // a prompt per line read
}

TEST_F(CliGpu, VerifyLogitsPasses) {
  const Out o = sh(bin() + " verify " + gguf_ + " " + tsr_ + " --logits 6 2>&1");
  EXPECT_EQ(o.code, 0) << o.text;
  EXPECT_NE(o.text.find("logits"), std::string::npos) << o.text;
}

// The Vulkan runtime on q6_K-composed weights (attn_vo stored q6_K; tiny's 96-long attn_qk rows
// fall back to q8_0): verify --logits passes against the CPU reference on the original.
TEST_F(CliGpu, VerifyLogitsPassesOnQ6KComposedWeights) {
  const std::string tsr = (dir_ / "tiny-q6_K.tsr").string();
  const Out c = sh(bin() + " --threads 2 convert " + gguf_ + " -o " + tsr + " --compose all --composed-type q6_K 2>&1");
  ASSERT_EQ(c.code, 0) << c.text;
  const Out o = sh(bin() + " --threads 2 verify " + gguf_ + " " + tsr + " --logits 8 --all 2>&1");
  EXPECT_EQ(o.code, 0) << o.text;
  EXPECT_NE(o.text.find("blk.1.attn_vo.weight: q6_K, 4 heads"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("blk.1.attn_qk.weight: q8_0, 4 heads"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("ok   logits"), std::string::npos) << o.text;
  EXPECT_EQ(o.text.find("FAIL"), std::string::npos) << o.text;
}

}  // namespace
}  // namespace tessera
