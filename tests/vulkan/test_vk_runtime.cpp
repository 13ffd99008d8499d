// The Vulkan runtime foundation: device listing/selection, memory pools and the memory plan,
// the staging ring, the SPIR-V / pipeline caches, and the command recorder (resubmission with
// changed per-token buffers, counters, timestamps, binding checks).
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "runtime/vulkan/kernels_basic.h"
#include "runtime/vulkan/kernels_matvec.h"
#include "runtime/vulkan/shader_cache.h"
#include "shaders/kernel_args.h"
#include "tests/vulkan/vk_test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using vktest::Gpu;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

fs::path fresh_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / cat("tessera-test-", name, "-", ::getpid());
  fs::remove_all(p);
  return p;
}

TEST(VkDevice, EnumeratesAndChoosesDevices) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  const vk::DeviceInfo& d = g.ctx->info();
  EXPECT_FALSE(d.name.empty());
  EXPECT_GT(d.subgroup_size, 0u);
  EXPECT_GE(d.max_storage_buffer_range, 1u << 20);
  EXPECT_GT(d.max_memory_allocation_size, 0u);
  EXPECT_TRUE(d.features.storage_buffer_16bit);
  EXPECT_TRUE(d.unsupported_reason().empty());
  vk::Instance& inst = g.ctx->instance();
  EXPECT_EQ(inst.choose_device(static_cast<int>(d.index)), d.index);
  try {
    inst.choose_device(static_cast<int>(inst.devices().size()) + 5);
    ADD_FAILURE() << "an out-of-range --device was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_TRUE(contains(e.what(), "--device")) << e.what();
  }
}

TEST(VkDevice, UnsupportedReasonsAreNamed) {
  vk::DeviceInfo d;
  d.api_version = VK_API_VERSION_1_1;
  EXPECT_TRUE(contains(d.unsupported_reason(), "1.2")) << d.unsupported_reason();
  d.api_version = VK_API_VERSION_1_2;
  d.max_compute_workgroup_invocations = 1024;
  d.max_push_constants_size = 128;
  EXPECT_TRUE(contains(d.unsupported_reason(), "16-bit storage")) << d.unsupported_reason();
  d.features.storage_buffer_16bit = true;
  EXPECT_EQ(d.unsupported_reason(), "");
}

#ifdef TESSERA_BINARY
TEST(VkDevice, DevicesCommandListsFeatures) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  const std::string out = (fs::temp_directory_path() / cat("tessera-devices-", ::getpid(), ".txt")).string();
  const int rc = std::system(cat(TESSERA_BINARY, " devices > ", out, " 2>&1").c_str());
  std::ifstream in(out);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fs::remove(out);
  EXPECT_EQ(rc, 0) << text;
  for (const char* field : {"subgroup size", "maxStorageBufferRange", "maxMemoryAllocationSize", "16-bit storage",
                            "shaderFloat16", "integer dot product", "cooperative matrix", "kernel statistics",
                            "memory heap", "driver"})
    EXPECT_TRUE(contains(text, field)) << "missing '" << field << "' in:\n" << text;
  EXPECT_TRUE(contains(text, g.ctx->info().name)) << text;
}
#endif

// The driver's kernel statistics (bench --kernel-stats): each value format as text, and the
// extension enabled only on request (capturing costs pipeline creation time).
TEST(VkPipeline, StatisticTextEveryFormat) {
  VkPipelineExecutableStatisticValueKHR v{};
  v.b32 = VK_TRUE;
  EXPECT_EQ(vk::statistic_text(VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR, v), "true");
  v.i64 = -42;
  EXPECT_EQ(vk::statistic_text(VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR, v), "-42");
  v.u64 = 68719476736ull;
  EXPECT_EQ(vk::statistic_text(VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR, v), "68719476736");
  v.f64 = 2.5;
  EXPECT_EQ(vk::statistic_text(VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR, v), "2.5");
  EXPECT_EQ(vk::statistic_text(static_cast<VkPipelineExecutableStatisticFormatKHR>(7), v), "? (format 7)");
}

TEST(VkPipeline, KernelStatisticsOnlyOnRequest) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  EXPECT_FALSE(g.ctx->device().enabled().pipeline_statistics);
  vk::ContextOptions o;
  o.kernel_statistics = true;
  vk::Context ctx(o);
  EXPECT_EQ(ctx.device().enabled().pipeline_statistics, ctx.info().features.pipeline_statistics);
  vk::RmsNormOp op;  // any kernel: its pipeline carries statistics exactly where the device reports them
  vk::MemoryPool pool(ctx.device(), vk::MemoryKind::DeviceLocal);
  vk::Buffer b = pool.create_buffer(4096, "x");
  op.x = op.y = op.weight = b.whole();
  op.n = 64;
  vk::CommandRecorder rec(ctx);
  rec.begin();
  op.record(rec);
  rec.end();
  ASSERT_FALSE(ctx.pipelines().all().empty());
  for (const vk::Pipeline* p : ctx.pipelines().all())
    EXPECT_EQ(p->statistics().empty(), !ctx.info().features.pipeline_statistics) << p->name();
}

TEST(VkMemory, PlanRefusesWhatDoesNotFit) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  const vk::Device& dev = g.ctx->device();
  vk::MemoryPlan ok;
  ok.add("weights", vk::MemoryKind::DeviceLocal, 1 << 20);
  ok.add("step", vk::MemoryKind::Host, 4096);
  EXPECT_NO_THROW(ok.check(dev));

  // Many buffers that each fit one allocation but together exceed the heap.
  vk::MemoryPlan big;
  const uint64_t heap = dev.heap_size(vk::MemoryKind::DeviceLocal);
  const uint64_t piece = dev.info().max_memory_allocation_size;
  const uint64_t n = heap / piece + 2;
  for (uint64_t i = 0; i < n; ++i) big.add(cat("layer ", i), vk::MemoryKind::DeviceLocal, piece);
  try {
    big.check(dev);
    ADD_FAILURE() << "a plan larger than the device was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Runtime);
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, std::to_string(n * piece))) << msg;  // what is needed
    EXPECT_TRUE(contains(msg, std::to_string(heap))) << msg;  // what there is
    EXPECT_TRUE(contains(msg, dev.info().name)) << msg;
  }

  // One item larger than a single allocation may be.
  vk::MemoryPlan huge;
  huge.add("token_embd", vk::MemoryKind::DeviceLocal, piece + 1);
  try {
    huge.check(dev);
    ADD_FAILURE() << "an item above maxMemoryAllocationSize was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "token_embd")) << e.what();
    EXPECT_TRUE(contains(e.what(), std::to_string(piece + 1))) << e.what();
  }
}

TEST(VkMemory, PoolBuffersAndSlices) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  vk::MemoryPool pool(g.ctx->device(), vk::MemoryKind::Host, 1 << 16);
  vk::Buffer a = pool.create_buffer(1000, "a");
  vk::Buffer b = pool.create_buffer(100000, "b");  // larger than a block: gets its own
  ASSERT_NE(a.mapped(), nullptr);
  ASSERT_NE(b.mapped(), nullptr);
  EXPECT_GE(pool.allocated(), 100000u + (1u << 16));
  const uint32_t v = 0x12345678;
  a.write(996, &v, 4);
  uint32_t r = 0;
  a.read(996, &r, 4);
  EXPECT_EQ(r, v);
  EXPECT_THROW(a.write(998, &v, 4), Error);
  EXPECT_THROW(a.slice(900, 101), Error);
  EXPECT_EQ(a.slice(100, 200).sub(50, 10).offset, 150u);
  EXPECT_THROW(a.slice(100, 200).sub(150, 51), Error);
  EXPECT_THROW(pool.create_buffer(0, "empty"), Error);
}

TEST(VkMemory, StagingRingRoundTrip) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  // A tiny ring (4 slots of 4 KiB) forced on: uploads wrap many times, downloads are chunked.
  vk::Transfer t(g.ctx->device(), 16 << 10, 4, /*always_stage=*/true);
  vk::Buffer dst = vktest::make_buffer(g, 100000, "dst");
  std::vector<uint8_t> data(100000);
  std::mt19937 rng(5);
  for (auto& c : data) c = static_cast<uint8_t>(rng());
  t.upload(dst, 0, data.data(), 30001);
  t.upload(dst, 30001, data.data() + 30001, data.size() - 30001);
  t.finish();
  std::vector<uint8_t> back(data.size());
  t.download(dst, 0, back.data(), back.size());
  EXPECT_EQ(back, data);
  EXPECT_GE(t.bytes_staged(), 2 * data.size());
  std::vector<uint8_t> mid(777);
  t.download(dst, 12345, mid.data(), mid.size());
  EXPECT_EQ(0, std::memcmp(mid.data(), data.data() + 12345, mid.size()));
  EXPECT_THROW(t.upload(dst, 99999, data.data(), 2), Error);
}

TEST(VkShaders, WarmStartCompilesNothing) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  const fs::path dir = fresh_dir("cache");
  vk::ContextOptions o;
  o.cache_dir = dir;
  vk::RmsNormOp norm;
  {
    vk::Context cold(o);
    vk::PipelineDesc d;
    d.name = "rmsnorm";
    d.file = "rmsnorm.comp";
    d.defines = {{"WG_SIZE", "64"}};
    d.num_buffers = 3;
    d.push_bytes = sizeof(gpu::RmsNormArgs);
    cold.pipeline(d);
    EXPECT_EQ(cold.shaders().compile_count(), 1u);
    cold.pipeline(d);  // same desc: the library returns the existing pipeline
    EXPECT_EQ(cold.shaders().compile_count(), 1u);
    d.defines["WG_SIZE"] = "128";  // another permutation compiles
    cold.pipeline(d);
    EXPECT_EQ(cold.shaders().compile_count(), 2u);
    EXPECT_EQ(cold.pipelines().size(), 2u);
  }
  EXPECT_TRUE(fs::exists(dir / "spirv"));
  bool pipeline_cache = false;
  for (const auto& e : fs::directory_iterator(dir)) pipeline_cache |= e.path().filename().string().starts_with("pipelines-");
  EXPECT_TRUE(pipeline_cache) << "no VkPipelineCache file saved in " << dir;
  {
    vk::Context warm(o);
    vk::PipelineDesc d;
    d.name = "rmsnorm";
    d.file = "rmsnorm.comp";
    d.defines = {{"WG_SIZE", "128"}};
    d.num_buffers = 3;
    d.push_bytes = sizeof(gpu::RmsNormArgs);
    warm.pipeline(d);
    d.defines["WG_SIZE"] = "64";
    warm.pipeline(d);
    EXPECT_EQ(warm.shaders().compile_count(), 0u);
  }
  fs::remove_all(dir);
}

TEST(VkShaders, CorruptCacheEntryIsRecompiled) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  const fs::path dir = fresh_dir("corrupt");
  vk::ShaderCache a(g.ctx->info(), dir);
  const vk::ShaderDefines defs = {{"WG_SIZE", "64"}, {"USE_SUBGROUP", "0"}};
  const std::vector<uint32_t> code = a.spirv("rmsnorm.comp", defs);
  ASSERT_EQ(a.compile_count(), 1u);
  for (const auto& e : fs::directory_iterator(dir / "spirv")) {
    std::ofstream out(e.path(), std::ios::binary | std::ios::trunc);
    out << "not spir-v";
  }
  vk::ShaderCache b(g.ctx->info(), dir);
  EXPECT_EQ(b.spirv("rmsnorm.comp", defs), code);
  EXPECT_EQ(b.compile_count(), 1u);
  try {
    b.spirv("no_such_shader.comp", defs);
    ADD_FAILURE() << "an unknown shader file was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "no_such_shader.comp")) << e.what();
  }
  fs::remove_all(dir);
}

// One recording, resubmitted with new per-token values written by the host between submissions.
TEST(VkRecorder, ResubmissionSeesChangedStepBuffer) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  std::mt19937 rng(11);
  const uint32_t vocab = 50, dim = 96;
  const std::vector<uint8_t> table = vktest::random_matrix(rng, GgmlType::Q8_0, vocab, dim);
  auto emb = vktest::upload_matrix(g, GgmlType::Q8_0, vocab, dim, table);
  const std::vector<uint8_t> w = vktest::random_matrix(rng, GgmlType::Q4_0, 7, dim);
  auto mat = vktest::upload_matrix(g, GgmlType::Q4_0, 7, dim, w);
  vk::Buffer step = vktest::make_buffer(g, 16, "step", /*host_visible=*/true);
  vk::Buffer h = vktest::make_buffer(g, dim * 4, "h");
  vk::Buffer y = vktest::make_buffer(g, 7 * 4, "y", /*host_visible=*/true);

  vk::CommandRecorder rec(*g.ctx, {.timestamps = true});
  rec.begin();
  vk::EmbedOp embed;
  embed.table = emb->ref;
  embed.ids = step.slice(0, 16);
  embed.id_offset = 2;  // the token id lives in word 2 of the step buffer
  embed.out = h.whole();
  embed.record(rec);
  rec.barrier();
  vk::MatvecOp mv;
  mv.w = mat->ref;
  mv.x = h.whole();
  mv.y = y.whole();
  mv.label = "matvec test";
  mv.record(rec);
  rec.end();
  EXPECT_EQ(rec.dispatch_count(), 2u);
  EXPECT_EQ(rec.barrier_count(), 1u);

  for (uint32_t token : {3u, 41u, 0u, 49u}) {
    const uint32_t words[4] = {999, 999, token, 999};
    step.write(0, words, sizeof words);
    vktest::poison(g, y);
    rec.run();
    std::vector<float> got(7);
    y.read(0, got.data(), 28);
    const std::vector<float> xf = vktest::dequant_row(GgmlType::Q8_0, table, dim, token);
    const std::vector<double> x(xf.begin(), xf.end());
    std::vector<double> want(7), tol(7);
    for (uint32_t r = 0; r < 7; ++r) {
      const vktest::RowDot d = vktest::row_dot(GgmlType::Q4_0, w, dim, r, x.data());
      want[r] = d.sum;
      tol[r] = 1e-5 * d.mag + 1e-30;
    }
    vktest::expect_close(got, want, tol, cat("token ", token));
  }
  const std::vector<vk::DispatchTiming> t = rec.timings();
  if (g.ctx->device().has_timestamps()) {
    ASSERT_EQ(t.size(), 2u);
    EXPECT_EQ(t[0].label, "embed.q8_0");
    EXPECT_EQ(t[1].label, "matvec test");
    EXPECT_EQ(t[1].bytes, mv.bytes());
    EXPECT_EQ(t[0].bytes, embed.bytes());
    for (const auto& d : t) EXPECT_GE(d.microseconds, 0.0);
  }
  // begin() starts a fresh recording: counters restart.
  rec.begin();
  rec.end();
  EXPECT_EQ(rec.dispatch_count(), 0u);
  EXPECT_EQ(rec.barrier_count(), 0u);
}

TEST(VkRecorder, FillCopyAndBindingChecks) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  vk::Buffer a = vktest::make_buffer(g, 1024, "a");
  vk::Buffer b = vktest::make_buffer(g, 1024, "b");
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  rec.fill(a.whole(), 0x3F800000u);  // 1.0f
  rec.barrier();
  rec.copy(a.slice(0, 512), b.slice(512, 512));
  rec.fill(b.slice(0, 512), 0);
  rec.end();
  rec.run();
  const std::vector<float> got = vktest::download_floats(g, b, 256);
  for (size_t i = 0; i < 256; ++i) ASSERT_EQ(got[i], i < 128 ? 0.f : 1.f) << i;

  // Bindings are checked against the device limits and the pipeline before recording.
  vk::RmsNormOp n;
  n.x = a.whole();
  n.weight = a.whole();
  n.y = b.whole();
  n.n = 16;
  rec.begin();
  n.x.offset = 4;  // misaligned descriptor offset
  if (g.ctx->info().min_storage_buffer_offset_alignment > 4) {
    EXPECT_THROW(n.record(rec), Error);
  }
  n.x = {};  // empty binding
  EXPECT_THROW(n.record(rec), Error);
  n.x = a.whole();
  n.n = 1000;  // x too short for 1000 floats
  EXPECT_THROW(n.record(rec), Error);
  rec.end();
  EXPECT_THROW(rec.end(), Error);  // not recording
}

// Compute-only barriers (the model's default) cannot order a transfer after compute work: the
// recorder accepts fills and copies before the first dispatch and refuses them after it.
// The execution-only scope (no memory barrier between compute dispatches) refuses them the same way.
// A full barrier (CommandRecorder::full_barrier) makes them legal again until the next dispatch.
TEST(VkRecorder, ComputeOnlyScopeRefusesTransfersAfterDispatches) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  for (vk::BarrierScope scope : {vk::BarrierScope::ComputeOnly, vk::BarrierScope::ExecutionOnly}) {
  SCOPED_TRACE(int(scope));
  vk::Buffer a = vktest::make_buffer(g, 1024, "a");
  vk::Buffer b = vktest::make_buffer(g, 1024, "b", /*host_visible=*/true);
  vk::CommandRecorder rec(*g.ctx, {.barrier_scope = scope});
  rec.begin();
  rec.fill(a.whole(), 0x40000000u);  // 2.0f
  rec.fill(b.whole(), 0);
  rec.barrier();
  vk::RmsNormOp n;  // b[0:16] = rmsnorm(a[0:16]) * a[0:16] = 1 * 2
  n.x = a.slice(0, 64);
  n.weight = a.slice(0, 64);
  n.y = b.slice(0, 64);
  n.n = 16;
  n.record(rec);
  rec.barrier();
  try {
    rec.fill(b.whole(), 0);
    ADD_FAILURE() << "fill after a dispatch was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("compute-only barriers"), std::string::npos) << e.what();
  }
  EXPECT_THROW(rec.copy(a.slice(0, 512), b.slice(512, 512)), Error);
  // After a full barrier (the decode step's opening, also between steps of one submission) a
  // transfer is ordered again: b[16:32] = b[0:16], then the kernel once more over the copy (b[32:48]).
  const uint32_t barriers = rec.barrier_count();
  rec.full_barrier();
  EXPECT_EQ(rec.barrier_count(), barriers + 1) << "a full barrier after commands counts";
  rec.copy(b.slice(0, 64), b.slice(64, 64));
  rec.barrier();
  n.x = b.slice(64, 64);
  n.y = b.slice(128, 64);
  n.record(rec);
  EXPECT_THROW(rec.fill(b.whole(), 0), Error) << "a dispatch since the full barrier";
  rec.end();
  rec.run();
  std::vector<float> got(48);
  b.read(0, got.data(), got.size() * 4);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], 2.f, 1e-5) << i;  // 0 had the copy not run
  }

  vk::Buffer a = vktest::make_buffer(g, 1024, "a");
  vk::Buffer b = vktest::make_buffer(g, 1024, "b", /*host_visible=*/true);
  vk::RmsNormOp n;
  n.x = a.slice(0, 64);
  n.weight = a.slice(0, 64);
  n.y = b.slice(0, 64);
  n.n = 16;
  // The other scopes take transfers anywhere.
  vk::CommandRecorder full(*g.ctx, {.barrier_scope = vk::BarrierScope::Compute});
  full.begin();
  n.record(full);
  full.barrier();
  full.fill(b.whole(), 0);
  full.end();
}

}  // namespace
}  // namespace tessera
