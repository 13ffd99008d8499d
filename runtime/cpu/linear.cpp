#include "runtime/cpu/linear.h"

#include <Eigen/Dense>
#include <algorithm>
#include <vector>

#include "format/error.h"

namespace tessera::cpu {
namespace {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Rows per dequantized chunk: ~256 KiB of floats, at least 1 row.
uint64_t chunk_rows(uint64_t n_in) { return std::max<uint64_t>(1, (64 * 1024) / std::max<uint64_t>(1, n_in)); }

// X [n_tok x n_in] in f64, read from strided f32 input.
MatD load_x(const float* x, size_t x_stride, size_t n_tok, uint64_t n_in) {
  MatD X(n_tok, n_in);
  for (size_t t = 0; t < n_tok; ++t)
    for (uint64_t c = 0; c < n_in; ++c) X(t, c) = x[t * x_stride + c];
  return X;
}

// One chunk of rows [o0, o0+n) of W times X, written into y.
void chunk_product(const WeightSource& w, const RowBlock& W, const MatD& X, uint64_t o0, uint64_t n, float* y,
                   size_t y_stride) {
  thread_local std::vector<float> buf;
  buf.resize(n * W.n_in);
  w.read_rows(W.name, W.row0 + o0, n, buf.data());
  const MatD Wc = Eigen::Map<const MatF>(buf.data(), Eigen::Index(n), Eigen::Index(W.n_in)).cast<double>();
  const MatD Y = X * Wc.transpose();  // n_tok x n
  for (Eigen::Index t = 0; t < Y.rows(); ++t)
    for (uint64_t o = 0; o < n; ++o) y[size_t(t) * y_stride + o0 + o] = float(Y(t, Eigen::Index(o)));
}

void check(const WeightSource& w, const RowBlock& W, size_t x_stride, size_t y_stride) {
  const TensorDesc d = w.desc(W.name);
  if (d.ne[0] != W.n_in || W.row0 + W.n_out > d.n_rows())
    runtime_error("matmul: tensor '", W.name, "' ", d.shape_string(), " does not hold rows [", W.row0, ", ",
                  W.row0 + W.n_out, ") of length ", W.n_in);
  if (x_stride < W.n_in || y_stride < W.n_out)
    runtime_error("matmul: strides (", x_stride, ", ", y_stride, ") smaller than the matrix '", W.name, "'");
}

}  // namespace

RowBlock whole(const WeightSource& w, const std::string& name) {
  const TensorDesc d = w.desc(name);
  return {name, 0, d.n_rows(), d.ne[0]};
}

RowBlock slab(const WeightSource& w, const std::string& name, uint64_t s) {
  const TensorDesc d = w.desc(name);
  if (s >= d.ne[2] * d.ne[3]) runtime_error("tensor '", name, "' ", d.shape_string(), " has no slab ", s);
  return {name, s * d.ne[1], d.ne[1], d.ne[0]};
}

RowBlock rows(const WeightSource& w, const std::string& name, uint64_t row0, uint64_t n_out) {
  const TensorDesc d = w.desc(name);
  return {name, row0, n_out, d.ne[0]};
}

void matmul(const WeightSource& w, const RowBlock& W, const float* x, size_t x_stride, size_t n_tok, float* y,
            size_t y_stride, ThreadPool& pool) {
  check(w, W, x_stride, y_stride);
  if (n_tok == 0 || W.n_out == 0) return;
  const MatD X = load_x(x, x_stride, n_tok, W.n_in);
  const uint64_t step = chunk_rows(W.n_in);
  const uint64_t n_chunks = (W.n_out + step - 1) / step;
  pool.parallel_for(n_chunks, [&](size_t i) {
    const uint64_t o0 = i * step;
    chunk_product(w, W, X, o0, std::min(step, W.n_out - o0), y, y_stride);
  });
}

void matmul_serial(const WeightSource& w, const RowBlock& W, const float* x, size_t x_stride, size_t n_tok, float* y,
                   size_t y_stride) {
  check(w, W, x_stride, y_stride);
  if (n_tok == 0 || W.n_out == 0) return;
  const MatD X = load_x(x, x_stride, n_tok, W.n_in);
  const uint64_t step = chunk_rows(W.n_in);
  for (uint64_t o0 = 0; o0 < W.n_out; o0 += step) chunk_product(w, W, X, o0, std::min(step, W.n_out - o0), y, y_stride);
}

}  // namespace tessera::cpu
