// Weight matrices on the device: the SPLIT1 layout helpers (docs/FORMAT.md)
// and MatrixRef, the description of one matrix that kernels read.
//
// SPLIT1 for R rows x K columns of a block type (nb = K / block_elems blocks per row):
//   region Q at byte 0:                  for (r, b) row-major: the block's quant bytes (qbytes)
//   region M at align256(R*nb*qbytes):   for (r, b) row-major: the rest of the block (mbytes),
//                                        original byte order, quant bytes removed
//   total = align256(m_offset + R*nb*mbytes)
#pragma once
#include <cstdint>
#include <vector>

#include "format/quant.h"
#include "runtime/vulkan/instance.h"
#include "runtime/vulkan/memory.h"

namespace tessera::vk {

enum class WeightLayout : uint32_t { Plain = 0, Split1 = 1, MoeTile1 = 2 };  // = TS_LAYOUT_* ids

// True for the block types SPLIT1 defines: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K.
bool split1_supported(GgmlType t);
// Quant bytes per block (multiple of 16) / remaining bytes per block. Precondition: supported.
uint32_t split1_qbytes(GgmlType t);
uint32_t split1_mbytes(GgmlType t);
// Byte offset of region M, and total size, of a rows x cols SPLIT1 matrix.
uint64_t split1_m_offset(GgmlType t, uint64_t rows, uint64_t cols);
uint64_t split1_bytes(GgmlType t, uint64_t rows, uint64_t cols);

// SPLIT1 bytes of a rows x cols matrix given in GGUF layout (rows * row_bytes(t, cols) bytes at
// src). Throws Error(BadInput) if t is not a SPLIT1 type or cols is not a multiple of its block.
std::vector<uint8_t> split1_from_gguf(GgmlType t, uint64_t rows, uint64_t cols, const void* src);

// One weight matrix (W[rows][cols], y = W x) in a device buffer.
struct MatrixRef {
  const Buffer* buffer = nullptr;
  uint64_t offset = 0;  // byte offset of the matrix in buffer (multiple of minStorageBufferOffsetAlignment)
  GgmlType type = GgmlType::F32;
  WeightLayout layout = WeightLayout::Plain;  // Plain for F32/F16/BF16, Split1 for block types
  uint32_t rows = 0, cols = 0;

  // Bytes of the matrix data (plain: rows*cols*element size; SPLIT1: split1_bytes).
  uint64_t bytes() const;
  // Bytes a kernel reads to use the whole matrix once (data without the alignment padding).
  uint64_t read_bytes() const;
  // Throws Error(Runtime) naming `what` if the type/layout pair is not executable, the shape does
  // not fit the type's block, or the matrix does not fit in the buffer.
  void validate(const char* what) const;
};

// Rows [row_begin, row_begin + rows) of a matrix and the descriptor ranges that hold them: the
// weight bindings of kernels that read a matrix (Q region, M region; plain: the rows, twice).
struct RowChunk {
  uint32_t row_begin = 0, rows = 0;
  BufferSlice q, m;
};

// Splits m into row chunks whose bindings each fit maxStorageBufferRange and start at offsets
// aligned for descriptors (one chunk on GPUs with a 4 GiB range). Binding sizes are rounded up
// to 16 bytes (kernels read whole 32-bit words) but never past the buffer. max_range > 0 lowers
// the range limit (tests use it to exercise chunking on small matrices).
std::vector<RowChunk> row_chunks(const MatrixRef& m, const DeviceInfo& info, uint64_t max_range = 0);

}  // namespace tessera::vk
