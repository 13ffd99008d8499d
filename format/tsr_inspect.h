// `tessera inspect` for packed .tsr files (the GGUF renderers are in format/inspect.h): header,
// provenance and options, every metadata key, the tensor directory with each entry's layout
// parameters, the per-block spans, and totals by layout.
#pragma once
#include <string>

#include "format/inspect.h"

namespace tessera {

class TsrFile;

// Text: header, provenance, metadata (as describe_gguf_text shows it), directory table (index,
// block, layout, type, shape, offset, bytes, name; tiles and split1 matrices get a second line
// with their layout parameters), block spans, totals by layout.
std::string describe_tsr_text(const TsrFile& f, const InspectOptions& opt);
// One JSON object:
// {"kind":"tsr","path","file_size","version","flags","tensor_count","kv_count","data_offset",
//  "metadata":{key:{...as for GGUF...}},
//  "tensors":[{"name","layer","layout","type","shape","offset","bytes","xxh64","composed","params":{...}}],
//  "blocks":[{"layer","offset","bytes"}],
//  "totals":{"tensor_bytes","by_layout":[{"layout","tensors","bytes"}]}}
std::string describe_tsr_json(const TsrFile& f, const InspectOptions& opt);
// Opens `path` (TsrFile::open: every check but the tensor hashes) and describes it.
std::string inspect_tsr(const std::string& path, bool json, const InspectOptions& opt);

}  // namespace tessera
