// Small kernels: RmsNormOp (shaders/rmsnorm.comp), EmbedOp (shaders/embed.comp) and PrefetchOp
// (shaders/prefetch.comp).
// Each op is a plain description; record() adds its dispatch(es) to a recording (no barrier),
// bytes() is what it moves, for the profiler.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/vulkan/recorder.h"
#include "runtime/vulkan/split1.h"

namespace tessera::vk {

// For t < rows: y[y_offset + t*y_stride + i] = weight[i] * x[x_offset + t*x_stride + i] / rms,
// rms = sqrt(mean_i(x^2) + eps), i < n. f32. y may be the same memory as x (in place).
struct RmsNormOp {
  BufferSlice x;        // f32
  BufferSlice weight;   // f32 [n]
  BufferSlice y;        // f32
  uint32_t n = 0;       // elements per row
  uint32_t rows = 1;
  uint32_t x_stride = 0, y_stride = 0;  // floats between rows; 0 = n
  uint32_t x_offset = 0, y_offset = 0;  // floats
  float eps = 1e-6f;
  std::string label = "rmsnorm";
  // Set: y also as int8 blocks of 32 (q8_quantize.glsl, 48 bytes per block; row t's blocks from
  // t * n / 32), the x_q8 of a following int8 matvec (MatvecOp::x_q8). n must be a multiple of 32
  // and y must not overlap x.
  BufferSlice y_q8;
  // Set: y holds f16 (y_offset and y_stride count f16 elements), the x16 of a following MatmulOp.
  bool f16_out = false;
  // Cleared: y = x as it is (weight unused; with f16_out a plain conversion to f16).
  bool normalize = true;
  // Set (add.y): first, for the live rows t < step[count_word], s = add.y[row(t, 0)] + ... +
  // add.y[row(t, K-1)] (+ add.y[pair_base + t] with has_shared), rows of n floats, row(t, k) =
  // t * stride_t + k * stride_k, in that order, and x[t] += s (x[t] = s with replace), written
  // back to x; then the norm of the new rows (rmsnorm.comp SUM_IN). The prefill's FFN sum
  // (PrefillSumOp's order: stride_t K, stride_k 1) fused with the next layer's norm; a split-K
  // matmul's parts (MatmulOp::record_sum's order: stride_t 1, stride_k T, replace) with the norm
  // of its output. Needs n and x's and y's offsets and strides multiples of 4, and no y_q8.
  struct ResidualSum {
    BufferSlice y;      // f32 rows of n
    uint32_t n_used = 0;  // K
    bool has_shared = true;
    uint32_t pair_base = 0;
    uint32_t stride_t = 0;  // 0: K
    uint32_t stride_k = 1;
    bool replace = false;
    BufferSlice step;
    uint32_t count_word = 0;
  } add;

  uint64_t bytes() const;  // x read, weight read, y (and y_q8) written
  void record(CommandRecorder& rec) const;
};

// Embedding lookup: out[out_offset + t*out_stride + k] = table row ids[id_offset + t], element k,
// for t < n_tokens, k < table.cols. Ids are read on the GPU (a recording is reused across tokens
// by changing the ids buffer). An id >= table.rows produces a row of zeros.
struct EmbedOp {
  MatrixRef table;      // token_embd [n_vocab][n_embd], SPLIT1 or plain
  BufferSlice ids;      // uint32 token ids
  BufferSlice out;      // f32
  uint32_t id_offset = 0;   // index in ids of token 0
  uint32_t n_tokens = 1;
  uint32_t out_offset = 0;  // floats
  uint32_t out_stride = 0;  // floats between token rows; 0 = table.cols
  std::string label;        // empty = "embed.<type>"
  uint64_t max_binding_bytes = 0;  // 0 = device maxStorageBufferRange (lower: tests of chunking)

  uint64_t bytes() const;  // per token: one table row, the id, the output row
  void record(CommandRecorder& rec) const;
};

// L2 prefetch of weight spans for a later stage (shaders/prefetch.comp): reads one 32-bit word
// per 32-byte sector of every span and XOR-folds them into sink[0]. Record it beside a kernel
// that leaves the memory bandwidth idle (no barrier of its own); it only changes timing. Spans
// larger than maxStorageBufferRange are bound in pieces; four pieces per dispatch.
struct PrefetchOp {
  std::vector<BufferSlice> spans;  // sizes multiples of 4 bytes; empty spans are skipped
  BufferSlice sink;                // >= 4 bytes, read-write
  std::string label = "prefetch";
  uint64_t max_binding_bytes = 0;  // 0 = device maxStorageBufferRange (lower: tests of the split)

  uint64_t bytes() const;  // the spans' bytes (what the L2 fetches from memory)
  // Dispatches recorded (0 when every span is empty).
  uint32_t record(CommandRecorder& rec) const;
};

}  // namespace tessera::vk
