// The conversion plan: check the source, choose each tensor's layout, compose, order by execution.
#include <xxhash.h>

#include <map>
#include <unordered_set>

#include "format/version.h"
#include "convert/compose.h"
#include "convert/convert.h"
#include "format/error.h"

namespace tessera::convert {

const char* job_name(Job j) {
  switch (j) {
    case Job::Copy: return "plain";
    case Job::Split: return "split1";
    case Job::Tile: return "moe_tile1";
    case Job::ComposeQk: return "composed qk";
    case Job::ComposeVo: return "composed vo";
  }
  return "?";
}

namespace {

bool is_float(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

std::span<const uint64_t> shape_of(const GgufTensorInfo& t) { return {t.ne.data(), t.n_dims}; }

// A copied tensor: PLAIN for float types, SPLIT1 for block types (FORMAT.md §6.4).
PlannedTensor copy_or_split(const GgufFile& src, const GgufTensorInfo& t, int32_t layer) {
  PlannedTensor p;
  p.source = &t;
  p.source_bytes = t.nbytes;
  if (is_float(t.type)) {
    p.job = Job::Copy;
    p.entry = TsrTensor::plain(t.name, t.type, shape_of(t), layer);
  } else if (split1_block(t.type)) {
    p.job = Job::Split;
    p.entry = TsrTensor::split1(t.name, t.type, shape_of(t), layer);
  } else {
    bad_input(src.path(), ": tensor '", t.name, "' has type ", type_name(t.type),
              ", which tessera cannot run (expected f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k or q6_k)");
  }
  return p;
}

PlannedTensor plan_tile(const GgufFile& src, const ModelConfig& c, uint32_t L) {
  const GgufTensorInfo& gate = src.require_tensor(blk(L, "ffn_gate_exps.weight"));
  const GgufTensorInfo& up = src.require_tensor(blk(L, "ffn_up_exps.weight"));
  const GgufTensorInfo& down = src.require_tensor(blk(L, "ffn_down_exps.weight"));
  if (gate.type != up.type)
    bad_input(src.path(), ": block ", L, ": ffn_gate_exps is ", type_name(gate.type), " but ffn_up_exps is ",
              type_name(up.type), "; an expert tile needs gate and up of the same type");
  GgmlType sg = gate.type, sd = down.type;
  uint64_t bytes = gate.nbytes + up.nbytes + down.nbytes;
  if (c.n_expert_shared) {
    const GgufTensorInfo& gs = src.require_tensor(blk(L, "ffn_gate_shexp.weight"));
    const GgufTensorInfo& us = src.require_tensor(blk(L, "ffn_up_shexp.weight"));
    const GgufTensorInfo& ds = src.require_tensor(blk(L, "ffn_down_shexp.weight"));
    if (gs.type != us.type)
      bad_input(src.path(), ": block ", L, ": ffn_gate_shexp is ", type_name(gs.type), " but ffn_up_shexp is ",
                type_name(us.type), "; an expert tile needs gate and up of the same type");
    sg = gs.type;
    sd = ds.type;
    bytes += gs.nbytes + us.nbytes + ds.nbytes;
  }
  MoeTileGeometry g;
  try {
    g = moe_tile_geometry(c.n_expert, c.n_ff_exp, c.n_ff_shared(), c.n_embd, gate.type, down.type, sg, sd);
  } catch (const Error& e) {
    bad_input(src.path(), ": block ", L, " experts: ", e.what());
  }
  PlannedTensor p;
  p.job = Job::Tile;
  p.layer = L;
  p.source_bytes = bytes;
  p.entry = TsrTensor::moe_tile(blk(L, "ffn_moe_tile"), g, int32_t(L));
  return p;
}

PlannedTensor plan_composed(const GgufFile& src, const ModelConfig& c, const ConvertOptions& opt, uint32_t L, bool qk) {
  PlannedTensor p;
  p.layer = L;
  p.job = qk ? Job::ComposeQk : Job::ComposeVo;
  const GgufTensorInfo& a = qk ? query_tensor(src, c, L) : src.require_tensor(blk(L, "attn_output.weight"));
  const GgufTensorInfo& b = src.require_tensor(blk(L, qk ? "attn_k_b.weight" : "attn_v_b.weight"));
  p.source_bytes = a.nbytes + b.nbytes;
  const uint64_t row_len = qk ? qk_row_len(c) : vo_row_len(c);
  const uint64_t n_rows = qk ? qk_rows(c) : c.n_embd;
  const GgmlType t = composed_storage_type(opt.composed_type, a.type, row_len);
  const uint64_t ne[2] = {row_len, n_rows};
  const std::string name = qk ? qk_name(L) : vo_name(L);
  p.entry = is_float(t) ? TsrTensor::plain(name, t, ne, int32_t(L)) : TsrTensor::split1(name, t, ne, int32_t(L));
  p.entry.flags |= kTsrTensorComposed;
  return p;
}

}  // namespace

void check_source(const GgufFile& src, const ModelConfig& c) {
  for (const TensorSpec& s : expected_tensors(c)) {
    const GgufTensorInfo* t = src.find_tensor(s.name);
    if (!t) bad_input(src.path(), ": missing tensor '", s.name, "' (a deepseek2 model with these hyperparameters needs it)");
    std::vector<uint64_t> have(t->ne.begin(), t->ne.begin() + t->n_dims);
    while (have.size() > 1 && have.back() == 1) have.pop_back();
    std::vector<uint64_t> want = s.ne;
    while (want.size() > 1 && want.back() == 1) want.pop_back();
    if (have != want) {
      GgufTensorInfo w;
      w.n_dims = uint32_t(s.ne.size());
      for (size_t d = 0; d < s.ne.size(); ++d) w.ne[d] = s.ne[d];
      bad_input(src.path(), ": tensor '", s.name, "' has shape ", t->shape_string(), ", expected ", w.shape_string());
    }
  }
}

ConvertPlan make_plan(const GgufFile& src, const ConvertOptions& opt) {
  check_composed_type_option(opt.composed_type);
  ConvertPlan plan;
  plan.config = ModelConfig::from_metadata(src.metadata());
  const ModelConfig& c = plan.config;
  const std::string compose = resolve_compose(opt.compose, c);
  const ComposeSet comp = parse_compose(compose);

  check_source(src, c);
  const std::vector<TensorSpec> expected = expected_tensors(c);
  std::unordered_set<std::string> expected_names;
  for (const TensorSpec& s : expected) expected_names.insert(s.name);

  auto add_copy = [&](const std::string& name, int32_t layer) {
    plan.tensors.push_back(copy_or_split(src, src.require_tensor(name), layer));
  };
  auto drop = [&](const std::string& name) {
    plan.dropped.push_back(name);
    plan.dropped_bytes += src.require_tensor(name).nbytes;
  };

  // Execution order (FORMAT.md §5): expected_tensors() lists them in that order already; the
  // composed and tiled tensors replace their originals in place.
  for (const TensorSpec& s : expected) {
    if (s.layer < 0) {
      add_copy(s.name, -1);
      continue;
    }
    const uint32_t L = uint32_t(s.layer);
    const std::string suffix = s.name.substr(s.name.find('.', 4) + 1);
    const bool is_query = suffix == "attn_q_b.weight" || suffix == "attn_q.weight";
    if (comp.qk && (is_query || suffix == "attn_k_b.weight")) {
      if (is_query) plan.tensors.push_back(plan_composed(src, c, opt, L, true));
      drop(s.name);
    } else if (comp.vo && (suffix == "attn_v_b.weight" || suffix == "attn_output.weight")) {
      if (suffix == "attn_output.weight") plan.tensors.push_back(plan_composed(src, c, opt, L, false));
      drop(s.name);
    } else if (s.role == TensorRole::Experts || suffix.find("_shexp.") != std::string::npos) {
      if (suffix == "ffn_gate_exps.weight") plan.tensors.push_back(plan_tile(src, c, L));
    } else {
      add_copy(s.name, int32_t(L));
    }
  }
  // Anything else the source holds (e.g. a multi-token-prediction block) travels as is, after
  // the output head (FORMAT.md §5).
  for (const GgufTensorInfo& t : src.tensors())
    if (!expected_names.count(t.name)) plan.tensors.push_back(copy_or_split(src, t, -1));

  for (const PlannedTensor& p : plan.tensors)
    if (p.entry.composed()) plan.composed_bytes += p.entry.nbytes;
  return plan;
}

uint64_t source_metadata_hash(const GgufFile& src) { return XXH64(src.bytes().data(), src.data_offset(), 0); }

Metadata packed_metadata(const GgufFile& src, const ConvertOptions& opt) {
  Metadata m = src.metadata();
  std::string base = opt.in_path;
  if (const size_t slash = base.find_last_of('/'); slash != std::string::npos) base = base.substr(slash + 1);
  m.set_u32("tessera.format_version", kTsrVersion);
  m.set_string("tessera.converter", cat("tessera ", tessera_version(), " (", tessera_git_commit(), ")"));
  m.set_string("tessera.source.name", base);
  m.set_u64("tessera.source.size", src.file_size());
  m.set_u64("tessera.source.metadata_hash", source_metadata_hash(src));
  m.set_string("tessera.compose", resolve_compose(opt.compose, ModelConfig::from_metadata(src.metadata())));
  m.set_string("tessera.composed_type", opt.composed_type);
  m.set_u32("tessera.split_layout", uint32_t(TsrLayout::Split1));
  m.set_u32("tessera.tile_layout", uint32_t(TsrLayout::MoeTile1));
  return m;
}

}  // namespace tessera::convert
