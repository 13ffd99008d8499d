// WeightSource helpers and the GGUF-backed source.
#include "runtime/cpu/weight_source.h"

#include "format/error.h"

namespace tessera {

std::string TensorDesc::shape_string() const {
  int dims = 4;
  while (dims > 1 && ne[dims - 1] == 1) --dims;
  std::string s = "{";
  for (int i = 0; i < dims; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "}";
}

WeightSource::~WeightSource() = default;

std::vector<float> WeightSource::read_all(std::string_view name) const {
  const TensorDesc d = desc(name);
  std::vector<float> out(d.n_elements());
  read_rows(name, 0, d.n_rows(), out.data());
  return out;
}

TensorDesc WeightSource::require(std::string_view name, std::vector<uint64_t> expected) const {
  if (!has(name)) bad_input(metadata().origin(), ": tensor '", name, "' is missing");
  TensorDesc d = desc(name);
  TensorDesc want;
  for (size_t i = 0; i < expected.size() && i < 4; ++i) want.ne[i] = expected[i];
  if (expected.size() > 4 || want.ne != d.ne)
    bad_input(metadata().origin(), ": tensor '", name, "' has shape ", d.shape_string(), ", expected ",
              want.shape_string());
  return d;
}

GgufWeights::GgufWeights(const std::string& path) : file_(GgufFile::open(path)) {}
GgufWeights::GgufWeights(GgufFile file) : file_(std::move(file)) {}

TensorDesc GgufWeights::desc(std::string_view name) const {
  const GgufTensorInfo& t = file_.require_tensor(name);
  return TensorDesc{t.name, t.type, t.ne};
}

void GgufWeights::read_rows(std::string_view name, uint64_t row0, uint64_t n_rows, float* dst) const {
  const GgufTensorInfo& t = file_.require_tensor(name);
  if (row0 > t.n_rows() || n_rows > t.n_rows() - row0)
    bad_input(file_.path(), ": tensor '", name, "': rows [", row0, ", ", row0 + n_rows, ") requested, it has ",
              t.n_rows());
  const uint64_t rb = row_bytes(t.type, t.ne[0]);
  const uint8_t* base = file_.tensor_data(t);
  for (uint64_t r = 0; r < n_rows; ++r)
    dequantize_row(t.type, base + (row0 + r) * rb, dst + r * t.ne[0], int64_t(t.ne[0]));
}

}  // namespace tessera
