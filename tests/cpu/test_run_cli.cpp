// `tessera run --backend cpu`: deterministic output for a seed, greedy ids equal to an in-process
// argmax loop, --dump-logits contents and size, --print-ids, and exit codes for bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "convert/synth.h"
#include "format/error.h"
#include "runtime/cpu/forward.h"
#include "runtime/cpu/generate.h"
#include "runtime/cpu/weight_source.h"
#include "tests/cpu/test_util.h"

namespace tessera {
namespace {

struct RunResult {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `tessera <args>` (args are passed to the shell as written). `run` commands get
// --backend cpu unless they name a backend.
RunResult run_tessera(std::string args) {
  if (args.rfind("run ", 0) == 0 && args.find("--backend") == std::string::npos) args += " --backend cpu";
  const std::string out = (test::temp_dir() / "stdout.txt").string(), err = (test::temp_dir() / "stderr.txt").string();
  const std::string cmd = std::string("'") + TESSERA_BINARY + "' --threads 2 " + args + " >'" + out + "' 2>'" + err + "'";
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

const std::string& tiny_model() {
  static const std::string path = [] {
    const std::string p = (test::temp_dir() / "cli-tiny-q8_0.gguf").string();
    synth::SynthOptions o;
    o.preset = "tiny";
    o.type = "q8_0";
    o.seed = 9;
    o.out_path = p;
    o.threads = 2;
    synth::synthesize(o);
    return p;
  }();
  return path;
}

std::string last_line(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  const size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

TEST(RunCli, SameSeedSameOutput) {
  const std::string args = "run '" + tiny_model() + "' -p 'The quick brown fox' -n 24 --seed 1234 --print-ids";
  const RunResult a = run_tessera(args), b = run_tessera(args);
  ASSERT_EQ(a.rc, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.err.find("tok/s"), std::string::npos) << a.err;
  EXPECT_NE(a.err.find("prompt:"), std::string::npos) << a.err;
  const RunResult c = run_tessera("run '" + tiny_model() + "' -p 'The quick brown fox' -n 24 --seed 99 --print-ids");
  ASSERT_EQ(c.rc, 0) << c.err;
  EXPECT_NE(last_line(a.out), last_line(c.out));
}

TEST(RunCli, GreedyIdsMatchInProcessArgmax) {
  const std::vector<int32_t> prompt{5, 77, 300, 12, 901};
  const RunResult r = run_tessera("run '" + tiny_model() + "' --tokens 5,77,300,12,901 -n 6 --temp 0 --print-ids");
  ASSERT_EQ(r.rc, 0) << r.err;
  std::vector<int32_t> cli_ids;
  std::istringstream line(last_line(r.out));
  for (int32_t id; line >> id;) cli_ids.push_back(id);
  ASSERT_FALSE(cli_ids.empty());

  GgufWeights w(tiny_model());
  CpuModel model(w, 64, 2, AttentionPath::Absorbed);
  std::vector<float> logits = model.forward(prompt, true);
  for (size_t i = 0; i < cli_ids.size(); ++i) {
    const int32_t best = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_EQ(cli_ids[i], best) << "token " << i;
    logits = model.forward(std::vector<int32_t>{best}, true);
  }
}

TEST(RunCli, DumpLogitsSizeAndContents) {
  const std::string dump = (test::temp_dir() / "logits.f32").string();
  const RunResult r =
      run_tessera("run '" + tiny_model() + "' --tokens 1,2,3,4,5,6,7 -n 0 --attention expanded --dump-logits '" + dump + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "");  // -n 0: nothing generated
  const std::string bytes = slurp(dump);
  GgufWeights w(tiny_model());
  CpuModel model(w, 16, 2, AttentionPath::Absorbed);
  const std::vector<float> ref = model.forward(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7});
  ASSERT_EQ(bytes.size(), ref.size() * sizeof(float));
  std::vector<float> got(ref.size());
  std::memcpy(got.data(), bytes.data(), bytes.size());
  EXPECT_LT(test::max_rel_diff(got, ref), 1e-4);
}

TEST(RunCli, ChatPromptRuns) {
  const RunResult r = run_tessera("run '" + tiny_model() + "' --chat -p 'Hi there' -n 4 --seed 5 --print-ids");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_FALSE(last_line(r.out).empty());
}

TEST(RunCli, ExitCodes) {
  const std::string m = "'" + tiny_model() + "'";
  EXPECT_EQ(run_tessera("run " + m).rc, 1);                                   // no prompt
  EXPECT_EQ(run_tessera("run " + m + " -p hi --tokens 1,2").rc, 1);           // two prompts
  EXPECT_EQ(run_tessera("run " + m + " --tokens 1,x").rc, 1);                 // bad id list
  EXPECT_EQ(run_tessera("run " + m + " --tokens 1,99999 -n 0").rc, 1);        // id outside the vocab
  EXPECT_EQ(run_tessera("run " + m + " --tokens 1,2,3 --ctx 2 -n 0").rc, 1);  // prompt > context
  EXPECT_EQ(run_tessera("run " + m + " -p hi --backend metal").rc, 1);        // no such backend
  const RunResult missing = run_tessera("run /nonexistent/model.gguf -p hi");
  EXPECT_EQ(missing.rc, 3);
  EXPECT_NE(missing.err.find("/nonexistent/model.gguf"), std::string::npos) << missing.err;
  const std::string junk = (test::temp_dir() / "junk.gguf").string();
  std::ofstream(junk) << "this is not a model";
  EXPECT_EQ(run_tessera("run '" + junk + "' -p hi").rc, 2);
  const std::string truncated = (test::temp_dir() / "truncated.gguf").string();
  std::ofstream(truncated, std::ios::binary) << slurp(tiny_model()).substr(0, 5000);
  const RunResult t = run_tessera("run '" + truncated + "' -p hi");
  EXPECT_EQ(t.rc, 2) << t.err;
  EXPECT_NE(t.err.find("truncated.gguf"), std::string::npos) << t.err;
}

TEST(ParseTokenList, AcceptsAndRejects) {
  EXPECT_EQ(parse_token_list("1,2, 3 ,40"), (std::vector<int32_t>{1, 2, 3, 40}));
  EXPECT_EQ(parse_token_list("7"), (std::vector<int32_t>{7}));
  for (const char* bad : {"", "1,,2", "1,-2", "a", "1,2,", "99999999999"}) {
    try {
      parse_token_list(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage) << bad;
    }
  }
}

}  // namespace
}  // namespace tessera
