// WeightSource over a packed .tsr (see tsr_weights.h).
#include "runtime/cpu/tsr_weights.h"

#include <vector>

#include "format/error.h"

namespace tessera {

TsrWeights::TsrWeights(const std::string& path, bool check_tensors)
    : file_(TsrFile::open(path, TsrFile::OpenOptions{check_tensors, 1})) {
  index();
}

TsrWeights::TsrWeights(TsrFile file) : file_(std::move(file)) { index(); }

void TsrWeights::index() {
  for (const TsrTensor& t : file_.tensors()) {
    if (t.layout != TsrLayout::MoeTile1) {
      views_[t.name] = View{TensorDesc{t.name, t.type, t.ne}, &t};
      continue;
    }
    // blk.L.ffn_moe_tile -> the six GGUF expert tensors of block L.
    const MoeTileGeometry g = t.moe_tile();
    const std::string prefix = t.name.substr(0, t.name.size() - std::string("ffn_moe_tile").size());
    const uint64_t E = g.n_expert;
    auto add = [&](const char* suffix, GgmlType type, std::array<uint64_t, 4> ne, MoePart part, bool shared) {
      const std::string name = prefix + suffix;
      views_[name] = View{TensorDesc{name, type, ne}, &t, true, part, shared};
    };
    add("ffn_gate_exps.weight", g.gateup_type, {g.n_embd, g.w_routed, E, 1}, MoePart::Gate, false);
    add("ffn_up_exps.weight", g.gateup_type, {g.n_embd, g.w_routed, E, 1}, MoePart::Up, false);
    add("ffn_down_exps.weight", g.down_type, {g.w_routed, g.n_embd, E, 1}, MoePart::Down, false);
    if (g.has_shared()) {
      add("ffn_gate_shexp.weight", g.shared_gateup_type, {g.n_embd, g.w_shared, 1, 1}, MoePart::Gate, true);
      add("ffn_up_shexp.weight", g.shared_gateup_type, {g.n_embd, g.w_shared, 1, 1}, MoePart::Up, true);
      add("ffn_down_shexp.weight", g.shared_down_type, {g.w_shared, g.n_embd, 1, 1}, MoePart::Down, true);
    }
  }
}

const TsrWeights::View& TsrWeights::view(std::string_view name) const {
  const auto it = views_.find(std::string(name));
  if (it == views_.end()) bad_input(file_.path(), ": tensor '", name, "' not found");
  return it->second;
}

TensorDesc TsrWeights::desc(std::string_view name) const { return view(name).desc; }

void TsrWeights::read_rows(std::string_view name, uint64_t row0, uint64_t n_rows, float* dst) const {
  const View& v = view(name);
  const TensorDesc& d = v.desc;
  if (row0 > d.n_rows() || n_rows > d.n_rows() - row0)
    bad_input(file_.path(), ": tensor '", name, "': rows [", row0, ", ", row0 + n_rows, ") requested, it has ", d.n_rows());
  const uint64_t len = d.ne[0], rb = row_bytes(d.type, len);
  const uint8_t* bytes = file_.tensor_bytes(*v.entry).data();
  if (!v.tile_part && v.entry->layout == TsrLayout::Plain) {
    for (uint64_t r = 0; r < n_rows; ++r) dequantize_row(d.type, bytes + (row0 + r) * rb, dst + r * len, int64_t(len));
    return;
  }
  std::vector<uint8_t> row(rb);
  if (!v.tile_part) {  // SPLIT1
    const Split1Geometry g = v.entry->split1();
    for (uint64_t r = 0; r < n_rows; ++r) {
      split1_get_rows(g, bytes, row0 + r, 1, row.data());
      dequantize_row(d.type, row.data(), dst + r * len, int64_t(len));
    }
    return;
  }
  // Expert tile part: row = slab * ne[1] + r (slab = expert; the shared tensors have one slab).
  const MoeTileGeometry g = v.entry->moe_tile();
  for (uint64_t k = 0; k < n_rows; ++k) {
    const uint64_t at = row0 + k, slab = at / d.ne[1], r = at % d.ne[1];
    const uint32_t slot = v.shared ? g.n_expert : uint32_t(slab);
    moe_tile_get_rows(g, bytes, slot, v.part, r, 1, row.data());
    dequantize_row(d.type, row.data(), dst + k * len, int64_t(len));
  }
}

}  // namespace tessera
