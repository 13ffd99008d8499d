// ggml tensor types: the type table and CPU (de)quantization.
// Block layouts (ASCII diagrams) are in quant.cpp next to the code that reads them;
// numbers follow ../shared/spec/gguf.md §4, §7, §9.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tessera {

// ggml type ids as stored in a GGUF tensor-info record.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, BF16 = 30,
};

struct TypeInfo {
  GgmlType type;
  const char* name;      // "q4_0", lower case, as llama.cpp prints it
  uint32_t block_elems;  // elements per block (1 for plain types)
  uint32_t block_bytes;  // bytes per block
  bool readable;         // tessera dequantizes it (the 11 types of DESIGN.md §1)
  bool quantizable;      // tessera can produce it from float (quantize_row)
};

// The table entry for a raw type id, or nullptr if the id is unknown / retired.
const TypeInfo* type_info(uint32_t id);
const TypeInfo& type_info(GgmlType t);
inline const char* type_name(GgmlType t) { return type_info(t).name; }
// Case-insensitive lookup by name ("Q4_0", "q4_k", "bf16"); nullopt if unknown.
std::optional<GgmlType> type_from_name(std::string_view name);

// Bytes of one row of n elements. Precondition: n % block_elems == 0.
inline uint64_t row_bytes(GgmlType t, uint64_t n) {
  const TypeInfo& ti = type_info(t);
  return n / ti.block_elems * ti.block_bytes;
}

// Dequantize n consecutive elements (n % block_elems == 0) starting at a block boundary.
// Throws Error(BadInput) for a type that is not readable.
void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);

// Quantize n elements (n % block_elems == 0) with llama.cpp's reference rounding rules.
// Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K where quantizable.
void quantize_row(GgmlType t, const float* src, void* dst, int64_t n);

}  // namespace tessera
