// Micro-benchmark: matvec (y = W x, shaders/matvec.comp) per weight type at GLM-4.7-Flash shapes.
// Checked first against the CPU (dequantized rows, double sums) on random data.
#include <cmath>
#include <random>

#include "bench/micro_util.h"
#include "format/quant.h"
#include "runtime/vulkan/kernels_matvec.h"
#include "runtime/vulkan/split1.h"

namespace tessera::microbench {
namespace {

struct MatvecSetup {
  GgmlType type;
  uint32_t rows, cols;
  std::vector<uint8_t> gguf;      // W in GGUF layout
  std::vector<uint8_t> device;    // W as the kernel reads it (SPLIT1 or plain)
  std::vector<float> x;
};

MatvecSetup make_matrix(GgmlType type, uint32_t rows, uint32_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  MatvecSetup s{type, rows, cols, {}, {}, random_floats(rng, cols)};
  const uint64_t rb = row_bytes(type, cols);
  s.gguf.resize(rb * rows);
  for (uint32_t r = 0; r < rows; ++r) {
    const std::vector<float> v = random_floats(rng, cols, 0.05f);
    quantize_row(type, v.data(), s.gguf.data() + r * rb, cols);
  }
  s.device = vk::split1_supported(type) ? vk::split1_from_gguf(type, rows, cols, s.gguf.data()) : s.gguf;
  return s;
}

void BM_Matvec(benchmark::State& state, GgmlType type, uint32_t rows, uint32_t cols) {
  Gpu& g = gpu();
  if (!require_gpu(state, g)) return;
  const MatvecSetup s = make_matrix(type, rows, cols, rows * 31 + cols);
  const vk::WeightLayout layout = vk::split1_supported(type) ? vk::WeightLayout::Split1 : vk::WeightLayout::Plain;
  vk::MatrixRef m{nullptr, 0, type, layout, rows, cols};
  const uint32_t copies = copies_for(g, m.bytes());
  std::vector<vk::Buffer> w;
  for (uint32_t c = 0; c < copies; ++c) w.push_back(upload(g, s.device.data(), s.device.size(), "W"));
  vk::Buffer x = upload(g, s.x.data(), s.x.size() * 4, "x");
  vk::Buffer y = make_buffer(g, size_t(rows) * 4 * copies, "y");
  auto op_for = [&](uint32_t c) {
    vk::MatvecOp op;
    op.w = m;
    op.w.buffer = &w[c];
    op.x = x.whole();
    op.y = y.slice(uint64_t(c) * rows * 4, uint64_t(rows) * 4);
    return op;
  };

  // Check against the CPU first.
  {
    vk::CommandRecorder rec(*g.ctx);
    rec.begin();
    rec.fill(y.whole(), 0x7fc00000u);  // NaN: an unwritten row fails the check
    rec.barrier();
    op_for(0).record(rec);
    rec.end();
    rec.run();
    const std::vector<float> got = download(g, y, rows);
    std::vector<double> want(rows);
    std::vector<float> row(cols);
    for (uint32_t r = 0; r < rows; ++r) {
      dequantize_row(type, s.gguf.data() + r * row_bytes(type, cols), row.data(), cols);
      double acc = 0;
      for (uint32_t k = 0; k < cols; ++k) acc += double(row[k]) * s.x[k];
      want[r] = acc;
    }
    const double err = rel_error(got, want);
    if (!(err < 1e-4)) {
      state.SkipWithError(("matvec disagrees with the CPU: relative error " + std::to_string(err)).c_str());
      return;
    }
  }
  TimedOps ops(g, copies, [&](vk::CommandRecorder& rec, uint32_t c) { op_for(c).record(rec); });
  time_loop(state, ops, op_for(0).bytes());
}

// GLM-4.7-Flash shapes: q_a (768 x 2048), composed q (20 x 576 rows x 768), composed vo
// (2048 x 20*512), the LM head (154880 x 2048).
struct Shape {
  const char* name;
  uint32_t rows, cols;
};
constexpr Shape kShapes[] = {{"q_a", 768, 2048}, {"qk", 11520, 768}, {"vo", 2048, 10240}, {"lm_head", 154880, 2048}};
constexpr GgmlType kTypes[] = {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::F16};

const bool kRegistered = [] {
  for (GgmlType t : kTypes)
    for (const Shape& s : kShapes)
      benchmark::RegisterBenchmark((std::string("matvec/") + type_name(t) + "/" + s.name + "/" + std::to_string(s.rows) +
                                    "x" + std::to_string(s.cols))
                                       .c_str(),
                                   BM_Matvec, t, s.rows, s.cols)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
  return true;
}();

}  // namespace
}  // namespace tessera::microbench
