// Constants of the early-start gates (shaders/gate.glsl; docs/DECODE.md "Early start") shared by
// the kernels and their C++ wrappers. Valid GLSL and valid C++.
#ifndef TESSERA_GATE_ARGS_H
#define TESSERA_GATE_ARGS_H

// Group words of a tree arrival (gate.glsl gate_signal_tree): a producer's workgroups arrive on
// this many words, the last of each group on the gate word, which reaches min(workgroups, this).
#define TS_GATE_TREE_GROUPS 32u

// The MoE down's gate words (moe_down.comp WAIT_GATE / X_SIGNAL): 0 the route written, 1 h
// written, 2 x written (the next layer's stage 1 waits on it), then its tree's group words.
#define TS_DOWN_X_GROUP_WORD 3u
#define TS_DOWN_GATE_WORDS (TS_DOWN_X_GROUP_WORD + TS_GATE_TREE_GROUPS)

#endif  // TESSERA_GATE_ARGS_H
