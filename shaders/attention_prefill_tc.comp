#version 450
// D3 of the prefill chunk on tensor cores (docs/PREFILL.md): causal absorbed MLA attention of the
// chunk's (query, head) rows over one layer's latent cache, as 16 x 16 x 16 matrix products
// (VK_NV_cooperative_matrix, f16 operands, f32 sums), writing olat directly: no split along the
// context, no partials, no merge. Wrapper: PrefillAttentionOp (runtime/vulkan/kernels_prefill.h).
//
// Rows: r = t * N_HEAD + h (query t of the chunk, head h; q and olat are laid out this way).
// Workgroup x takes M_TILES tiles of 16 rows, MR = 16 M_TILES rows from MR x (a tile: about one
// query's heads, so the rows' causal bounds differ by at most a few positions) and walks the cache
// in blocks of 16 rows, [0, kv_end) with kv_end the bound of its last live row, each staged block
// serving all its tiles:
//   s(r, j) = kq_scale * (q_lat_r . c_j + rope(q_pe_r, pos_t) . kpe_j),   j < kv_len_t
//   per block S = Q K^T, then per row a reference m (the row's running maximum, moved only when a
//   block's maximum passes it by more than MARGIN nats), P = exp(S - m) (f16, at most e^MARGIN),
//   l = sum P, O += P V (V = the rows' first R values); where some row's m moved, O's tiles go
//   through shared memory once to be scaled by exp(m_old - m_new) (cooperative matrices have no
//   per-row scale). olat[r] = O[r] / l[r]. MARGIN 0 is the exact online softmax.
// SPLIT (the decode step's long range, AttentionOp::record_decode; session 26): one query, its
// heads as the rows (workgroup y = head tiles M_TILES y + m, tile k = heads 16 k .., the last
// tile overlapping the one before it where there are at least 16 heads), workgroup x = chunk c
// of the context
// split as attention_partial.comp splits it (ts_attn_chunk_len with TILE, kv_min / kv_max bounds),
// writing that kernel's partials (o unnormalized against the row's reference m, and (m, l)) for
// attention_merge.comp: the same merge, the cache read once per workgroup of head tiles instead
// of once per head.
// SPLIT_Q (the prefill's walk split along the context, PrefillAttentionOp tc_split; session 29):
// rows (query, head) as without SPLIT, workgroup y = chunk c of every row's query's context, cut
// as the merge cuts it (ts_attn_chunk_len of the query's kv_len with n_groups, min_chunk, TILE):
// the workgroup walks the union of its rows' chunks c, each row masked to its own, and writes
// the per-query partials attention_merge.comp reads (query t's at t n_groups N_HEAD (R + 2)
// floats; a row whose chunk c is empty writes m = -3e38, l = 0, which the merge never reads). So a
// chunk's workgroups come in n_groups shorter walks, and the last wave of a long context is not
// mostly idle (PERFORMANCE.md session 29).
// N_GROUPS groups of 32 lanes ("subgroups"), GPT = N_GROUPS / M_TILES (4 or 8) per tile: S's 36
// (ROW / 16) k-tiles split over a tile's groups (partial tiles summed through shared memory), O's
// R / 16 column tiles too. Per block: the block's rows stored (barrier), S (barrier), P and the
// rows' scales (barrier), O += P V (barrier); with DOUBLE_K the next block's rows go to the other
// buffer, so no fourth barrier guards them. The row statistics and P: invocations 0 .. 8 MR - 1,
// 8 a row.
//
//   sh (uvec4, 8 f16 or 4 f32 per element):
//     [Q_BASE]  (without QREG) MR query rows, f16, roped and scaled (RS uvec4 a row: ROW values +
//               8 padding); with QREG they pass through K buffer 0 (a tile at a time) into the
//               groups' registers
//     [K_BASE]  1 or 2 (DOUBLE_K) buffers of a block's 16 cache rows, f16 (zeros past kv_end)
//     [SP_BASE] the groups' partial S tiles, f32 row-major 16 x 16 (64 uvec4 each); also each
//               group's scratch for its O tiles (rescales, the output)
//     [P_BASE]  P per tile, f16 row-major 16 x 16 (2 uvec4 a row)
//
// Defines: N_HEAD, KV_LORA (R, a multiple of 16, <= 512), N_ROT (Dr; R + Dr a multiple of 16,
// <= 576) + the rope.glsl table; COOP; SUBGROUP_SIZE (>= 8: the row statistics reduce over 8
// lanes); TC_PREFETCH (0/1, below); MARGIN (nats, a float literal, 0 .. 10: P <= e^10 stays far
// inside f16); DOUBLE_K (0/1); QREG (0/1, COOP only: each group's query k-tiles in registers);
// M_TILES (1 or 2); N_GROUPS (GPT M_TILES, GPT 4 or 8); OUT_F16 (0/1: olat as f16, the matmul's
// input rows, instead of f32);
// SPLIT (0/1) or SPLIT_Q (0/1) with TILE (the chunking's rounding); STAGGER (0/1, the prefill's: with SPLIT each
// chunk is its own already): workgroup x walks its blocks from block x mod n_blk on, around to
// the start (the softmax does not depend on the order), so the resident workgroups do not all
// read the same cache rows at once.
// Bindings: 0 = q (f32 [T][N_HEAD][R + Dr], unroped), 1 = cache (f16 rows of R + Dr), 2 = step
// words (position of query 0, live query count), 3 = olat (f32, or f16, [T][N_HEAD][R]).
// SPLIT: 3 = partials ([n_groups][N_HEAD][R] o, then [n_groups][N_HEAD] (m, l)); SPLIT_Q: the
// same per query.
// PARTIAL_SIGNAL (0/1, with SPLIT; AttentionTuning::merge_wait): every workgroup, those that
// return early too, adds 1 to word SIGNAL_WORD of binding 4 once its partials are written and
// visible device-wide, for the merge recorded with no barrier after it (attention_merge.comp
// WAIT_GATE).
// Arguments: AttnPartialArgs (pos_word, n_ctx, kq_scale, count_word; SPLIT: n_groups, min_chunk,
// kv_min, kv_max too, count_word unused; SPLIT_Q: n_groups, min_chunk too).
#extension GL_GOOGLE_include_directive : require
#include "timeline.glsl"  // before main(): bench --timeline
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#if COOP
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_NV_cooperative_matrix : require
#endif
#include "attention_args.h"
#include "rope.glsl"

#define ROW (KV_LORA + N_ROT)
#if ROW % 16 != 0 || KV_LORA % 16 != 0
#error "attention_prefill_tc.comp: R and R + Dr must be multiples of 16"
#endif
#if COOP && SUBGROUP_SIZE != 32
#error "attention_prefill_tc.comp: COOP needs subgroups of 32"
#endif
#if SUBGROUP_SIZE < 8
#error "attention_prefill_tc.comp: the row statistics need subgroups of at least 8"
#endif

#ifndef N_GROUPS
#define N_GROUPS 4
#endif
#ifndef M_TILES
#define M_TILES 1
#endif
#if M_TILES != 1 && M_TILES != 2
#error "attention_prefill_tc.comp: M_TILES is 1 or 2"
#endif
#define GPT (N_GROUPS / M_TILES)   // groups per M tile
#if GPT != 4 && GPT != 8
#error "attention_prefill_tc.comp: 4 or 8 groups per M tile"
#endif
#define WG_SIZE (32 * N_GROUPS)
#define RS (ROW / 8 + 1)           // row stride in uvec4 (ROW f16 + 8 f16 of padding)
#define NT_K (ROW / 16)            // k-tiles of S
#define KPG ((NT_K + GPT - 1) / GPT)  // ... per group
#define NT_V (KV_LORA / 16)        // column tiles of O
#define RT ((NT_V + GPT - 1) / GPT)   // ... per group
#define MR (16 * M_TILES)          // the workgroup's rows
#if KPG > 9 || RT > 8
#error "attention_prefill_tc.comp: R <= 512 and R + Dr <= 576"
#endif
#ifndef TC_PREFETCH
#define TC_PREFETCH 0
#endif
#ifndef MARGIN
#define MARGIN 8.0
#endif
#ifndef DOUBLE_K
#define DOUBLE_K 0
#endif
#ifndef STAGGER
#define STAGGER 0
#endif
#if !COOP || !defined(QREG)
#undef QREG
#define QREG 0
#endif
#if QREG
#define Q_BASE 0  // staged in K buffer 0 one M tile at a time, then held in registers
#define K_BASE 0
#else
#define Q_BASE 0
#define K_BASE (MR * RS)
#endif
#if DOUBLE_K
#define N_KBUF 2
#else
#define N_KBUF 1
#endif
#define SP_BASE (K_BASE + N_KBUF * 16 * RS)
#define P_BASE (SP_BASE + 64 * N_GROUPS)
#define SH_SIZE (P_BASE + 32 * M_TILES)

layout(local_size_x = WG_SIZE) in;

layout(std430, binding = 0) readonly restrict buffer Query { float q[]; };
layout(std430, binding = 1) readonly restrict buffer Cache { uvec4 cache4[]; };
layout(std430, binding = 2) readonly restrict buffer Step { uint step_words[]; };
#ifndef OUT_F16
#define OUT_F16 0
#endif
#ifndef SPLIT
#define SPLIT 0
#endif
#ifndef SPLIT_Q
#define SPLIT_Q 0
#endif
#if (SPLIT || SPLIT_Q) && OUT_F16
#error "attention_prefill_tc.comp: SPLIT and SPLIT_Q write f32 partials"
#endif
#if SPLIT && SPLIT_Q
#error "attention_prefill_tc.comp: SPLIT or SPLIT_Q"
#endif
// SPLIT with at least 16 heads: the last head tile overlaps the one before it (rows r0 = N_HEAD -
// 16 ..), so every row is a head; with cooperative matrices the O tiles then go from registers
// straight to the partials (no shared-memory pass; rows of two tiles get the same bits twice).
#if SPLIT && N_HEAD >= 16
#define TILE_R0(y) min((y) * 16u, uint(N_HEAD) - 16u)
#define DIRECT_OUT COOP
#else
#define TILE_R0(y) ((y) * 16u)
#define DIRECT_OUT 0
#endif
#ifndef PARTIAL_SIGNAL
#define PARTIAL_SIGNAL 0
#endif
#if PARTIAL_SIGNAL && !SPLIT
#error "attention_prefill_tc.comp: PARTIAL_SIGNAL is the decode step's (SPLIT)"
#endif
#if PARTIAL_SIGNAL  // the merge's gate
layout(std430, binding = 4) coherent restrict buffer Gate { uint gate[]; };
#include "gate.glsl"
#endif
#if SPLIT || SPLIT_Q
layout(std430, binding = 3) writeonly restrict buffer Out { float partials[]; };
#elif OUT_F16  // olat as f16: the input rows (x16) of the matmul W_vo that follows (session 25)
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
layout(std430, binding = 3) writeonly restrict buffer Out { float16_t olat[]; };
#define OLAT_VALUE(v) float16_t(v)
#else
layout(std430, binding = 3) writeonly restrict buffer Out { float olat[]; };
#define OLAT_VALUE(v) (v)
#endif

layout(push_constant) uniform Push { AttnPartialArgs args; };

shared uvec4 sh[SH_SIZE];
shared float row_l[MR];  // each row's sum, at the end
#if SPLIT || SPLIT_Q
shared float row_m[MR];  // each row's reference maximum, at the end
#endif
shared float row_a[MR];  // the block's scale of each row's O (1 where m stayed)

const float kNegHuge = -3.0e38;

// bench --timeline --tune tc_phases=N (TS_TC_PHASES, process-wide): invocation 0's time in the
// kernel's phases, summed over its blocks; two of them replace its marks (the layer table's
// "early" and "mark" columns): 1 = a block's rows staged, its partial scores; 2 = P and the rows'
// scales, O's products; 3 = the query's tiles into registers (QREG), the output; 4 = the step
// words read (SPLIT), the query staged (and the first block's loads issued). Each phase ends
// after its barrier, but for the step words (invocation 0's own loads) and, with DOUBLE_K (no
// barrier after O's products), O's products (the other groups' then land in the next phase).
#if defined(TS_TIMELINE) && TS_TIMELINE && defined(TS_TC_PHASES) && TS_TC_PHASES
uint ph_sum[8] = uint[8](0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u);
uvec2 ph_clock, ph_begin;
#define PH_BEGIN() (ph_begin = ph_clock = clockRealtime2x32EXT())
#define PH_SYNC() barrier()
#define PH_END(I)                                   \
  {                                                 \
    const uvec2 now_ = clockRealtime2x32EXT();      \
    ph_sum[I] += now_.x - ph_clock.x;               \
    ph_clock = now_;                                \
  }
#define PH_MARKS()                                                                   \
  {                                                                                  \
    ts_early_clock = uvec2(ph_begin.x + ph_sum[2 * (TS_TC_PHASES - 1)] + 1u, ph_begin.y); \
    ts_mark_clock = uvec2(ph_begin.x + ph_sum[2 * (TS_TC_PHASES - 1) + 1] + 1u, ph_begin.y); \
  }
#else
#define PH_BEGIN()
#define PH_SYNC()
#define PH_END(I)
#define PH_MARKS()
#endif

#if COOP
#define ACC fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define F16M fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
void acc_zero(out ACC a) { a = ACC(0.0); }
// acc += A B: A row-major at a0 (stride as), B at b0 (stride bs) column-major (BCOL) or row-major.
#define MMA(ACCV, A0, AS, B0, BS, BCOL)        \
  {                                            \
    F16M ma, mb;                               \
    coopMatLoadNV(ma, sh, (A0), (AS), false);  \
    coopMatLoadNV(mb, sh, (B0), (BS), BCOL);   \
    ACCV = coopMatMulAddNV(ma, mb, ACCV);      \
  }
// acc += A B with A held in a register matrix.
#define MMA_REG(ACCV, MA, B0, BS, BCOL)        \
  {                                            \
    F16M mb;                                   \
    coopMatLoadNV(mb, sh, (B0), (BS), BCOL);   \
    ACCV = coopMatMulAddNV((MA), mb, ACCV);    \
  }
void acc_store(ACC a, uint at) { coopMatStoreNV(a, sh, at, 4u, false); }
void acc_load(out ACC a, uint at) { coopMatLoadNV(a, sh, at, 4u, false); }
// The group's lanes see each other's shared-memory writes (a group is one subgroup).
void group_sync() {
  subgroupMemoryBarrierShared();
  subgroupBarrier();
}
#else
#define ACC float[8]
void acc_zero(out ACC a) {
  [[unroll]] for (uint i = 0; i < 8; ++i) a[i] = 0.0;
}
// f16 value (row r, column c) of a row-major f16 matrix at uvec4 index base, stride in uvec4.
float sh_h(uint base, uint stride, uint r, uint c) {
  return unpackHalf2x16(sh[base + r * stride + c / 8u][(c % 8u) / 2u] >> ((c & 1u) * 16u)).x;
}
#define MMA(ACCV, A0, AS, B0, BS, BCOL)                                                         \
  {                                                                                             \
    const uint ln = gl_LocalInvocationIndex % 32u;                                              \
    [[unroll]] for (uint i = 0; i < 8; ++i) {                                                   \
      const uint e = ln + 32u * i, mr = e % 16u, mn = e / 16u;                                  \
      float sum = ACCV[i];                                                                      \
      for (uint k = 0; k < 16u; ++k)                                                            \
        sum += sh_h((A0), (AS), mr, k) * ((BCOL) ? sh_h((B0), (BS), mn, k) : sh_h((B0), (BS), k, mn)); \
      ACCV[i] = sum;                                                                            \
    }                                                                                           \
  }
void acc_store(ACC a, uint at) {
  const uint ln = gl_LocalInvocationIndex % 32u;
  [[unroll]] for (uint i = 0; i < 8; ++i) {
    const uint e = ln + 32u * i, f = (e % 16u) * 16u + e / 16u;  // row-major (row, column)
    sh[at + f / 4u][f % 4u] = floatBitsToUint(a[i]);
  }
}
// A group is several subgroups here: the whole workgroup waits (called in uniform control flow).
void group_sync() {
  memoryBarrierShared();
  barrier();
}
#endif

// f32 element (row r, column c) of a row-major 16 x 16 f32 tile at uvec4 index at.
float tile_f(uint at, uint r, uint c) { return uintBitsToFloat(sh[at + r * 4u + c / 4u][c % 4u]); }

// The block's cache rows kb .. kb + 15 into the K buffer at kbase (zeros from kv_end on).
void stage_block(uint kb, uint kv_end, uint kbase) {
  for (uint i = gl_LocalInvocationIndex; i < 16u * (ROW / 8u); i += WG_SIZE) {
    const uint r = i / (ROW / 8u), u = i % (ROW / 8u);
    sh[kbase + r * RS + u] = kb + r < kv_end ? cache4[(kb + r) * (ROW / 8u) + u] : uvec4(0u);
  }
}

#if TC_PREFETCH
// TC_PREFETCH: the next block's cache rows are loaded into registers while the current block is
// multiplied, and stored into its K buffer at the next block's start (its load latency off the chain).
#define KPT ((16u * (ROW / 8u) + WG_SIZE - 1u) / WG_SIZE)  // uvec4 per invocation and block
uvec4 pf[KPT];
void load_block(uint kb, uint kv_end) {
  [[unroll]] for (uint i = 0; i < KPT; ++i) {
    const uint idx = gl_LocalInvocationIndex + i * WG_SIZE, r = idx / (ROW / 8u), u = idx % (ROW / 8u);
    pf[i] = idx < 16u * (ROW / 8u) && kb + r < kv_end ? cache4[(kb + r) * (ROW / 8u) + u] : uvec4(0u);
  }
}
void store_block(uint kbase) {
  [[unroll]] for (uint i = 0; i < KPT; ++i) {
    const uint idx = gl_LocalInvocationIndex + i * WG_SIZE;
    if (idx < 16u * (ROW / 8u)) sh[kbase + (idx / (ROW / 8u)) * RS + idx % (ROW / 8u)] = pf[i];
  }
}
#define STAGE(kb, kbase)                              \
  store_block(kbase);                                 \
  barrier();                                          \
  if (i + 1u < n_blk) load_block(kb_next, kv_end);
#define STAGE_FIRST() load_block(kb_first, kv_end);
#else
#define STAGE(kb, kbase)               \
  stage_block((kb), kv_end, (kbase));  \
  barrier();
#define STAGE_FIRST()
#endif

// Group g's k-tiles kk = gt KPG + i (gt: its index among its M tile's groups): the query's either
// in registers (QREG: q0 .. q8) or in sh (its M tile's rows).
#if QREG
#define FOR_Q(X) X(0, q0) X(1, q1) X(2, q2) X(3, q3) X(4, q4) X(5, q5) X(6, q6) X(7, q7) X(8, q8)
#define Q_DECL(I, V) F16M V;
#define Q_LOAD(I, V) if (I < KPG && gt * KPG + I < NT_K) coopMatLoadNV(V, sh, Q_BASE + 2u * (gt * KPG + I), RS, false);
#define S_MMA(I, V) if (I < KPG && gt * KPG + I < NT_K) MMA_REG(s, V, kbase + 2u * (gt * KPG + I), RS, true)
#else
#define FOR_Q(X) [[unroll]] for (uint kt = 0; kt < KPG; ++kt) X(kt, unused)  // (MMA's own loop is over i)
#define Q_DECL(I, V)
#define Q_LOAD(I, V)
#define S_MMA(I, V) \
  if (gt * KPG + I < NT_K) MMA(s, Q_BASE + mt * 16u * RS + 2u * (gt * KPG + I), RS, kbase + 2u * (gt * KPG + I), RS, true)
#endif
// Group g's part of S for the block in the K buffer at kbase, stored at SP_BASE + 64 g.
#define PARTIAL_SCORES(kbase) \
  {                           \
    ACC s;                    \
    acc_zero(s);              \
    FOR_Q(S_MMA)              \
    acc_store(s, SP_BASE + 64u * g); \
  }

// S (row r of the workgroup's MR, block column c): the partial tiles of its M tile's groups summed.
float score(uint r, uint c) {
  float s = 0.0;
  [[unroll]] for (uint g = 0; g < GPT; ++g) s += tile_f(SP_BASE + 64u * ((r / 16u) * GPT + g), r % 16u, c);
  return s;
}

// Sum / max over the 8 lanes of a row (consecutive invocations of one subgroup).
float max8(float v) {
  v = max(v, subgroupShuffleXor(v, 1u));
  v = max(v, subgroupShuffleXor(v, 2u));
  return max(v, subgroupShuffleXor(v, 4u));
}
float sum8(float v) {
  v += subgroupShuffleXor(v, 1u);
  v += subgroupShuffleXor(v, 2u);
  return v + subgroupShuffleXor(v, 4u);
}

// The group's f32 row-major tile at uvec4 index at, row r scaled by row_a[16 m + r] (m: its M tile).
void scale_tile(uint at, uint m) {
  group_sync();
  const uint ln = gl_LocalInvocationIndex % 32u;
  [[unroll]] for (uint i = 0; i < 2u; ++i) {
    const uint u = at + ln + 32u * i;  // uvec4 u - at holds row (u - at) / 4
    sh[u] = floatBitsToUint(uintBitsToFloat(sh[u]) * row_a[16u * m + (u - at) / 4u]);
  }
  group_sync();
}

#if SPLIT_Q
uint split_q_live = 0u;  // the live query count (set by main)
// Query t's partials (floats): the merge's per-query layout.
uint split_q_base(uint t) { return t * args.n_groups * uint(N_HEAD) * (KV_LORA + 2u); }
// Query t's chunk c of the context: [x, y) (empty where x >= y), cut as the merge cuts it.
uvec2 split_q_chunk(uint pos0, uint t, uint c) {
  const uint kv_len = min(pos0 + t + 1u, args.n_ctx);
  const uint len = ts_attn_chunk_len(kv_len, args.n_groups, args.min_chunk, TILE);
  return uvec2(min(c * len, kv_len), min(c * len + len, kv_len));
}
#endif

// The group's tile jt (O's columns 16 jt ..; none past NT_V) of the live rows out, divided by
// their sums, through its scratch tile at `at` (stored there before the call).
// `sel`: the live query count; SPLIT (SPLIT_Q): the chunk, whose partial o goes out unnormalized for the
// heads r0 + r < N_HEAD. m: the group's M tile (its rows' sums row_l[16 m ..]).
void write_tile(uint at, uint jt, uint r0, uint sel, uint m) {
  group_sync();
  const uint ln = gl_LocalInvocationIndex % 32u;
  [[unroll]] for (uint i = 0; i < 8u; ++i) {
    const uint e = ln + 32u * i, r = e / 16u, c = e % 16u;
#if SPLIT
    if (jt < NT_V && r0 + r < uint(N_HEAD)) partials[(sel * N_HEAD + r0 + r) * KV_LORA + 16u * jt + c] = tile_f(at, r, c);
#elif SPLIT_Q
    const uint t = (r0 + r) / uint(N_HEAD), h = (r0 + r) % uint(N_HEAD);
    if (jt < NT_V && t < split_q_live)
      partials[split_q_base(t) + (sel * N_HEAD + h) * KV_LORA + 16u * jt + c] = tile_f(at, r, c);
#else
    const float inv = row_l[16u * m + r] > 0.0 ? 1.0 / row_l[16u * m + r] : 0.0;
    if (jt < NT_V && (r0 + r) / uint(N_HEAD) < sel) olat[(r0 + r) * KV_LORA + 16u * jt + c] = OLAT_VALUE(tile_f(at, r, c) * inv);
#endif
  }
  group_sync();
}

// O's accumulators, tile gt * RT + j in the j-th: with COOP named variables o0 .. o7 (an array of
// cooperative matrices may live in local memory: PERFORMANCE.md session 17); without, an array
// (lavapipe compiles the unrolled form in seconds; dynamic indices took it minutes). O_SCALE
// multiplies row r of every tile by row_a[r]: with COOP through the group's own 1 KB of SP_BASE
// (free once P is written), in the plain form on the lanes' known elements.
#if COOP
#define FOR_O(X) X(0, o0) X(1, o1) X(2, o2) X(3, o3) X(4, o4) X(5, o5) X(6, o6) X(7, o7)
#define O_DECL(J, V) ACC V; if (J < RT) acc_zero(V);
#define O_MMA(J, V) if (J < RT && gt * RT + J < NT_V) MMA(V, P_BASE + 32u * mt, 2u, kbase + 2u * (gt * RT + J), RS, false)
#define SCRATCH (SP_BASE + 64u * g)  // group g's scratch tile (its partial S tile's place)
#define O_SCALE1(J, V) if (J < RT) { acc_store(V, SCRATCH); scale_tile(SCRATCH, mt); acc_load(V, SCRATCH); }
#if DIRECT_OUT
#define O_WRITE1(J, V) \
  if (J < RT && gt * RT + J < NT_V) coopMatStoreNV(V, partials, (out_sel * N_HEAD + r0) * KV_LORA + 16u * (gt * RT + J), KV_LORA, false);
#else
#define O_WRITE1(J, V) if (J < RT) { acc_store(V, SCRATCH); write_tile(SCRATCH, gt * RT + J, r0, out_sel, mt); }
#endif
#define O_DECLS FOR_O(O_DECL)
#define O_MMAS FOR_O(O_MMA)
#define O_SCALE FOR_O(O_SCALE1)
#define O_WRITE FOR_O(O_WRITE1)
#else
#define O_DECLS ACC o[RT]; [[unroll]] for (uint j = 0; j < RT; ++j) acc_zero(o[j]);
#define O_MMAS                             \
  [[unroll]] for (uint j = 0; j < RT; ++j) \
    if (gt * RT + j < NT_V) MMA(o[j], P_BASE + 32u * mt, 2u, kbase + 2u * (gt * RT + j), RS, false)
#define O_SCALE                                                                       \
  [[unroll]] for (uint j = 0; j < RT; ++j) [[unroll]] for (uint i = 0; i < 8u; ++i) \
    o[j][i] *= row_a[16u * mt + (gl_LocalInvocationIndex % 32u + 32u * i) % 16u];
#define O_WRITE                                           \
  [[unroll]] for (uint j = 0; j < RT; ++j) {              \
    acc_store(o[j], SP_BASE + 64u * g);                   \
    write_tile(SP_BASE + 64u * g, gt * RT + j, r0, out_sel, mt); \
  }
#endif

void tc_main() {
  PH_BEGIN();
  // Group g works on M tile mt (rows TR0(mt) ..), as its M tile's gt-th group.
  const uint tid = gl_LocalInvocationIndex, g = tid / 32u, mt = g / GPT, gt = g % GPT;
#if SPLIT
  // One query (n_q 1): rows are heads (tile m of workgroup y: TILE_R0(M_TILES y + m)); this
  // workgroup's chunk [kv_begin, kv_end) of the context.
#define TR0(m) TILE_R0(gl_WorkGroupID.y * M_TILES + (m))
  const uint r0 = TR0(mt), chunk = gl_WorkGroupID.x;
  const uint n_q = 1u, pos0 = step_words[args.pos_word];
  const uint kv_len = min(pos0 + 1u, args.n_ctx);
  if (kv_len < args.kv_min || (args.kv_max != 0u && kv_len > args.kv_max) || gl_WorkGroupID.y * MR >= uint(N_HEAD))
    return;  // uniform
  const uint len = ts_attn_chunk_len(kv_len, args.n_groups, args.min_chunk, TILE);
  const uint kv_begin = chunk * len;
  if (kv_begin >= kv_len) return;  // uniform: past the context's chunks
  const uint kv_end = min(kv_begin + len, kv_len);
  PH_END(6)
#else
  const uint r0w = gl_WorkGroupID.x * MR;  // the workgroup's rows r0w .. r0w + MR - 1
#define TR0(m) (r0w + 16u * (m))
  const uint r0 = TR0(mt);
  const uint n_q = step_words[args.count_word], pos0 = step_words[args.pos_word];
  if (r0w / uint(N_HEAD) >= n_q) return;  // uniform: no live row
  const uint t_last = min((r0w + MR - 1u) / uint(N_HEAD), n_q - 1u);
#if SPLIT_Q
  // The union of the rows' chunks c (both ends grow with the query), none where all are empty.
  const uint chunk = gl_WorkGroupID.y;
  split_q_live = n_q;
  const uint kv_begin = split_q_chunk(pos0, r0w / uint(N_HEAD), chunk).x;
  const uint kv_end = split_q_chunk(pos0, t_last, chunk).y;
  if (kv_begin >= kv_end) return;  // uniform
#else
  const uint kv_begin = 0u, kv_end = min(pos0 + t_last + 1u, args.n_ctx);
#endif
#endif
  // The blocks of [kv_begin, kv_end), walked from block blk0 on and around (STAGGER: each
  // workgroup of the prefill from its own block, so the resident workgroups read different rows).
  const uint n_blk = (kv_end - kv_begin + 15u) / 16u;
#if STAGGER && !SPLIT
  const uint blk0 = gl_WorkGroupID.x % n_blk;
#else
  const uint blk0 = 0u;
#endif
  const uint kb_first = kv_begin + 16u * blk0;

  // Q rows: roped at their query's position, scaled, as f16 (zeros for rows past the live ones),
  // one M tile at a time (with QREG through K buffer 0 into its groups' registers).
#if QREG
  FOR_Q(Q_DECL)
#endif
  [[unroll]] for (uint m = 0u; m < M_TILES; ++m) {
    const uint qr0 = TR0(m);
    for (uint i = tid; i < 16u * (ROW / 8u); i += WG_SIZE) {
      const uint r = i / (ROW / 8u), c0 = 8u * (i % (ROW / 8u)), t = (qr0 + r) / uint(N_HEAD);
      float v[8];
      [[unroll]] for (uint k = 0; k < 8u; ++k) v[k] = t < n_q ? q[(qr0 + r) * ROW + c0 + k] * args.kq_scale : 0.0;
      if (c0 >= KV_LORA) {  // the rope part (pairs (R + 2p, R + 2p + 1); c0 is even)
        [[unroll]] for (uint k = 0; k < 8u; k += 2u) {
          const vec2 rr = rope_rotate(vec2(v[k], v[k + 1u]), rope_cos_sin(pos0 + t, (c0 + k - KV_LORA) / 2u));
          v[k] = rr.x;
          v[k + 1u] = rr.y;
        }
      }
      sh[Q_BASE + (QREG != 0 ? 0u : 16u * RS * m) + r * RS + i % (ROW / 8u)] =
          uvec4(packHalf2x16(vec2(v[0], v[1])), packHalf2x16(vec2(v[2], v[3])), packHalf2x16(vec2(v[4], v[5])),
                packHalf2x16(vec2(v[6], v[7])));
    }
    if (m == 0u) {
      STAGE_FIRST()
    }
    barrier();
    if (m + 1u == M_TILES) {
      PH_END(7)
    }
#if QREG
    if (mt == m) {  // uniform in each group
      FOR_Q(Q_LOAD)
    }
    barrier();  // K buffer 0, where the query passed, is written by the next M tile's or the first block
#endif
  }
  TS_MARK_EARLY();  // bench --timeline: the queries staged
  PH_END(4)

  // This thread's row sr of the statistics and P (invocations 0 .. MR * 8 - 1: 8 a row, 2 columns
  // each; row sr of the workgroup is row sr % 16 of M tile sr / 16) and its bound; the row's
  // reference maximum and sum, the same in its 8 lanes (butterfly reductions).
  const uint sr = tid / 8u, sc = 2u * (tid % 8u);
  const uint st = (TR0(sr / 16u) + sr % 16u) / uint(N_HEAD);
#if SPLIT_Q
  const uvec2 row_chunk = st < n_q ? split_q_chunk(pos0, st, chunk) : uvec2(0u);
  const uint kv_lo = row_chunk.x, kv_row = min(row_chunk.y, kv_end);
#else
  const uint kv_lo = 0u, kv_row = st < n_q ? min(min(pos0 + st + 1u, args.n_ctx), kv_end) : 0u;
#endif
  float m_ref = kNegHuge, l_sum = 0.0;
  O_DECLS
  uint kb = kb_first;
  for (uint i = 0u; i < n_blk; ++i) {  // uniform
    const uint kb_next = kb + 16u < kv_end ? kb + 16u : kv_begin;  // the walk's next block
    const uint kbase = K_BASE + (DOUBLE_K != 0 ? i % 2u : 0u) * 16u * RS;
    STAGE(kb, kbase)
    PH_END(0)
    PARTIAL_SCORES(kbase)
    barrier();
    PH_END(1)
    if (tid < 8u * MR) {  // the rows' 8 lanes each (whole subgroups)
      const bool live0 = kb + sc >= kv_lo && kb + sc < kv_row, live1 = kb + sc + 1u >= kv_lo && kb + sc + 1u < kv_row;
      const float s0 = live0 ? score(sr, sc) : kNegHuge, s1 = live1 ? score(sr, sc + 1u) : kNegHuge;
      const float m_blk = max8(max(s0, s1));
      float a = 1.0;
      if (m_blk > m_ref + MARGIN) {  // the same in the row's 8 lanes
        // O and l are still 0 before a row's first live block (nothing to scale); after it, a may
        // be 0 (a jump of > ~87 nats) and O must be scaled all the same.
        a = m_ref == kNegHuge ? 1.0 : exp(m_ref - m_blk);
        l_sum *= a;
        m_ref = m_blk;
      }
      const float p0 = live0 ? exp(s0 - m_ref) : 0.0, p1 = live1 ? exp(s1 - m_ref) : 0.0;
      l_sum += sum8(p0 + p1);
      sh[P_BASE + sr * 2u + sc / 8u][(sc % 8u) / 2u] = packHalf2x16(vec2(p0, p1));
      if (tid % 8u == 0u) row_a[sr] = a;
    }
    barrier();
    PH_END(2)
    // O needs scaling where a row of the group's M tile moved its m.
    bool moved = false;
    [[unroll]] for (uint r = 0; r < 16u; ++r) moved = moved || row_a[16u * mt + r] < 1.0;
    if (moved) {  // uniform in the group (with M_TILES 1 in the workgroup)
      O_SCALE
    }
    O_MMAS
    // Without DOUBLE_K, K and P are rewritten by the next block; with it, the next block's rows
    // go to the other buffer, and the next barrier (its rows stored) comes before P, row_a and
    // the partial tiles are rewritten.
    if (DOUBLE_K == 0) barrier();
    PH_END(3)
    kb = kb_next;
  }
  TS_MARK();  // bench --timeline: the rows attended
  if (tid < 8u * MR && tid % 8u == 0u) row_l[sr] = l_sum;
#if SPLIT || SPLIT_Q
  if (tid < 8u * MR && tid % 8u == 0u) row_m[sr] = m_ref;
#endif
  barrier();  // row_l; every group's last products done with the scratch tiles (SP)

#if SPLIT
  // The chunk's (m, l) per head; its O tiles, unnormalized, below.
  if (tid < MR && TR0(tid / 16u) + tid % 16u < uint(N_HEAD)) {  // (overlapping tiles: the same values)
    const uint ml = args.n_groups * N_HEAD * KV_LORA + (chunk * N_HEAD + TR0(tid / 16u) + tid % 16u) * 2u;
    partials[ml] = row_m[tid];
    partials[ml + 1u] = row_l[tid];
  }
  const uint out_sel = chunk;
#elif SPLIT_Q
  // Each live row's (m, l) for its query's chunk; its O tiles, unnormalized, below.
  if (tid < MR) {
    const uint rr = TR0(tid / 16u) + tid % 16u, t = rr / uint(N_HEAD);
    if (t < n_q) {
      const uint ml = split_q_base(t) + args.n_groups * N_HEAD * KV_LORA + (chunk * N_HEAD + rr % uint(N_HEAD)) * 2u;
      partials[ml] = row_m[tid];
      partials[ml + 1u] = row_l[tid];
    }
  }
  const uint out_sel = chunk;
#else
  const uint out_sel = n_q;
#endif
  // O's tiles out through each group's scratch tile, the live rows divided by their sums.
  O_WRITE
  PH_SYNC();
  PH_END(5)
  PH_MARKS()
}

void main() {
  tc_main();
#if PARTIAL_SIGNAL
  gate_signal(uint(SIGNAL_WORD), 1u);  // this workgroup's partials written (or none to write)
#endif
}
