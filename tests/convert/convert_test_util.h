// Helpers of the convert / verify / .tsr tests: a per-process temp folder, synthetic source
// models made once per process, conversion with options, byte-level file surgery (flip a byte,
// re-seal the checksums so a change reaches the deeper checks).
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "convert/convert.h"
#include "convert/synth.h"
#include "format/error.h"
#include "format/tsr.h"
#include "format/tsr_codec.h"

namespace tessera::convert::testing {

using Bytes = std::vector<uint8_t>;

// <tmp>/tessera-test-convert-<pid>/ (removed by the environment in test_main_env.cpp).
inline std::filesystem::path temp_dir() {
  static const std::filesystem::path dir = [] {
    auto p = std::filesystem::temp_directory_path() / ("tessera-test-convert-" + std::to_string(getpid()));
    std::filesystem::create_directories(p);
    return p;
  }();
  return dir;
}
inline std::string temp_file(const std::string& name) { return (temp_dir() / name).string(); }

// A synthetic model preset/type (seed 7), made once per process.
inline const std::string& synth_model(const std::string& preset, const std::string& type) {
  static std::map<std::string, std::string> made;
  const std::string key = preset + "-" + type;
  if (auto it = made.find(key); it != made.end()) return it->second;
  const std::string path = temp_file(key + ".gguf");
  synth::SynthOptions o;
  o.preset = preset;
  o.type = type;
  o.seed = 7;
  o.out_path = path;
  o.threads = 2;
  synth::synthesize(o);
  return made[key] = path;
}

inline ConvertOptions convert_options(const std::string& in, const std::string& out, const std::string& compose = "all",
                                      const std::string& composed_type = "q8_0") {
  ConvertOptions o;
  o.in_path = in;
  o.out_path = out;
  o.compose = compose;
  o.composed_type = composed_type;
  o.threads = 2;
  return o;
}

// The packed form of a synthetic model, made once per (preset, type, compose, composed type).
inline const std::string& packed_model(const std::string& preset, const std::string& type, const std::string& compose,
                                       const std::string& composed_type = "q8_0") {
  static std::map<std::string, std::string> made;
  const std::string key = preset + "-" + type + "-" + compose + "-" + composed_type;
  if (auto it = made.find(key); it != made.end()) return it->second;
  const std::string out = temp_file(key + ".tsr");
  convert_model(convert_options(synth_model(preset, type), out, compose, composed_type));
  return made[key] = out;
}

inline Bytes read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
inline void write_file(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

// Recompute every tensor hash in the directory and the header hash of a .tsr image, so that a
// deliberate change of tensor bytes passes the checksums and must be found by the byte and
// composed-weight comparisons.
inline void reseal(Bytes& b) {
  using namespace tsr_codec;
  const uint64_t count = get<uint64_t>(b.data(), kOffTensorCount);
  for (uint64_t i = 0; i < count; ++i) {
    uint8_t* e = b.data() + kTsrHeaderBytes + i * kTsrEntryBytes;
    const uint64_t off = get<uint64_t>(e, kEntOffset), n = get<uint64_t>(e, kEntNBytes);
    set<uint64_t>(e, kEntHash, XXH64(b.data() + off, n, 0));
  }
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  XXH64_update(st, b.data(), kHeaderHashedBytes);
  XXH64_update(st, b.data() + kTsrHeaderBytes, count * kTsrEntryBytes);
  set<uint64_t>(b.data(), kOffHeaderHash, XXH64_digest(st));
  XXH64_freeState(st);
}

// The message of the tessera::Error thrown by f, or "" if none was thrown.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace tessera::convert::testing
