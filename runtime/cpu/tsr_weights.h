// A WeightSource over a packed .tsr file (docs/FORMAT.md): the CPU reference runs packed files
// through it. PLAIN tensors are read in place, SPLIT1 rows are un-split into their GGUF blocks
// and dequantized, and each MoE block's expert tile is presented again as the six GGUF expert
// tensors (blk.L.ffn_{gate,up,down}_{exps,shexp}.weight) with their original types and shapes,
// so CpuModel needs no knowledge of the packed layouts. Composed attn_qk / attn_vo are exposed
// under their own names (CpuModel uses them when present).
#pragma once
#include <string>
#include <string_view>
#include <unordered_map>

#include "format/tsr.h"
#include "runtime/cpu/weight_source.h"

namespace tessera {

class TsrWeights : public WeightSource {
 public:
  // Opens and validates the file (TsrFile::open); with check_tensors also every tensor hash.
  explicit TsrWeights(const std::string& path, bool check_tensors = false);
  explicit TsrWeights(TsrFile file);

  const Metadata& metadata() const override { return file_.metadata(); }
  bool has(std::string_view name) const override { return views_.count(std::string(name)) != 0; }
  TensorDesc desc(std::string_view name) const override;
  void read_rows(std::string_view name, uint64_t row0, uint64_t n_rows, float* dst) const override;

  const TsrFile& file() const { return file_; }

 private:
  // How a logical (GGUF-named) tensor is found in the file.
  struct View {
    TensorDesc desc;
    const TsrTensor* entry = nullptr;  // the directory entry holding the bytes
    bool tile_part = false;            // a part of an expert tile (else: the entry itself)
    MoePart part = MoePart::Gate;
    bool shared = false;               // the tile's shared slot (else routed slot = slab)
  };
  void index();
  const View& view(std::string_view name) const;

  TsrFile file_;
  std::unordered_map<std::string, View> views_;
};

}  // namespace tessera
