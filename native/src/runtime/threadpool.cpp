// threadpool.cpp — see threadpool.h.
#include "runtime/threadpool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define LLMD_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define LLMD_PAUSE() __asm__ __volatile__("yield") // a hint, as pause is; no system call
#else
#define LLMD_PAUSE() std::this_thread::yield()
#endif

namespace llmd {

namespace {
// About half a millisecond of spinning (a pause is ~25 ns on the reference
// machine): longer than the gap between two regions of one decode step and than
// the Python work between two decode steps, far shorter than the gap between two
// requests.
constexpr int kSpinIterations = 20000;

uint64_t region_of(uint64_t state) { return state >> 32; }
} // namespace

ThreadPool::ThreadPool(int n_threads) {
    for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
        state_.store((region_of(state_.load()) + 1) << 32);
    }
    wake_.notify_all();
    for (auto &t : workers_) t.join();
}

void ThreadPool::work(uint64_t region) {
    uint64_t s = state_.load();
    while (region_of(s) == region) {
        const int next = static_cast<int>(s & 0xffff), n = static_cast<int>((s >> 16) & 0xffff);
        if (next >= n) return;
        if (!state_.compare_exchange_weak(s, s + 1)) continue; // s reloaded
        // The claimed task keeps this region open, so job_ cannot change under us.
        (*job_)(next);
        done_.fetch_add(1);
        s = state_.load();
    }
}

void ThreadPool::run(int n_tasks, const std::function<void(int)> &fn) {
    if (workers_.empty() || n_tasks <= 1) {
        for (int t = 0; t < n_tasks; ++t) fn(t);
        return;
    }
    if (n_tasks > kMaxTasks) { // the state word counts tasks in 16 bits: run in rounds
        for (int base = 0; base < n_tasks; base += kMaxTasks) {
            const std::function<void(int)> round = [&](int t) { fn(base + t); };
            run(std::min(kMaxTasks, n_tasks - base), round);
        }
        return;
    }
    job_ = &fn;
    done_.store(0);
    const uint64_t region = region_of(state_.load()) + 1;
    state_.store(region << 32 | static_cast<uint64_t>(n_tasks) << 16);
    if (sleepers_.load() > 0) {
        std::lock_guard<std::mutex> lock(mutex_);
        wake_.notify_all();
    }
    work(region);
    while (done_.load() != n_tasks) LLMD_PAUSE();
}

void ThreadPool::worker_loop() {
    uint64_t seen = 0;
    for (;;) {
        int spins = 0;
        while (region_of(state_.load()) == seen && spins < kSpinIterations) {
            LLMD_PAUSE();
            ++spins;
        }
        if (region_of(state_.load()) == seen) {
            std::unique_lock<std::mutex> lock(mutex_);
            sleepers_.fetch_add(1);
            wake_.wait(lock, [&] { return region_of(state_.load()) != seen; });
            sleepers_.fetch_sub(1);
        }
        seen = region_of(state_.load());
        if (stop_.load()) return;
        work(seen);
    }
}

} // namespace llmd
