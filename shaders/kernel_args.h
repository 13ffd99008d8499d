// Push-constant structs and constants shared by the GLSL kernels and their C++ wrappers.
// This file is valid GLSL (included by *.comp through the embedded-file includer) and valid C++
// (included by runtime/vulkan/*.cpp): only `uint`/`float` scalars, no arrays, no bools, every
// struct a multiple of 16 bytes so std430 push-constant layout equals the C++ layout.
#ifndef TESSERA_KERNEL_ARGS_H
#define TESSERA_KERNEL_ARGS_H

#ifdef __cplusplus
#include <cstdint>
namespace tessera::gpu {
using uint = uint32_t;
#endif

// Weight layout ids (docs/FORMAT.md; the .tsr directory stores the same numbers).
#define TS_LAYOUT_PLAIN 0      // F32 / F16 / BF16 row-major as in GGUF
#define TS_LAYOUT_SPLIT1 1     // quant bytes region Q, then (256-aligned) the rest region M
#define TS_LAYOUT_MOE_TILE1 2  // per MoE layer: routed expert slots + one shared slot

// ggml type ids used as the WTYPE define of weight-reading kernels.
#define TS_TYPE_F32 0
#define TS_TYPE_F16 1
#define TS_TYPE_Q4_0 2
#define TS_TYPE_Q4_1 3
#define TS_TYPE_Q5_0 6
#define TS_TYPE_Q5_1 7
#define TS_TYPE_Q8_0 8
#define TS_TYPE_Q4_K 12
#define TS_TYPE_Q5_K 13
#define TS_TYPE_Q6_K 14
#define TS_TYPE_BF16 30

// MatvecArgs.flags bits.
#define TS_MATVEC_ACCUMULATE 1u  // y += W x instead of y = W x
// (The high 16 bits of MatvecArgs::flags stay zero: matvec_q8.comp WAIT_GATE masks with them.)

// The router fold (shaders/router_partial.glsl, docs/ARCHITECTURE.md "Router fold"): the matvec
// that writes x before a MoE FFN adds partial router logits and sum(x^2) into 64-bit fixed-point
// accumulators, the MoE gate-up reads them. Accumulator array of one layer: TS_ROUTER_FOLD_SLOTS
// copies (picked by workgroup id) of n_expert + 1 int64 values: [s * (n_expert + 1) + e] = sum of
// round(W_router[e][r] * norm_w[r] * x[r] * 2^32) over the rows r added to copy s, e < n_expert;
// [s * (n_expert + 1) + n_expert] = sum of round(x[r]^2 * 2^20). Integer sums: the same bits in
// every run whatever the order of the atomics.
#define TS_ROUTER_FOLD_SLOTS 16u
#define TS_ROUTER_FOLD_LOGIT_SCALE 4294967296.0  // 2^32
#define TS_ROUTER_FOLD_SS_SCALE 1048576.0        // 2^20 (x^2 reaches ~1e9 in massive activations)

// matvec.comp: y[c*y_stride + row_begin + r] (+)= sum_k W[r][k] * xn[c*x_stride + k],
// r < rows (the rows bound in this dispatch), c < NUM_COLS (a define);
// xn = x, or with NORM_INPUT: x * norm_w * 1/sqrt(mean(x^2) + norm_eps) over k < cols.
struct MatvecArgs {
  uint rows;       // rows of W bound to this dispatch (the weight bindings start at row_begin)
  uint cols;       // K: row length in elements
  uint row_begin;  // index in y of the first row of this dispatch
  uint flags;      // TS_MATVEC_* bits
  uint x_stride;   // floats between consecutive x vectors (batched form)
  uint y_stride;   // floats between consecutive y vectors (batched form)
  float norm_eps;  // NORM_INPUT only
  uint x_offset;   // index in x (floats) of the first x vector
};

// matmul.comp: y[t*y_stride + row_begin + r] (+)= sum_k W[r][k] * x16[x_offset + t*x_stride + k]
// for r < rows (the rows bound in this dispatch), t < n_tokens; x16 f16, y f32.
// Split over K (n_splits > 1): workgroup z sums columns [z k_split, (z + 1) k_split) into
// part[(z*n_tokens + t)*part_rows + row_begin + r]; then the REDUCE variant adds the n_splits
// partial sums in order into y.
struct MatmulArgs {
  uint rows;       // rows of W bound to this dispatch (the weight bindings start at row_begin)
  uint cols;       // K: row length in elements
  uint row_begin;  // index in y of the first row of this dispatch
  uint flags;      // TS_MATVEC_ACCUMULATE
  uint x_stride;   // f16 elements between consecutive tokens of x16 (a multiple of 8)
  uint y_stride;   // floats between consecutive tokens of y
  uint n_tokens;   // tokens (x16 holds them rounded up to 16)
  uint x_offset;   // index in x16 of token 0's first element (a multiple of 8)
  uint k_split;    // columns per workgroup along z (a multiple of KT; >= cols: no split)
  uint n_splits;   // workgroups along z (1: y written directly)
  uint part_rows;  // rows of the whole matrix (the partial sums' token stride)
  uint count_word; // with TS_MATMUL_LIVE_COUNT: the word of binding 5 with the live token count
};
#define TS_MATMUL_LIVE_COUNT 2u  // MatmulArgs.flags: tokens past min(n_tokens, count) are skipped

// rmsnorm.comp: for each row t < n_rows:
//   y[y_offset + t*y_stride + i] = w[i] * x[x_offset + t*x_stride + i] / sqrt(mean_i(x^2) + eps)
// for i < n. One workgroup per row.
struct RmsNormArgs {
  uint n;         // elements per row
  uint n_rows;    // rows
  uint x_stride;  // floats between rows of x
  uint y_stride;  // floats between rows of y
  uint x_offset;  // index in x of row 0
  uint y_offset;  // index in y of row 0
  float eps;
  uint sum_k;          // SUM_IN: rows of y_in summed per row (K pairs; 0 for a dense FFN; or split-K parts)
  uint sum_pair_base;  // SUM_IN: the shared pair of row 0 (rows' shared pairs follow)
  uint sum_flags;      // SUM_IN: TS_NORM_SUM_SHARED | TS_NORM_SUM_REPLACE
  uint count_word;     // SUM_IN: step word with the live row count
  uint sum_stride_t;   // SUM_IN: row t's k-th summand is y_in row t * sum_stride_t + k * sum_stride_k
  uint sum_stride_k;
  uint pad0, pad1, pad2;
};
#define TS_NORM_SUM_SHARED 1u   // also add y_in row sum_pair_base + t
#define TS_NORM_SUM_REPLACE 2u  // x = the sum (a split-K matmul's parts), not x + the sum

// prefetch.comp: pulls up to four byte spans (bindings 0..3) into the GPU's L2 cache by reading
// one 32-bit word per 32-byte sector; workgroups [first_group_i, first_group_{i+1}) read span i.
// The words read are XOR-folded into sink[0] (atomicXor), so no load can be dropped and a test
// can check which words were read. A span with sectors_i = 0 is not read.
#define TS_PREFETCH_SECTOR_BYTES 32u
struct PrefetchArgs {
  uint sectors0, sectors1, sectors2, sectors3;  // 32-byte sectors of each span (the last may be partial)
  uint first1, first2, first3, n_groups;        // first workgroup of spans 1..3, workgroups in all
};

// embed.comp: for t < n_tokens, with id = ids[id_offset + t]:
//   out[out_offset + t*out_stride + k] = dequant(W row id)[k], k < cols,
// done only by the dispatch whose bound rows [row_begin, row_begin + rows) contain id
// (large tables are bound in row ranges that fit maxStorageBufferRange). An id >= n_vocab writes
// zeros (the dispatch with row_begin 0 does it) so a bad id is visible, never an OOB read.
struct EmbedArgs {
  uint rows;        // rows of W bound to this dispatch
  uint cols;        // row length in elements
  uint row_begin;   // first table row bound to this dispatch
  uint n_vocab;     // rows of the whole table
  uint id_offset;   // index in ids of token 0
  uint n_tokens;    // tokens
  uint out_offset;  // index in out of token 0's row
  uint out_stride;  // floats between token rows of out
};

#ifdef __cplusplus
static_assert(sizeof(MatvecArgs) % 16 == 0 && sizeof(MatmulArgs) % 16 == 0 && sizeof(RmsNormArgs) % 16 == 0 && sizeof(EmbedArgs) % 16 == 0);
}  // namespace tessera::gpu
#endif

#endif  // TESSERA_KERNEL_ARGS_H
