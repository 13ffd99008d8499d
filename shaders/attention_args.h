// Push-constant structs and the split-K chunking rule shared by the attention kernels
// (kv_write.comp, attention_partial.comp, attention_merge.comp, absorb.comp) and their C++
// wrappers (runtime/vulkan/kernels_attention.h). Valid GLSL and valid C++: uint/float scalars
// only, every struct a multiple of 16 bytes (std430 push-constant layout == C++ layout).
#ifndef TESSERA_ATTENTION_ARGS_H
#define TESSERA_ATTENTION_ARGS_H

#ifdef __cplusplus
#include <cstdint>
namespace tessera::gpu {
using uint = uint32_t;
#define TS_ATTN_FN inline
#else
#define TS_ATTN_FN
#endif

// Word index meaning "no token-count word": one query / one row (the decode step).
#define TS_ATTN_NO_COUNT 0xFFFFFFFFu

// kv_write.comp, workgroup y = token t (prefill: several rows; decode: t = 0 only):
// pos = step[pos_word] + t; if pos < n_ctx and t < step[count_word] (count_word ==
// TS_ATTN_NO_COUNT: t == 0 only):
//   cache[pos] = f16([ RMSNorm(kv_t[0:R]; norm_w, eps) | rope(kv_t[R:R+Dr], pos) ]),
//   kv_t = kv[t*kv_stride ...]
struct KvWriteArgs {
  uint pos_word;    // index (in 32-bit words) of the (first) position in the step buffer
  uint n_ctx;       // rows the bound cache holds; a position >= n_ctx writes nothing
  float eps;        // RMSNorm epsilon
  uint count_word;  // index of the token count in the step buffer, or TS_ATTN_NO_COUNT
  uint kv_stride;   // floats between consecutive tokens' kv inputs
  uint pad0, pad1, pad2;
};

// attention_partial.comp: query t = workgroup z (decode: only t = 0) at position
// pos = step[pos_word] + t (skipped when t >= step[count_word]; count_word == TS_ATTN_NO_COUNT:
// one query); kv_len = min(pos + 1, n_ctx) (causal: query t sees [0, pos]); the positions
// [0, kv_len) are cut into chunks (ts_attn_chunk_len); workgroup c < ts_attn_num_chunks handles
// chunk c and writes its partial (running max m, sum l, unnormalized latent output o) for every
// head. Query t's q is at float t*N_HEAD*(R+Dr), its partials at float
// t*n_groups*N_HEAD*(R+2) (the per-query layout of the decode step, repeated).
// attention_prefill.comp takes the same arguments (count_word required) and writes the same
// partials, workgroup z = a group of queries (its header gives the chunking of a group).
struct AttnPartialArgs {
  uint pos_word;    // index (in 32-bit words) of the (first) query position in the step buffer
  uint n_ctx;       // rows the bound cache holds
  uint n_groups;    // workgroups dispatched (upper bound of the chunk count)
  uint min_chunk;   // fewest positions per chunk (a multiple of the kernel's TILE)
  float kq_scale;   // score scale (forward.md section 4)
  uint count_word;  // index of the query count in the step buffer, or TS_ATTN_NO_COUNT
  uint kv_min;      // the dispatch does nothing unless kv_min <= kv_len (a query's) ...
  uint kv_max;      // ... <= kv_max (0: no upper bound): two variants, one recording
};

// attention_merge.comp: olat[h*R + r] = sum_c exp(m_c - M) o_c[h][r] / sum_c exp(m_c - M) l_c,
// over the chunks attention_partial wrote for the same step (same chunking arguments); query t
// = workgroup z as in AttnPartialArgs, its output at float t*N_HEAD*R.
struct AttnMergeArgs {
  uint pos_word;
  uint n_ctx;
  uint n_groups;
  uint min_chunk;
  uint count_word;  // as in AttnPartialArgs
  uint zero;        // 0 (the gated merge's run-time zero: gate.glsl gate_wait's zero_mask)
  uint pad1, pad2;
};

// absorb.comp: per-head matvec. For the weight rows g in [row_begin, row_begin + n_rows) bound to
// this dispatch (the whole matrix is n_head*rows rows x cols; head h owns rows h*rows..+rows-1),
// with h = g / rows, r = g % rows:
//   y[h*y_stride + y_offset + r] = sum_k W[g][k] * x[h*x_stride + x_offset + k],  k < cols
// With copy_n > 0 the dispatch whose row_begin is 0 also copies, per head h < n_head,
// x[h*x_stride + copy_src + i] to y[h*y_stride + copy_dst + i] for i < copy_n (the unroped q_pe
// values beside q_lat). Several tokens (prefill): workgroup z = token t, every x / y index above
// offset by t*x_token_stride / t*y_token_stride.
struct AbsorbArgs {
  uint row_begin;  // first weight row bound to this dispatch
  uint n_rows;     // weight rows bound to this dispatch
  uint rows;       // rows per head
  uint cols;       // contraction length (elements per weight row)
  uint x_stride;   // floats between consecutive heads' inputs
  uint x_offset;   // index of head 0's first input value
  uint y_stride;   // floats between consecutive heads' outputs
  uint y_offset;   // index of head 0's first output value
  uint n_head;     // heads (for the copy)
  uint copy_n;     // values copied per head (0 = none)
  uint copy_src;   // offset of the copied values within a head's input
  uint copy_dst;   // offset of the copied values within a head's output
  uint x_token_stride;  // workgroup z = token t: floats between tokens' inputs (t*... added)
  uint y_token_stride;  // and outputs
  uint pad0, pad1;
};

// Positions per chunk for a context of kv_len positions split over at most n_groups workgroups:
// ceil(kv_len / n_groups) rounded up to a multiple of tile, and at least min_chunk.
TS_ATTN_FN uint ts_attn_chunk_len(uint kv_len, uint n_groups, uint min_chunk, uint tile) {
  uint per_group = (kv_len + n_groups - 1u) / n_groups;
  per_group = (per_group + tile - 1u) / tile * tile;
  return per_group > min_chunk ? per_group : min_chunk;
}

// Chunks that hold at least one position (<= n_groups; 0 when kv_len is 0).
TS_ATTN_FN uint ts_attn_num_chunks(uint kv_len, uint n_groups, uint min_chunk, uint tile) {
  uint len = ts_attn_chunk_len(kv_len, n_groups, min_chunk, tile);
  return (kv_len + len - 1u) / len;
}

// The decode step's indirect attention group counts as a function of the context length
// (AttentionOp::decode_counts on the host; sample.comp on the GPU, which writes the next step's
// counts itself so that steps can be queued without the host): words 0-2 are the short range's
// dispatch (x = chunks over short_groups workgroups, y = short_y), words 3-5 the long one's
// (x = chunks over long_groups, y = long_y); the range kv_len is not in gets x = 0 (the single
// and mid ranges, below their bounds, are direct dispatches: both get 0). A bound of 0: no such
// range. Stored as 12 words (the step buffer), in this order.
struct AttnDecodeRule {
  uint single_max;   // kv_len <= single_max: the single range (0: none)
  uint mid_max;      // else kv_len <= mid_max: the mid range (0: none)
  uint short_max;    // else kv_len <= short_max: the short range (0: none), else the long one
  uint short_groups; // context workgroups of the short range
  uint long_groups;  // ... of the long range
  uint short_y;      // head groups of the short range's dispatch
  uint long_y;       // ... of the long one's
  uint n_ctx;        // positions the cache holds (kv_len is clamped to it)
  uint min_chunk;
  uint tile;
  uint pad0, pad1;
};

// Word i (< 6) of the group counts for a context of kv_len >= 1 positions.
TS_ATTN_FN uint ts_attn_decode_count(AttnDecodeRule r, uint kv_len, uint i) {
  const uint range = kv_len <= r.single_max ? 0u : kv_len <= r.mid_max ? 1u : kv_len <= r.short_max ? 2u : 3u;
  if (i == 2u || i == 5u) return 1u;
  if (i == 1u) return r.short_y;
  if (i == 4u) return r.long_y;
  if ((i == 0u && range != 2u) || (i == 3u && range != 3u)) return 0u;
  const uint len = kv_len < r.n_ctx ? kv_len : r.n_ctx;
  const uint chunks = ts_attn_num_chunks(len, i == 0u ? r.short_groups : r.long_groups, r.min_chunk, r.tile);
  return chunks > 1u ? chunks : 1u;
}

#ifdef __cplusplus
static_assert(sizeof(AttnDecodeRule) == 48);
static_assert(sizeof(KvWriteArgs) % 16 == 0 && sizeof(AttnPartialArgs) % 16 == 0);
static_assert(sizeof(AttnMergeArgs) % 16 == 0 && sizeof(AbsorbArgs) % 16 == 0);
}  // namespace tessera::gpu
#endif
#undef TS_ATTN_FN

#endif  // TESSERA_ATTENTION_ARGS_H
