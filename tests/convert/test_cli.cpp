// `tessera convert`, `tessera verify` and `tessera inspect` on .tsr files, end to end through the
// built binary: outputs, exit codes (0 ok, 1 usage, 2 bad input / failed verification).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>

#include "format/tsr.h"
#include "tests/convert/convert_test_util.h"

namespace tessera::convert {
namespace {

using testing::read_file;
using testing::synth_model;
using testing::temp_file;
using testing::write_file;

struct CliResult {
  int rc = -1;
  std::string out;  // stdout and stderr together
};

CliResult run(const std::string& args) {
  const std::string cmd = std::string(TESSERA_BINARY) + " " + args + " 2>&1";
  CliResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(ConvertCli, ConvertVerifyInspect) {
  const std::string src = synth_model("tiny-lite", "q4_k_m");
  const std::string out = temp_file("cli.tsr");
  const CliResult c = run("--threads 2 convert " + src + " -o " + out + " --compose qk --composed-type f16");
  ASSERT_EQ(c.rc, 0) << c.out;
  EXPECT_NE(c.out.find("wrote " + out), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("composed qk"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("composition:"), std::string::npos) << c.out;  // the size change
  EXPECT_EQ(TsrFile::open(out).metadata().get_string("tessera.composed_type"), "f16");

  const CliResult v = run("verify " + src + " " + out + " --all");
  EXPECT_EQ(v.rc, 0) << v.out;
  EXPECT_NE(v.out.find("result: PASS"), std::string::npos) << v.out;
  EXPECT_NE(v.out.find("ok   composed  blk.0.attn_qk.weight: f16"), std::string::npos) << v.out;

  const CliResult i = run("inspect " + out);
  EXPECT_EQ(i.rc, 0) << i.out;
  EXPECT_NE(i.out.find(".tsr file: " + out), std::string::npos) << i.out;
  EXPECT_NE(i.out.find("moe_tile1"), std::string::npos);
  EXPECT_NE(i.out.find("slot_stride="), std::string::npos);
  const CliResult j = run("inspect --json " + out);
  EXPECT_EQ(j.rc, 0) << j.out;
  EXPECT_NE(j.out.find("\"kind\": \"tsr\""), std::string::npos) << j.out.substr(0, 200);
  EXPECT_NE(j.out.find("\"slot_stride\": "), std::string::npos);

  // A changed tensor byte (checksums re-sealed) fails verification with exit code 2.
  testing::Bytes b = read_file(out);
  const TsrFile f = TsrFile::from_memory(b, "x");
  const TsrTensor& t = f.require_tensor("blk.2.ffn_moe_tile");
  b[t.offset + 100] ^= 0x21;
  testing::reseal(b);
  const std::string bad = temp_file("cli-bad.tsr");
  write_file(bad, b);
  const CliResult vb = run("verify " + src + " " + bad);
  EXPECT_EQ(vb.rc, 2) << vb.out;
  EXPECT_NE(vb.out.find("FAIL bytes  blk.2.ffn_gate_exps.weight"), std::string::npos) << vb.out;
  EXPECT_NE(vb.out.find("result: FAIL"), std::string::npos);
  // A damaged header is refused at open: exit code 2, the reason named.
  b = read_file(out);
  b[20] ^= 1;
  write_file(bad, b);
  const CliResult vh = run("verify " + src + " " + bad);
  EXPECT_EQ(vh.rc, 2) << vh.out;
  EXPECT_NE(vh.out.find("tessera: error:"), std::string::npos) << vh.out;
  const CliResult ih = run("inspect " + bad);
  EXPECT_EQ(ih.rc, 2) << ih.out;
}

// --composed-type q6_K / q4_K through the binary: tiny-lite's rows (256, 512) take the K-quants
// as asked; verify passes and reports each composed tensor's type and error.
TEST(ConvertCli, KQuantComposedTypes) {
  const std::string src = synth_model("tiny-lite", "q4_0");
  for (const std::string type : {"q6_K", "q4_K"}) {
    SCOPED_TRACE(type);
    const std::string out = temp_file("cli-" + type + ".tsr");
    const CliResult c = run("--threads 2 convert " + src + " -o " + out + " --compose all --composed-type " + type);
    ASSERT_EQ(c.rc, 0) << c.out;
    EXPECT_EQ(TsrFile::open(out).metadata().get_string("tessera.composed_type"), type);
    const CliResult v = run("--threads 2 verify " + src + " " + out + " --all");
    EXPECT_EQ(v.rc, 0) << v.out;
    EXPECT_NE(v.out.find("result: PASS"), std::string::npos) << v.out;
    for (const char* name : {"blk.0.attn_qk.weight", "blk.2.attn_vo.weight"})
      EXPECT_NE(v.out.find("ok   composed  " + std::string(name) + ": " + type + ", 4 heads: composition err max"),
                std::string::npos)
          << name << "\n" << v.out;
  }
}

TEST(ConvertCli, ConvertRefusals) {
  const std::string src = synth_model("tiny", "q4_0");
  EXPECT_EQ(run("convert " + src + " -o " + temp_file("x.tsr") + " --compose maybe").rc, 1);
  EXPECT_EQ(run("convert " + src + " -o " + temp_file("x.tsr") + " --composed-type q2_k").rc, 1);
  // The k-quants are spelled as GGUF names them; the usage error names every accepted word.
  const CliResult k = run("convert " + src + " -o " + temp_file("x.tsr") + " --composed-type q6_k");
  EXPECT_EQ(k.rc, 1) << k.out;
  for (const char* word : {"f32", "f16", "bf16", "q8_0", "q6_K", "q4_K", "q4_0", "source"})
    EXPECT_NE(k.out.find(word), std::string::npos) << word << " not named in: " << k.out;
  EXPECT_NE(k.out.find("spelled as GGUF names them: 'q6_K'"), std::string::npos) << k.out;
  EXPECT_EQ(run("convert " + src).rc, 1);  // no -o
  const CliResult same = run("convert " + src + " -o " + src);
  EXPECT_EQ(same.rc, 1) << same.out;
  EXPECT_NE(same.out.find("is the input file"), std::string::npos) << same.out;
  const std::string garbage = temp_file("garbage.gguf");
  write_file(garbage, testing::Bytes(100, 0x41));
  const CliResult g = run("convert " + garbage + " -o " + temp_file("x.tsr"));
  EXPECT_EQ(g.rc, 2) << g.out;
  EXPECT_FALSE(std::filesystem::exists(temp_file("x.tsr")));
  const CliResult vg = run("verify " + src + " " + garbage);
  EXPECT_EQ(vg.rc, 2) << vg.out;
  EXPECT_NE(vg.out.find("bad magic"), std::string::npos) << vg.out;
}

}  // namespace
}  // namespace tessera::convert
