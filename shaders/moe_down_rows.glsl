// The MoE down done by the gate-up's own workgroups after their gate-up (moe_gateup.comp
// DOWN_AFTER; docs/DECODE.md "The down in the gate-up's workgroups"): no down dispatch, no second
// wave of down workgroups, and every workgroup holds its down weights before the last h is written.
//
//   workgroup w (of W): rows [w * DOWN_ROWS, +DOWN_ROWS) of x (DOWN_ROWS = ceil(n_embd / W))
//   task t < rows * slots (row t / slots, slot t % slots) -> subgroup t % subgroups; each lane
//   holds blocks lane + j * subgroup size (j < DOWN_OWN) of the task's down row
//   x[r] += sum over slots in order of weight_s * (down_s row r . h_s)     (as moe_down.comp)
//
// Needs every workgroup of the dispatch resident at once (each waits for all of them on gate
// word 1): the host uses it where the dispatch fits the device in one wave; a wait that gives up
// sets the error words and the model re-records without it.
// The including kernel provides: args (MoeArgs), weights.glsl (w_q / w_m), q8_activations.glsl,
// routing.glsl (the route in every workgroup), down_mat(base, cols), hq_in[] (the int8 h blocks,
// plain loads), x_out[] (x), gate.glsl with GATE_WAIT, and defines DOWN_ROWS, DOWN_TASKS
// (ceil(DOWN_ROWS * slots / subgroups)), DOWN_OWN (ceil(blocks of the widest slot / subgroup size)).
#ifndef TESSERA_MOE_DOWN_ROWS_GLSL
#define TESSERA_MOE_DOWN_ROWS_GLSL

shared float dr_part[DOWN_ROWS][TS_ROUTE_MAX_K + 1];  // [row][slot]: weight * dot

// Slot s's down matrix (base byte in the weight binding, columns) and routing weight.
float down_slot(uint s, uint n_routed, out uint base, out uint cols) {
  if (s < n_routed) {
    base = (route_expert(s) - args.expert_lo) * args.slot_stride + args.down_routed_offset;
    cols = args.w_routed;
    return route_weight(s);
  }
  base = args.down_shared_offset;
  cols = args.w_shared;
  return 1.0;
}

// Uniform control flow (every workgroup of the dispatch, after its gate-up and its arrival).
void down_rows(uint zero) {
  const uint r0 = linear_workgroup_id() * uint(DOWN_ROWS);
  const uint n_rows = r0 < args.n_embd ? min(uint(DOWN_ROWS), args.n_embd - r0) : 0u;
  const uint n_routed = (args.flags & TS_MOE_ROUTED) != 0u ? args.n_used : 0u;
  const uint n_slots = n_routed + ((args.flags & TS_MOE_SHARED) != 0u ? 1u : 0u);
  const uint n_tasks = n_rows * n_slots;
  const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID, nl = gl_SubgroupSize;
  // This subgroup's tasks' weight blocks, before the wait.
  Q8W w[DOWN_TASKS][DOWN_OWN];
  uint dep = 0u;
  [[unroll]] for (uint k = 0; k < DOWN_TASKS; ++k) {
    const uint t = sg + k * gl_NumSubgroups;
    if (t >= n_tasks) continue;  // uniform per subgroup
    uint base, cols;
    down_slot(t % n_slots, n_routed, base, cols);
    const uvec2 m = down_mat(base, cols);
    const uint nb = cols / 32u, row = r0 + t / n_slots;
    [[unroll]] for (uint j = 0; j < DOWN_OWN; ++j) {
      w[k][j] = q8_load_block(m.x, m.y, row * nb + min(lane + j * nl, nb - 1u));
      dep |= w[k][j].a.x ^ w[k][j].b.w;
    }
  }
  gate_wait(1u, gl_NumWorkGroups.x * gl_NumWorkGroups.y, dep, zero);  // every workgroup's h and hq
  [[unroll]] for (uint k = 0; k < DOWN_TASKS; ++k) {
    const uint t = sg + k * gl_NumSubgroups;
    if (t >= n_tasks) continue;
    const uint s = t % n_slots;
    uint base, cols;
    const float weight = down_slot(s, n_routed, base, cols);
    const uint nb = cols / 32u, hb = s * (args.h_stride / 32u);
    float d = 0.0;
    [[unroll]] for (uint j = 0; j < DOWN_OWN; ++j) {
      const uint b = lane + j * nl;
      if (b < nb) d += q8_dot_loaded(w[k][j], hq_in[3u * (hb + b)], hq_in[3u * (hb + b) + 1u], uintBitsToFloat(hq_in[3u * (hb + b) + 2u]));
    }
    d = subgroupAdd(d);
    if (subgroupElect()) dr_part[t / n_slots][s] = weight * d;
  }
  barrier();
  // Slots summed in order (moe_down.comp's arithmetic).
  if (gl_LocalInvocationIndex < n_rows) {
    const uint r = gl_LocalInvocationIndex;
    float acc = 0.0;
    for (uint s = 0; s < n_slots; ++s) acc += dr_part[r][s];
    x_out[r0 + r] += acc;
  }
}

#endif  // TESSERA_MOE_DOWN_ROWS_GLSL
