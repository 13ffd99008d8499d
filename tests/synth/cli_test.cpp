// `tessera synth` on the command line: output file, summary line, exit codes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include "format/gguf.h"
#include "tests/synth/test_util.h"

namespace tessera::synth {
namespace {

using testing::ScratchDir;

struct ProcessResult {
  int code = -1;
  std::string output;  // stdout + stderr
};

ProcessResult run_tessera(const std::string& args) {
  const std::string cmd = std::string(TESSERA_BINARY) + " " + args + " 2>&1";
  ProcessResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(SynthCli, WritesFileAndPrintsSummary) {
  ScratchDir dir;
  const std::string out = dir.file("tiny.gguf");
  const ProcessResult r = run_tessera("--threads 2 synth --preset tiny --type q4_k_m --seed 3 -o " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("tensors"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("MB/s"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("q6_K"), std::string::npos) << r.output;  // the type mix summary
  const GgufFile f = GgufFile::open(out);
  EXPECT_EQ(f.metadata().get_uint("general.file_type"), 15u);

  // Same options through the CLI and a second run: same bytes.
  const std::string again = dir.file("again.gguf");
  ASSERT_EQ(run_tessera("--threads 1 synth --preset tiny --type q4_k_m --seed 3 -o " + again).code, 0);
  EXPECT_TRUE(testing::read_bytes(out) == testing::read_bytes(again));
}

TEST(SynthCli, LayersOption) {
  ScratchDir dir;
  const std::string out = dir.file("lite.gguf");
  const ProcessResult r = run_tessera("synth --preset tiny-lite --type q8_0 --layers 2 -o " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(GgufFile::open(out).metadata().get_uint("deepseek2.block_count"), 2u);
}

TEST(SynthCli, ExitCodes) {
  ScratchDir dir;
  const std::string out = dir.file("x.gguf");
  ProcessResult r = run_tessera("synth --preset nosuch --type q4_0 -o " + out);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("tiny-lite"), std::string::npos) << "the error should list the presets: " << r.output;
  r = run_tessera("synth --preset tiny --type q3_k -o " + out);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("q4_k_m"), std::string::npos) << r.output;
  EXPECT_EQ(run_tessera("synth --preset tiny --type q4_0 --layers 1 -o " + out).code, 1);
  EXPECT_EQ(run_tessera("synth --preset tiny --type q4_0").code, 1);              // no -o
  EXPECT_EQ(run_tessera("synth --preset tiny --type q4_0 --seed x -o " + out).code, 1);
  EXPECT_FALSE(std::filesystem::exists(out));
  r = run_tessera("synth --preset tiny --type q4_0 -o " + dir.file("no/such/dir/x.gguf"));
  EXPECT_EQ(r.code, 3) << r.output;
}

}  // namespace
}  // namespace tessera::synth
