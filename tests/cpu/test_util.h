// Helpers shared by the tests of the CPU reference.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

namespace tessera::test {

// A fresh folder for this test binary's files: <tmp>/tessera-test-cpu-<pid>/ (removed at exit
// by the environment below).
inline std::filesystem::path temp_dir() {
  static const std::filesystem::path dir = [] {
    auto p = std::filesystem::temp_directory_path() / ("tessera-test-cpu-" + std::to_string(getpid()));
    std::filesystem::create_directories(p);
    return p;
  }();
  return dir;
}

// max |a - b| / max |b| over two equally long vectors (b is the reference).
inline double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, ref = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    ref = std::max(ref, std::abs(double(b[i])));
  }
  return ref > 0 ? diff / ref : diff;
}

inline bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

}  // namespace tessera::test
