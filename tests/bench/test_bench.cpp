// `tessera bench` on a tiny synthetic model (lavapipe here): the JSON schema, the markdown and CSV
// shapes, the CPU backend, the profiler (grouping; per-kernel times adding up to the measured
// token time), the SVG, --roofline, and usage errors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "convert/convert.h"
#include "convert/synth.h"
#include "format/error.h"
#include "runtime/model/bench.h"
#include "runtime/model/profile.h"
#include "runtime/vulkan/context.h"
#include "tests/bench/mini_json.h"
#include "tests/model/model_fixture.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testjson::Value;

testfx::TempDir test_dir("bench");
const fs::path& temp_dir() { return test_dir.path(); }

bool have_vulkan() {
  static const bool ok = [] {
    try {
      vk::Context ctx;
      return true;
    } catch (const Error&) {
      return false;
    }
  }();
  return ok;
}

// The tiny preset as GGUF (once) and packed with every MLA weight composed (once).
const std::string& tiny_gguf() {
  static const std::string p = [] {
    const fs::path g = temp_dir() / "tiny-q4_0.gguf";
    synth::synthesize({"tiny", "q4_0", 5, -1, g.string()});
    return g.string();
  }();
  return p;
}
const std::string& tiny_tsr() {
  static const std::string p = [] {
    const fs::path t = temp_dir() / "tiny-q4_0-all.tsr";
    convert::ConvertOptions o;
    o.in_path = tiny_gguf();
    o.out_path = t.string();
    o.compose = "all";
    o.threads = 2;
    convert::convert_model(o);
    return t.string();
  }();
  return p;
}

struct RunResult {
  int rc = -1;
  std::string out;
};
// Runs the tessera binary with `args` (a shell-quoted string); stdout captured, stderr dropped.
RunResult run_tessera(const std::string& args) {
  const std::string cmd = std::string("'") + TESSERA_BINARY + "' " + args + " 2>/dev/null";
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// ---------------------------------------------------------------------------------------------
// Pure functions: no device needed.

TEST(BenchProfile, KernelFamilyDropsTensorAndBlockNames) {
  EXPECT_EQ(model::kernel_family("matvec.q4_0.norm blk.3.attn_q_a.weight"), "matvec.q4_0.norm");
  EXPECT_EQ(model::kernel_family("matvec.q6_k output.weight"), "matvec.q6_k");
  EXPECT_EQ(model::kernel_family("attention blk.3. partial"), "attention.partial");
  EXPECT_EQ(model::kernel_family("attention blk.12. merge"), "attention.merge");
  EXPECT_EQ(model::kernel_family("moe_gateup blk.1."), "moe_gateup");
  EXPECT_EQ(model::kernel_family("absorb.q blk.0.attn_k_b"), "absorb.q");
  EXPECT_EQ(model::kernel_family("sample"), "sample");
  EXPECT_EQ(model::kernel_family(""), "unnamed");
}

TEST(BenchProfile, SummaryAddsUpAndSortsByTime) {
  // Two tokens of four dispatches: two matvecs, one attention, one sample.
  const std::vector<std::vector<vk::DispatchTiming>> steps = {
      {{"matvec.q4_0 blk.0.a.weight", 1000, 10}, {"attention blk.0. partial", 200, 5},
       {"matvec.q4_0 blk.1.a.weight", 3000, 30}, {"sample", 40, 1}},
      {{"matvec.q4_0 blk.0.a.weight", 1000, 12}, {"attention blk.0. partial", 200, 7},
       {"matvec.q4_0 blk.1.a.weight", 3000, 28}, {"sample", 40, 3}}};
  const std::vector<double> wall = {60, 50, 55};
  const model::TokenProfile p = model::summarize_profile(steps, wall, 100.0, 17);
  EXPECT_EQ(p.depth, 17u);
  EXPECT_EQ(p.tokens, 2);
  EXPECT_EQ(p.dispatches, 4u);
  EXPECT_EQ(p.bytes_per_token, 4240u);
  EXPECT_DOUBLE_EQ(p.kernel_us, 48.0);  // median of 46 and 50
  EXPECT_DOUBLE_EQ(p.token_us, 55.0);
  EXPECT_DOUBLE_EQ(p.outside_us, 7.0);
  EXPECT_NEAR(p.floor_us, 4240 / (100.0 * 1e3), 1e-12);
  ASSERT_EQ(p.families.size(), 3u);
  EXPECT_EQ(p.families[0].family, "matvec.q4_0");
  EXPECT_EQ(p.families[0].calls_per_token, 2);
  EXPECT_DOUBLE_EQ(p.families[0].us_per_token, 40.0);
  EXPECT_DOUBLE_EQ(p.families[0].us_per_call, 20.0);  // median of 10, 30, 12, 28
  EXPECT_DOUBLE_EQ(p.families[0].bytes_per_call, 2000.0);
  EXPECT_NEAR(p.families[0].gbps, 8000.0 / (80.0 * 1e3), 1e-12);
  EXPECT_EQ(p.families[1].family, "attention.partial");
  EXPECT_EQ(p.families[2].family, "sample");
  double share = 0;
  for (const auto& f : p.families) share += f.share;
  EXPECT_NEAR(share, 1.0, 0.05);

  const std::string md = model::profile_markdown(p);
  EXPECT_NE(md.find("| matvec.q4_0 | 2 |"), std::string::npos) << md;
  EXPECT_NE(md.find("outside kernels"), std::string::npos);
  const std::vector<model::TokenProfile> ps = {p};
  const std::string svg = model::profile_svg(ps, "a <title> & more");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("a &lt;title&gt; &amp; more"), std::string::npos);
  EXPECT_NE(svg.find(">attention.partial<"), std::string::npos);
  size_t rects = 0;
  for (size_t at = svg.find("<rect"); at != std::string::npos; at = svg.find("<rect", at + 1)) ++rects;
  EXPECT_EQ(rects, 1u + 3u);  // background + one bar per family
}

TEST(BenchProfile, MismatchedStepsAreRefused) {
  const std::vector<std::vector<vk::DispatchTiming>> steps = {{{"a", 1, 1}, {"b", 1, 1}}, {{"a", 1, 1}}};
  const std::vector<double> wall = {1};
  EXPECT_THROW(model::summarize_profile(steps, wall, 1, 0), Error);
  EXPECT_THROW(model::summarize_profile({}, wall, 1, 0), Error);
}

// ---------------------------------------------------------------------------------------------
// The command, end to end.

// The warm-up: one run, then more until its seconds have passed: one run with --warmup 0,
// several where a run takes a fraction of them; a greedy decode test always one (its runs continue from each
// other's samples); a negative time is refused (CLI11's range check).
TEST(BenchCli, WarmupRunsUntilItsTime) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  for (const char* warmup : {"0", "1"}) {
    const RunResult r = run_tessera("bench '" + tiny_tsr() + "' -p 3 -n 2 -r 1 -o json --warmup " + warmup);
    ASSERT_EQ(r.rc, 0) << r.out;
    const Value j = testjson::parse(r.out);
    const Value& pp = j["results"].arr.at(0);
    if (std::string(warmup) == "0") EXPECT_EQ(pp["warmup_runs"].num, 1);
    else if (pp["seconds"].arr.at(0).num < 0.1) EXPECT_GE(pp["warmup_runs"].num, 2) << "runs of " << pp["seconds"].arr[0].num << " s";
    EXPECT_EQ(j["results"].arr.at(1)["warmup_runs"].num, 1);  // tg2, greedy
  }
  EXPECT_NE(run_tessera("bench '" + tiny_tsr() + "' -p 3 -n 0 --warmup -1").rc, 0);
}

TEST(BenchCli, JsonHasTheSchemaFields) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const RunResult r = run_tessera("bench '" + tiny_tsr() + "' -p 3 -n 4 -d 0,5 -r 2 -o json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const Value j = testjson::parse(r.out);
  EXPECT_EQ(j["tessera"]["version"].kind, Value::String);
  EXPECT_FALSE(j["tessera"]["commit"].str.empty());
  EXPECT_FALSE(j["device"]["name"].str.empty());
  EXPECT_EQ(j["device"]["backend"].str, "vulkan");
  EXPECT_EQ(j["model"]["composition"].str, "qk+vo");
  EXPECT_NE(j["model"]["types"].str.find("q4_0"), std::string::npos);
  EXPECT_GE(j["model"]["n_ctx"].num, 5 + 4);
  EXPECT_GT(j["model"]["dispatches_per_token"].num, 0);
  EXPECT_GT(j["model"]["barriers_per_token"].num, 0);
  EXPECT_GT(j["model"]["weight_bytes_per_token"].num, 0);
  const Value& res = j["results"];
  ASSERT_EQ(res.kind, Value::Array);
  ASSERT_EQ(res.arr.size(), 4u);  // pp3, tg4 at depths 0 and 5
  const char* tests[] = {"pp3", "tg4", "pp3", "tg4"};
  const double depths[] = {0, 0, 5, 5};
  for (size_t i = 0; i < 4; ++i) {
    const Value& t = res.arr[i];
    EXPECT_EQ(t["test"].str, tests[i]);
    EXPECT_EQ(t["kind"].str, i % 2 ? "decode" : "prefill");
    EXPECT_EQ(t["depth"].num, depths[i]);
    EXPECT_EQ(t["repetitions"].num, 2);
    EXPECT_GE(t["warmup_runs"].num, 1);
    ASSERT_EQ(t["seconds"].arr.size(), 2u);
    EXPECT_GT(t["tok_per_s_mean"].num, 0);
    EXPECT_GE(t["tok_per_s_stddev"].num, 0);
    EXPECT_GT(t["tok_per_s_median"].num, 0);
    // The median of two runs' tok/s is their mean.
    const double n = t["n_tokens"].num, s0 = t["seconds"].arr[0].num, s1 = t["seconds"].arr[1].num;
    EXPECT_NEAR(t["tok_per_s_median"].num, 0.5 * (n / s0 + n / s1), 1e-6 * t["tok_per_s_median"].num);
    EXPECT_NEAR(t["tok_per_s_mean"].num, 0.5 * (n / s0 + n / s1), 1e-6 * t["tok_per_s_mean"].num);
    if (i % 2) EXPECT_EQ(t["ids_digest"].str.size(), 16u);  // decode: the token ids' digest
    else EXPECT_FALSE(t.has("ids_digest"));
  }
  EXPECT_FALSE(j.has("profiles"));
  EXPECT_FALSE(j.has("roofline"));
}

TEST(BenchCli, MarkdownAndCsvShapes) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const RunResult md = run_tessera("bench '" + tiny_tsr() + "' -p 2 -n 2 -r 1");
  ASSERT_EQ(md.rc, 0) << md.out;
  for (const char* s : {"device:", "tessera:", "model:", "types:", "mla:", "context:", "per token:",
                        "| test | depth | reps |", "| pp2 | 0 | 1 |", "| tg2 | 0 | 1 |"})
    EXPECT_NE(md.out.find(s), std::string::npos) << s << "\n" << md.out;
  const RunResult csv = run_tessera("bench '" + tiny_tsr() + "' -p 0 -n 2,3 -r 1 -o csv");
  ASSERT_EQ(csv.rc, 0) << csv.out;
  std::istringstream lines(csv.out);
  std::string header, line;
  std::getline(lines, header);
  EXPECT_EQ(header.rfind("device,driver,backend,", 0), 0u);
  const size_t columns = std::count(header.begin(), header.end(), ',');
  int rows = 0;
  while (std::getline(lines, line)) {
    ++rows;
    EXPECT_NE(line.find(rows == 1 ? ",tg2,decode,2,0,1," : ",tg3,decode,3,0,1,"), std::string::npos) << line;
    EXPECT_GE(size_t(std::count(line.begin(), line.end(), ',')), columns);  // quoted fields may hold commas
  }
  EXPECT_EQ(rows, 2);
}

// --kernel-stats: every kernel the run compiled with the driver's statistics, or (a device without
// VK_KHR_pipeline_executable_properties, e.g. this lavapipe) a note saying so; both formats.
TEST(BenchCli, KernelStatsOrWhyNot) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const RunResult r = run_tessera("bench '" + tiny_tsr() + "' -p 0 -n 2 -r 1 --kernel-stats -o json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const Value j = testjson::parse(r.out);
  ASSERT_TRUE(j.has("kernel_statistics")) << r.out;
  const Value& ks = j["kernel_statistics"];
  const bool reported = !ks["kernels"].arr.empty();
  EXPECT_NE(reported, !ks["note"].str.empty()) << "statistics and a note saying there are none";
  for (const Value& k : ks["kernels"].arr) {
    EXPECT_FALSE(k["kernel"].str.empty());
    EXPECT_FALSE(k["statistics"].obj.empty()) << k["kernel"].str;
  }
  if (reported) {  // the decode step's kernels are among them
    bool matvec = false;
    for (const Value& k : ks["kernels"].arr) matvec = matvec || k["kernel"].str.rfind("matvec.", 0) == 0;
    EXPECT_TRUE(matvec);
  } else {
    EXPECT_NE(ks["note"].str.find("VK_KHR_pipeline_executable_properties"), std::string::npos) << ks["note"].str;
  }
  const RunResult md = run_tessera("bench '" + tiny_tsr() + "' -p 0 -n 2 -r 1 --kernel-stats");
  ASSERT_EQ(md.rc, 0) << md.out;
  EXPECT_NE(md.out.find(reported ? "| kernel | statistics |" : "kernel statistics: "), std::string::npos) << md.out;
  const RunResult plain = run_tessera("bench '" + tiny_tsr() + "' -p 0 -n 2 -r 1 -o json");
  ASSERT_EQ(plain.rc, 0);
  EXPECT_FALSE(testjson::parse(plain.out).has("kernel_statistics"));
  // Without a model (--roofline only): the roofline's own kernels, or the note.
  const RunResult roof = run_tessera("bench --roofline --roofline-mib 8 --kernel-stats -o json");
  ASSERT_EQ(roof.rc, 0) << roof.out;
  const Value rj = testjson::parse(roof.out);
  ASSERT_TRUE(rj.has("kernel_statistics")) << roof.out;
  EXPECT_NE(rj["kernel_statistics"]["kernels"].arr.empty(), rj["kernel_statistics"]["note"].str.empty());
  // The CPU backend has no kernels to report: a usage error, not a silent run.
  EXPECT_EQ(run_tessera("bench '" + tiny_gguf() + "' --backend cpu -p 0 -n 2 -r 1 --kernel-stats").rc, 1);
}

// The statistics table as bench prints it (no device: a report made here).
TEST(BenchFormat, KernelStatisticsTable) {
  model::BenchReport r;
  r.kernel_stats.push_back({"moe_gateup.q4_0.q8act", {{"Register Count", "64"}, {"Shared Memory", "3072"}}});
  r.kernel_stats.push_back({"matvec.q8_0.q8act", {{"Register Count", "40"}}});
  const std::string md = model::bench_markdown(r);
  EXPECT_NE(md.find("| moe_gateup.q4_0.q8act | Register Count 64; Shared Memory 3072 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| matvec.q8_0.q8act | Register Count 40 |"), std::string::npos) << md;
  const Value j = testjson::parse(model::bench_json(r));
  const Value& k = j["kernel_statistics"]["kernels"];
  ASSERT_EQ(k.arr.size(), 2u);
  EXPECT_EQ(k.arr[0]["statistics"]["Shared Memory"].str, "3072");
  EXPECT_EQ(j["kernel_statistics"]["note"].str, "");
}

// A decode whose runs from the same forced inputs decoded other ids (BenchResult::runs_differ):
// flagged beside the digest in markdown and as a count in the JSON; nothing said where none differ.
TEST(BenchFormat, RunsThatDifferAreFlagged) {
  model::BenchReport r;
  model::BenchResult b;
  b.kind = "tg";
  b.n_tokens = 16;
  b.seconds = {0.1, 0.1};
  b.ids_digest = 0x0123456789abcdefull;
  b.runs_differ = 2;
  r.results.push_back(b);
  b.runs_differ = 0;
  r.results.push_back(b);
  const std::string md = model::bench_markdown(r);
  EXPECT_NE(md.find("| 0123456789abcdef (2 runs differ) |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 0123456789abcdef |"), std::string::npos) << md;
  const Value j = testjson::parse(model::bench_json(r));
  ASSERT_EQ(j["results"].arr.size(), 2u);
  EXPECT_EQ(j["results"].arr[0]["runs_differ"].num, 2);
  EXPECT_EQ(j["results"].arr[1]["runs_differ"].num, 0);
}

// --tune router=0|1: the router's own dispatch or the router fold (where the device has 64-bit
// integer atomics), named in the JSON header; the fold records one dispatch and one barrier less
// per MoE layer.
TEST(BenchCli, TuneRouterChoosesTheRouterPath) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const RunResult off = run_tessera("bench '" + tiny_tsr() + "' -p 0 -n 2 -r 1 -o json --tune router=0");
  ASSERT_EQ(off.rc, 0) << off.out;
  const RunResult on = run_tessera("bench '" + tiny_tsr() + "' -p 0 -n 2 -r 1 -o json --tune router=1");
  ASSERT_EQ(on.rc, 0) << on.out;
  const Value a = testjson::parse(off.out), b = testjson::parse(on.out);
  EXPECT_EQ(a["model"]["router"].str, "dispatch");
  if (b["model"]["router"].str == "fused") {
    EXPECT_LT(b["model"]["dispatches_per_token"].num, a["model"]["dispatches_per_token"].num);
    EXPECT_LT(b["model"]["barriers_per_token"].num, a["model"]["barriers_per_token"].num);
  } else {
    EXPECT_EQ(b["model"]["router"].str, "dispatch");  // no 64-bit integer atomics on this device
  }
  EXPECT_EQ(run_tessera("bench '" + tiny_tsr() + "' -p 0 -n 2 -r 1 --tune router=2").rc, 1);
}

// --tune and --attention refuse, before loading anything, a value past a knob's range (naming the
// range and what the values mean) and an unknown key (listing the keys); usage errors exit 1.
TEST(BenchCli, TuneRefusesValuesOutsideAKnobsRangeAndUnknownKeys) {
  EXPECT_EQ(run_tessera("bench no-such-model.tsr --tune early_down=2").rc, 1);
  EXPECT_EQ(run_tessera("bench no-such-model.tsr --tune nope=1").rc, 1);
  const std::string range = run_tessera("bench no-such-model.tsr --tune matvec_teams=4,early_down=2 2>&1 | cat").out;
  EXPECT_NE(range.find("early_down=2 is outside 0..1"), std::string::npos) << range;
  const std::string unknown = run_tessera("bench no-such-model.tsr --tune nope=1 2>&1 | cat").out;
  EXPECT_NE(unknown.find("unknown key 'nope'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("gate_late"), std::string::npos) << "the keys are listed: " << unknown;
  // --attention's knobs the same way.
  const std::string attn = run_tessera("bench no-such-model.tsr --attention rows_round=2,single=2 2>&1 | cat").out;
  EXPECT_NE(attn.find("--attention: single=2 is outside 0..1"), std::string::npos) << attn;
  EXPECT_EQ(run_tessera("bench no-such-model.tsr --attention single=2").rc, 1);
}

// --tune barrier=N widens the barriers from the default compute-only scope (said in the header).
TEST(BenchCli, TuneBarrierScope) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const RunResult r = run_tessera("bench '" + tiny_tsr() + "' -p 4 -n 2 -r 1 --tune barrier=0");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("barriers:   full"), std::string::npos) << r.out;
  const RunResult c = run_tessera("bench '" + tiny_tsr() + "' -p 0 -n 2 -r 1 --tune barrier=1");
  ASSERT_EQ(c.rc, 0) << c.out;
  EXPECT_NE(c.out.find("barriers:   compute ("), std::string::npos) << c.out;
  const RunResult d = run_tessera("bench '" + tiny_tsr() + "' -p 0 -n 2 -r 1");
  ASSERT_EQ(d.rc, 0) << d.out;
  EXPECT_EQ(d.out.find("barriers:   "), std::string::npos) << d.out;
  // Execution-only barriers (roofline only): the kernels' buffers are not declared coherent.
  EXPECT_EQ(run_tessera("bench '" + tiny_tsr() + "' -p 0 -n 2 -r 1 --tune barrier=3").rc, 1);
}

// The session-6 knobs: accepted in range, refused out of range as usage errors (exit code 1).
TEST(BenchCli, AttentionAndMatvecKnobsAreChecked) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const RunResult ok = run_tessera("bench '" + tiny_tsr() +
                                   "' -p 0 -n 2 -r 1 --tune olat_q8=1,matvec_unroll=4 --attention direct=0,short_groups=5,merge_tail=1");
  EXPECT_EQ(ok.rc, 0) << ok.out;
  const RunResult q8 = run_tessera("bench '" + tiny_tsr() + "' -p 0 -n 2 -r 1 --tune olat_q8=2");
  EXPECT_EQ(q8.rc, 1);
  const RunResult un = run_tessera("bench '" + tiny_tsr() + "' -p 0 -n 2 -r 1 --tune matvec_unroll=3");
  EXPECT_EQ(un.rc, 1);
  const RunResult sg = run_tessera("bench '" + tiny_tsr() + "' -p 0 -n 2 -r 1 --attention short_groups=5000");
  EXPECT_EQ(sg.rc, 1);
}

// The decoded tokens' digest: the same for knobs that keep the kernels (barrier scopes), so an A/B
// run on the GPU machine shows a variant decoding the same tokens; a barrier scope out of range is
// a usage error.
TEST(BenchCli, BarrierScopesDecodeTheSameTokens) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  std::string digest[3];
  for (int scope = 0; scope < 3; ++scope) {
    const RunResult r = run_tessera("bench '" + tiny_tsr() + "' -p 0 -n 12 -d 0,7 -r 2 -o json --tune barrier=" +
                                    std::to_string(scope));
    ASSERT_EQ(r.rc, 0) << r.out;
    const Value j = testjson::parse(r.out);
    ASSERT_EQ(j["results"].arr.size(), 2u);
    digest[scope] = j["results"].arr[0]["ids_digest"].str + j["results"].arr[1]["ids_digest"].str;
    EXPECT_EQ(digest[scope].size(), 32u);
    if (scope > 0) EXPECT_EQ(digest[scope], digest[0]) << "barrier=" << scope;
  }
}

// --forced-tokens: decode is fed fixed ids, not its own samples (said in the header and the JSON),
// so the sampled ids depend on the inputs only: the Vulkan run on the packed file (factored, f32
// activations) and the CPU reference on the Q8_0 GGUF sample the same ids from the same forced
// inputs (there the backends' greedy tokens agree), at two depths.
TEST(BenchCli, ForcedTokensFeedFixedIds) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const fs::path gguf = temp_dir() / "tiny-q8_0.gguf", tsr = temp_dir() / "tiny-q8_0-none.tsr";
  synth::synthesize({"tiny", "q8_0", 5, -1, gguf.string()});
  convert::ConvertOptions co;
  co.in_path = gguf.string();
  co.out_path = tsr.string();
  co.compose = "none";
  co.threads = 2;
  convert::convert_model(co);
  const std::string args = " -p 0 -n 8 -d 0,5 -r 1 -o json --forced-tokens";
  const RunResult g = run_tessera("bench '" + tsr.string() + "'" + args + " --f32-activations");
  ASSERT_EQ(g.rc, 0) << g.out;
  const RunResult c = run_tessera("bench '" + gguf.string() + "'" + args + " --threads 2");
  ASSERT_EQ(c.rc, 0) << c.out;
  const Value jg = testjson::parse(g.out), jc = testjson::parse(c.out);
  EXPECT_TRUE(jg["model"]["forced_tokens"].b);
  ASSERT_EQ(jg["results"].arr.size(), 2u);
  ASSERT_EQ(jc["results"].arr.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(jg["results"].arr[i]["ids_digest"].str, jc["results"].arr[i]["ids_digest"].str) << "depth " << i;
    // Every run (the warm-up ones too) decoded the first run's ids.
    EXPECT_EQ(jg["results"].arr[i]["runs_differ"].num, 0) << "depth " << i;
    EXPECT_EQ(jc["results"].arr[i]["runs_differ"].num, 0) << "depth " << i;
  }
  const RunResult text = run_tessera("bench '" + tiny_tsr() + "' -p 0 -n 2 -r 1 --forced-tokens");
  ASSERT_EQ(text.rc, 0) << text.out;
  EXPECT_NE(text.out.find("decode:     fed fixed token ids"), std::string::npos) << text.out;
}

TEST(BenchCli, CpuReferenceRunsTheGguf) {
  const RunResult r = run_tessera("bench '" + tiny_gguf() + "' -p 2 -n 2 -d 0,3 -r 1 --threads 2 -o json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const Value j = testjson::parse(r.out);
  EXPECT_EQ(j["device"]["backend"].str, "cpu");
  EXPECT_EQ(j["model"]["composition"].str, "none");
  EXPECT_EQ(j["results"].arr.size(), 4u);
  for (const Value& t : j["results"].arr) EXPECT_GT(t["tok_per_s_median"].num, 0);
}

TEST(BenchCli, UsageErrors) {
  EXPECT_EQ(run_tessera("bench").rc, 1);                                          // no model, no --roofline
  EXPECT_EQ(run_tessera("bench '" + tiny_gguf() + "' --profile").rc, 1);          // CPU backend
  EXPECT_EQ(run_tessera("bench '" + tiny_gguf() + "' --timeline").rc, 1);         // CPU backend
  EXPECT_EQ(run_tessera("bench '" + tiny_gguf() + "' --backend vulkan").rc, 1);   // not a .tsr
  EXPECT_EQ(run_tessera("bench '" + tiny_gguf() + "' -p 0 -n 0").rc, 1);         // nothing to run
  EXPECT_EQ(run_tessera("bench '" + tiny_gguf() + "' -d 100000000 -n 1").rc, 1);  // beyond the context
  EXPECT_EQ(run_tessera("bench /nonexistent/model.tsr").rc, 2);
}

// --timeline: every decoded dispatch of each depth in the JSON's families, the device span within
// the host's time (the clock read as ns), the middle layer's dispatches from its first start; the
// markdown carries the table and the waterfall; -p 0 -n 0 with --timeline alone runs only the timeline.
TEST(BenchCli, TimelineJsonAndMarkdown) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  {
    vk::Context ctx;
    if (!ctx.device().enabled().device_clock) GTEST_SKIP() << "no shader device clock";
  }
  const RunResult r = run_tessera("bench '" + tiny_tsr() + "' -p 0 -n 0 -d 0,4 -r 2 --timeline -o json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const Value j = testjson::parse(r.out);
  ASSERT_EQ(j["timelines"].arr.size(), 2u);
  for (const Value& t : j["timelines"].arr) {
    double calls = 0;
    for (const Value& k : t["kernels"].arr) {
      calls += k["calls_per_token"].num;
      EXPECT_GT(k["us_per_call"].num, 0) << k["kernel"].str;
    }
    EXPECT_EQ(calls, t["dispatches"].num);
    EXPECT_EQ(t["dispatches"].num, j["model"]["dispatches_per_token"].num);
    EXPECT_GT(t["device_us"].num, 0);
    EXPECT_LE(t["device_us"].num, t["token_us"].num * 1.05 + 50);
    EXPECT_GT(t["read_gbps"].num, 0) << "the timeline measures the read bandwidth for its shares";
    for (const Value& k : t["kernels"].arr) EXPECT_GE(k["early_gbps"].num, 0) << k["kernel"].str;
    // Each family's ceiling: what one read of its bytes reaches, from the short reads the
    // timeline measures with the read bandwidth (where the queue has timestamps). The tiny
    // model's kernels read far less than the smallest short read, so theirs are extrapolations,
    // 0 where the line through the two smallest reads leaves no time (a busy CPU device).
    const auto read_list = [&](const char* name) {
      std::vector<model::ShortRead> out;
      for (const Value& q : j["roofline"][name].arr) out.push_back({uint64_t(q["bytes"].num), q["us"].num, q["gbps"].num});
      return out;
    };
    const std::vector<model::ShortRead> reads = read_list("short_reads");
    const std::vector<model::ShortRead> gated = read_list("gated_reads");  // the same line (none in a 64 MiB buffer)
    for (const Value& k : t["kernels"].arr) {
      const double want = model::short_read_ceiling_gbps(reads, k["bytes_per_call"].num);
      EXPECT_NEAR(k["ceiling_gbps"].num, want, 1e-5 * std::max(1.0, want)) << k["kernel"].str;
      const double want_gated = model::short_read_ceiling_gbps(gated, k["bytes_per_call"].num);
      EXPECT_NEAR(k["gated_ceiling_gbps"].num, want_gated, 1e-5 * std::max(1.0, want_gated)) << k["kernel"].str;
    }
    EXPECT_GE(t["layer"].num, 0);
    for (const Value& d : t["layer_dispatches"].arr) {
      EXPECT_NE(d["label"].str.find(cat("blk.", int(t["layer"].num), ".")), std::string::npos) << d["label"].str;
      EXPECT_GE(d["start_us"].num, 0);  // from the layer's first start
      EXPECT_LE(d["start_us"].num, d["last_start_us"].num);
      EXPECT_LE(d["last_start_us"].num, d["end_us"].num);
    }
    EXPECT_FALSE(t["layer_dispatches"].arr.empty());
  }
  const RunResult md = run_tessera("bench '" + tiny_tsr() + "' -p 0 -n 2 -r 1 --timeline");
  ASSERT_EQ(md.rc, 0) << md.out;
  EXPECT_NE(md.out.find("timeline:   every kernel records"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("device-clock timeline of one decoded token at depth 0"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("µs from its first start"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("GB/s from the first early mark (% of the read bandwidth"), std::string::npos) << md.out;
  // The ceilings' source, measured whenever the queue has timestamps (the shares' text:
  // Timeline.RateFromTheEarlyMark).
  if (j["roofline"]["gpu_timestamps"].b)
    EXPECT_NE(md.out.find("one dispatch reading 4.0 MiB"), std::string::npos) << md.out;
}

TEST(BenchCli, RooflineRuns) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const RunResult r = run_tessera("bench --roofline --roofline-mib 32 -o json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const Value j = testjson::parse(r.out);
  const Value& q = j["roofline"];
  EXPECT_EQ(q["read_bytes"].num, 32 << 20);
  EXPECT_GT(q["read_gbps"].num, 0);
  // Short reads: 4 MiB (the 32 MiB buffer's first half holds four of them), with timestamps.
  if (q["gpu_timestamps"].b) {
    ASSERT_EQ(q["short_reads"].arr.size(), 1u);
    EXPECT_EQ(q["short_reads"].arr[0]["bytes"].num, 4 << 20);
    EXPECT_GT(q["short_reads"].arr[0]["us"].num, 0);
    EXPECT_GT(q["short_reads"].arr[0]["gbps"].num, 0);
  } else {
    EXPECT_TRUE(q["short_reads"].arr.empty());
  }
  EXPECT_GT(q["dispatches"].num, 0);
  EXPECT_GE(q["dispatch_barrier_us"].num, 0);
  EXPECT_GE(q["dispatch_barrier_compute_us"].num, 0);  // per barrier scope
  EXPECT_GE(q["dispatch_barrier_compute_only_us"].num, 0);
  EXPECT_GE(q["dispatch_barrier_execution_only_us"].num, 0);
  EXPECT_GE(q["dispatch_indirect_us"].num, 0);
  EXPECT_GE(q["grid_barrier_us"].num, 0);
  EXPECT_GE(q["grid_barrier_fenced_us"].num, 0);
  EXPECT_GT(q["grid_groups"].num, 0);
  EXPECT_GE(q["dispatch_indirect_barrier_us"].num, 0);
  EXPECT_GT(q["wide_groups"].num, 1);
  EXPECT_GE(q["dispatch_barrier_wide_us"].num, 0);
  EXPECT_GE(q["dispatch_chained_us"].num, 0);  // dispatches ordered by counters in memory ...
  EXPECT_GE(q["dispatch_chained_wide_us"].num, 0);
  EXPECT_GE(q["dispatch_gated_us"].num, 0);  // ... and by the early starts' gates
  EXPECT_GE(q["dispatch_gated_wide_us"].num, 0);
  EXPECT_EQ(q["gated_timed_out"].kind, Value::Bool);
  EXPECT_FALSE(q["gated_timed_out"].b) << "a gate's wait gave up";
  EXPECT_EQ(q["chained_timed_out"].kind, Value::Bool);
  EXPECT_FALSE(q["chained_timed_out"].b) << "a counter wait gave up";  // ... every wait was met
  EXPECT_GE(q["dispatch_us"].num, 0);
  EXPECT_GT(q["submit_us"].num, 0);
  EXPECT_EQ(q["gated_reads"].kind, Value::Array);  // none fit a 32 MiB buffer (RooflineGatedRead)
  EXPECT_EQ(q["gate_hops"].arr.size(), 4u);
  EXPECT_EQ(q["gated_broadcast"].arr.size(), 2u);
  EXPECT_FALSE(q["gated_read_gave_up"].b);
  EXPECT_TRUE(j["results"].arr.empty());
  const RunResult md = run_tessera("bench --roofline --roofline-mib 32");
  ASSERT_EQ(md.rc, 0);
  EXPECT_NE(md.out.find("read bandwidth, 16-byte loads"), std::string::npos) << md.out;
  if (q["gpu_timestamps"].b) EXPECT_NE(md.out.find("one dispatch reading 4.0 MiB after a barrier"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("dispatch cost with a barrier"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("compute-scoped barriers"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("indirect dispatches"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("grid-wide barrier"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("chained by a counter"), std::string::npos) << md.out;
  if (q["dispatch_gated_wide_us"].num > 0) EXPECT_NE(md.out.find("chained by gates"), std::string::npos) << md.out;
}

// The gated read (roofline.comp MODE 6): the consumer's workgroups wait for the producer's gate,
// then read their region; the words say when the first saw it and when the last one's loads
// landed. A 128 MiB buffer leaves room for two 4 MiB regions (the warm-up and one timed).
TEST(RooflineGatedRead, ReadsFromTheGatesOpening) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  vk::Context ctx;
  if (!ctx.device().enabled().device_clock || !ctx.pipelines().use_subgroup())
    GTEST_SKIP() << "no shader device clock or no subgroups";
  model::RooflineOptions o;
  o.read_bytes = 128ull << 20;
  o.repetitions = 1;
  o.read_only = true;
  o.short_reads = true;
  const model::RooflineResult r = model::measure_roofline(ctx, o);
  ASSERT_EQ(r.read_bytes, 128ull << 20) << "the device's buffer limits changed the test's sizes";
  EXPECT_FALSE(r.gated_read_gave_up) << "a gated read's wait gave up or its words were not written";
  ASSERT_EQ(r.gated_reads.size(), 1u);
  const model::ShortRead& g = r.gated_reads[0];
  EXPECT_EQ(g.bytes, 4ull << 20);
  EXPECT_GT(g.us, 0);
  EXPECT_GE(g.open_us, 0);
  EXPECT_NEAR(g.gbps, double(g.bytes) / (g.us * 1e3), 1e-6 * g.gbps);
  EXPECT_GE(g.open_last_us, g.open_us);  // the last waiting workgroup saw it no earlier than the first
  for (const model::GateHop& h : r.gate_hops) {  // the three ways of opening it, measured on the 4 MiB rounds
    EXPECT_GT(h.last_us, 0);
    EXPECT_GE(h.last_us, h.first_us);
  }
  EXPECT_EQ(r.gate_hops[0].first_us, g.open_us);  // gate.glsl's way is the gated read's own
  for (const model::GateHop& b : r.gated_broadcast) {  // every workgroup reads the same 8 KiB
    EXPECT_GT(b.first_us, 0);
    EXPECT_GE(b.last_us, b.first_us);
  }
  const std::string md = model::roofline_markdown(r);
  EXPECT_NE(md.find("resident workgroups reading 4.0 MiB from the moment their gate opens"), std::string::npos) << md;
  EXPECT_EQ(md.find("a wait gave up"), std::string::npos) << md;
  EXPECT_NE(md.find("a gate's hop, opening -> first / last waiting workgroup"), std::string::npos) << md;
  EXPECT_NE(md.find("reading the same 8 KiB from the L2"), std::string::npos) << md;
}

// The profiler's per-kernel times add up to the measured token time (within 10 %), every
// dispatch is counted in one family, and the profile lands in the SVG. Host-clock times on a
// loaded CPU device are noisy (a late thread wake-up adds milliseconds outside the kernels), so
// up to 5 attempts may be made: a profiler that misses or double-counts dispatches fails every one.
TEST(BenchCli, ProfileAddsUpToTheTokenTime) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const fs::path svg = temp_dir() / "profile.svg";
  Value j;
  std::string why;
  for (int attempt = 0; attempt < 5; ++attempt) {
    const RunResult r = run_tessera("bench '" + tiny_tsr() + "' -p 0 -n 4 -d 0,6 -r 5 --roofline-mib 8 -o json --profile-out '" +
                                    svg.string() + "'");
    ASSERT_EQ(r.rc, 0) << r.out;
    j = testjson::parse(r.out);
    why.clear();
    for (const Value& p : j["profiles"].arr) {
      const double kernel = p["kernel_us"].num, token = p["token_us"].num;
      if (!(std::fabs(kernel - token) <= 0.10 * token))
        why += cat(p["what"].str, " depth ", p["depth"].num, ": kernels ", kernel, " µs, token ", token, " µs\n");
      // Every dispatch lands in exactly one family; the families' medians add up to about the median
      // kernel time (a sum of medians: under load each family's median drops the spikes that
      // almost every token has somewhere, hence the wider bound).
      double per_token = 0, share = 0, calls = 0;
      for (const Value& k : p["kernels"].arr) {
        per_token += k["us_per_token"].num;
        share += k["share"].num;
        calls += k["calls_per_token"].num;
      }
      if (calls != p["dispatches"].num)
        why += cat(p["what"].str, " depth ", p["depth"].num, ": families hold ", calls, " calls of ", p["dispatches"].num,
                   " dispatches\n");
      if (!(std::fabs(per_token - kernel) <= 0.25 * kernel) || !(std::fabs(share - 1.0) <= 0.25))
        why += cat(p["what"].str, " depth ", p["depth"].num, ": families add up to ", per_token, " µs (share ", share,
                   ") of ", kernel, " µs\n");
    }
    if (why.empty()) break;
  }
  EXPECT_TRUE(why.empty()) << "per-kernel times do not add up to the token / kernel time in 5 attempts:\n" << why;
  // A decoded token at each depth; a prefill chunk where one fits the context (depth 0 here).
  const Value& profiles = j["profiles"];
  int decode = 0, prefill = 0;
  for (const Value& p : profiles.arr) {
    const double kernel = p["kernel_us"].num, token = p["token_us"].num;
    const bool is_prefill = p["what"].str.rfind("prefill chunk", 0) == 0;
    (is_prefill ? prefill : decode) += 1;
    if (is_prefill) {
      EXPECT_EQ(p["dispatches"].num, j["model"]["prefill_dispatches_per_chunk"].num);
    } else {
      EXPECT_EQ(p["what"].str, "decoded token");
      EXPECT_EQ(p["dispatches"].num, j["model"]["dispatches_per_token"].num);
    }
    EXPECT_GT(kernel, 0);
    EXPECT_NEAR(p["outside_us"].num, token - kernel, 1e-6 * token);
    EXPECT_GT(p["floor_us"].num, 0);
    EXPECT_GT(p["read_gbps"].num, 0);
    double calls = 0;
    for (const Value& k : p["kernels"].arr) {
      calls += k["calls_per_token"].num;
      EXPECT_FALSE(k["kernel"].str.empty());
    }
    EXPECT_EQ(calls, p["dispatches"].num);
  }
  EXPECT_EQ(decode, 2);
  EXPECT_EQ(prefill, 1);
  const std::string text = read_text(svg);
  EXPECT_EQ(text.rfind("<svg", 0), 0u);
  EXPECT_NE(text.find("depth 6"), std::string::npos);
  EXPECT_NE(text.find("attention"), std::string::npos);
}

// With a tail recording (chunks of 128, the last tokens in chunks of 64) the profile holds both
// chunks: the large one (every dispatch of its recording) and the tail's (fewer: without tensor
// cores the dense matrices are batched matvecs of 8 tokens per dispatch).
TEST(BenchCli, ProfileHoldsTheTailChunk) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const RunResult r = run_tessera("bench '" + tiny_tsr() + "' -p 128 -n 1 -d 0 -r 1 --prefill-chunk 128 --profile -o json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const Value j = testjson::parse(r.out);
  std::vector<std::string> whats;
  const double chunk_dispatches = j["model"]["prefill_dispatches_per_chunk"].num;
  for (const Value& p : j["profiles"].arr) {
    whats.push_back(p["what"].str);
    if (p["what"].str == "prefill chunk of 128 tokens") EXPECT_EQ(p["dispatches"].num, chunk_dispatches);
    if (p["what"].str == "prefill tail chunk of 64 tokens") {
      EXPECT_GT(p["dispatches"].num, 0);
      EXPECT_LE(p["dispatches"].num, chunk_dispatches);
      EXPECT_GT(p["kernel_us"].num, 0);
    }
  }
  EXPECT_EQ(whats, (std::vector<std::string>{"decoded token", "prefill chunk of 128 tokens", "prefill tail chunk of 64 tokens"}));
}

}  // namespace
}  // namespace tessera
