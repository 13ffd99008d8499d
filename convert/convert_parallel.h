// A parallel loop for the converter and verifier: fn(i) for i in [0, n) on up to `threads`
// threads (the caller's thread included), dynamic scheduling. The first exception thrown by any
// call is rethrown after all threads stop; the remaining indices are skipped.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace tessera::convert {

template <class Fn>
void parallel_for(size_t n, unsigned threads, Fn&& fn) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex mu;
  auto work = [&] {
    for (size_t i; !failed.load() && (i = next.fetch_add(1)) < n;) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        failed.store(true);
      }
    }
  };
  const size_t n_threads = std::min<size_t>(std::max(1u, threads), n);
  std::vector<std::thread> pool;
  for (size_t k = 1; k < n_threads; ++k) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace tessera::convert
