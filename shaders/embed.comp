#version 450
// Embedding lookup: out row t = dequantized row ids[id_offset + t] of the table (SPLIT1 block
// types or plain F32/F16/BF16), f32 out (EmbedArgs, kernel_args.h). The token ids come from a GPU
// buffer so a recorded command buffer is reused for every token. Tables larger than one binding
// range are bound in row chunks, one dispatch each; a dispatch writes only ids in its chunk.
// Grid: x covers the row, y = token. x: one thread per element (plain), per block (32-element
// blocks: split1_unit) or per 8-value unit (K-quants: split1_unit8) - the opposite decode
// granularity of matvec.comp, so the kernel tests cover both decoders for every type.
// Wrapper: runtime/vulkan/kernels_basic.h (EmbedOp).
// Bindings: 0 = table region Q (plain: rows), 1 = table region M, 2 = ids (uint), 3 = out.

#include "common.glsl"

#define W_Q_BINDING 0
#define W_M_BINDING 1
#include "weights.glsl"

layout(local_size_x = WG_SIZE) in;

layout(std430, binding = 2) readonly restrict buffer Ids { uint ids[]; };
layout(std430, binding = 3) writeonly restrict buffer Out { float outv[]; };

layout(push_constant) uniform Push { EmbedArgs args; };

void main() {
  const uint t = gl_WorkGroupID.y;
  const uint id = ids[args.id_offset + t];
  const uint ob = args.out_offset + t * args.out_stride;
  const bool bad = id >= args.n_vocab;
  if (bad && args.row_begin != 0u) return;  // the first chunk's dispatch writes the zeros
  if (!bad && (id < args.row_begin || id >= args.row_begin + args.rows)) return;
  const uint r = id - args.row_begin;
#if W_PLAIN
  const uint k = gl_GlobalInvocationID.x;
  if (k >= args.cols) return;
  outv[ob + k] = bad ? 0.0 : plain_value(r * args.cols + k);
#elif W_BLOCK == 32
  // 32-value units (split1_unit): one thread per block.
  const uint b = gl_GlobalInvocationID.x;
  if (b >= args.cols / W_BLOCK) return;
  if (bad) {
    [[unroll]] for (uint i = 0; i < 32; ++i) outv[ob + 32u * b + i] = 0.0;
    return;
  }
  float lo[16], hi[16];
  uint off_lo, off_hi;
  split1_unit(0u, 0u, r * (args.cols / W_BLOCK) + b, 0u, lo, hi, off_lo, off_hi);
  [[unroll]] for (uint i = 0; i < 16; ++i) {
    outv[ob + b * W_BLOCK + off_lo + i] = lo[i];
    outv[ob + b * W_BLOCK + off_hi + i] = hi[i];
  }
#else
  // 8-value units (split1_unit8).
  const uint u = gl_GlobalInvocationID.x;
  const uint nb = args.cols / W_BLOCK;
  if (u >= nb * W_UNITS8) return;
  if (bad) {
    [[unroll]] for (uint i = 0; i < 8; ++i) outv[ob + 8u * u + i] = 0.0;
    return;
  }
  const uint b = u / W_UNITS8, j = u % W_UNITS8;
  vec4 lo, hi;
  uint off_lo, off_hi;
  split1_unit8(0u, 0u, r * nb + b, j, lo, hi, off_lo, off_hi);
  [[unroll]] for (uint i = 0; i < 4; ++i) {
    outv[ob + b * W_BLOCK + off_lo + i] = lo[i];
    outv[ob + b * W_BLOCK + off_hi + i] = hi[i];
  }
#endif
}
