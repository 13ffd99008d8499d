// Matrix products straight from a WeightSource: weights are dequantized one block of rows at a
// time (never a whole matrix), products accumulate in f64, rows are split over a ThreadPool.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/cpu/thread_pool.h"
#include "runtime/cpu/weight_source.h"

namespace tessera::cpu {

// A block of consecutive rows of one weight tensor, used as a matrix W [n_out x n_in]:
// W[o][c] = tensor row (row0 + o), element c.
struct RowBlock {
  std::string name;    // tensor name
  uint64_t row0 = 0;   // first row (3-D tensors: slab*ne1 + r)
  uint64_t n_out = 0;  // rows used
  uint64_t n_in = 0;   // row length = tensor ne[0]
};

// The whole of a 2-D tensor (or all rows of a 3-D one).
RowBlock whole(const WeightSource& w, const std::string& name);
// Slab `slab` of a 3-D tensor {ne0, ne1, ne2}: rows slab*ne1 .. slab*ne1+ne1-1.
RowBlock slab(const WeightSource& w, const std::string& name, uint64_t slab);
// Rows [row0, row0+n_out) of a tensor.
RowBlock rows(const WeightSource& w, const std::string& name, uint64_t row0, uint64_t n_out);

// y[t*y_stride + o] = sum_c W[o][c] * x[t*x_stride + c] for t < n_tok, o < W.n_out.
// Strides are in floats (x_stride >= n_in, y_stride >= n_out). Parallel over row chunks.
void matmul(const WeightSource& w, const RowBlock& W, const float* x, size_t x_stride, size_t n_tok, float* y,
            size_t y_stride, ThreadPool& pool);

// The same product on the calling thread only (for use inside a parallel task).
void matmul_serial(const WeightSource& w, const RowBlock& W, const float* x, size_t x_stride, size_t n_tok, float* y,
                   size_t y_stride);

}  // namespace tessera::cpu
