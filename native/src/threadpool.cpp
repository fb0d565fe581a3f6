// threadpool.cpp — see threadpool.h.
#include "threadpool.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define LLMD_PAUSE() _mm_pause()
#else
#define LLMD_PAUSE() std::this_thread::yield()
#endif

namespace llmd {

namespace {
// About 50-100 µs of spinning: longer than the gap between two regions of one
// decode step, far shorter than the gap between two requests.
constexpr int kSpinIterations = 20000;
} // namespace

ThreadPool::ThreadPool(int n_threads) {
    for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
        generation_.fetch_add(1);
    }
    wake_.notify_all();
    for (auto &t : workers_) t.join();
}

void ThreadPool::drain_tasks() {
    for (int t = next_task_.fetch_add(1); t < n_tasks_; t = next_task_.fetch_add(1)) (*job_)(t);
}

void ThreadPool::run(int n_tasks, const std::function<void(int)> &fn) {
    if (workers_.empty() || n_tasks <= 1) {
        for (int t = 0; t < n_tasks; ++t) fn(t);
        return;
    }
    job_ = &fn;
    n_tasks_ = n_tasks;
    next_task_.store(0);
    busy_workers_.store(static_cast<int>(workers_.size()));
    generation_.fetch_add(1);
    if (sleepers_.load() > 0) {
        std::lock_guard<std::mutex> lock(mutex_);
        wake_.notify_all();
    }
    drain_tasks();
    while (busy_workers_.load() != 0) LLMD_PAUSE();
}

void ThreadPool::worker_loop() {
    uint64_t seen = 0;
    for (;;) {
        int spins = 0;
        while (generation_.load() == seen && spins < kSpinIterations) {
            LLMD_PAUSE();
            ++spins;
        }
        if (generation_.load() == seen) {
            std::unique_lock<std::mutex> lock(mutex_);
            sleepers_.fetch_add(1);
            wake_.wait(lock, [&] { return generation_.load() != seen; });
            sleepers_.fetch_sub(1);
        }
        seen = generation_.load();
        if (stop_.load()) return;
        drain_tasks();
        busy_workers_.fetch_sub(1);
    }
}

} // namespace llmd
