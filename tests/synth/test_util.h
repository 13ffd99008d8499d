// Shared helpers of the synth tests: a per-test scratch folder and file reading.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "convert/synth.h"

namespace tessera::synth::testing {

// A fresh folder under the system temp dir, removed (with its files) when the test ends.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("tessera_synth_" + std::to_string(getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// SynthOptions by position, every field set (no -Wmissing-field-initializers noise).
inline SynthOptions options(std::string preset, std::string type, uint64_t seed = 1, int layers = -1, std::string out_path = "",
                            unsigned threads = 0, Generation generation = Generation::Auto) {
  return SynthOptions{std::move(preset), std::move(type), seed, layers, std::move(out_path), threads, false, generation};
}

inline std::vector<char> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

}  // namespace tessera::synth::testing
