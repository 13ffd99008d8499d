// Constants of the early-start gates (shaders/gate.glsl; docs/DECODE.md "Early start") shared by
// the kernels and their C++ wrappers. Valid GLSL and valid C++.
#ifndef TESSERA_GATE_ARGS_H
#define TESSERA_GATE_ARGS_H

// Group words of a tree arrival (gate.glsl gate_signal_tree): a producer's workgroups arrive on
// this many words, the last of each group on the gate word, which reaches min(workgroups, this).
#define TS_GATE_TREE_GROUPS 32u

// Replicas of a gate word (gate.glsl GATE_REPLICAS, a process-wide tuning define, at most
// TS_GATE_MAX_REPLICAS): the arrival that brings the word to its target adds 1 to each replica,
// one 128-byte line apart, and consumer workgroup w polls replica w % GATE_REPLICAS, so that
// hundreds of pollers do not queue at one word.
#define TS_GATE_REPLICA_STRIDE 32u
#define TS_GATE_MAX_REPLICAS 32u

// The MoE down's gate words (moe_down.comp WAIT_GATE / X_SIGNAL): 0 the route written, 1 h
// written, 2 x written (the next layer's stage 1 waits on it), then its tree's group words, then
// (from word TS_DOWN_H_REPLICA_WORD, 256 bytes in) the replicas of word 1.
#define TS_DOWN_X_GROUP_WORD 3u
#define TS_DOWN_H_REPLICA_WORD 64u
#define TS_DOWN_GATE_WORDS (TS_DOWN_H_REPLICA_WORD + TS_GATE_MAX_REPLICAS * TS_GATE_REPLICA_STRIDE)

#endif  // TESSERA_GATE_ARGS_H
