// MatmulOp: Y = W X for a chunk of tokens (shaders/matmul.comp), the prefill's dense matrices.
//   W: MatrixRef, SPLIT1 (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K) or plain (F32 F16 BF16);
//   X: f16 token rows (x16, written by RmsNormOp with f16_out: the norm, or a plain conversion,
//   in front); Y: f32 token rows; f16 products, f32 sums.
// Each workgroup reads its rows of W once for 64 tokens (the batched matvec reads them once per 8):
// on tensor cores where the device has 16 x 16 x 16 f16 cooperative matrices
// (VK_NV_cooperative_matrix, subgroups of 32), else the same kernel with plain FMAs
// (MatmulKernel::Plain: the tests' path on devices without them; slower than the int8 matvec).
// Matrices with few row tiles are split along K over several workgroups (split-K), whose partial
// sums a second dispatch adds in order into Y: the same bits on every run.
//
//   vk::MatmulOp op;
//   op.w = weight; op.x16 = x16.whole(); op.y = y.whole(); op.n_tokens = 64;
//   op.partials = scratch;          // op.partials_bytes(ctx) bytes, where op.splits(ctx) > 1
//   op.record(rec);                 // the matmul (one dispatch per row chunk of the bindings)
//   rec.barrier();                  // where op.splits(ctx) > 1:
//   op.record_sum(rec);             //   the partial sums into y
#pragma once
#include <cstdint>
#include <string>

#include "runtime/vulkan/kernels_basic.h"
#include "runtime/vulkan/recorder.h"
#include "runtime/vulkan/split1.h"

namespace tessera::vk {

enum class MatmulKernel { Auto, Coop, Plain };  // Auto: Coop where matmul_coop_supported

// The device multiplies 16 x 16 x 16 f16 cooperative matrices (enabled NV extension, f16
// arithmetic, subgroup ops with subgroups of exactly 32).
bool matmul_coop_supported(Context& ctx);
// MatmulOp runs here at all (f16 arithmetic for its staging).
bool matmul_supported(Context& ctx);
// Whether `kernel` runs on tensor cores here (Auto: where matmul_coop_supported).
bool matmul_uses_coop(Context& ctx, MatmulKernel kernel);
// The columns a step's width must be a multiple of for weights of type t (matmul_tile.glsl
// UNIT_SPAN: K-quant units interleave inside their block): 64 for Q4_K / Q5_K, 128 for Q6_K, else 32.
uint32_t matmul_step_granule(GgmlType t);
// Shared memory of a workgroup of the matmul kernels (matmul_tile.glsl): 16 mr weight rows and
// 16 tg input rows of kt + 8 f16 each, or the tg x mr accumulator tiles, whichever is larger.
uint64_t matmul_shared_bytes(uint32_t mr, uint32_t tg, uint32_t kt);

// The most bytes of partial sums one MatmulOp asks for (automatic splits stay below it).
constexpr uint64_t kMatmulMaxPartialBytes = 16ull << 20;

// The FFN kernels' matmul form (moe_matmul.comp, MoePrefillOp / DensePrefillOp); 0 = automatic.
struct FfnMatmulTuning {
  uint32_t row_tiles = 0;  // 16-row tiles of W per workgroup (the gate-up's half gate and half
                           // up): 2, 4 or 8 (auto: 4 where it fits, else 2). Each workgroup stages its
                           // pairs' inputs once per step: more rows read them fewer times.
  uint32_t step = 0;       // columns per step: 32, 64, 128 or 256 (auto: the first of 64, 128, 256
                           // that the type's unit span allows and the shared memory holds; 32
                           // first for the shared expert's gate-up)
  uint32_t groups = 0;     // groups of 16 pairs per workgroup: 1, 2 or 4, with split rows 1 or 2
                           // (auto: the most that fit)
  uint32_t split_rows = 0; // 2: twice the groups of 32 invocations per pair group, each taking
                           // half its row tiles (half the accumulators); 1: not; 0 auto (2 for the
                           // routed experts, whose lists half fill 64-pair workgroups; 1 for the
                           // shared expert and a dense FFN: H100 GLM pp512 5378 -> 5595, session 22)
  uint32_t loop = 0;       // the products' slices of 16 columns: 1 unrolled, 2 a loop (auto: a loop;
                           // H100 GLM pp512 4830 -> 4920 tok/s, session 22)
  uint32_t prefetch = 0;   // the next step's loads issued before this step's products: 1 none,
                           // 2 W words, 3 input values, 4 both (auto: both; H100 GLM pp512
                           // 4633 -> 4816 tok/s, session 22)
};

// The FFN kernels' int8 form (moe_prefill.comp Q8ACT: experts of short chunks) work split; 0 = automatic.
struct FfnInt8Tuning {
  uint32_t lanes = 0;     // lanes per weight row: 8, 16 or 32 (auto 8: a row's 8 consecutive blocks
                          // per load, and one staged-input read serves 4 rows of a 32-lane subgroup;
                          // H100 GLM pp64 1879 with 32 -> 2111, session 23)
  uint32_t rows = 0;      // output rows per workgroup of 256 invocations in the routed experts'
                          // dispatches: 32, 64 or 128 (auto 128: each staging serves more rows;
                          // H100 GLM pp64 2111 / 2425 / 2475, session 23)
  uint32_t rows_all = 0;  // ... in the all-token dispatches (shared expert, dense FFN): auto 64
  uint32_t pairs = 0;     // pairs per pass, at most: 1, 2, 4 or 8 (auto 4: an expert's pairs over
                          // more workgroups, each with less work; H100 GLM pp64 2545 with 8 -> 2733)
  uint32_t outs = 0;      // output rows a team computes at once, 1 or 2: each staged input read
                          // once for them, their weight loads issued together (auto: 2 in the
                          // downs, 1 in the gate-ups, whose 2 are 4 weight rows; H100 GLM pp64:
                          // down 86.9 -> 80.5 us a layer, gate-up 137.7 -> 148.1, session 23)
  uint32_t unroll = 0;    // each lane's loop over a row's blocks: 1 unrolled, 2 a loop (auto: a loop;
                          // a tie, session 23)
};

// Work split; 0 = automatic.
struct MatmulTuning {
  uint32_t row_tiles = 0;  // 16-row tiles per workgroup: 1, 2 or 4 (auto: the first of 2, 4, 1
                           // whose step fits the device's shared memory; in chunks of at most
                           // 64 tokens 1, 2, 4 for matrices of at most 1024 rows, and 4, 2, 1 for
                           // larger ones that would split)
  uint32_t step = 0;       // columns of W staged per step: a multiple of 32 (of 64 for Q4_K /
                           // Q5_K, 128 for Q6_K) up to 2048 (auto: 64 where it fits)
  uint32_t groups = 0;     // groups of 16 tokens per workgroup: 1, 2 or 4 (auto 4, fewer where
                           // the shared memory cannot hold the step otherwise)
  uint32_t prefetch = 0;   // 1: the next step's token values loaded ahead into registers (steps of
                           // at most 128 columns; matmul.comp PREFETCH_B); 2: not; 0 auto (1;
                           // 2 in chunks of at most 64 tokens)
  uint32_t splits = 0;     // workgroups along K per tile, 1..64, partial sums within
                           // kMatmulMaxPartialBytes (auto: enough for 1024 workgroups, at most 32
                           // and one step each; 256 with 64-row tiles in chunks of at most 64
                           // tokens; none where the tiles make 256 workgroups of at most 32 steps)
  uint32_t prefetch_w = 0; // 1: the next step's W words (SPLIT1 types) loaded before this step's
                           // products (PREFETCH_W); 2: not; 3: two steps ahead, in two register
                           // sets (W_AHEAD 2); 0 auto (3 in chunks of more than 64 tokens: H100
                           // GLM pp512 5757 -> 5872, session 25; else 1: pp64 3176 against 3104)
  uint32_t loop = 0;       // the products' slices of 16 columns: 1 unrolled, 2 a loop; 0 auto (unrolled)
  FfnMatmulTuning ffn;      // the FFN kernels' matmul form
  FfnInt8Tuning ffn_int8;   // ... and their int8 form
};

struct MatmulOp {
  MatrixRef w;                // W [rows][cols]
  BufferSlice x16;            // f16: token t, element k at x_offset + t * x_stride + k, for t below
                              // n_tokens rounded up to 16 (rows past n_tokens are read, not used)
  BufferSlice y;              // f32: token t, row r at t * y_stride + r
  BufferSlice partials;       // f32 scratch of partials_bytes(); needed where splits() > 1
  uint32_t n_tokens = 0;      // 1..
  uint32_t x_offset = 0;      // f16 elements; multiple of 8
  uint32_t x_stride = 0;      // f16 elements between tokens; 0 = cols; multiple of 8
  uint32_t y_stride = 0;      // floats between tokens; 0 = rows
  bool accumulate = false;    // y += W x
  // Set: word count_word of this buffer holds the live token count (<= n_tokens), read by the GPU
  // when the recording runs: tokens past it are neither computed nor stored (a recording for a
  // chunk of n_tokens serves shorter chunks at their cost).
  BufferSlice live_count;
  uint32_t count_word = 0;
  MatmulKernel kernel = MatmulKernel::Auto;
  MatmulTuning tuning;
  std::string label;          // profile label; empty = kernel_name()
  uint64_t max_binding_bytes = 0;  // 0 = device maxStorageBufferRange (lower: tests of chunking)

  // Whether record() takes the tensor-core kernel on this device.
  bool uses_coop(Context& ctx) const;
  // Workgroups along K per tile (1: no partial sums, no record_sum).
  uint32_t splits(Context& ctx) const;
  uint64_t partials_bytes(Context& ctx) const;
  // Pipeline name, e.g. "matmul.q4_0.coop.m4" / "matmul.q8_0.plain".
  std::string kernel_name(Context& ctx) const;
  // Bytes moved: W once per workgroup's tokens (64 by default), x16 read, y written (and read
  // when accumulating), the partial sums written.
  uint64_t bytes(Context& ctx) const;
  // Records the matmul's dispatches (no barrier). Validates type, shapes, strides, sizes, the
  // work split and the device first; throws Error(Runtime) naming the label and the problem.
  void record(CommandRecorder& rec) const;
  // Where splits() > 1: the dispatch that adds the partial sums into y, to record after a
  // barrier that follows record(); nothing otherwise.
  void record_sum(CommandRecorder& rec) const;
  // Where splits() > 1, instead of record_sum: the partial sums as the rows an RmsNormOp over y
  // adds up first (RmsNormOp::add, record_sum's order: the same bits). Needs live_count, y rows
  // of `rows` floats and no accumulate (else Error(Runtime)).
  RmsNormOp::ResidualSum split_parts(Context& ctx) const;
};

}  // namespace tessera::vk
