// Quant blocks: hand-built blocks of every readable type with values worked out by hand, fp16 /
// bf16 rounding edge cases, gguf.md §9.2's worked examples byte for byte, and quantize ->
// dequantize error bounds on random data.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "format/error.h"
#include "format/fp16.h"
#include "format/quant.h"

namespace tessera {
namespace {

using Bytes = std::vector<uint8_t>;

std::vector<float> dequant(GgmlType t, const Bytes& block, int64_t n) {
  std::vector<float> out(size_t(n), -12345.f);
  dequantize_row(t, block.data(), out.data(), n);
  return out;
}
void put_u16(Bytes& b, size_t at, uint16_t v) { std::memcpy(b.data() + at, &v, 2); }

// ---- type table --------------------------------------------------------------------------

TEST(QuantTable, SizesAndFlags) {
  struct Row { uint32_t id; uint32_t elems, bytes; bool readable; };
  const Row rows[] = {{0, 1, 4, true},     {1, 1, 2, true},     {2, 32, 18, true},   {3, 32, 20, true},
                      {6, 32, 22, true},   {7, 32, 24, true},   {8, 32, 34, true},   {9, 32, 36, false},
                      {10, 256, 84, false}, {11, 256, 110, false}, {12, 256, 144, true}, {13, 256, 176, true},
                      {14, 256, 210, true}, {15, 256, 292, false}, {24, 1, 1, false},  {27, 1, 8, false},
                      {28, 1, 8, false},   {30, 1, 2, true},    {39, 32, 17, false}};
  for (const Row& r : rows) {
    const TypeInfo* ti = type_info(r.id);
    ASSERT_NE(ti, nullptr) << r.id;
    EXPECT_EQ(uint32_t(ti->type), r.id);
    EXPECT_EQ(ti->block_elems, r.elems) << ti->name;
    EXPECT_EQ(ti->block_bytes, r.bytes) << ti->name;
    EXPECT_EQ(ti->readable, r.readable) << ti->name;
    EXPECT_EQ(ti->quantizable, r.readable) << ti->name;
  }
  for (uint32_t retired : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 40u, 41u, 1000u, 0xffffffffu})
    EXPECT_EQ(type_info(retired), nullptr) << retired;
  EXPECT_EQ(type_from_name("Q4_K"), GgmlType::Q4_K);
  EXPECT_EQ(type_from_name("q8_0"), GgmlType::Q8_0);
  EXPECT_EQ(type_from_name("BF16"), GgmlType::BF16);
  EXPECT_FALSE(type_from_name("q4_2").has_value());
  EXPECT_FALSE(type_from_name("").has_value());
  EXPECT_EQ(row_bytes(GgmlType::Q4_0, 4096), 4096u / 32 * 18);
  EXPECT_STREQ(type_name(GgmlType::Q6_K), "q6_K");
}

TEST(QuantTable, UnreadableTypesAreRefused) {
  Bytes block(84);
  float out[256];
  try {
    dequantize_row(GgmlType::Q2_K, block.data(), out, 256);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput);
    EXPECT_NE(std::string(e.what()).find("q2_K"), std::string::npos);
  }
  EXPECT_THROW(quantize_row(GgmlType::Q8_1, out, block.data(), 32), Error);
  EXPECT_THROW(quantize_row(GgmlType::Q4_0, out, block.data(), 31), Error);
}

// ---- fp16 / bf16 -------------------------------------------------------------------------

TEST(Fp16, RoundToNearestEvenAndEdges) {
  EXPECT_EQ(f32_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_fp16(-2.0f), 0xC000);
  EXPECT_EQ(f32_to_fp16(65504.f), 0x7BFF);                  // largest finite
  EXPECT_EQ(f32_to_fp16(65519.99f), 0x7BFF);                // below the rounding midpoint
  EXPECT_EQ(f32_to_fp16(65520.f), 0x7C00);                  // midpoint to inf rounds to inf (even)
  EXPECT_EQ(f32_to_fp16(1e10f), 0x7C00);                    // overflow
  EXPECT_EQ(f32_to_fp16(-1e10f), 0xFC00);
  EXPECT_EQ(f32_to_fp16(1.0f + 0x1p-11f), 0x3C00);          // tie -> even (down)
  EXPECT_EQ(f32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3C02);      // tie -> even (up)
  EXPECT_EQ(f32_to_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);  // just above the tie
  EXPECT_EQ(f32_to_fp16(0x1p-24f), 0x0001);                 // smallest subnormal
  EXPECT_EQ(f32_to_fp16(0x1p-25f), 0x0000);                 // tie with zero -> even (zero)
  EXPECT_EQ(f32_to_fp16(3 * 0x1p-25f), 0x0002);             // tie between 1 and 2 -> 2
  EXPECT_EQ(f32_to_fp16(0x1p-25f * 1.0001f), 0x0001);
  EXPECT_EQ(f32_to_fp16(0x1p-14f), 0x0400);                 // smallest normal
  EXPECT_EQ(f32_to_fp16(0x1p-14f - 0x1p-24f), 0x03FF);      // largest subnormal
  EXPECT_EQ(f32_to_fp16(1e-30f), 0x0000);
  EXPECT_EQ(f32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_fp16(std::numeric_limits<float>::infinity()), 0x7C00);
  const uint16_t nan = f32_to_fp16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);

  EXPECT_EQ(fp16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(fp16_to_f32(0x03FF), 0x1p-14f - 0x1p-24f);
  EXPECT_EQ(fp16_to_f32(0x7BFF), 65504.f);
  EXPECT_EQ(fp16_to_f32(0xC000), -2.f);
  EXPECT_TRUE(std::signbit(fp16_to_f32(0x8000)));
  EXPECT_EQ(fp16_to_f32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(fp16_to_f32(0x7E00)));
  // Every finite half survives a round trip.
  for (uint32_t h = 0; h < 0x10000; ++h)
    if ((h & 0x7C00) != 0x7C00) {
      ASSERT_EQ(f32_to_fp16(fp16_to_f32(uint16_t(h))), h) << h;
    }
}

TEST(Bf16, RoundToNearestEvenAndEdges) {
  auto bf = [](uint32_t bits) { return f32_to_bf16(bits_f32(bits)); };
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(bf(0x3F808000u), 0x3F80);  // tie -> even (down)
  EXPECT_EQ(bf(0x3F818000u), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(bf(0x3F808001u), 0x3F81);  // above the tie
  EXPECT_EQ(bf(0x3F807FFFu), 0x3F80);
  EXPECT_EQ(bf(0x7F7FFFFFu), 0x7F80);  // FLT_MAX rounds to inf
  EXPECT_EQ(bf(0x00010000u), 0x0001);  // subnormals are kept
  EXPECT_EQ(bf(0x80000000u), 0x8000);
  EXPECT_EQ(bf(0x7F800000u), 0x7F80);  // inf stays inf
  EXPECT_EQ(bf(0x7FC00001u), 0x7FC0);  // NaN stays NaN (quiet)
  EXPECT_EQ(bf(0x7F800001u), 0x7FC0);  // signalling NaN whose payload is in the low half
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xC040), -3.0f);
}

// ---- hand-built blocks ---------------------------------------------------------------------

TEST(Dequant, PlainTypes) {
  Bytes f32(8);
  const float vals[2] = {1.5f, -0.0f};
  std::memcpy(f32.data(), vals, 8);
  auto x = dequant(GgmlType::F32, f32, 2);
  EXPECT_EQ(x[0], 1.5f);
  EXPECT_TRUE(std::signbit(x[1]));
  Bytes f16(6);
  put_u16(f16, 0, 0x3C00), put_u16(f16, 2, 0xC500), put_u16(f16, 4, 0x0001);
  x = dequant(GgmlType::F16, f16, 3);
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(x[1], -5.0f);
  EXPECT_EQ(x[2], 0x1p-24f);
  Bytes bf(4);
  put_u16(bf, 0, 0x4049), put_u16(bf, 2, 0xBF80);
  x = dequant(GgmlType::BF16, bf, 2);
  EXPECT_EQ(x[0], bits_f32(0x40490000u));
  EXPECT_EQ(x[1], -1.0f);
}

TEST(Dequant, Q8_0) {
  Bytes b(34);
  put_u16(b, 0, 0x3800);  // d = 0.5
  for (int i = 0; i < 32; ++i) b[2 + i] = uint8_t(int8_t(i * 8 - 128));  // -128, -120, ..., 120
  const auto x = dequant(GgmlType::Q8_0, b, 32);
  EXPECT_EQ(x[0], -64.f);
  EXPECT_EQ(x[1], -60.f);
  EXPECT_EQ(x[16], 0.f);
  EXPECT_EQ(x[31], 60.f);
}

TEST(Dequant, Q4_0LowNibblesFirstHalf) {
  Bytes b(18);
  put_u16(b, 0, 0x4000);  // d = 2
  for (int j = 0; j < 16; ++j) b[2 + j] = uint8_t(j | ((15 - j) << 4));
  const auto x = dequant(GgmlType::Q4_0, b, 32);
  EXPECT_EQ(x[0], -16.f);   // (0 - 8) * 2
  EXPECT_EQ(x[8], 0.f);     // (8 - 8) * 2
  EXPECT_EQ(x[15], 14.f);   // (15 - 8) * 2
  EXPECT_EQ(x[16], 14.f);   // high nibble of byte 0 = 15
  EXPECT_EQ(x[31], -16.f);  // high nibble of byte 15 = 0
}

TEST(Dequant, Q4_1AddsMin) {
  Bytes b(20);
  put_u16(b, 0, 0x3400);  // d = 0.25
  put_u16(b, 2, 0xBC00);  // m = -1
  for (int j = 0; j < 16; ++j) b[4 + j] = uint8_t(j | ((15 - j) << 4));
  const auto x = dequant(GgmlType::Q4_1, b, 32);
  EXPECT_EQ(x[0], -1.f);
  EXPECT_EQ(x[4], 0.f);
  EXPECT_EQ(x[15], 2.75f);
  EXPECT_EQ(x[16], 2.75f);
  EXPECT_EQ(x[31], -1.f);
}

// qh: bit j (j < 16) set for even j; bit j+16 set for odd j. qs[j] = j | (15-j) << 4.
Bytes q5_bits() {
  Bytes b(20);
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    if (j % 2 == 0) qh |= 1u << j;
    else qh |= 1u << (j + 16);
  }
  std::memcpy(b.data(), &qh, 4);
  for (int j = 0; j < 16; ++j) b[4 + j] = uint8_t(j | ((15 - j) << 4));
  return b;
}

TEST(Dequant, Q5_0HighBits) {
  Bytes b(22);
  put_u16(b, 0, 0x3C00);  // d = 1
  const Bytes bits = q5_bits();
  std::copy(bits.begin(), bits.end(), b.begin() + 2);
  const auto x = dequant(GgmlType::Q5_0, b, 32);
  EXPECT_EQ(x[0], 0.f);     // 0 + 16 - 16
  EXPECT_EQ(x[1], -15.f);   // 1 - 16
  EXPECT_EQ(x[2], 2.f);     // 2 + 16 - 16
  EXPECT_EQ(x[15], -1.f);   // 15 - 16
  EXPECT_EQ(x[16], -1.f);   // 15 - 16 (bit 16 clear: j = 0 is even)
  EXPECT_EQ(x[17], 14.f);   // 14 + 16 - 16
  EXPECT_EQ(x[31], 0.f);    // 0 + 16 - 16
}

TEST(Dequant, Q5_1HighBitsAndMin) {
  Bytes b(24);
  put_u16(b, 0, 0x3800);  // d = 0.5
  put_u16(b, 2, 0x3C00);  // m = 1
  const Bytes bits = q5_bits();
  std::copy(bits.begin(), bits.end(), b.begin() + 4);
  const auto x = dequant(GgmlType::Q5_1, b, 32);
  EXPECT_EQ(x[0], 9.f);     // 16 * 0.5 + 1
  EXPECT_EQ(x[1], 1.5f);    // 1 * 0.5 + 1
  EXPECT_EQ(x[16], 8.5f);   // 15 * 0.5 + 1
  EXPECT_EQ(x[17], 16.f);   // 30 * 0.5 + 1
  EXPECT_EQ(x[31], 9.f);
}

// sc = {1,2,3,4,5,6,7,40}, mn = {0,2,4,6,8,50,12,14}, packed by hand (gguf.md §7.7).
const uint8_t kKScales[12] = {0x01, 0x02, 0x03, 0x84, 0x00, 0xC2, 0x04, 0x06, 0x85, 0x26, 0xC7, 0xE8};

TEST(Dequant, Q4_KScalesAndMins) {
  Bytes b(144);
  put_u16(b, 0, 0x3C00);  // d = 1
  put_u16(b, 2, 0x3800);  // dmin = 0.5
  std::memcpy(b.data() + 4, kKScales, 12);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) b[16 + 32 * c + l] = uint8_t((l & 15) | ((15 - (l & 15)) << 4));
  const auto x = dequant(GgmlType::Q4_K, b, 256);
  EXPECT_EQ(x[0], 0.f);          // sub 0: 1*0 - 0.5*0
  EXPECT_EQ(x[1], 1.f);          // 1*1
  EXPECT_EQ(x[32], 29.f);        // sub 1: 2*15 - 0.5*2
  EXPECT_EQ(x[67], 7.f);         // sub 2: 3*3 - 0.5*4
  EXPECT_EQ(x[96], 57.f);        // sub 3: 4*15 - 0.5*6
  EXPECT_EQ(x[128 + 17], 1.f);   // sub 4: 5*1 - 0.5*8
  EXPECT_EQ(x[161], 59.f);       // sub 5: 6*14 - 0.5*50
  EXPECT_EQ(x[207], 99.f);       // sub 6: 7*15 - 0.5*12
  EXPECT_EQ(x[255], -7.f);       // sub 7: 40*0 - 0.5*14
  EXPECT_EQ(x[224], 593.f);      // sub 7: 40*15 - 7
}

TEST(Dequant, Q5_KFifthBit) {
  Bytes b(176);
  put_u16(b, 0, 0x3C00);
  put_u16(b, 2, 0x3800);
  std::memcpy(b.data() + 4, kKScales, 12);
  for (int l = 0; l < 32; ++l) b[16 + l] = l % 2 == 0 ? 0x55 : 0xAA;  // even l: low halves; odd: high
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) b[48 + 32 * c + l] = uint8_t((l & 15) | ((15 - (l & 15)) << 4));
  const auto x = dequant(GgmlType::Q5_K, b, 256);
  EXPECT_EQ(x[0], 16.f);         // (0+16)*1 - 0
  EXPECT_EQ(x[1], 1.f);          // odd l: low half without the 5th bit
  EXPECT_EQ(x[32], 29.f);        // even l: high half without it: 2*15 - 1
  EXPECT_EQ(x[33], 59.f);        // (14+16)*2 - 1
  EXPECT_EQ(x[64], 46.f);        // sub 2: (0+16)*3 - 2
  EXPECT_EQ(x[255], 633.f);      // sub 7, l = 31 odd: (0+16)*40 - 7
}

TEST(Dequant, Q6_KSignedScales) {
  Bytes b(210);
  for (int k = 0; k < 128; ++k) b[k] = 0x21;        // low nibble 1, high nibble 2
  for (int k = 0; k < 64; ++k) b[128 + k] = 0xE4;   // 2-bit highs 0,1,2,3
  for (int i = 0; i < 16; ++i) b[192 + i] = uint8_t(int8_t(i % 2 ? -(i + 1) : i + 1));
  put_u16(b, 208, 0x3800);                          // d = 0.5
  // q: elements base+l -> 1-32 = -31, base+32+l -> 17-32 = -15, base+64+l -> 34-32 = 2,
  // base+96+l -> 50-32 = 18.
  const auto x = dequant(GgmlType::Q6_K, b, 256);
  EXPECT_EQ(x[0], -15.5f);    // 0.5 * 1 * -31
  EXPECT_EQ(x[16], 31.f);     // 0.5 * -2 * -31
  EXPECT_EQ(x[32], -22.5f);   // 0.5 * 3 * -15
  EXPECT_EQ(x[64], 5.f);      // 0.5 * 5 * 2
  EXPECT_EQ(x[100], 63.f);    // 0.5 * 7 * 18
  EXPECT_EQ(x[130], -139.5f); // 0.5 * 9 * -31
  EXPECT_EQ(x[255], -144.f);  // 0.5 * -16 * 18
}

// ---- gguf.md §9.2 worked examples ------------------------------------------------------------

std::vector<float> worked_input() {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = float(j - 10) / 4.f;
  return x;
}

TEST(Quantize, Q4_0WorkedExample) {
  const auto x = worked_input();
  Bytes b(18);
  quantize_row(GgmlType::Q4_0, x.data(), b.data(), 32);
  const Bytes expect = {0x40, 0xb9, 0x6c, 0x5b, 0x5b, 0x5b, 0x4a, 0x4a, 0x3a,
                        0x39, 0x39, 0x28, 0x28, 0x28, 0x17, 0x17, 0x06, 0x06};
  EXPECT_EQ(b, expect);
  const auto y = dequant(GgmlType::Q4_0, b, 32);
  EXPECT_EQ(y[0], -2.625f);
  EXPECT_EQ(y[31], 5.25f);
}

TEST(Quantize, Q8_0WorkedExample) {
  const auto x = worked_input();
  Bytes b(34);
  quantize_row(GgmlType::Q8_0, x.data(), b.data(), 32);
  const Bytes expect = {0x4b, 0x29, 0xc4, 0xca, 0xd0, 0xd6, 0xdc, 0xe2, 0xe8, 0xee, 0xf4, 0xfa,
                        0x00, 0x06, 0x0c, 0x12, 0x18, 0x1e, 0x24, 0x2a, 0x30, 0x36, 0x3c, 0x43,
                        0x49, 0x4f, 0x55, 0x5b, 0x61, 0x67, 0x6d, 0x73, 0x79, 0x7f};
  EXPECT_EQ(b, expect);
}

TEST(Quantize, Q8_0RoundsHalvesAwayFromZero) {
  // amax 127 -> d = 1 exactly; 2.5 -> 3 and -2.5 -> -3 (roundf), not 2 / -2 (nearest-even).
  std::vector<float> x(32, 0.f);
  x[0] = 127.f, x[1] = 2.5f, x[2] = -2.5f, x[3] = 0.5f;
  Bytes b(34);
  quantize_row(GgmlType::Q8_0, x.data(), b.data(), 32);
  EXPECT_EQ(int8_t(b[3]), 3);
  EXPECT_EQ(int8_t(b[4]), -3);
  EXPECT_EQ(int8_t(b[5]), 1);
}

TEST(Quantize, F16RowMatchesScalarConversionBitForBit) {
  // Long enough for any vector path; includes ties, subnormals, overflow, inf and NaN payloads.
  std::vector<float> x;
  for (uint32_t k = 0; k < 4096; ++k) x.push_back(bits_f32(k * 1048573u + 12345u));
  for (float v : {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 0x1p-25f, 3 * 0x1p-25f, 65520.f, 65519.f, -1e-8f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::quiet_NaN(),
                  bits_f32(0x7F800001u), bits_f32(0xFFC12345u)})
    x.push_back(v);
  Bytes h(2 * x.size());
  quantize_row(GgmlType::F16, x.data(), h.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    uint16_t got;
    std::memcpy(&got, h.data() + 2 * i, 2);
    ASSERT_EQ(got, f32_to_fp16(x[i])) << "input bits " << std::hex << f32_bits(x[i]);
  }
}

TEST(Quantize, Q8_0MatchesRoundfOnManyInputs) {
  std::vector<float> x(32 * 256);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  for (float& v : x) v = u(rng);
  for (int b = 0; b < 16; ++b) x[32 * b] = 127.f;  // d = 1: inputs at exact halves
  for (int b = 0; b < 16; ++b)
    for (int i = 1; i < 32; ++i) x[32 * b + i] = float(i - 16) + 0.5f;
  Bytes q(row_bytes(GgmlType::Q8_0, x.size()));
  quantize_row(GgmlType::Q8_0, x.data(), q.data(), int64_t(x.size()));
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[32 * b + i]));
    const float d = amax / 127.f, inv = d != 0 ? 1.f / d : 0.f;
    for (int i = 0; i < 32; ++i)
      ASSERT_EQ(int8_t(q[34 * b + 2 + i]), int8_t(std::roundf(x[32 * b + i] * inv))) << b << " " << i;
  }
}

TEST(Quantize, PlainTypesMatchScalarConversions) {
  const std::vector<float> x = {1.f, -0.1f, 65519.f, 1e-7f, 3.14159f};
  Bytes h(10), bf(10), f(20);
  quantize_row(GgmlType::F16, x.data(), h.data(), 5);
  quantize_row(GgmlType::BF16, x.data(), bf.data(), 5);
  quantize_row(GgmlType::F32, x.data(), f.data(), 5);
  for (int i = 0; i < 5; ++i) {
    uint16_t a, c;
    std::memcpy(&a, h.data() + 2 * i, 2);
    std::memcpy(&c, bf.data() + 2 * i, 2);
    EXPECT_EQ(a, f32_to_fp16(x[i]));
    EXPECT_EQ(c, f32_to_bf16(x[i]));
  }
  EXPECT_EQ(0, std::memcmp(f.data(), x.data(), 20));
}

// ---- quantize -> dequantize error ------------------------------------------------------------

double relative_rms_error(GgmlType t, const std::vector<float>& x) {
  const int64_t n = int64_t(x.size());
  Bytes q(row_bytes(t, uint64_t(n)));
  quantize_row(t, x.data(), q.data(), n);
  const auto y = dequant(t, q, n);
  double err = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    err += double(y[i] - x[i]) * double(y[i] - x[i]);
    ref += double(x[i]) * double(x[i]);
  }
  return std::sqrt(err / ref);
}

std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

TEST(Quantize, RoundTripErrorBounds) {
  // Bounds sit ~15% above what the reference algorithms reach on Gaussian data; a quantizer that
  // mis-packs a nibble, a scale or a sign lands far above them.
  struct Bound { GgmlType type; double max_rel_rms; };
  const Bound bounds[] = {
      {GgmlType::F32, 0.0},       {GgmlType::F16, 2.5e-4},    {GgmlType::BF16, 1.95e-3},
      {GgmlType::Q8_0, 0.0062},   {GgmlType::Q6_K, 0.0205},   {GgmlType::Q5_K, 0.041},
      {GgmlType::Q5_1, 0.043},    {GgmlType::Q5_0, 0.049},    {GgmlType::Q4_K, 0.082},
      {GgmlType::Q4_1, 0.090},    {GgmlType::Q4_0, 0.100},
  };
  const auto x = gaussian(256 * 64, 1234);
  for (const Bound& b : bounds) {
    const double e = relative_rms_error(b.type, x);
    EXPECT_LE(e, b.max_rel_rms) << type_name(b.type);
    std::printf("  %-5s relative rms error %.5f (bound %.5f)\n", type_name(b.type), e, b.max_rel_rms);
    if (b.type != GgmlType::F32) {
      EXPECT_GT(e, 0.0) << type_name(b.type);
    }
  }
  EXPECT_LT(relative_rms_error(GgmlType::Q6_K, x), relative_rms_error(GgmlType::Q5_K, x));
  EXPECT_LT(relative_rms_error(GgmlType::Q5_K, x), relative_rms_error(GgmlType::Q4_K, x));
  EXPECT_LT(relative_rms_error(GgmlType::Q4_K, x), relative_rms_error(GgmlType::Q4_0, x));
}

// After choosing its scales, a K-quant must store for every element the level whose value is
// nearest to the input. The candidate values are read back from the block itself: overwrite all
// quants with level q and dequantize.
void expect_nearest_levels(GgmlType t, const std::vector<float>& x) {
  const int n = 256;
  Bytes q(row_bytes(t, n));
  quantize_row(t, x.data(), q.data(), n);
  const auto y = dequant(t, q, n);
  const int levels = t == GgmlType::Q4_K ? 16 : t == GgmlType::Q5_K ? 32 : 64;
  std::vector<float> best(n, INFINITY);
  for (int level = 0; level < levels; ++level) {
    Bytes b = q;
    if (t == GgmlType::Q4_K) {
      std::fill(b.begin() + 16, b.end(), uint8_t(level * 0x11));
    } else if (t == GgmlType::Q5_K) {
      std::fill(b.begin() + 16, b.begin() + 48, uint8_t(level >> 4 ? 0xFF : 0x00));
      std::fill(b.begin() + 48, b.end(), uint8_t((level & 15) * 0x11));
    } else {
      std::fill(b.begin(), b.begin() + 128, uint8_t((level & 15) * 0x11));
      std::fill(b.begin() + 128, b.begin() + 192, uint8_t((level >> 4) * 0x55));
    }
    const auto cand = dequant(t, b, n);
    for (int e = 0; e < n; ++e) best[e] = std::min(best[e], std::fabs(cand[e] - x[e]));
  }
  for (int e = 0; e < n; ++e)
    ASSERT_LE(std::fabs(y[e] - x[e]), best[e] + 1e-4f * (std::fabs(x[e]) + 1.f)) << type_name(t) << " element " << e;
}

TEST(Quantize, KQuantsStoreTheNearestLevel) {
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    auto x = gaussian(256, seed);
    if (seed % 2 == 0)
      for (float& v : x) v = v * 0.3f + 1.f;  // skewed: exercises the mins
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) expect_nearest_levels(t, x);
  }
}

TEST(Quantize, SkewedAndScaledData) {
  // Non-centred data (the min term matters) and tiny / large magnitudes.
  auto x = gaussian(256 * 8, 99);
  for (float& v : x) v = v * 0.5f + 2.f;
  EXPECT_LT(relative_rms_error(GgmlType::Q4_K, x), 0.03);
  EXPECT_LT(relative_rms_error(GgmlType::Q5_K, x), 0.015);
  EXPECT_LT(relative_rms_error(GgmlType::Q4_1, x), 0.035);
  for (float scale : {1e-3f, 1e3f}) {
    auto y = gaussian(256 * 4, 7);
    for (float& v : y) v *= scale;
    for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K})
      EXPECT_LT(relative_rms_error(t, y), 0.1) << type_name(t) << " scale " << scale;
  }
}

TEST(Quantize, ZeroAndConstantBlocks) {
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                     GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    std::vector<float> zero(256, 0.f);
    Bytes q(row_bytes(t, 256));
    quantize_row(t, zero.data(), q.data(), 256);
    for (float v : dequant(t, q, 256)) ASSERT_EQ(v, 0.f) << type_name(t);
    std::vector<float> ones(256, 1.f);
    quantize_row(t, ones.data(), q.data(), 256);
    for (float v : dequant(t, q, 256)) ASSERT_NEAR(v, 1.f, 0.01f) << type_name(t);
  }
}

}  // namespace
}  // namespace tessera
