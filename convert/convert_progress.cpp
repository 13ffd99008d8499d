// Progress bar for convert / verify (see convert_progress.h).
#include "convert/convert_progress.h"

#include <algorithm>
#include <cstdio>

namespace tessera::convert {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string human_bytes(uint64_t n) {
  char buf[32];
  if (n >= 1000000000ull) std::snprintf(buf, sizeof buf, "%.2f GB", double(n) / 1e9);
  else if (n >= 1000000ull) std::snprintf(buf, sizeof buf, "%.1f MB", double(n) / 1e6);
  else if (n >= 1000ull) std::snprintf(buf, sizeof buf, "%.1f KB", double(n) / 1e3);
  else std::snprintf(buf, sizeof buf, "%llu B", (unsigned long long)n);
  return buf;
}

ProgressBar::ProgressBar(std::string label, uint64_t total_bytes, bool enabled)
    : label_(std::move(label)), total_(total_bytes ? total_bytes : 1), enabled_(enabled) {
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

ProgressBar::~ProgressBar() {
  // An unfinished bar (an error is on its way) ends its line so the message starts clean.
  if (enabled_ && !finished_) std::fputc('\n', stderr);
}

void ProgressBar::add(uint64_t bytes) {
  done_.fetch_add(bytes);
  if (!enabled_) return;
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  draw(false);
}

void ProgressBar::finish() {
  if (!enabled_ || finished_) return;
  std::lock_guard<std::mutex> lock(mu_);
  done_.store(total_);
  draw(true);
  finished_ = true;
}

void ProgressBar::draw(bool final) {
  const uint64_t done = std::min(done_.load(), total_);
  const double frac = double(done) / double(total_), secs = seconds_since(start_);
  const double mbps = secs > 0 ? double(done) / 1e6 / secs : 0.0;
  constexpr int kWidth = 30;
  const int fill = int(frac * kWidth);
  char bar[kWidth + 1];
  for (int i = 0; i < kWidth; ++i) bar[i] = i < fill ? '#' : '.';
  bar[kWidth] = 0;
  char eta[32] = "";
  if (!final && frac > 0.001) std::snprintf(eta, sizeof eta, " ETA %.0fs", secs / frac - secs);
  std::fprintf(stderr, "\r%s [%s] %5.1f%% %8.1f MB/s %.1fs%s   %s", label_.c_str(), bar, frac * 100, mbps, secs, eta,
               final ? "\n" : "");
  std::fflush(stderr);
}

}  // namespace tessera::convert
