// The merge of attention_merge.comp done by the last workgroups of attention_partial.comp
// (FUSED_MERGE, decode: one query), so the decode step has no merge dispatch and no barrier
// before it. After a workgroup has written its chunk's partial (o, m, l per head):
//
//   chunks are taken in sets of MERGE_SET (set s = chunks s*MERGE_SET ..);
//   the last workgroup of a set to arrive (arrival counter per set and head group) combines the
//   set's partials: M = max m_c, w_c = exp(m_c - M), L = sum w_c l_c, O = sum w_c o_c;
//     one set (<= MERGE_SET chunks): olat = O / L, done;
//     else it writes (O, M, L) over the set's first partial and arrives at the head group's top
//     counter; the last set to arrive combines the set results the same way into olat.
//   One chunk: the workgroup writes olat = o / l straight from its registers.
//
// So the critical path holds at most two combinations of <= MERGE_SET partials (every cached row
// is still read once: all heads in one workgroup). Counters: per head group y, word
// y * (1 + n_sets_max) is the top counter and word y * (1 + n_sets_max) + 1 + s set s's;
// zero before the first dispatch, each reset by the workgroup that saw it complete.
// Memory order: partials written, memoryBarrierBuffer, arrival; the last arrival's
// memoryBarrierBuffer, then its reads (partials are coherent).
//
// Included by attention_partial.comp (after its declarations) when FUSED_MERGE is 1; defines
// MERGE_SET and MERGE_MAX (>= MERGE_SET and >= the set count of the dispatch's n_groups).
#ifndef TESSERA_ATTENTION_MERGE_TAIL_GLSL
#define TESSERA_ATTENTION_MERGE_TAIL_GLSL

shared float mg_w[MERGE_MAX * kHWP];  // m_c, then w_c, of combined partial c for head h at [c * kHWP + h]
shared float mg_lc[MERGE_MAX * kHWP]; // l_c
shared float mg_l[kHWP];
shared bool mg_last;

const uint kMergeOuts = (HW * kOQ + WG - 1) / WG;  // output vec4 per thread

uint ml_index(uint p_base, uint chunk, uint head) { return p_base + args.n_groups * N_HEAD * KV_LORA + (chunk * N_HEAD + head) * 2; }
uint o_index4(uint p_base, uint chunk, uint head) { return (p_base + (chunk * N_HEAD + head) * KV_LORA) / 4; }

// Combines the partials of chunks first + c * stride, c < count, for this workgroup's heads: into
// olat (to_olat), else over chunk `first`'s partial. Uniform control flow. The loads of each step
// are independent of each other (spread over threads, or unrolled over a constant count).
void merge_partials(uint first, uint stride, uint count, bool to_olat, uint head0, uint n_heads, uint p_base) {
  const uint tid = gl_LocalInvocationID.x;
  for (uint i = tid; i < count * n_heads; i += WG) {
    const uint c = i / n_heads, h = i % n_heads, ml = ml_index(p_base, first + c * stride, head0 + h);
    mg_w[c * kHWP + h] = partials[ml];
    mg_lc[c * kHWP + h] = partials[ml + 1];
  }
  barrier();
  if (tid < n_heads) {
    float m = kNegHuge;
    for (uint c = 0; c < count; ++c) m = max(m, mg_w[c * kHWP + tid]);
    float l = 0.0;
    for (uint c = 0; c < count; ++c) {
      const float w = exp(mg_w[c * kHWP + tid] - m);
      mg_w[c * kHWP + tid] = w;
      l += w * mg_lc[c * kHWP + tid];
    }
    mg_lc[tid] = m;  // chunk 0's l is no longer needed: the combined m
    mg_l[tid] = l;
  }
  barrier();
  vec4 o[kMergeOuts];
  [[unroll]] for (uint k = 0; k < kMergeOuts; ++k) o[k] = vec4(0.0);
  for (uint c = 0; c < count; c += 2u) {
    const bool two = c + 1u < count;
    [[unroll]] for (uint k = 0; k < kMergeOuts; ++k) {
      const uint i = tid + k * WG, h = i / kOQ, quad = i % kOQ;
      if (i < n_heads * kOQ) {
        const vec4 a = partials4[o_index4(p_base, first + c * stride, head0 + h) + quad];
        const vec4 b = two ? partials4[o_index4(p_base, first + (c + 1u) * stride, head0 + h) + quad] : vec4(0.0);
        o[k] += mg_w[c * kHWP + h] * a;
        if (two) o[k] += mg_w[(c + 1u) * kHWP + h] * b;
      }
    }
  }
  [[unroll]] for (uint k = 0; k < kMergeOuts; ++k) {
    const uint i = tid + k * WG, h = i / kOQ, quad = i % kOQ;
    if (i < n_heads * kOQ) {
      if (to_olat) olat4[(head0 + h) * kOQ + quad] = o[k] / mg_l[h];
      else partials4[o_index4(p_base, first, head0 + h) + quad] = o[k];
    }
  }
  if (!to_olat && tid < n_heads) {
    const uint ml = ml_index(p_base, first, head0 + tid);
    partials[ml] = mg_lc[tid];
    partials[ml + 1] = mg_l[tid];
  }
  barrier();  // the shared arrays are reused by the next combination
}

// Arrival at counter word `word` expecting `expected` arrivals: true in the last workgroup, which
// also resets the counter. Uniform control flow.
bool arrive_last(uint word, uint expected) {
  memoryBarrierBuffer();
  barrier();
  if (gl_LocalInvocationID.x == 0) {
    mg_last = atomicAdd(merge_count[word], 1u) == expected - 1u;
    if (mg_last) atomicExchange(merge_count[word], 0u);
  }
  barrier();
  memoryBarrierBuffer();
  return mg_last;
}

// After this workgroup wrote the partial of `chunk` (of n_chunks > 1).
void merge_tail(uint chunk, uint n_chunks, uint head0, uint n_heads, uint p_base) {
  const uint n_sets = (n_chunks + MERGE_SET - 1) / MERGE_SET, set = chunk / MERGE_SET;
  const uint base = gl_WorkGroupID.y * (1u + (args.n_groups + MERGE_SET - 1) / MERGE_SET);
  const uint first = set * MERGE_SET, count = min(uint(MERGE_SET), n_chunks - first);
  if (!arrive_last(base + 1u + set, count)) return;
  if (n_sets == 1u) {
    merge_partials(0u, 1u, count, true, head0, n_heads, p_base);
    return;
  }
  merge_partials(first, 1u, count, false, head0, n_heads, p_base);
  if (!arrive_last(base, n_sets)) return;
  merge_partials(0u, MERGE_SET, n_sets, true, head0, n_heads, p_base);
}

#endif  // TESSERA_ATTENTION_MERGE_TAIL_GLSL
