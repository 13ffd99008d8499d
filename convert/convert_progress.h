// A byte-count progress bar on stderr for convert / verify: percentage, MB/s and ETA, redrawn
// in place at most ~10 times a second. Thread-safe add(); draws nothing when disabled.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace tessera::convert {

class ProgressBar {
 public:
  ProgressBar(std::string label, uint64_t total_bytes, bool enabled);
  ~ProgressBar();
  void add(uint64_t bytes);  // record progress; redraws if ~100 ms have passed
  void finish();             // final line (100 %) and newline

 private:
  void draw(bool final);
  std::string label_;
  uint64_t total_;
  bool enabled_, finished_ = false;
  std::atomic<uint64_t> done_{0};
  std::mutex mu_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// Seconds since `t0`.
double seconds_since(std::chrono::steady_clock::time_point t0);
// "1.23 GB" / "456.7 MB" / "12.3 KB" / "512 B" (decimal units).
std::string human_bytes(uint64_t n);

}  // namespace tessera::convert
