// libFuzzer entry point for the .tsr reader (format/tsr.h) and the CPU loader on top of it: any
// byte string must either open (and then every tensor, padding span and block span lies inside
// the buffer, every metadata getter, ModelConfig::from_metadata, TsrWeights' row reads and
// ModelWeights::load are safe) or throw tessera::Error(BadInput). Anything else (another
// exception, a sanitizer report, an abort below) is a bug.
//
// Each input runs twice: as is, and re-sealed (the header+directory and metadata checksums the
// reader checks recomputed), so that byte mutations get past the checksums to the deeper checks.
// A structure-aware mutator (LLVMFuzzerCustomMutator) edits directory fields, re-lays out edited
// entries as the writer would, and edits the metadata (decompress, change, recompress); it
// re-seals most of its outputs. Seed it with small valid files, which it keeps valid-looking.
//
// Not built by default. Build and run from the repository root with clang:
//
//   clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -I. tests/fuzz/fuzz_tsr.cpp \
//       format/tsr.cpp format/tsr_codec.cpp format/tsr_layout.cpp format/metadata.cpp format/gguf.cpp \
//       format/mapped_file.cpp format/quant.cpp format/quant_kquants.cpp format/model_config.cpp \
//       runtime/cpu/tsr_weights.cpp runtime/cpu/weight_source.cpp runtime/cpu/model_weights.cpp \
//       -lzstd -lxxhash -pthread -o fuzz_tsr
//   mkdir -p tsr-seeds tsr-corpus          # seeds: small valid files, see make_tsr_seeds.cpp
//   ./fuzz_tsr tsr-corpus tsr-seeds -max_len=300000 -fork=2 -ignore_crashes=1 -max_total_time=600
//
// -max_len must exceed the largest seed. Seeds from the CLI work too (`tessera synth --preset tiny
// --type q4_0 --layers 2`, then `tessera convert` with --compose all / none, other types), but the
// tiny presets pack to 1.1-1.6 MB and the fuzzer then runs ~8x slower (-max_len=2000000).
// A crash reproduces with `./fuzz_tsr crash-<hash>`; add a case to tests/convert/test_tsr_file.cpp.
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "format/error.h"
#include "format/model_config.h"
#include "format/tsr.h"
#include "format/tsr_codec.h"
#include "runtime/cpu/model_weights.h"
#include "runtime/cpu/tsr_weights.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

using namespace tessera;
namespace codec = tsr_codec;
using Bytes = std::vector<uint8_t>;

volatile uint64_t g_sink;  // keeps the harness's reads of tensor bytes and metadata

bool in_bounds(uint64_t offset, uint64_t n, uint64_t size) { return offset <= size && n <= size - offset; }

// Runs f; true if it returned, false if it threw tessera::Error(BadInput). Another error kind
// aborts; any other exception escapes (libFuzzer reports it).
template <class F>
bool attempt(F&& f) {
  try {
    f();
    return true;
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::BadInput) std::abort();
    return false;
  }
}

// Recomputes the checksums TsrFile::parse checks, as TsrWriter computes them: metadata_xxh64 over
// the metadata section, then header_xxh64 over header bytes [0, 248) and the directory. A section
// the header places outside the buffer is left alone (the reader refuses it before hashing).
void reseal(std::span<uint8_t> b) {
  if (b.size() < kTsrHeaderBytes) return;
  uint8_t* p = b.data();
  const TsrHeader h = codec::decode_header(p);
  if (in_bounds(h.metadata_offset, h.metadata_size, b.size()))
    codec::set<uint64_t>(p, codec::kOffMetaHash, XXH64(p + h.metadata_offset, h.metadata_size, 0));
  if (h.directory_offset != kTsrHeaderBytes || !in_bounds(h.directory_offset, h.directory_size, b.size())) return;
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  XXH64_update(st, p, codec::kHeaderHashedBytes);
  XXH64_update(st, p + h.directory_offset, h.directory_size);
  codec::set<uint64_t>(p, codec::kOffHeaderHash, XXH64_digest(st));
  XXH64_freeState(st);
}

// The logical tensors TsrWeights serves for one directory entry (a tile: its six expert parts).
std::vector<std::string> served_names(const TsrTensor& t) {
  if (t.layout != TsrLayout::MoeTile1) return {t.name};
  const std::string prefix = t.name.substr(0, t.name.size() - std::min<size_t>(t.name.size(), 12));  // "ffn_moe_tile"
  std::vector<std::string> out;
  for (const char* part : {"gate", "up", "down"})
    for (const char* kind : {"exps", "shexp"}) out.push_back(prefix + "ffn_" + part + "_" + kind + ".weight");
  return out;
}

// What the CPU runtime does with an opened file: shapes, first and last rows, the model loader.
void exercise_weights(const TsrWeights& w) {
  for (const TsrTensor& t : w.file().tensors())
    for (const std::string& name : served_names(t)) {
      if (!w.has(name)) continue;
      const TensorDesc d = w.desc(name);
      std::vector<float> row(d.row_elems());
      for (uint64_t r : {uint64_t(0), d.n_rows() - 1}) w.read_rows(name, r, 1, row.data());
      if (attempt([&] { w.read_rows(name, d.n_rows(), 1, row.data()); })) std::abort();  // past the end
    }
  std::optional<ModelConfig> config;
  attempt([&] { config = ModelConfig::from_metadata(w.metadata()); });
  if (!config) return;
  for (AttentionPath path : {AttentionPath::Absorbed, AttentionPath::Expanded})
    attempt([&] { (void)cpu::ModelWeights::load(w, *config, path); });
}

// Opens `bytes`; on success uses every accessor the runtime uses and checks the reader's contract.
void exercise(std::span<const uint8_t> bytes) {
  std::optional<TsrFile> opened;
  if (!attempt([&] { opened.emplace(TsrFile::from_memory(bytes, "fuzz.tsr")); })) return;
  const TsrFile& f = *opened;
  uint64_t sink = 0;
  for (const TsrTensor& t : f.tensors()) {
    if (!in_bounds(t.offset, t.nbytes, bytes.size())) std::abort();  // the reader's contract
    const std::span<const uint8_t> b = f.tensor_bytes(t);
    if (!b.empty()) sink += b.front() + b.back();
    for (const TsrSpan& s : t.padding())
      if (!in_bounds(s.offset, s.size, t.nbytes)) std::abort();
    if (t.layout == TsrLayout::Split1 && t.split1().total_bytes != t.nbytes) std::abort();
    if (t.layout == TsrLayout::MoeTile1 && t.moe_tile().total_bytes != t.nbytes) std::abort();
    if (f.find_tensor(t.name) != &t || &f.require_tensor(t.name) != &t) std::abort();
  }
  for (int l = 0; l < f.n_layer_groups(); ++l) {
    const TsrSpan s = f.layer_span(l);
    if (!in_bounds(s.offset, s.size, bytes.size())) std::abort();
  }
  if (attempt([&] { f.require_tensor(std::string(64, 'x')); })) std::abort();  // names have <= 63 bytes
  const Metadata& md = f.metadata();
  for (const GgufKV& kv : md.entries()) {
    attempt([&] { sink += md.get_uint(kv.key).value_or(0); });
    attempt([&] { sink += uint64_t(md.get_int(kv.key).value_or(0)); });
    attempt([&] { sink += md.get_float(kv.key).has_value(); });
    attempt([&] { sink += md.get_bool(kv.key).value_or(false); });
    attempt([&] { sink += md.get_string(kv.key).value_or("").size(); });
    attempt([&] { sink += md.get_string_array(kv.key).size(); });
    attempt([&] { sink += md.get_int_array(kv.key).size(); });
    attempt([&] { sink += md.get_float_array(kv.key).size(); });
  }
  std::optional<TsrWeights> weights;
  if (attempt([&] { weights.emplace(std::move(*opened)); })) exercise_weights(*weights);
  g_sink = sink;
}

// ---- Structure-aware mutations -------------------------------------------------------------

// A value near a boundary the reader checks, or near / derived from the old value, or random.
uint64_t interesting(std::mt19937_64& rng, uint64_t old) {
  static const uint64_t kValues[] = {0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 33, 63, 64, 255, 256, 4095, 4096,
                                     65535, 65536, 0x7fffffff, 0x80000000, 0xffffffff, uint64_t(1) << 32,
                                     uint64_t(1) << 40, uint64_t(1) << 48, uint64_t(1) << 63, ~uint64_t(0)};
  switch (rng() % 4) {
    case 0: return kValues[rng() % std::size(kValues)];
    case 1: {
      const uint64_t small = kValues[rng() % 17];
      return rng() % 2 ? old + small : old - small;
    }
    case 2: return rng() % 2 ? old * 2 : old / 2;
    default: return rng() >> (rng() % 64);
  }
}

// The header and directory entries of `b`, if the header places the directory inside it.
struct DecodedFile {
  TsrHeader header;
  std::vector<TsrTensor> entries;
};
std::optional<DecodedFile> decode(std::span<const uint8_t> b) {
  if (b.size() < kTsrHeaderBytes) return std::nullopt;
  DecodedFile l{codec::decode_header(b.data()), {}};
  const TsrHeader& h = l.header;
  if (h.directory_offset != kTsrHeaderBytes || h.tensor_count > (b.size() - kTsrHeaderBytes) / kTsrEntryBytes ||
      !in_bounds(h.metadata_offset, h.metadata_size, b.size()) || h.metadata_raw_size > (uint64_t(64) << 20))
    return std::nullopt;
  for (uint64_t i = 0; i < h.tensor_count; ++i)
    if (!attempt([&] { l.entries.push_back(codec::decode_entry(b.data() + kTsrHeaderBytes + i * kTsrEntryBytes, "", i)); }))
      return std::nullopt;
  return l;
}

constexpr uint64_t kMaxAssembled = uint64_t(64) << 20;

// A file laid out as TsrWriter lays it out: header, directory, metadata `meta`, then the tensors
// from a page boundary on (groups on pages, tensors on 256 bytes), each with the bytes it had at its
// old offset in `old` (zeros where those lie outside). Checksums are left to reseal().
Bytes assemble(TsrHeader h, std::vector<TsrTensor> entries, std::span<const uint8_t> meta, uint64_t raw_size,
               uint64_t kv_count, std::span<const uint8_t> old) {
  h.tensor_count = entries.size();
  h.directory_size = entries.size() * kTsrEntryBytes;
  h.metadata_offset = kTsrHeaderBytes + h.directory_size;
  h.metadata_size = meta.size();
  h.metadata_raw_size = raw_size;
  h.metadata_kv_count = kv_count;
  h.data_offset = align_up(h.metadata_offset + meta.size(), kTsrGroupAlign);
  std::vector<uint64_t> old_offset;
  uint64_t at = h.data_offset;
  int32_t prev_layer = INT32_MIN;
  for (TsrTensor& t : entries) {  // as TsrWriter's assign_offsets
    if (t.nbytes > kMaxAssembled) return {};
    old_offset.push_back(t.offset);
    t.offset = at = align_up(at, t.layer != prev_layer ? kTsrGroupAlign : kTsrTensorAlign);
    at += t.nbytes;
    prev_layer = t.layer;
  }
  h.file_size = align_up(at, kTsrGroupAlign);
  h.data_size = h.file_size - h.data_offset;
  if (h.file_size > kMaxAssembled) return {};
  Bytes out(h.file_size, 0);
  codec::encode_header(h, out.data());
  for (size_t i = 0; i < entries.size(); ++i) {
    codec::encode_entry(entries[i], out.data() + kTsrHeaderBytes + i * kTsrEntryBytes);
    const TsrTensor& t = entries[i];
    if (old_offset[i] < old.size())
      std::memcpy(out.data() + t.offset, old.data() + old_offset[i],
                  std::min({t.nbytes, old.size() - old_offset[i], h.file_size - t.offset}));
  }
  std::copy(meta.begin(), meta.end(), out.begin() + int64_t(h.metadata_offset));
  return out;
}

// One field of one directory entry set to an interesting value, in place (no re-layout).
void mutate_entry_field(std::span<uint8_t> b, const DecodedFile& l, std::mt19937_64& rng) {
  static const uint32_t k32[] = {codec::kEntLayout, codec::kEntType, codec::kEntNDims, codec::kEntLayer, codec::kEntFlags};
  uint8_t* e = b.data() + kTsrHeaderBytes + (rng() % l.entries.size()) * kTsrEntryBytes;
  if (rng() % 3 == 0) {
    const uint32_t off = k32[rng() % std::size(k32)];
    codec::set<uint32_t>(e, off, uint32_t(interesting(rng, codec::get<uint32_t>(e, off))));
    return;
  }
  // ne[0..3], offset, nbytes, params[0..13]: the 64-bit words at 80..127 and 144..255.
  const uint32_t word = uint32_t(rng() % 20), off = word < 6 ? codec::kEntNe + 8 * word : codec::kEntParams + 8 * (word - 6);
  codec::set<uint64_t>(e, off, interesting(rng, codec::get<uint64_t>(e, off)));
}

// An entry edited (shape, type, layout, layer, flags; or entries dropped, swapped, duplicated),
// its params and nbytes recomputed when the edit allows, the file re-laid out.
Bytes relayout(std::span<const uint8_t> b, DecodedFile l, std::mt19937_64& rng) {
  std::vector<TsrTensor>& es = l.entries;
  const size_t i = rng() % es.size(), j = rng() % es.size();
  TsrTensor& t = es[i];
  switch (rng() % 8) {
    case 0: t.ne[rng() % 4] = interesting(rng, t.ne[0]); break;
    case 1: t.type = GgmlType(rng() % 2 ? rng() % 32 : uint32_t(es[j].type)); break;
    case 2: t.layout = TsrLayout(rng() % 4); break;
    case 3: t.layer = int32_t(rng() % 2 ? es[j].layer : interesting(rng, uint64_t(t.layer))); break;
    case 4: t.flags ^= kTsrTensorComposed; break;
    case 5: std::swap(es[i], es[j]); break;
    case 6: if (es.size() > 1) es.erase(es.begin() + int64_t(i)); break;
    default: es.insert(es.begin() + int64_t(j), es[i]); es[j].name += "x"; break;
  }
  for (TsrTensor& e : es) attempt([&] { codec::validate_entry(e, "", /*fill=*/true); });
  const TsrHeader& h = l.header;
  return assemble(h, es, b.subspan(h.metadata_offset, h.metadata_size), h.metadata_raw_size, h.metadata_kv_count, b);
}

// The metadata decompressed, edited (a value replaced or a key dropped, or the raw bytes mutated),
// recompressed, and the file re-laid out around it.
Bytes mutate_metadata(std::span<const uint8_t> b, const DecodedFile& l, std::mt19937_64& rng) {
  const TsrHeader& h = l.header;
  Bytes raw(h.metadata_raw_size + 4096);
  const size_t n = ZSTD_decompress(raw.data(), raw.size(), b.data() + h.metadata_offset, h.metadata_size);
  if (ZSTD_isError(n) || n == 0) return {};
  raw.resize(n);
  uint64_t kv_count = h.metadata_kv_count;
  std::optional<Metadata> md;
  if (rng() % 4 == 0 || !attempt([&] { md.emplace(Metadata::parse(raw, kv_count, "")); }) || md->entries().empty()) {
    raw.resize(n + 64);
    raw.resize(LLVMFuzzerMutate(raw.data(), n, raw.size()));
    if (rng() % 8 == 0) kv_count = interesting(rng, kv_count);
  } else {
    static const char* kStrings[] = {"", "deepseek2", "llama", "yarn", "linear", "none", "x"};
    const GgufKV& kv = md->entries()[rng() % md->entries().size()];
    const std::string key = kv.key;
    const uint64_t old = kv.value.u ? kv.value.u : uint64_t(kv.value.i);
    switch (rng() % 6) {
      case 0: md->erase(key); break;
      case 1: md->set_u32(key, uint32_t(interesting(rng, old))); break;
      case 2: md->set_u64(key, interesting(rng, old)); break;
      case 3: md->set_i32(key, int32_t(interesting(rng, old))); break;
      case 4: md->set_f32(key, std::bit_cast<float>(uint32_t(interesting(rng, std::bit_cast<uint32_t>(float(kv.value.f)))))); break;
      default: md->set_string(key, kStrings[rng() % std::size(kStrings)]); break;
    }
    raw = md->serialize();
    kv_count = md->entries().size();
  }
  Bytes packed(ZSTD_compressBound(raw.size()));
  const size_t zn = ZSTD_compress(packed.data(), packed.size(), raw.data(), raw.size(), 1);
  if (ZSTD_isError(zn)) return {};
  packed.resize(zn);
  return assemble(h, l.entries, packed, raw.size(), kv_count, b);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  exercise({data, size});
  if (size >= kTsrHeaderBytes) {
    Bytes sealed(data, data + size);
    reseal(sealed);
    if (!std::equal(sealed.begin(), sealed.end(), data)) exercise(sealed);
  }
  return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  std::mt19937_64 rng(seed);
  const std::span<uint8_t> in(data, size);
  const std::optional<DecodedFile> l = decode(in);
  // 0: bytes of header, directory and metadata; 1: one entry field; 2: an entry re-laid out;
  // 3: the metadata; 4 (and files that do not decode): libFuzzer's own mutations of everything.
  const unsigned how = l && !l->entries.empty() ? unsigned(rng() % 5) : 4;
  Bytes out;
  if (how == 0) {  // the size stays
    const size_t prefix = std::clamp<uint64_t>(l->header.metadata_offset + l->header.metadata_size, kTsrHeaderBytes, size);
    Bytes head(data, data + prefix);
    const size_t n = LLVMFuzzerMutate(head.data(), prefix, prefix);
    std::memcpy(data, head.data(), n);
  } else if (how == 1) {
    mutate_entry_field(in, *l, rng);
  } else if (how == 2) {
    out = relayout(in, *l, rng);
  } else if (how == 3) {
    out = mutate_metadata(in, *l, rng);
  }
  if (!out.empty() && out.size() <= max_size) {
    std::memcpy(data, out.data(), out.size());
    size = out.size();
  } else if (how >= 2) {  // also when a structured edit gave nothing usable
    size = LLVMFuzzerMutate(data, size, max_size);
  }
  if (rng() % 16) reseal({data, size});
  return size;
}
