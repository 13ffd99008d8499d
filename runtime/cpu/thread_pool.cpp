#include "runtime/cpu/thread_pool.h"

namespace tessera {

ThreadPool::ThreadPool(unsigned n_threads) {
  for (unsigned i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::run_tasks() {
  std::unique_lock<std::mutex> lock(mu_);
  while (next_index_ < job_size_) {
    const size_t i = next_index_++;
    const std::function<void(size_t)>& fn = *job_;
    lock.unlock();
    try {
      fn(i);
    } catch (...) {
      lock.lock();
      if (!error_) error_ = std::current_exception();
      next_index_ = job_size_;  // skip what is left
      continue;
    }
    lock.lock();
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      ++busy_;
    }
    run_tasks();
    {
      std::lock_guard<std::mutex> lock(mu_);
      --busy_;
    }
    done_cv_.notify_all();
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (workers_.empty() || n == 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_size_ = n;
    next_index_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  start_cv_.notify_all();
  run_tasks();
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lock(mu_);
    // All indices are taken; wait until every worker that joined has left the job.
    done_cv_.wait(lock, [&] { return busy_ == 0 && next_index_ >= job_size_; });
    job_ = nullptr;
    job_size_ = 0;
    err = error_;
    error_ = nullptr;
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace tessera
