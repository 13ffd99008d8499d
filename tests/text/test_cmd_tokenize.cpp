// `tessera tokenize` end to end on a GGUF holding only a synthetic vocab.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "format/gguf.h"
#include "runtime/text/tokenizer.h"
#include "runtime/text/vocab_builder.h"

using namespace tessera;
using namespace tessera::text;

namespace {

struct RunResult {
  int exit_code;
  std::string out;  // stdout and stderr together
};

RunResult run(const std::string& args) {
  const std::string cmd = std::string(TESSERA_BINARY) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

class TokenizeCommand : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("tessera-tokenize-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write_model(const std::string& name, const VocabArrays& vocab, const std::string& model_key) {
    const std::string path = (dir_ / name).string();
    GgufWriter w;
    w.metadata().set_string("general.architecture", "deepseek2");
    write_vocab(vocab, w.metadata());
    w.metadata().set_string("tokenizer.ggml.model", model_key);
    w.begin(path);
    w.finish();
    return path;
  }

  std::filesystem::path dir_;
};

}  // namespace

TEST_F(TokenizeCommand, PrintsIdsAndPieces) {
  const std::string path = write_model("glm.gguf", build_synthetic_vocab("glm4", 1200), "gpt2");
  const Tokenizer tok = Tokenizer::from_metadata(GgufFile::open(path).metadata());

  const RunResult ids = run("tokenize " + path + " -p '[gMASK]<sop>Hello world' --ids");
  ASSERT_EQ(ids.exit_code, 0) << ids.out;
  std::string expected;
  for (int32_t id : tok.encode("[gMASK]<sop>Hello world", true, false))
    expected += (expected.empty() ? "" : " ") + std::to_string(id);
  EXPECT_EQ(ids.out, expected + "\n");

  const RunResult lines = run("tokenize " + path + " -p 'a\n b' ");
  ASSERT_EQ(lines.exit_code, 0) << lines.out;
  std::string want;
  for (int32_t id : tok.encode("a\n b", true, false)) {
    std::string piece = tok.token_piece(id, true);
    std::string escaped;
    for (char c : piece) escaped += c == '\n' ? std::string("\\n") : std::string(1, c);
    want += std::to_string(id) + "\t" + escaped + "\n";
  }
  EXPECT_EQ(lines.out, want);

  // --no-special: [gMASK] is plain text, so its id does not appear.
  const RunResult plain = run("tokenize " + path + " -p '[gMASK]' --ids --no-special");
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  EXPECT_EQ(plain.out.find(std::to_string(*tok.bos())), std::string::npos) << plain.out;
}

TEST_F(TokenizeCommand, RejectsNonBpeModelWithExitCode2) {
  const std::string path = write_model("spm.gguf", build_synthetic_vocab("glm4", 1200), "llama");
  const RunResult r = run("tokenize " + path + " -p hi");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("\"llama\""), std::string::npos) << r.out;
}
