#include "runtime/vulkan/split1.h"

#include <algorithm>
#include <cstring>

#include "format/error.h"

namespace tessera::vk {
namespace {

uint64_t align256(uint64_t v) { return (v + 255) / 256 * 256; }

// Where the quant bytes sit inside the GGUF block (gguf.md section 7).
struct QuantPart {
  uint32_t q_begin, q_bytes;
};

bool quant_part(GgmlType t, QuantPart& p) {
  switch (t) {
    case GgmlType::Q4_0: p = {2, 16}; return true;
    case GgmlType::Q4_1: p = {4, 16}; return true;
    case GgmlType::Q5_0: p = {6, 16}; return true;
    case GgmlType::Q5_1: p = {8, 16}; return true;
    case GgmlType::Q8_0: p = {2, 32}; return true;
    case GgmlType::Q4_K: p = {16, 128}; return true;
    case GgmlType::Q5_K: p = {48, 128}; return true;
    case GgmlType::Q6_K: p = {0, 128}; return true;
    default: return false;
  }
}

uint32_t plain_elem_bytes(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return 4;
    case GgmlType::F16:
    case GgmlType::BF16: return 2;
    default: return 0;
  }
}

}  // namespace

bool split1_supported(GgmlType t) {
  QuantPart p;
  return quant_part(t, p);
}

uint32_t split1_qbytes(GgmlType t) {
  QuantPart p{};
  if (!quant_part(t, p)) bad_input("SPLIT1 layout: type ", type_name(t), " is not a SPLIT1 block type");
  return p.q_bytes;
}

uint32_t split1_mbytes(GgmlType t) { return type_info(t).block_bytes - split1_qbytes(t); }

uint64_t split1_m_offset(GgmlType t, uint64_t rows, uint64_t cols) {
  return align256(rows * (cols / type_info(t).block_elems) * split1_qbytes(t));
}

uint64_t split1_bytes(GgmlType t, uint64_t rows, uint64_t cols) {
  return align256(split1_m_offset(t, rows, cols) + rows * (cols / type_info(t).block_elems) * split1_mbytes(t));
}

std::vector<uint8_t> split1_from_gguf(GgmlType t, uint64_t rows, uint64_t cols, const void* src) {
  QuantPart p{};
  if (!quant_part(t, p)) bad_input("SPLIT1 layout: type ", type_name(t), " is not a SPLIT1 block type");
  const TypeInfo& ti = type_info(t);
  if (cols % ti.block_elems != 0)
    bad_input("SPLIT1 layout: row length ", cols, " is not a multiple of the ", ti.name, " block (", ti.block_elems, ")");
  const uint64_t blocks = rows * (cols / ti.block_elems);
  const uint32_t mbytes = ti.block_bytes - p.q_bytes;
  std::vector<uint8_t> out(split1_bytes(t, rows, cols), 0);
  uint8_t* q = out.data();
  uint8_t* m = out.data() + split1_m_offset(t, rows, cols);
  const auto* in = static_cast<const uint8_t*>(src);
  for (uint64_t i = 0; i < blocks; ++i, in += ti.block_bytes) {
    std::memcpy(q + i * p.q_bytes, in + p.q_begin, p.q_bytes);
    uint8_t* mi = m + i * mbytes;
    std::memcpy(mi, in, p.q_begin);
    std::memcpy(mi + p.q_begin, in + p.q_begin + p.q_bytes, ti.block_bytes - p.q_begin - p.q_bytes);
  }
  return out;
}

uint64_t MatrixRef::bytes() const {
  if (layout == WeightLayout::Split1) return split1_bytes(type, rows, cols);
  return uint64_t(rows) * cols * plain_elem_bytes(type);
}

uint64_t MatrixRef::read_bytes() const {
  if (layout == WeightLayout::Split1) return uint64_t(rows) * row_bytes(type, cols);
  return uint64_t(rows) * cols * plain_elem_bytes(type);
}

void MatrixRef::validate(const char* what) const {
  if (!buffer) runtime_error(what, ": matrix has no buffer");
  if (rows == 0 || cols == 0) runtime_error(what, ": matrix shape ", rows, " x ", cols, " is empty");
  if (layout == WeightLayout::Plain) {
    if (!plain_elem_bytes(type))
      runtime_error(what, ": type ", type_name(type), " cannot be read in the plain layout (expected F32/F16/BF16)");
  } else if (layout == WeightLayout::Split1) {
    if (!split1_supported(type)) runtime_error(what, ": type ", type_name(type), " has no SPLIT1 layout");
    if (cols % type_info(type).block_elems != 0)
      runtime_error(what, ": ", cols, " columns is not a multiple of the ", type_name(type), " block (",
                    type_info(type).block_elems, ")");
  } else {
    runtime_error(what, ": layout id ", static_cast<uint32_t>(layout), " is not a single-matrix layout");
  }
  if (offset > buffer->size() || bytes() > buffer->size() - offset)
    runtime_error(what, ": matrix of ", bytes(), " bytes at offset ", offset, " does not fit buffer '", buffer->name(),
                  "' (", buffer->size(), " bytes)");
}

std::vector<RowChunk> row_chunks(const MatrixRef& m, const DeviceInfo& info, uint64_t max_range) {
  m.validate("row_chunks");
  const uint64_t align = std::max<uint64_t>(info.min_storage_buffer_offset_alignment, 16);
  if (m.offset % align != 0)
    runtime_error("matrix in buffer '", m.buffer->name(), "' at offset ", m.offset, " is not aligned to ", align);
  uint64_t row_q, row_m, m_base;
  if (m.layout == WeightLayout::Split1) {
    const uint64_t nb = m.cols / type_info(m.type).block_elems;
    row_q = nb * split1_qbytes(m.type);
    row_m = nb * split1_mbytes(m.type);
    m_base = m.offset + split1_m_offset(m.type, m.rows, m.cols);
  } else {
    row_q = row_m = uint64_t(m.cols) * plain_elem_bytes(m.type);
    m_base = m.offset;
  }
  // Row granularity: chunk starts must keep both regions' offsets aligned.
  uint64_t gran = 1;
  while ((gran * row_q) % align != 0 || (gran * row_m) % align != 0) gran *= 2;
  const uint64_t limit = max_range ? std::min(max_range, info.max_storage_buffer_range) : info.max_storage_buffer_range;
  const uint64_t range = limit - 16;  // room for the 16-byte round-up
  uint64_t max_rows = range / row_q / gran * gran;
  if (max_rows == 0)
    runtime_error("matrix in buffer '", m.buffer->name(), "': ", gran, " row(s) of ", row_q,
                  " bytes exceed the binding range limit ", limit);
  const uint64_t end = m.buffer->size();
  auto slice = [&](uint64_t off, uint64_t bytes) {
    return m.buffer->slice(off, std::min<uint64_t>((bytes + 15) / 16 * 16, end - off));
  };
  std::vector<RowChunk> chunks;
  for (uint64_t r = 0; r < m.rows; r += max_rows) {
    const uint64_t n = std::min<uint64_t>(max_rows, m.rows - r);
    RowChunk c;
    c.row_begin = static_cast<uint32_t>(r);
    c.rows = static_cast<uint32_t>(n);
    c.q = slice(m.offset + r * row_q, n * row_q);
    c.m = slice(m_base + r * row_m, n * row_m);
    chunks.push_back(c);
  }
  return chunks;
}

}  // namespace tessera::vk
