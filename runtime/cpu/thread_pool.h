// A small fixed-size pool of worker threads for data-parallel loops (the CPU reference splits
// matrix rows and attention heads over it).
#pragma once
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tessera {

class ThreadPool {
 public:
  // `n_threads` >= 1 threads take part in each loop: the caller plus n_threads-1 workers
  // (0 is treated as 1).
  explicit ThreadPool(unsigned n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned size() const { return unsigned(workers_.size()) + 1; }

  // Calls fn(i) once for every i in [0, n), spread over the pool (dynamic scheduling); returns
  // when all calls are done. If any call throws, the remaining indices are skipped and the first
  // exception is rethrown here. Not re-entrant: fn must not call parallel_for on the same pool.
  void parallel_for(size_t n, const std::function<void(size_t)>& fn);

 private:
  void worker_loop();
  void run_tasks();  // take indices of the current job until none are left

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(size_t)>* job_ = nullptr;  // current loop body (guarded by mu_)
  size_t job_size_ = 0, next_index_ = 0;              // guarded by mu_
  unsigned busy_ = 0;                                 // workers inside the current job
  uint64_t generation_ = 0;                           // bumped for every new job
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace tessera
