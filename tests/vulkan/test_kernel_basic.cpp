// rmsnorm.comp (RmsNormOp), embed.comp (EmbedOp), prefetch.comp (PrefetchOp) and split1_from_gguf
// against the CPU.
#include <cmath>
#include <cstring>
#include <random>

#include "format/fp16.h"
#include "runtime/vulkan/kernels_basic.h"
#include "tests/vulkan/vk_test_util.h"

namespace tessera {
namespace {

using vktest::Gpu;

const GgmlType kAllTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                              GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::F32,  GgmlType::F16,
                              GgmlType::BF16};

TEST(Split1, MovesQuantBytesToRegionQAndTheRestToRegionM) {
  // Two rows of two Q4_0 blocks with recognizable bytes: block i = d(2) then qs[16].
  const uint32_t rows = 2, cols = 64;
  std::vector<uint8_t> gguf(rows * 2 * 18);
  for (size_t i = 0; i < gguf.size(); ++i) gguf[i] = static_cast<uint8_t>(i);
  const std::vector<uint8_t> s = vk::split1_from_gguf(GgmlType::Q4_0, rows, cols, gguf.data());
  ASSERT_EQ(s.size(), vk::split1_bytes(GgmlType::Q4_0, rows, cols));
  ASSERT_EQ(vk::split1_m_offset(GgmlType::Q4_0, rows, cols), 256u);  // align256(4 blocks x 16)
  EXPECT_EQ(s.size(), 512u);
  for (int b = 0; b < 4; ++b) {
    EXPECT_EQ(0, std::memcmp(&s[b * 16], &gguf[b * 18 + 2], 16)) << "Q entry of block " << b;
    EXPECT_EQ(0, std::memcmp(&s[256 + b * 2], &gguf[b * 18], 2)) << "M entry of block " << b;
  }
  // Q6_K: ql[128] is the Q entry, qh, scales, d (82 bytes) the M entry, in block order.
  std::mt19937 rng(3);
  const std::vector<uint8_t> q6 = vktest::random_matrix(rng, GgmlType::Q6_K, 3, 512);
  const std::vector<uint8_t> s6 = vk::split1_from_gguf(GgmlType::Q6_K, 3, 512, q6.data());
  const uint64_t m6 = vk::split1_m_offset(GgmlType::Q6_K, 3, 512);
  EXPECT_EQ(m6, 768u);
  for (int b = 0; b < 6; ++b) {
    EXPECT_EQ(0, std::memcmp(&s6[b * 128], &q6[b * 210], 128));
    EXPECT_EQ(0, std::memcmp(&s6[m6 + b * 82], &q6[b * 210 + 128], 82));
  }
  // Q5_K: the M entry is d, dmin, scales (16 bytes before qs) then qh (32 bytes before qs).
  EXPECT_EQ(vk::split1_qbytes(GgmlType::Q5_K), 128u);
  EXPECT_EQ(vk::split1_mbytes(GgmlType::Q5_K), 48u);
  EXPECT_THROW(vk::split1_from_gguf(GgmlType::F16, 1, 32, gguf.data()), Error);
  EXPECT_THROW(vk::split1_from_gguf(GgmlType::Q4_0, 1, 48, gguf.data()), Error);
}

// q8: also the int8 blocks (RmsNormOp::y_q8), against the CPU quantization of the GPU's f32 result
// (the kernel quantizes the same values). Offsets x 3, y 5 (value by value); `by4`: x 4, y 8, which
// with n and the strides multiples of 4 takes the kernel's vec4 path.
void run_norm(Gpu& g, uint32_t n, uint32_t rows, uint32_t xs, uint32_t ys, bool in_place, uint32_t seed, bool q8 = false,
              bool by4 = false) {
  const uint32_t xo = by4 ? 4 : 3, yo = in_place ? xo : by4 ? 8 : 5;
  std::mt19937 rng(seed);
  const std::vector<float> x = vktest::random_values(rng, size_t(xs) * rows + 8);
  const std::vector<float> w = vktest::random_values(rng, n);
  const float eps = 1e-6f;
  vk::Buffer xb = vktest::make_buffer(g, x.size() * 4, "x");
  vk::Buffer wb = vktest::make_buffer(g, w.size() * 4, "w");
  vk::Buffer yb = vktest::make_buffer(g, (size_t(ys) * rows + 8) * 4, "y");
  vktest::upload_bytes(g, xb, x.data(), x.size() * 4);
  vktest::upload_bytes(g, wb, w.data(), w.size() * 4);
  vktest::poison(g, yb);
  vk::RmsNormOp op;
  op.x = xb.whole();
  op.weight = wb.whole();
  op.y = in_place ? xb.whole() : yb.whole();
  op.n = n;
  op.rows = rows;
  op.x_stride = xs;
  op.y_stride = in_place ? xs : ys;
  op.x_offset = xo;
  op.y_offset = yo;
  op.eps = eps;
  vk::Buffer qb = vktest::make_buffer(g, std::max<size_t>(size_t(rows) * n / 32 * 48, 48), "y q8");
  vktest::poison(g, qb);
  if (q8) op.y_q8 = qb.whole();
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  op.record(rec);
  rec.end();
  rec.run();
  const vk::Buffer& out = in_place ? xb : yb;
  const std::vector<float> got_all = vktest::download_floats(g, out, out.size() / 4);
  std::vector<float> got;
  std::vector<double> want, tol;
  for (uint32_t t = 0; t < rows; ++t) {
    double ss = 0;
    for (uint32_t i = 0; i < n; ++i) ss += double(x[xo + t * xs + i]) * x[xo + t * xs + i];
    const double scale = 1.0 / std::sqrt(ss / n + eps);
    for (uint32_t i = 0; i < n; ++i) {
      got.push_back(got_all[op.y_offset + t * op.y_stride + i]);
      want.push_back(x[xo + t * xs + i] * scale * w[i]);
      tol.push_back(2e-6 * std::fabs(want.back()) + 1e-7);
    }
  }
  vktest::expect_close(got, want, tol, cat("rmsnorm n ", n, " rows ", rows, in_place ? " in place" : ""));
  if (q8) {
    std::vector<uint32_t> words(size_t(rows) * n / 32 * 12);
    g.transfer->download(qb, 0, words.data(), words.size() * 4);  // device-local on a discrete GPU
    vktest::expect_q8_blocks_close(words, vktest::q8_blocks(got), cat("rmsnorm int8 blocks n ", n, " rows ", rows));
  }
  if (!in_place) {  // nothing outside the rows was written
    for (uint32_t i = 0; i < yo; ++i) EXPECT_TRUE(std::isnan(got_all[i])) << "y[" << i << "] written";
  }
}

TEST(KernelRmsNorm, MatchesCpu) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  uint32_t seed = 1;
  for (uint32_t n : {1u, 7u, 64u, 576u, 2048u, 2080u})
    for (uint32_t rows : {1u, 3u}) run_norm(g, n, rows, n + 1, n + 2, false, seed++);
  run_norm(g, 512, 5, 576, 576, true, seed++);  // the latent part of kv rows, in place
  run_norm(g, 300, 2, 300, 300, false, seed++);
  // With the int8 blocks (the LM head's input): one row of GLM's width, three rows of 2080.
  run_norm(g, 2048, 1, 2048, 2048, false, seed++, true);
  run_norm(g, 2080, 3, 2081, 2082, false, seed++, true);
  // As vec4 (batches of 4 per invocation): a row past one batch of the workgroup (1028), the
  // attention output's width (10240), in place, with the int8 blocks.
  for (uint32_t n : {4u, 1028u, 10240u}) run_norm(g, n, 2, n + 4, n + 8, false, seed++, false, true);
  run_norm(g, 512, 5, 576, 576, true, seed++, false, true);
  run_norm(g, 2048, 3, 2052, 2048, false, seed++, true, true);
  vk::RmsNormOp bad;
  vk::Buffer b = vktest::make_buffer(g, 4096, "b");
  bad.x = bad.weight = bad.y = bad.y_q8 = b.whole();
  bad.n = 100;  // not a multiple of 32
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  EXPECT_THROW(bad.record(rec), Error);
  bad.n = 64;  // in place: the blocks would be quantized from already normalized values
  vk::Buffer q = vktest::make_buffer(g, 4096, "q");
  bad.y_q8 = q.whole();
  EXPECT_THROW(bad.record(rec), Error);
  rec.end();
}

TEST(KernelRmsNorm, SharedMemoryReductionPath) {
  Gpu& g = vktest::gpu(/*no_subgroup_ops=*/true);
  VK_TEST_REQUIRE_GPU(g);
  run_norm(g, 2080, 3, 2080, 2080, false, 50);
  run_norm(g, 7, 1, 7, 7, true, 51);
}

void run_embed(Gpu& g, GgmlType type, uint32_t vocab, uint32_t cols, const std::vector<uint32_t>& ids,
               uint64_t max_binding, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<uint8_t> table = vktest::random_matrix(rng, type, vocab, cols);
  auto dm = vktest::upload_matrix(g, type, vocab, cols, table);
  const uint32_t n = static_cast<uint32_t>(ids.size()), stride = cols + 3;
  vk::Buffer idb = vktest::make_buffer(g, (n + 1) * 4, "ids", true);
  std::vector<uint32_t> words = {77777};
  words.insert(words.end(), ids.begin(), ids.end());
  idb.write(0, words.data(), words.size() * 4);
  vk::Buffer out = vktest::make_buffer(g, (size_t(n) * stride + 2) * 4, "out");
  vktest::poison(g, out);
  vk::EmbedOp op;
  op.table = dm->ref;
  op.ids = idb.whole();
  op.id_offset = 1;
  op.n_tokens = n;
  op.out = out.whole();
  op.out_offset = 2;
  op.out_stride = stride;
  op.max_binding_bytes = max_binding;
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  op.record(rec);
  rec.end();
  rec.run();
  const std::vector<float> got_all = vktest::download_floats(g, out, out.size() / 4);
  std::vector<float> got;
  std::vector<double> want, tol;
  for (uint32_t t = 0; t < n; ++t) {
    const std::vector<float> row =
        ids[t] < vocab ? vktest::dequant_row(type, table, cols, ids[t]) : std::vector<float>(cols, 0.f);
    for (uint32_t k = 0; k < cols; ++k) {
      got.push_back(got_all[2 + t * stride + k]);
      want.push_back(row[k]);
      tol.push_back(1e-6 * std::fabs(row[k]));
    }
    for (uint32_t k = cols; k < stride && t + 1 < n; ++k) {
      EXPECT_TRUE(std::isnan(got_all[2 + t * stride + k])) << "padding written, token " << t;
    }
  }
  vktest::expect_close(got, want, tol, cat("embed ", type_name(type), " ", vocab, "x", cols));
}

TEST(KernelEmbed, EveryTypeMatchesDequantizeRow) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  uint32_t seed = 10;
  for (GgmlType t : kAllTypes) {
    const bool k256 = type_info(t).block_elems == 256;
    const bool plain = type_info(t).block_elems == 1;
    for (uint32_t vocab : {1u, 7u, 67u}) {
      const uint32_t cols = k256 ? 768 : plain ? 33 : 288;
      std::vector<uint32_t> ids = {vocab - 1, 0, vocab / 2, vocab - 1};
      run_embed(g, t, vocab, cols, ids, 0, seed++);
    }
  }
}

TEST(KernelEmbed, ChunkedTableAndBadIds) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  // Bindings of a few KiB: the table is bound in row chunks, one dispatch each.
  run_embed(g, GgmlType::Q4_K, 67, 256, {66, 0, 31, 32, 5}, 2048, 90);
  run_embed(g, GgmlType::F16, 100, 96, {99, 1, 50}, 1024, 91);
  // An id past the table gives a zero row instead of reading out of bounds.
  run_embed(g, GgmlType::Q8_0, 7, 96, {3, 7, 1000000, 6}, 0, 92);
  run_embed(g, GgmlType::Q6_K, 67, 256, {67, 12}, 4096, 93);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// The prefetch kernel reads word 0 of every 32-byte sector of every span (pieces start on sector
// boundaries), XOR-folded into sink[0]: the CPU computes the same fold.
uint32_t prefetch_fold(const std::vector<uint32_t>& words, uint64_t begin_word, uint64_t n_words) {
  uint32_t f = 0;
  for (uint64_t i = 0; i < n_words; i += 8) f ^= words[begin_word + i];
  return f;
}

void run_prefetch(Gpu& g, bool subgroups_off, uint64_t max_binding) {
  std::mt19937 rng(subgroups_off ? 91 : 90);
  const uint64_t n = 300000;  // words: several workgroups' worth (2048 sectors of 8 words each)
  std::vector<uint32_t> words(n);
  for (uint32_t& w : words) w = rng();
  vk::Buffer src = vktest::make_buffer(g, n * 4, "spans");
  vktest::upload_bytes(g, src, words.data(), n * 4);
  vk::Buffer sink = vktest::make_buffer(g, 16, "sink", true);
  // Spans (word offsets aligned to the descriptor alignment on every device): awkward lengths,
  // an empty one, one of a single word, and more than four so that two dispatches are needed.
  struct Span {
    uint64_t begin, words;
  };
  const std::vector<Span> spans = {{0, 1}, {64, 77}, {1024, 0}, {2048, 16389}, {32768, 200001}, {262144, 37855}};
  vk::PrefetchOp op;
  uint32_t want = 0;
  for (const Span& s : spans) {
    op.spans.push_back(src.slice(s.begin * 4, s.words * 4));
    if (max_binding == 0) want ^= prefetch_fold(words, s.begin, s.words);
    else  // pieces of max_binding bytes, each folded from its own start
      for (uint64_t p = 0; p < s.words; p += max_binding / 4)
        want ^= prefetch_fold(words, s.begin + p, std::min<uint64_t>(max_binding / 4, s.words - p));
  }
  op.sink = sink.whole();
  op.max_binding_bytes = max_binding;
  const uint32_t zero[4] = {0, 0, 0, 0};
  sink.write(0, zero, 16);
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  const uint32_t dispatches = op.record(rec);
  rec.end();
  rec.run();
  uint32_t got[4];
  sink.read(0, got, 16);
  EXPECT_EQ(got[0], want) << "fold of the sectors' first words, max binding " << max_binding;
  EXPECT_EQ(got[1], 0u) << "only sink[0] is written";
  EXPECT_EQ(dispatches, max_binding ? 5u : 2u);  // 5 non-empty spans; in 64 KiB pieces: 20
  EXPECT_EQ(op.bytes(), (1 + 77 + 16389 + 200001 + 37855) * 4u);
}

TEST(KernelPrefetch, ReadsTheFirstWordOfEverySector) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  run_prefetch(g, false, 0);
  run_prefetch(g, false, 64 * 1024);  // spans bound in pieces of 64 KiB
}

TEST(KernelPrefetch, WithoutSubgroupArithmetic) {
  Gpu& g = vktest::gpu(/*no_subgroup_ops=*/true);
  VK_TEST_REQUIRE_GPU(g);
  run_prefetch(g, true, 0);
}

TEST(KernelPrefetch, RejectsBadSpans) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  vk::Buffer src = vktest::make_buffer(g, 4096, "spans");
  vk::Buffer sink = vktest::make_buffer(g, 16, "sink");
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  vk::PrefetchOp op;
  op.spans = {src.slice(0, 4096)};
  EXPECT_THROW(op.record(rec), Error);  // no sink
  op.sink = sink.whole();
  op.spans = {src.slice(0, 4094)};
  EXPECT_THROW(op.record(rec), Error);  // not whole words
  op.spans = {};
  EXPECT_EQ(op.record(rec), 0u);  // nothing to read: nothing recorded
  rec.end();
}

}  // namespace
}  // namespace tessera
