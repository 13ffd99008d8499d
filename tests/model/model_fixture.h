// What the GPU model test files share: a temp folder per test file (removed when the program ends),
// a Vulkan context per test file, and tiny synthetic models synthesized and converted into that
// folder once each. Define one TempDir / ModelFixture per test file at namespace scope, so that the
// cleanup registers with gtest before main, as a global test environment.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "convert/convert.h"
#include "convert/synth.h"
#include "format/error.h"
#include "format/tsr.h"
#include "runtime/model/gpu_model.h"
#include "runtime/vulkan/context.h"

namespace tessera::testfx {

// <tmp>/tessera-test-<tag>-<pid>: made on first use, removed (with what it holds) when the test
// program ends.
class TempDir {
 public:
  explicit TempDir(std::string tag) : tag_(std::move(tag)) {
    ::testing::AddGlobalTestEnvironment(new Cleanup(this));
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() {
    std::call_once(once_, [this] {
      path_ = std::filesystem::temp_directory_path() / ("tessera-test-" + tag_ + "-" + std::to_string(getpid()));
      std::filesystem::create_directories(path_);
    });
    return path_;
  }

 private:
  class Cleanup : public ::testing::Environment {
   public:
    explicit Cleanup(TempDir* dir) : dir_(dir) {}
    void TearDown() override { std::filesystem::remove_all(dir_->path()); }

   private:
    TempDir* dir_;
  };

  std::string tag_;
  std::once_flag once_;
  std::filesystem::path path_;
};

// A synthesized GGUF and its conversion to .tsr.
struct ModelFiles {
  std::string gguf, tsr;
};

// A test file's temp folder, its Vulkan context and its converted models.
class ModelFixture {
 public:
  explicit ModelFixture(std::string tag) : dir_(std::move(tag)) {}

  const std::filesystem::path& dir() { return dir_.path(); }

  // Made on first use; nullptr where no Vulkan device can be had.
  vk::Context* context() {
    std::call_once(ctx_once_, [this] {
      try {
        ctx_ = std::make_unique<vk::Context>();
      } catch (const Error&) {
        ctx_.reset();
      }
    });
    return ctx_.get();
  }

  // Synthesizes (seed 3) once per preset/type and converts once per compose mode and composed
  // type; returns both paths.
  ModelFiles files(const std::string& preset, const std::string& type, const std::string& compose,
                   const std::string& composed_type = "q8_0") {
    const std::filesystem::path g = dir() / (preset + "-" + type + ".gguf");
    if (!std::filesystem::exists(g)) synth::synthesize({preset, type, 3, -1, g.string()});
    const std::filesystem::path t = dir() / (preset + "-" + type + "-" + compose + "-" + composed_type + ".tsr");
    if (!std::filesystem::exists(t)) {
      convert::ConvertOptions o;
      o.in_path = g.string();
      o.out_path = t.string();
      o.compose = compose;
      o.composed_type = composed_type;
      o.threads = 2;
      convert::convert_model(o);
    }
    return {g.string(), t.string()};
  }

 private:
  TempDir dir_;
  std::once_flag ctx_once_;
  std::unique_ptr<vk::Context> ctx_;
};

// A prompt of n deterministic token ids spread over the vocabulary (seed: another spread).
inline std::vector<int32_t> prompt(uint32_t n_vocab, size_t n, size_t seed = 0) {
  std::vector<int32_t> p;
  for (size_t i = 0; i < n; ++i) p.push_back(int32_t((i * 7919 + 13 + seed * 104729) % n_vocab));
  return p;
}

// Rows of V logits against a reference's: max |a - ref| / max |ref| over all rows, and the rows
// whose argmax agrees; every value of `a` must be finite (the sizes must match).
struct LogitGap {
  double max_rel = 0;
  size_t top1_same = 0, rows = 0;
  size_t top1_diff() const { return rows - top1_same; }
};
inline LogitGap compare_logits(const std::vector<float>& a, const std::vector<float>& ref, size_t V) {
  LogitGap c;
  EXPECT_EQ(a.size(), ref.size());
  c.rows = std::min(a.size(), ref.size()) / V;
  double diff = 0, big = 0;
  for (size_t r = 0; r < c.rows; ++r) {
    const float* x = a.data() + r * V;
    const float* y = ref.data() + r * V;
    for (size_t i = 0; i < V; ++i) {
      EXPECT_TRUE(std::isfinite(x[i])) << "row " << r << " logit " << i;
      diff = std::max(diff, std::abs(double(x[i]) - double(y[i])));
      big = std::max(big, std::abs(double(y[i])));
    }
    c.top1_same += std::max_element(x, x + V) - x == std::max_element(y, y + V) - y;
  }
  c.max_rel = big > 0 ? diff / big : diff;
  return c;
}

// A prompt of 5 tokens (its logits) and 12 greedy tokens after it through a model made with `o`.
struct Decoded {
  std::vector<float> logits;
  std::vector<int32_t> tokens;
  model::DecodeStats stats;   // of the model's first recording
  bool early_starts = false;  // after the run: false where a wait gave up
};
inline Decoded decode(vk::Context& ctx, const TsrFile& tsr, const model::GpuModelOptions& o) {
  model::GpuModel m(ctx, tsr, o);
  Decoded d;
  d.stats = m.stats();
  d.logits = m.forward(prompt(m.n_vocab(), 5), false);
  for (int i = 0; i < 12; ++i) d.tokens.push_back(m.decode_step());
  d.early_starts = m.early_starts();
  return d;
}

}  // namespace tessera::testfx
