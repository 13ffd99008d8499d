// `tessera convert`: runs the plan (convert_plan.cpp) through the streaming TsrWriter.
// Memory stays bounded: every job works on a chunk of rows, one expert slot or one head at a
// time per thread (plus one block's dequantized attn_v_b for W_vo), never on a whole model.
#include "convert/convert.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "convert/compose.h"
#include "convert/convert_parallel.h"
#include "convert/convert_progress.h"
#include "format/error.h"

namespace tessera::convert {

namespace {

constexpr uint64_t kChunkBytes = uint64_t(4) << 20;  // rows per chunk: about this many bytes

// Writes GGUF-layout rows [row0, row0+n) of entry `index` (PLAIN or SPLIT1).
void write_rows(TsrWriter& w, size_t index, uint64_t row0, uint64_t n, const uint8_t* gguf_rows) {
  const TsrTensor& e = w.tensors()[index];
  if (e.layout == TsrLayout::Plain) {
    const uint64_t rb = row_bytes(e.type, e.ne[0]);
    w.write(index, gguf_rows, n * rb, row0 * rb);
    return;
  }
  const Split1Geometry g = e.split1();
  const Split1Block b = *split1_block(e.type);
  std::vector<uint8_t> q(n * g.blocks_per_row * g.q_bytes), m(n * g.blocks_per_row * g.m_bytes);
  split1_split_blocks(b, n * g.blocks_per_row, gguf_rows, q.data(), m.data());
  w.write(index, q.data(), q.size(), g.q_row_offset(row0));
  w.write(index, m.data(), m.size(), g.m_row_offset(row0));
}

// The zero bytes between region Q and region M of a SPLIT1 entry (written so every byte of the
// tensor is accounted for).
void write_split_padding(TsrWriter& w, size_t index) {
  const TsrTensor& e = w.tensors()[index];
  if (e.layout != TsrLayout::Split1) return;
  const Split1Geometry g = e.split1();
  const uint64_t q_end = g.q_row_offset(g.rows);
  const std::vector<uint8_t> zeros(g.m_offset - q_end, 0);
  w.write(index, zeros.data(), zeros.size(), q_end);
}

struct Runner {
  const GgufFile& src;
  const ConvertPlan& plan;
  TsrWriter& w;
  unsigned threads;
  ProgressBar& bar;

  void copy(size_t index, const GgufTensorInfo& t) {
    const uint8_t* data = src.tensor_data(t);
    const size_t chunks = size_t((t.nbytes + kChunkBytes - 1) / kChunkBytes);
    parallel_for(chunks, threads, [&](size_t k) {
      const uint64_t at = k * kChunkBytes, n = std::min(kChunkBytes, t.nbytes - at);
      w.write(index, data + at, n, at);
      bar.add(n);
    });
  }

  void split(size_t index, const GgufTensorInfo& t) {
    const uint64_t rb = row_bytes(t.type, t.ne[0]), rows = t.n_rows();
    const uint64_t per = std::max<uint64_t>(1, kChunkBytes / rb);
    parallel_for(size_t((rows + per - 1) / per), threads, [&](size_t k) {
      const uint64_t r0 = k * per, n = std::min(per, rows - r0);
      write_rows(w, index, r0, n, src.tensor_data(t) + r0 * rb);
      bar.add(n * rb);
    });
    write_split_padding(w, index);
  }

  void tile(size_t index, uint32_t L) {
    const MoeTileGeometry g = w.tensors()[index].moe_tile();
    const ModelConfig& c = plan.config;
    parallel_for(g.n_slots(), threads, [&](size_t s) {
      const uint32_t slot = uint32_t(s);
      const uint64_t base = g.gateup_at(slot), w_slot = g.width(slot);
      std::vector<uint8_t> buf(g.slot_end(slot) - base, 0);
      const bool sh = g.is_shared(slot);
      const struct { MoePart part; const char* name; uint64_t rows; } parts[3] = {
          {MoePart::Gate, sh ? "ffn_gate_shexp.weight" : "ffn_gate_exps.weight", w_slot},
          {MoePart::Up, sh ? "ffn_up_shexp.weight" : "ffn_up_exps.weight", w_slot},
          {MoePart::Down, sh ? "ffn_down_shexp.weight" : "ffn_down_exps.weight", c.n_embd}};
      for (const auto& p : parts) {
        const GgufTensorInfo& t = src.require_tensor(blk(L, p.name));
        const uint64_t rb = row_bytes(t.type, t.ne[0]), first = sh ? 0 : uint64_t(slot) * p.rows;
        moe_tile_put_rows(g, slot, p.part, 0, p.rows, src.tensor_data(t) + first * rb, buf.data(), base);
      }
      w.write(index, buf.data(), buf.size(), base);
      bar.add(buf.size());
    });
  }

  void compose_qk(size_t index, uint32_t L) {
    const TsrTensor& e = w.tensors()[index];
    const ModelConfig& c = plan.config;
    const GgufTensorInfo& q = query_tensor(src, c, L);
    const uint64_t R = c.kv_lora_rank, Dr = c.n_rot, q_in = qk_row_len(c);
    const uint64_t out_rb = row_bytes(e.type, q_in), src_rb = row_bytes(q.type, q_in);
    parallel_for(c.n_head, threads, [&](size_t h) {
      std::vector<double> wqk;
      compose_qk_head(src, c, L, uint32_t(h), wqk);
      std::vector<uint8_t> rows((R + Dr) * out_rb);
      quantize_rows_f64(e.type, wqk.data(), R, q_in, rows.data());
      const uint64_t pe_row = h * c.n_qk() + c.n_nope;  // first rope row of head h in the query
      if (e.type == q.type) {  // same type: the original rope rows' bytes, unchanged
        std::memcpy(rows.data() + R * out_rb, src.tensor_data(q) + pe_row * src_rb, Dr * src_rb);
      } else {
        std::vector<double> pe(Dr * q_in);
        dequant_rows_f64(src, q, pe_row, Dr, pe.data());
        quantize_rows_f64(e.type, pe.data(), Dr, q_in, rows.data() + R * out_rb);
      }
      write_rows(w, index, h * (R + Dr), R + Dr, rows.data());
      bar.add(rows.size());
    });
    write_split_padding(w, index);
  }

  void compose_vo(size_t index, uint32_t L) {
    const TsrTensor& e = w.tensors()[index];
    const ModelConfig& c = plan.config;
    const std::vector<double> v_b = load_v_b(src, c, L);
    const uint64_t len = vo_row_len(c), rb = row_bytes(e.type, len), per = 16;
    parallel_for(size_t((c.n_embd + per - 1) / per), threads, [&](size_t k) {
      const uint64_t r0 = k * per, n = std::min<uint64_t>(per, c.n_embd - r0);
      std::vector<double> wvo;
      compose_vo_rows(src, c, L, v_b, r0, n, wvo);
      std::vector<uint8_t> rows(n * rb);
      quantize_rows_f64(e.type, wvo.data(), n, len, rows.data());
      write_rows(w, index, r0, n, rows.data());
      bar.add(rows.size());
    });
    write_split_padding(w, index);
  }
};

// Drop the source pages a finished job read from this process's resident memory. The source is a
// private read-only file mapping, so the pages are simply re-read from the file if touched again;
// without this, resident memory would grow to the size of the source (17 GB for GLM Q4_0).
void release_source(const GgufFile& src, const GgufTensorInfo& t) {
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t from = uintptr_t(src.tensor_data(t)) / page * page;
  const uintptr_t to = uintptr_t(src.tensor_data(t) + t.nbytes) / page * page;  // keep a shared last page
  if (to > from) ::madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);
}

void release_inputs(const GgufFile& src, const PlannedTensor& p, const ModelConfig& c) {
  if (p.source) return release_source(src, *p.source);
  std::vector<std::string> names;
  if (p.job == Job::Tile)
    names = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight",
             "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"};
  if (p.job == Job::ComposeQk) names = {c.q_lora_rank ? "attn_q_b.weight" : "attn_q.weight", "attn_k_b.weight"};
  if (p.job == Job::ComposeVo) names = {"attn_output.weight", "attn_v_b.weight"};
  for (const std::string& n : names)
    if (const GgufTensorInfo* t = src.find_tensor(blk(p.layer, n.c_str()))) release_source(src, *t);
}

// Refuse writing over the input (same path, or another name for the same file).
void check_not_same_file(const std::string& in, const std::string& out) {
  if (in == out) usage_error("output path '", out, "' is the input file; choose another name");
  struct stat a {}, b {};
  if (::stat(in.c_str(), &a) == 0 && ::stat(out.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
    usage_error("output path '", out, "' is the same file as the input '", in, "'; choose another name");
}

}  // namespace

ConvertResult convert_model(const ConvertOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  if (opt.out_path.empty()) usage_error("no output path (-o OUT.tsr)");
  check_not_same_file(opt.in_path, opt.out_path);
  const GgufFile src = GgufFile::open(opt.in_path);
  const ConvertPlan plan = make_plan(src, opt);

  TsrWriter w;
  w.metadata() = packed_metadata(src, opt);
  for (const PlannedTensor& p : plan.tensors) w.add_tensor(p.entry);
  w.begin(opt.out_path);

  ConvertResult res;
  res.out_path = opt.out_path;
  res.n_tensors = plan.tensors.size();
  res.source_file_bytes = src.file_size();
  res.dropped_bytes = plan.dropped_bytes;
  res.composed_bytes = plan.composed_bytes;
  {
    ProgressBar bar("convert", w.tensor_bytes(), opt.progress);
    Runner run{src, plan, w, std::max(1u, opt.threads), bar};
    for (size_t i = 0; i < plan.tensors.size(); ++i) {
      const PlannedTensor& p = plan.tensors[i];
      switch (p.job) {
        case Job::Copy: run.copy(i, *p.source); break;
        case Job::Split: run.split(i, *p.source); break;
        case Job::Tile: run.tile(i, p.layer); break;
        case Job::ComposeQk: run.compose_qk(i, p.layer); break;
        case Job::ComposeVo: run.compose_vo(i, p.layer); break;
      }
      release_inputs(src, p, plan.config);
      res.bytes_by_job[int(p.job)] += p.entry.nbytes;
      res.tensors_by_job[int(p.job)] += 1;
      if (opt.after_tensor) opt.after_tensor(i, p.entry.name);
    }
    w.finish(std::max(1u, opt.threads));
    bar.finish();
  }
  struct stat st {};
  if (::stat(opt.out_path.c_str(), &st) == 0) res.out_file_bytes = uint64_t(st.st_size);
  res.seconds = seconds_since(t0);
  return res;
}

std::string ConvertResult::summary() const {
  std::string s = cat("  ", "kind          tensors          bytes\n");
  char line[128];
  uint64_t total = 0;
  size_t count = 0;
  for (int j = 0; j < 5; ++j) {
    if (!tensors_by_job[j]) continue;
    std::snprintf(line, sizeof line, "  %-12s %8zu %14s\n", job_name(Job(j)), tensors_by_job[j],
                  human_bytes(bytes_by_job[j]).c_str());
    s += line;
    total += bytes_by_job[j];
    count += tensors_by_job[j];
  }
  std::snprintf(line, sizeof line, "  %-12s %8zu %14s\n", "total", count, human_bytes(total).c_str());
  s += line;
  if (composed_bytes || dropped_bytes) {
    const double delta = double(composed_bytes) - double(dropped_bytes);
    std::snprintf(line, sizeof line, "  composition: %s of originals replaced by %s composed (%+.1f MB, %+.1f%% of the source)\n",
                  human_bytes(dropped_bytes).c_str(), human_bytes(composed_bytes).c_str(), delta / 1e6,
                  source_file_bytes ? 100.0 * delta / double(source_file_bytes) : 0.0);
    s += line;
  }
  std::snprintf(line, sizeof line, "  source %s -> packed %s in %.1f s (%.1f MB/s)\n", human_bytes(source_file_bytes).c_str(),
                human_bytes(out_file_bytes).c_str(), seconds, seconds > 0 ? double(out_file_bytes) / 1e6 / seconds : 0.0);
  s += line;
  return s;
}

}  // namespace tessera::convert
